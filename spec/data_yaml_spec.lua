-- data_yaml_spec.lua — data= as an Ultralytics data YAML (data.load_yaml,
-- data.load_descriptor): read with libyaml, `path`/`train`/`val` resolved as
-- Ultralytics' check_det_dataset does, kpt_shape/flip_idx/names taken over,
-- errors naming the file and the key; the mini dataset through its YAML
-- (datasets/coco_pose_mini.yaml) equals its .lua descriptor.
local ffi = require "ffi"
local lucid = require "lucid"
local data = require "lucid.data"
local files = require "support.files"
local write, read = files.write, files.read

ffi.cdef [[
int setenv(const char *name, const char *value, int overwrite);
int unsetenv(const char *name);
]]

local env0 = os.getenv("LUCID_DATASETS") -- restored by the first block's teardown
local mini = data.find_dataset("coco-pose-mini")

-- the number of images of split in descriptor d (opened, then freed)
local function size_of(d, split)
  local ds = assert(data.open(d, split, { imgsz = 64 }))
  local n = #ds
  ds:free()
  return n
end

-- the error message of f(...) (which must fail)
local err_of = require("support.errors").err_of

local POSE = "kpt_shape: [17, 3]\nflip_idx: [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]\n"
  .. "names:\n  0: person\n"

