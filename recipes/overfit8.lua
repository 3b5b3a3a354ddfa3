--[[
recipes/overfit8.lua — the overfitting check of the trainer (issue 7):
8 real images, augmentation off, no accumulation (nbs = batch = 8), trained
for 2000 steps and validated on the same 8 images. A working trainer reaches
box mAP50 >= 0.9 and pose mAP50 >= 0.5. Prints the loss and metric curves;
exits with status 3 (a line on stderr says why) when either is missed, so
a script can rely on it (a short run, e.g. steps=30, is expected to miss).

  luajit recipes/overfit8.lua                  # 2000 steps on the GPU
  luajit recipes/overfit8.lua steps=200 device=cpu imgsz=128
  luajit recipes/overfit8.lua --help                # every key and its default

The 8 images and their labels are copied (by Lua, so any path works) into
a temporary folder under $TMPDIR (default /tmp), which is removed when the
run ends, on success and on every error (Ctrl-C included, and SIGTERM while
training).
]]
local lucid = require "lucid"
local recipe = require "lucid.recipe"
local data = require "lucid.data"

local q = recipe.shell_quote

-- The whole content of a file (binary), or an error naming it.
local function copy_file(from, to)
  local f, err = io.open(from, "rb")
  if not f then error(string.format("cannot copy %s (%s)", from, tostring(err):gsub("^.*: ", "")), 0) end
  local bytes = f:read("*a")
  f:close()
  local g, gerr = io.open(to, "wb")
  if not g then error(string.format("cannot copy %s to %s (%s)", from, to, tostring(gerr):gsub("^.*: ", "")), 0) end
  local ok, werr = g:write(bytes)
  g:close()
  if not ok then error(string.format("cannot copy %s to %s (%s)", from, to, tostring(werr)), 0) end
end

-- A new, empty temporary folder under $TMPDIR (default /tmp).
local function make_tmpdir()
  local p = io.popen("mktemp -d \"${TMPDIR:-/tmp}/lucid-overfit8.XXXXXX\" 2>&1")
  local dir = p:read("*l")
  p:close()
  if not dir or dir:sub(1, 1) ~= "/" or recipe.path_kind(dir) ~= "dir" then
    error("cannot create a temporary folder (" .. tostring(dir) .. "); check TMPDIR", 0)
  end
  return dir
end

local defaults = { steps = 2000, device = "auto", imgsz = 640, val_every = 100, seed = 0,
  precision = "auto", workers = 4, record = false, name = "overfit8", project = "runs" }
local descriptions = {
  steps = "training steps (each an epoch of the 8 images)",
  device = "cpu, cuda, cuda:N or auto",
  imgsz = "image side (a multiple of 32)",
  val_every = "validate every N steps (and at the end; 0: only at the end)",
  seed = "random seed",
  precision = "auto (bf16 on a GPU, fp32 on the CPU), bf16, fp16 or fp32",
  workers = "loader threads",
  record = "the recorded (CUDA-graph) training step on a GPU",
  name = "the run folder under project",
  project = "the folder that holds the run folders",
}

-- Errors print "overfit8: <message>" and exit with status 1 (recipe.run).
local function main()
if recipe.help_requested(arg) then
  io.stdout:write(recipe.usage(arg[0] or "recipes/overfit8.lua", defaults, descriptions,
    "Overfits the pose model on 8 real images (augmentation off): a working trainer reaches box mAP50 >= 0.9 "
    .. "and pose mAP50 >= 0.5.", recipe.program(arg)))
  return
end
local opts = recipe.resolve(defaults, arg)

-- steps and val_every become the trainer's epochs and val_period (one
-- epoch of the 8 images is one step): checked under the names given here
for _, k in ipairs({ "steps", "val_every" }) do
  local v, lo = opts[k], k == "steps" and 1 or 0
  if v ~= math.floor(v) or v < lo or v > recipe.INT_MAX then
    error(string.format("%s = %s: expected an integer in [%d, %d]", k, recipe.show(v), lo, recipe.INT_MAX), 0)
  end
end

-- an 8-image dataset: the first 8 training images, as train and as val
local src = data.find_dataset("coco-pose-mini")
if not src then error("the dataset coco-pose-mini was not found (set LUCID_DATASETS)", 0) end

