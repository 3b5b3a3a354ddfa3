--[[
recipes/overfit8.lua — the overfitting check of the trainer (issue 7):
8 real images, augmentation off, no accumulation (nbs = batch = 8), trained
for 2000 steps and validated on the same 8 images. A working trainer reaches
box mAP50 >= 0.9 and pose mAP50 >= 0.5. Prints the loss and metric curves.

  luajit recipes/overfit8.lua                  # 2000 steps on the GPU
  luajit recipes/overfit8.lua steps=200 device=cpu imgsz=128
]]
local lucid = require "lucid"
local recipe = require "lucid.recipe"
local data = require "lucid.data"

-- Errors print "overfit8: <message>" and exit with status 1 (recipe.run).
local function main()
local opts = recipe.resolve({ steps = 2000, device = "auto", imgsz = 640, val_every = 100, seed = 0,
  precision = "auto", workers = 4, record = false, name = "overfit8" }, arg)

-- steps and val_every become the trainer's epochs and val_period (one
-- epoch of the 8 images is one step): checked under the names given here
for _, k in ipairs({ "steps", "val_every" }) do
  local v, lo = opts[k], k == "steps" and 1 or 0
  if v ~= math.floor(v) or v < lo or v > recipe.INT_MAX then
    error(string.format("%s = %s: expected an integer in [%d, %d]", k, tostring(v), lo, recipe.INT_MAX), 0)
  end
end

-- an 8-image dataset: the first 8 training images, as train and as val
local src = data.find_dataset("coco-pose-mini")
if not src then error("the dataset coco-pose-mini was not found (set LUCID_DATASETS)", 0) end
local dir = os.tmpname()
os.remove(dir)

-- the trainer's settings (data: the descriptor written into dir below)
local cfg = {
  name = opts.name, project = "runs", exist_ok = true, resume = false, device = opts.device, seed = opts.seed,
  workers = opts.workers, quiet = true, model = "yolo11", scale = "n", data = dir .. "/overfit8.lua",
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

for _, sub in ipairs({ "images/train", "labels/train", "images/val", "labels/val" }) do
  os.execute("mkdir -p " .. dir .. "/" .. sub)
end
local p = io.popen("ls " .. src .. "/images/train | sort | head -8")
for name in p:lines() do
  local stem = name:gsub("%.[^.]+$", "")
  for _, split in ipairs({ "train", "val" }) do
    os.execute(string.format("cp %s/images/train/%s %s/images/%s/", src, name, dir, split))
    os.execute(string.format("cp %s/labels/train/%s.txt %s/labels/%s/", src, stem, dir, split))
  end
end
p:close()
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
os.execute("rm -rf " .. dir)
end

recipe.run("overfit8", main)