describe("data= as an Ultralytics data YAML", function()
  local root, base, name -- root = base/name: a dataset of 2 train + 1 val images
  setup(function()
    base = os.tmpname()
    os.remove(base)
    name = "yset"
    root = base .. "/" .. name
    assert(os.execute(string.format("mkdir -p '%s/images/train' '%s/images/val' '%s/labels/train' '%s/labels/val' "
      .. "'%s/cfg'", root, root, root, root, root)))
    if mini then
      -- the first 2 train and the first val image of the mini dataset
      for split, n in pairs({ train = 2, val = 1 }) do
        local p = io.popen("ls '" .. mini .. "/images/" .. split .. "' | sort | head -" .. n)
        for file in p:lines() do
          local stem = file:gsub("%.jpg$", "")
          write(root .. "/images/" .. split .. "/" .. file, read(mini .. "/images/" .. split .. "/" .. file))
          write(root .. "/labels/" .. split .. "/" .. stem .. ".txt", read(mini .. "/labels/" .. split .. "/" .. stem .. ".txt"))
        end
        p:close()
      end
    end
  end)
  teardown(function()
    -- the caller's setting back (later specs find the mini dataset through it)
    if env0 then ffi.C.setenv("LUCID_DATASETS", env0, 1) else ffi.C.unsetenv("LUCID_DATASETS") end
    os.execute("rm -rf '" .. base .. "'")
  end)
  local saved_env
  before_each(function() saved_env = os.getenv("LUCID_DATASETS") end)
  after_each(function()
    if saved_env then ffi.C.setenv("LUCID_DATASETS", saved_env, 1) else ffi.C.unsetenv("LUCID_DATASETS") end
  end)

  it("path absent: the YAML's folder; the fields come over as in the file", function()
    local y = root .. "/data.yaml"
    write(y, "train: images/train\nval: images/val\n" .. POSE)
    local d = data.load_descriptor(y)
    assert.are.equal(root, d.path)
    assert.are.equal("images/train", d.train)
    assert.are.equal("images/val", d.val)
    assert.are.same({ 17, 3 }, d.kpt_shape)
    assert.are.same({ 0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15 }, d.flip_idx)
    assert.are.same({ "person" }, d.names)
    assert.are.equal(y, d.descriptor_file)
    -- a YAML null (path: ~ / null) is absent too
    for _, v in ipairs({ "~", "null" }) do
      local yn = root .. "/null_" .. (v == "~" and "tilde" or v) .. ".yaml"
      write(yn, "path: " .. v .. "\ntrain: images/train\nval: images/val\n" .. POSE)
      assert.are.equal(root, data.load_descriptor(yn).path)
    end
    if not mini then pending("coco-pose-mini not found (the images come from it)") return end
    assert.are.equal(2, size_of(d, "train"))
  end)

  it("path relative: the working directory first, then the datasets folder (LUCID_DATASETS)", function()
    local y = root .. "/cfg/pose.yaml"
    -- not under the working directory: found in the datasets folder
    write(y, "path: " .. name .. "\ntrain: images/train\nval: images/val\n" .. POSE)
    ffi.C.setenv("LUCID_DATASETS", base, 1)
    assert.are.equal(base .. "/" .. name, data.load_yaml(y).path)
    -- under the working directory: that one, as Ultralytics (the YAML's folder plays no part)
    local cwd = io.popen("pwd"):read("*l")
    local depth = select(2, cwd:gsub("/", "/"))
    local rel = string.rep("../", depth) .. root:sub(2) -- root, relative to the working directory
    write(y, "path: " .. rel .. "\ntrain: images/train\nval: images/val\n" .. POSE)
    assert.are.equal(rel, data.load_yaml(y).path)
    -- nowhere: the error names the file, the key and the places tried
    write(y, "path: no-such-set\ntrain: images/train\nval: images/val\n" .. POSE)
    local e = err_of(data.load_yaml, y)
    assert.truthy(e:find("data YAML " .. y .. ": 'path' = no-such-set: no such folder (tried no-such-set "
      .. "(working directory), " .. base .. "/no-such-set", 1, true), e)
  end)

  it("train/val: absolute as they are, and Ultralytics' '../' rule", function()
    local y = root .. "/cfg/abs.yaml"
    write(y, "path: " .. root .. "\ntrain: ../images/train\nval: " .. root .. "/images/val\n" .. POSE)
    local d = data.load_yaml(y)
    assert.are.equal(root, d.path)
    assert.are.equal("images/train", d.train) -- root/../images/train is absent: root/images/train
    assert.are.equal(root .. "/images/val", d.val)
    if not mini then return end
    assert.are.equal(1, size_of(d, "val"))
  end)

  it("errors name the file and the key", function()
    local y = root .. "/bad.yaml"
    local function fails(text, ...)
      write(y, text)
      local e = err_of(data.load_descriptor, y)
      for _, needle in ipairs({ y, ... }) do assert.truthy(e:find(needle, 1, true), e .. "\n  lacks: " .. needle) end
    end
    fails("train: images/train\n" .. POSE, "'val' is missing")
    fails("train: images/train\nval: images/nope\n" .. POSE, "'val' = images/nope: " .. root .. "/images/nope does not exist")
    fails("train: images/train\nval: images/val\nnames: [person]\n", "'kpt_shape' is missing")
    fails("train: images/train\nval: images/val\nkpt_shape: [17]\nnames: [person]\n", "bad.yaml:3:", "kpt_shape = [17]:")
    -- the value as written, whatever its form
    fails("train: images/train\nval: images/val\nkpt_shape: seventeen\nnames: [person]\n", "bad.yaml:3:",
      "kpt_shape = seventeen: must be [K, D]")
    fails("train: images/train\nval: images/val\nkpt_shape: [3, 3]\nflip_idx: [0, 2, 2]\nnames: [person]\n",
      "bad.yaml:4:", "flip_idx")
    fails("train: images/train\nval: images/val\nkpt_shape: [3, 3]\nflip_idx: [0, 2]\nnames: [person]\n",
      "bad.yaml:4:", "flip_idx has 2 entries, kpt_shape has 3 keypoints")
    fails("train: images/train\nval: images/val\nkpt_shape: [3, 3]\nflip_idx: [0, x, 1]\nnames: [person]\n",
      "bad.yaml:4:", "flip_idx = [0, x, 1]: must be a list")
    fails("train: images/train\nval: images/val\nkpt_shape: [17, 3]\nnc: 2\nnames: [person]\n",
      "nc = 2 but names has 1 entries")
    fails("train: [images/train, images/val]\nval: images/val\n" .. POSE, "bad.yaml:1:", "'train' must be a string")
    fails("train: images/train\nval: images/val\nkpt_shape: [17, 3\n", "bad.yaml:", "YAML error")
    write(root .. "/train.txt", "images/train/000000000139.jpg\n")
    fails("train: train.txt\nval: images/val\n" .. POSE, "'train' = train.txt", "image-list files are not supported")
    local e = err_of(data.load_descriptor, root .. "/missing.yaml")
    assert.truthy(e:find("data YAML " .. root .. "/missing.yaml: file not found", 1, true), e)
  end)

  it("flip_idx absent: horizontal flips are off (as Ultralytics); the dataset still opens", function()
    local y = root .. "/noflip.yaml"
    write(y, "train: images/train\nval: images/val\nkpt_shape: [17, 3]\nnames: [person]\n")
    local d = data.load_yaml(y)
    assert.is_nil(d.flip_idx)
    if not mini then return end
    size_of(d, "train")
  end)
end)

describe("the mini dataset through its data YAML", function()
  if not mini then
    it("is not present", function() pending("coco-pose-mini not found ($LUCID_DATASETS, ../shared/datasets, datasets)") end)
    return
  end

  it("datasets/coco_pose_mini.yaml gives the .lua descriptor's dataset", function()
    local y = data.load_descriptor("datasets/coco_pose_mini.yaml")
    local l = data.load_descriptor("coco_pose_mini")
    for _, k in ipairs({ "train", "val", "kpt_shape", "flip_idx", "names" }) do assert.are.same(l[k], y[k], k) end
    -- the same folder (found in the datasets folder: 'path' is relative)
    local function real(p) return io.popen("realpath '" .. p .. "'"):read("*l") end
    assert.are.equal(real(l.path), real(y.path))
    -- a bare name is found in the repository's datasets/ too
    assert.are.equal(real(y.path), real(data.load_yaml("coco_pose_mini.yaml").path))
    for split, n in pairs({ train = 137, val = 32 }) do
      local ds = assert(data.open(y, split, { imgsz = 64 }))
      assert.are.equal(n, #ds)
      assert.are.equal(0, ds:stats().rejected)
      ds:free()
    end
  end)

  it("trains through the recipe's data= (one epoch)", function()
    local Trainer = require "lucid.trainer"
    local fit_cfg = require "support.fit_cfg"
    local tmp = os.tmpname()
    os.remove(tmp)
    local tr = Trainer.new(fit_cfg.cfg(tmp, { name = "yaml", epochs = 1, data = "datasets/coco_pose_mini.yaml" }))
    local res = tr:fit(fit_cfg.build(tr))
    assert.are.equal(1, res.epochs)
    assert.are.equal(32, res.metrics.images)
    assert.are.equal(68, res.metrics.box.instances)
    os.execute("rm -rf '" .. tmp .. "'")
  end)

  it("the model follows the data's classes: a mismatch is an error naming the data, before any step; "
    .. "the recipe builds the head from names/nc and kpt_shape", function()
    local Trainer = require "lucid.trainer"
    local fit_cfg = require "support.fit_cfg"
    local tmp = os.tmpname()
    os.remove(tmp)
    os.execute("mkdir -p '" .. tmp .. "'")
    local y = tmp .. "/two.yaml"
    write(y, "path: " .. mini .. "\ntrain: images/train\nval: images/val\n" .. POSE .. "names: [person, dog]\n")
    local tr = Trainer.new(fit_cfg.cfg(tmp, { name = "nc2", epochs = 1, data = y }))
    local ok, err = pcall(tr.fit, tr, fit_cfg.build(tr)) -- an nc=1 model
    assert.is_false(ok)
    assert.truthy(tostring(err):find("the model has nc=1 classes, the data " .. y .. " has 2", 1, true), tostring(err))
    -- the recipe's way: the head from the data (nc 2, 17x3) trains
    local desc = data.load_descriptor(y)
    local tr2 = Trainer.new(fit_cfg.cfg(tmp, { name = "nc2b", epochs = 1, data = y }))
    local m = require("lucid.models.yolo11_pose"){ scale = "n", nc = #desc.names, kpt_shape = desc.kpt_shape,
      ctx = tr2.ctx, device = tr2.device }
    local res = tr2:fit(m)
    assert.are.equal(1, res.epochs)
    -- and the recipe itself (it builds the head from the data)
    local cmd = string.format("luajit recipes/pose_nano.lua epochs=1 imgsz=64 batch=8 device=cpu workers=1 "
      .. "data=%s project=%s name=rec exist_ok=true 2>&1", y, tmp)
    local p = io.popen(cmd)
    local out = p:read("*a")
    p:close()
    assert.truthy(out:find("final:", 1, true), out) -- the recipe's last line: it trained and validated
    os.execute("rm -rf '" .. tmp .. "'")
  end)
end)