-- the trainer's settings (data: the descriptor written into the temporary folder)
local cfg = {
  name = opts.name, project = opts.project, exist_ok = true, resume = false, device = opts.device, seed = opts.seed,
  workers = opts.workers, quiet = true, model = "yolo11", scale = "n", data = "(temporary folder)/overfit8.lua",
  imgsz = opts.imgsz, batch = 8, cache = true, max_gt = "auto", epochs = opts.steps, optimizer = "auto",
  lr0 = 0.01, lrf = 0.01, cos_lr = false, momentum = 0.937, weight_decay = 0.0005, nbs = 8,
  warmup_epochs = 3, warmup_momentum = 0.8, warmup_bias_lr = 0.1, precision = opts.precision,
  clip = { max_norm = 10.0 }, loss = { box = 7.5, cls = 0.5, dfl = 1.5, pose = 12.0, kobj = 1.0 },
  augment = { mosaic = 0, close_mosaic = 0, degrees = 0, translate = 0, scale = 0, shear = 0, perspective = 0,
    flipud = 0, fliplr = 0, hsv_h = 0, hsv_s = 0, hsv_v = 0 },
  conf = 0.001, iou = 0.7, max_det = 300, ap = "coco", val_period = opts.val_every, save_period = opts.steps,
  val_batch = 8, record = opts.record,
}
local Trainer = require "lucid.trainer"
Trainer.check_config(cfg) -- every other setting, before the images are copied
Trainer.check_paths(cfg)

-- the temporary dataset: removed when the run ends, whether it succeeded or failed
local dir = make_tmpdir()
cfg.data = dir .. "/overfit8.lua"
local passed = false
local ok, err = pcall(function()
  for _, sub in ipairs({ "images/train", "labels/train", "images/val", "labels/val" }) do
    recipe.make_folder(dir .. "/" .. sub, "TMPDIR", "overfit8")
  end
  local p = io.popen("ls -1 " .. q(src .. "/images/train") .. " 2>/dev/null")
  local names = {}
  for name in p:lines() do
    if name:lower():match("%.jpe?g$") or name:lower():match("%.png$") then names[#names + 1] = name end
  end
  p:close()
  table.sort(names)
  if #names < 8 then
    error(string.format("%s/images/train has %d images; overfit8 needs 8", src, #names), 0)
  end
  for i = 1, 8 do
    local name = names[i]
    local stem = name:gsub("%.[^.]+$", "")
    for _, split in ipairs({ "train", "val" }) do
      copy_file(src .. "/images/train/" .. name, dir .. "/images/" .. split .. "/" .. name)
      copy_file(src .. "/labels/train/" .. stem .. ".txt", dir .. "/labels/" .. split .. "/" .. stem .. ".txt")
    end
  end
  local f = assert(io.open(dir .. "/overfit8.lua", "w"))
  f:write(string.format([[return { name = "overfit8", path = %q, train = "images/train", val = "images/val",
  kpt_shape = {17, 3}, flip_idx = {0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15}, names = {"person"} }]], dir))
  f:close()

  local tr = Trainer.new(cfg)
  local model = require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { 17, 3 }, ctx = tr.ctx,
    device = tr.device }
  print(string.format("overfit8: %d steps, batch 8, imgsz %d, %s, %s", opts.steps, opts.imgsz, tr.device, tr.precision))
  print(string.format("%6s %8s %8s %8s %8s %8s | %8s %8s %8s %8s", "step", "box", "pose", "kobj", "cls", "dfl",
    "B mAP50", "B 50-95", "P mAP50", "P 50-95"))
  local last_losses
  tr:add_callback("on_epoch_end", function(_, ev)
    last_losses = ev.train_losses
    local m = ev.metrics
    if m then
      local l = last_losses
      print(string.format("%6d %8.4f %8.4f %8.4f %8.4f %8.4f | %8.4f %8.4f %8.4f %8.4f", ev.epoch + 1, l.box, l.pose,
        l.kobj, l.cls, l.dfl, m.box.map50, m.box.map50_95, m.pose.map50, m.pose.map50_95))
      io.stdout:flush()
    end
  end)
  local res = tr:fit(model)
  local m = res.metrics
  print(string.format("overfit8 result: box mAP50 %.4f (>= 0.9: %s), pose mAP50 %.4f (>= 0.5: %s), %.1f s",
    m.box.map50, tostring(m.box.map50 >= 0.9), m.pose.map50, tostring(m.pose.map50 >= 0.5), res.fit_seconds))
  passed = m.box.map50 >= 0.9 and m.pose.map50 >= 0.5
end)
os.execute("rm -rf -- " .. q(dir))
if not ok then error(err, 0) end
if not passed then
  -- the check is the recipe's purpose: a script (or CI) can rely on the status
  io.stdout:flush()
  io.stderr:write("overfit8: check failed: box mAP50 >= 0.9 and pose mAP50 >= 0.5 not both reached "
    .. "(exit status 3)\n")
  os.exit(3)
end
end

recipe.run("overfit8", main)
