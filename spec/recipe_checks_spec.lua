-- recipe_checks_spec.lua — what a recipe user sees for bad input: every
-- key=value checked up front with an error naming the key and the value
-- (empty paths, booleans that are not, non-finite numbers, Ultralytics'
-- ranges, imgsz bounds, a 1-image batch at imgsz 32, predict's keys, a
-- source that is no image or an empty folder, values past the engine's
-- C int / f32 / device names named by key rather than by the C binding
-- they used to reach), no internal "file.lua:NN:" location in what the
-- recipes print, a clean line on Ctrl-C, and the smaller messages (a
-- synchronous checkpoint write, the resume folder with quiet=true,
-- predict's per-image input shape, bin/lucid -e's `lucid`, a truncated
-- JPEG of a folder skipped with one stderr line, predict's imgsz taken from
-- the checkpoint). Each fix has a negative control: the valid neighbour of
-- the bad value is accepted.
local lucid = require "lucid"
local recipe = require "lucid.recipe"
local Trainer = require "lucid.trainer"
local predict = require "lucid.predict"
local data = require "lucid.data"
local files = require "support.files"
local interrupt_run = require "support.interrupt_run"
local fit_cfg = require "support.fit_cfg"

local mini = data.find_dataset("coco-pose-mini")
local describe_data = mini and describe or pending

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Run a shell command; returns stdout, stderr and the exit status.
local function run(cmd)
  local errf = os.tmpname()
  local p = assert(io.popen("(" .. cmd .. ") 2>" .. shell_quote(errf) .. "; echo \"__rc=$?\""))
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)%s*$"))
  local err = files.read(errf)
  os.remove(errf)
  return (out:gsub("__rc=%d+%s*$", "")), err, rc
end

local err_of = require("support.errors").err_of

-- no "something.lua:12: " location anywhere in a message shown to a user
local function no_location(s)
  assert.is_nil(s:match("[%w_]+%.lua:%d+:"), s)
end

describe("recipe.resolve: values checked by type, up front", function()
  local defaults = {
    out = "runs/predict", project = "runs", name = "x", data = "coco_pose_mini", weights = "w.safetensors",
    source = "", device = "auto", lr0 = 0.01, cos_lr = false, exist_ok = false, device_hsv = true, resume = false,
    cache = true, max_gt = "auto", clip = { max_norm = 10.0 },
  }
  local function resolve(...) return recipe.resolve(defaults, { ... }) end

  it("refuses an empty value for every key (an empty path would mean the filesystem root)", function()
    for _, k in ipairs({ "out", "project", "name", "data", "weights", "source", "device" }) do
      local e = err_of(resolve, k .. "=")
      assert.truthy(e:find("recipe: " .. k .. ": empty value; give one", 1, true), e)
    end
    assert.are.equal("recipe: out: empty value; give one (the default is out=runs/predict)", err_of(resolve, "out="))
    assert.are.equal("recipe: source: empty value; give one", err_of(resolve, "source="))
    assert.truthy(err_of(resolve, "lr0="):find("recipe: lr0: empty value", 1, true))
    assert.truthy(err_of(resolve, "cos_lr="):find("recipe: cos_lr: empty value", 1, true))
    assert.truthy(err_of(resolve, "resume="):find("recipe: resume: empty value", 1, true))
    -- negative control: non-empty values go through as given
    local cfg = resolve("out=/tmp/x", "project=p", "name=n", "data=d.yaml", "weights=a/b.safetensors", "source=img.jpg")
    assert.are.same({ "/tmp/x", "p", "n", "d.yaml", "a/b.safetensors", "img.jpg" },
      { cfg.out, cfg.project, cfg.name, cfg.data, cfg.weights, cfg.source })
  end)

  it("boolean keys take true/false spellings only; resume also a path, cache also ram", function()
    assert.are.equal("recipe: cos_lr: expected true or false, got 'x/y'", err_of(resolve, "cos_lr=x/y"))
    assert.are.equal("recipe: exist_ok: expected true or false, got 'a.safetensors'",
      err_of(resolve, "exist_ok=a.safetensors"))
    assert.are.equal("recipe: device_hsv: expected true or false, got 'no/way'", err_of(resolve, "device_hsv=no/way"))
    assert.are.equal("recipe: cache: expected true, false or ram, got '/tmp/foo'", err_of(resolve, "cache=/tmp/foo"))
    local e = err_of(resolve, "cache=disk")
    assert.truthy(e:find("recipe: cache=disk is not supported: lucid caches the prepared images in RAM only", 1, true), e)
    assert.truthy(err_of(resolve, "resume=maybe"):find("recipe: resume: expected true, false or a checkpoint path", 1, true))
    -- negative controls: the accepted spellings
    for text, want in pairs({ ["true"] = true, ["false"] = false, yes = true, no = false, ["1"] = true, ["0"] = false,
                              TRUE = true, No = false }) do
      assert.are.equal(want, resolve("cos_lr=" .. text).cos_lr, text)
    end
    assert.are.equal(true, resolve("cache=ram").cache)  -- Ultralytics' 'ram' is lucid's cache
    assert.are.equal(false, resolve("cache=false").cache)
    assert.are.equal("runs/x/weights/last.safetensors", resolve("resume=runs/x/weights/last.safetensors").resume)
    assert.are.equal("last.safetensors", resolve("resume=last.safetensors").resume)
    assert.are.equal(true, resolve("resume=true").resume)
  end)

  it("refuses non-finite numbers for every numeric key", function()
    assert.are.equal("recipe: lr0: expected a finite number, got '1e999'", err_of(resolve, "lr0=1e999"))
    for _, v in ipairs({ "inf", "-inf", "nan", "-1e400" }) do
      assert.truthy(err_of(resolve, "lr0=" .. v):find("expected a finite number", 1, true), v)
      assert.truthy(err_of(resolve, "clip.max_norm=" .. v):find("recipe: clip.max_norm: expected a finite number", 1, true))
    end
    assert.are.equal("recipe: max_gt: expected a finite number, got '1e999'", err_of(resolve, "max_gt=1e999"))
    assert.are.equal("recipe: v: expected comma-separated finite numbers, got '1,inf'",
      err_of(recipe.resolve, { v = { 1, 2 } }, { "v=1,inf" }))
    -- negative control: finite values, in every form tonumber reads
    local cfg = resolve("lr0=1e-3", "clip.max_norm=5", "max_gt=64")
    assert.are.same({ 1e-3, 5, 64 }, { cfg.lr0, cfg.clip.max_norm, cfg.max_gt })
    assert.are.same({ 1, 2.5 }, recipe.resolve({ v = { 1, 2 } }, { "v=1,2.5" }).v)
  end)
end)

describe("Trainer.check_config: Ultralytics' ranges, before anything is opened", function()
  local base = fit_cfg.cfg("/tmp/unused", {})

  local function check(over)
    local c = fit_cfg.cfg("/tmp/unused", {})
    for k, v in pairs(over) do
      local node, last = c, nil
      local parts = {}
      for p in k:gmatch("[^.]+") do parts[#parts + 1] = p end
      for i = 1, #parts - 1 do node[parts[i]] = node[parts[i]] or {}; node = node[parts[i]] end
      last = parts[#parts]
      node[last] = v
    end
    return pcall(Trainer.check_config, c)
  end
  local function msg(over)
    local ok, e = check(over)
    assert.is_false(ok, "expected an error")
    return e
  end

  it("names the key, the value and the range", function()
    local cases = {
      { { lr0 = 1 / 0 }, "trainer: lr0 = inf: expected a finite number" },
      { { ["loss.box"] = 0 / 0 }, "trainer: loss.box = " .. tostring(0 / 0) .. ": expected a finite number" },
      { { lr0 = 0 }, "trainer: lr0 = 0: expected a number in (0, 1]" },
      { { lr0 = 2 }, "trainer: lr0 = 2: expected a number in (0, 1]" },
      { { momentum = 1 }, "trainer: momentum = 1: expected a number in [0, 1)" },
      { { weight_decay = -1 }, "trainer: weight_decay = -1: expected a number in [0, 1]" },
      { { warmup_epochs = -1 }, "trainer: warmup_epochs = -1: expected a number >= 0" },
      { { conf = 2 }, "trainer: conf = 2: expected a confidence threshold in [0, 1]" },
      { { iou = -1 }, "trainer: iou = -1: expected an IoU threshold in [0, 1]" },
      { { ["clip.max_norm"] = -1 }, "trainer: clip.max_norm = -1: expected a number > 0 (the gradient-norm limit "
        .. "of every optimizer step)" },
      { { ["clip.max_norm"] = 0 }, "trainer: clip.max_norm = 0: expected a number > 0 (the gradient-norm limit "
        .. "of every optimizer step)" },
      { { max_det = 0 }, "trainer: max_det = 0: expected an integer >= 1" },
      { { val_period = -1 }, "trainer: val_period = -1: expected an integer >= 0" },
      { { save_period = 1.5 }, "trainer: save_period = 1.5: expected an integer >= 0" },
      { { max_reject_fraction = 1.5 }, "trainer: max_reject_fraction = 1.5: expected a fraction in [0, 1]" },
      { { max_reject_fraction = -0.1 }, "trainer: max_reject_fraction = -0.1: expected a fraction in [0, 1]" },
      { { ["augment.mosaic"] = 2 }, "trainer: augment.mosaic = 2: expected a probability in [0, 1]" },
      { { ["augment.hsv_h"] = -0.1 }, "trainer: augment.hsv_h = -0.1: expected a fraction in [0, 1]" },
      { { ["augment.close_mosaic"] = -1 }, "trainer: augment.close_mosaic = -1: expected an integer >= 0" },
      { { optimizer = "foo" }, "trainer: optimizer = 'foo': expected auto, SGD, AdamW or MuSGD (any case, as "
        .. "Ultralytics)" },
      { { ap = "x" }, "trainer: ap = 'x': expected coco or ultralytics" },
      { { seed = -1 }, "trainer: seed = -1: expected an integer >= 0" },
      { { cos_lr = "x/y" }, "trainer: cos_lr = 'x/y': expected true or false" },
      { { exist_ok = "a.safetensors" }, "trainer: exist_ok = 'a.safetensors': expected true or false" },
      { { cache = "/tmp/foo" }, "trainer: cache = '/tmp/foo': expected true, false or 'ram' (the prepared images "
        .. "kept in RAM)" },
      { { cache = "disk" }, "trainer: cache = 'disk': expected true, false or 'ram' (cache='disk' is not "
        .. "supported: lucid caches the prepared images in RAM only)" },
      { { project = "" }, "trainer: project = '': expected a non-empty folder (the run folders go under it)" },
      { { name = "" }, "trainer: name = '': expected a non-empty name without '/' (the run folder under project)" },
      { { data = "" }, "trainer: data = '': expected a dataset descriptor name, a descriptor .lua or a data .yaml" },
      { { data = false }, "trainer: data = false: expected a dataset descriptor name, a descriptor .lua or a data .yaml" },
      { { resume = "" }, "trainer: resume = '': expected true, false or a checkpoint path" },
      { { imgsz = 0 }, "trainer: imgsz = 0: expected a multiple of 32 (the network's largest stride), at least 32" },
      { { imgsz = 100000 }, "trainer: imgsz = 100000: expected at most 23168 (the engine's image buffers hold at "
        .. "most 2^31 pixels, and the training mosaic canvas is 2 x imgsz on a side)" },
    }
    for _, c in ipairs(cases) do assert.are.equal(c[2], msg(c[1])) end
  end)

  it("negative control: the defaults and the valid edges pass", function()
    assert.is_true((pcall(Trainer.check_config, base)))
    for _, over in ipairs({
      { lr0 = 1 }, { lr0 = 1e-6 }, { momentum = 0 }, { momentum = 0.999 }, { weight_decay = 0 }, { warmup_epochs = 0 },
      { conf = 0 }, { conf = 1 }, { iou = 0 }, { iou = 1 }, { ["clip.max_norm"] = 1e-3 }, { max_det = 1 },
      { val_period = 0 }, { save_period = 0 }, { val_period = 3 }, { cache = "ram" }, { cache = false },
      { max_reject_fraction = 0 }, { max_reject_fraction = 1 },
      { resume = "runs/x/weights/last.safetensors" }, { optimizer = "adamw" }, { optimizer = "MuSGD" },
      { ap = "ultralytics" }, { imgsz = 23168 }, { imgsz = 32 }, { ["augment.degrees"] = -45 },
    }) do
      local ok, e = check(over)
      assert.is_true(ok, tostring(e))
    end
  end)
end)

describe("settings the C bindings would refuse are named by key, not by binding", function()
  -- a value past what the engine holds (a C int, an f32, a device name)
  -- used to reach lucid.Context, lucid.optim.schedule.*, the loader or the
  -- validator, which named themselves (or printed a wrapped -2147483648)
  local function cfg(over)
    local c = fit_cfg.cfg("/tmp/unused", {})
    for k, v in pairs(over) do
      local a, b = k:match("^([^.]+)%.(.+)$")
      if a then c[a] = c[a] or {}; c[a][b] = v else c[k] = v end
    end
    return c
  end
  local INT = " (the engine counts it in a C int)"

  it("Trainer.check_config: C int bounds, the seed, f32 magnitudes and the device name", function()
    local cases = {
      { { batch = 1e12 }, "trainer: batch = 1000000000000: expected an integer in [1, 2147483647]" .. INT },
      { { epochs = 2 ^ 31 }, "trainer: epochs = 2147483648: expected an integer in [1, 2147483647]" .. INT },
      { { nbs = 1e12 }, "trainer: nbs = 1000000000000: expected an integer in [1, 2147483647]" .. INT },
      { { max_gt = 1e10 }, "trainer: max_gt = 10000000000: expected an integer in [1, 2147483647]" .. INT },
      { { max_det = 1e12 }, "trainer: max_det = 1000000000000: expected an integer in [1, 2147483647]" .. INT },
      { { workers = 1e12 }, "trainer: workers = 1000000000000: expected an integer in [0, 2147483647]" .. INT },
      { { val_period = 1e12 }, "trainer: val_period = 1000000000000: expected an integer in [0, 2147483647]" .. INT },
      { { ["augment.close_mosaic"] = 2 ^ 31 },
        "trainer: augment.close_mosaic = 2147483648: expected an integer in [0, 2147483647]" .. INT },
      { { seed = 1e20 }, "trainer: seed = 1e+20: expected an integer in [0, 9007199254740991] (the largest "
        .. "integer a Lua number holds exactly)" },
      { { ["clip.max_norm"] = 1e300 }, "trainer: clip.max_norm = 1e+300: expected a finite number of magnitude "
        .. "at most 3.4e+38 (the engine computes in f32)" },
      { { ["augment.degrees"] = -1e300 }, "trainer: augment.degrees = -1e+300: expected a finite number of "
        .. "magnitude at most 3.4e+38 (the engine computes in f32)" },
      { { ["loss.pose"] = 1e39 }, "trainer: loss.pose = 1e+39: expected a finite number of magnitude at most "
        .. "3.4e+38 (the engine computes in f32)" },
      { { device = "badvalue" }, "trainer: device = 'badvalue': expected cpu, cuda, cuda:N (N in 0..1024) or auto" },
      { { device = "gpu" }, "trainer: device = 'gpu': expected cpu, cuda, cuda:N (N in 0..1024) or auto" },
      { { device = "cuda:x" }, "trainer: device = 'cuda:x': expected cpu, cuda, cuda:N (N in 0..1024) or auto" },
      { { device = "cuda:2000" }, "trainer: device = 'cuda:2000': expected cpu, cuda, cuda:N (N in 0..1024) or auto" },
      { { device = 0 }, "trainer: device = 0: expected cpu, cuda, cuda:N (N in 0..1024) or auto" },
    }
    for _, c in ipairs(cases) do assert.are.equal(c[2], err_of(Trainer.check_config, cfg(c[1]))) end
    -- negative control: the largest values the engine holds, and every device spelling it takes
    for _, over in ipairs({
      { batch = 2 ^ 31 - 1 }, { epochs = 2 ^ 31 - 1 }, { nbs = 2 ^ 31 - 1 }, { max_det = 2 ^ 31 - 1 },
      { seed = 2 ^ 53 - 1 }, { ["clip.max_norm"] = 3.4e38 }, { ["augment.degrees"] = -3.4e38 },
      { device = "cpu" }, { device = "auto" }, { device = "cuda" }, { device = "cuda:0" }, { device = "cuda:1024" },
      { device = "CPU" }, { device = "Cuda:1" }, { device = "AUTO" }, -- any case, as Ultralytics
    }) do
      assert.has_no.errors(function() Trainer.check_config(cfg(over)) end)
    end
  end)

  it("a device name in another case makes the context Ultralytics' select_device would (device=CPU)", function()
    local tr = Trainer.new(cfg({ device = "CPU" }))
    assert.are.equal("cpu", tr.device)
    assert.are.equal("cuda:3", require("lucid.recipe").device_name("CUDA:3"))
    assert.is_nil(require("lucid.recipe").device_name(nil))
  end)

  it("predict.check_options: max_det within a C int, the device name", function()
    local c = predict.check_options
    assert.are.equal("predict: max_det = 1000000000000: expected an integer in [1, 2147483647] (the engine counts it in a "
      .. "C int)", err_of(c, { max_det = 1e12 }))
    assert.are.equal("predict: device = 'gpu': expected cpu, cuda, cuda:N (N in 0..1024) or auto",
      err_of(c, { device = "gpu" }))
    -- negative control
    assert.has_no.errors(function() c({ max_det = 2 ^ 31 - 1, device = "cuda:1" }) end)
    assert.has_no.errors(function() c({ device = "auto" }) end)
  end)
end)

describe("Trainer.check_last_batch: a 1-image batch at imgsz 32", function()
  it("refuses imgsz 32 when a batch would hold one image, suggesting what works", function()
    assert.are.equal("trainer: imgsz=32 with batch=4 on 137 training images leaves a last batch of 1 image; at "
      .. "imgsz 32 the network's last feature map is 1x1, so batch normalisation in training would see 1 value per "
      .. "channel (PyTorch refuses this too). Use imgsz=64 or more, or batch=5",
      err_of(Trainer.check_last_batch, 32, 4, 137))
    assert.truthy(err_of(Trainer.check_last_batch, 32, 1, 10):find("imgsz=32 with batch=1 gives batches of 1 image", 1, true))
    -- the suggestion itself passes
    assert.has_no.errors(function() Trainer.check_last_batch(32, 5, 137) end)
  end)

  it("negative control: larger maps, or no 1-image batch", function()
    for _, c in ipairs({ { 64, 4, 137 }, { 64, 1, 10 }, { 32, 8, 136 }, { 32, 4, 138 }, { 32, 137, 137 } }) do
      assert.has_no.errors(function() Trainer.check_last_batch(c[1], c[2], c[3]) end)
    end
  end)
end)

describe("predict.check_options and predict.list_sources", function()
  it("names the key and the value", function()
    local c = predict.check_options
    assert.are.equal("predict: conf = -1: expected a confidence threshold in [0, 1]", err_of(c, { conf = -1 }))
    assert.are.equal("predict: iou = 2: expected an IoU threshold in [0, 1]", err_of(c, { iou = 2 }))
    assert.are.equal("predict: max_det = 0: expected an integer >= 1", err_of(c, { max_det = 0 }))
    assert.are.equal("predict: imgsz = 0: expected a multiple of 32 (the network's largest stride), at least 32",
      err_of(c, { imgsz = 0 }))
    assert.are.equal("predict: imgsz = 100000: expected at most 46336 (the letterboxed input is imgsz x imgsz, and "
      .. "the engine's image buffers hold at most 2^31 pixels)", err_of(c, { imgsz = 100000 }))
    assert.are.equal("predict: conf = inf: expected a finite number", err_of(c, { conf = 1 / 0 }))
    assert.are.equal("predict: out = '': expected a non-empty path", err_of(c, { out = "" }))
    assert.are.equal("predict: kpt_threshold = 1.5: expected a confidence threshold in [0, 1]",
      err_of(c, { kpt_threshold = 1.5 }))
    -- negative control
    assert.has_no.errors(function()
      c({ imgsz = 640, conf = 0, iou = 1, max_det = 1, kpt_threshold = 0.5, out = "runs/predict", ema = true })
      c({ imgsz = 46336 })
    end)
  end)

  it("an empty folder is an error naming it (Ultralytics: No images or videos found)", function()
    local d = files.tmpdir()
    assert.are.equal("predict: source = '" .. d .. "': no images found in the folder (supported formats: .jpg, "
      .. ".jpeg, .png)", err_of(predict.list_sources, d))
    files.write(d .. "/notes.txt", "x")
    assert.truthy(err_of(predict.list_sources, { d }):find("source = '" .. d .. "': no images found in the folder",
      1, true))
    -- negative control: one image in it
    files.write(d .. "/a.png", "x")
    assert.are.same({ d .. "/a.png" }, predict.list_sources(d))
    os.execute("rm -rf " .. shell_quote(d))
  end)

  it("a named source is an existing image file (by extension) or a folder with images, else an error "
    .. "naming the key, the value and why", function()
    local d = files.tmpdir()
    files.write(d .. "/notes.txt", "x")
    files.write(d .. "/a.png", "x")
    os.execute("mkdir -p " .. shell_quote(d .. "/sub") .. " " .. shell_quote(d .. "/empty"))
    files.write(d .. "/sub/b.JPG", "x")
    local ls = predict.list_sources
    local FORMATS = "(supported formats: .jpg, .jpeg, .png; or a folder of them)"
    assert.are.equal("predict: source = '" .. d .. "/notes.txt': not an image file " .. FORMATS,
      err_of(ls, d .. "/notes.txt"))
    assert.are.equal("predict: source = 'README.md': not an image file " .. FORMATS, err_of(ls, "README.md"))
    assert.are.equal("predict: source = '" .. d .. "/none.jpg': cannot open it (No such file or directory)",
      err_of(ls, d .. "/none.jpg"))
    -- in a list: the whole value, then the entry at fault
    assert.are.equal("predict: source = '" .. d .. "/a.png," .. d .. "/notes.txt': " .. d .. "/notes.txt: not an "
      .. "image file " .. FORMATS, err_of(ls, { d .. "/a.png", d .. "/notes.txt" }))
    assert.are.equal("predict: source = '" .. d .. "/a.png," .. d .. "/empty': " .. d .. "/empty: no images found "
      .. "in the folder (supported formats: .jpg, .jpeg, .png)", err_of(ls, { d .. "/a.png", d .. "/empty" }))
    -- the caller's key (predict.run's option is sources)
    assert.are.equal("predict: sources = 'README.md': not an image file " .. FORMATS, err_of(ls, "README.md", "sources"))
    -- negative control: an image file (any case of the extension), a folder, a list of both
    assert.are.same({ d .. "/a.png" }, ls(d .. "/a.png"))
    assert.are.same({ d .. "/sub/b.JPG" }, ls(d .. "/sub"))
    assert.are.same({ d .. "/a.png", d .. "/sub/b.JPG" }, ls({ d .. "/a.png", d .. "/sub/" }))
    os.execute("rm -rf " .. shell_quote(d))
  end)
end)

describe("recipe.message and recipe.run", function()
  it("drops the internal location prefixes and keeps the message", function()
    assert.are.equal("lucid argument error: batchnorm2d_silu_forward: expected more than 1 value",
      recipe.message("/path/lua/lucid/nn/prim.lua:181: lucid argument error: batchnorm2d_silu_forward: "
        .. "expected more than 1 value"))
    assert.are.equal("model must be yolo11 or yolov8", recipe.message("recipes/pose_nano.lua:84: model must be yolo11 or yolov8"))
    assert.are.equal("x", recipe.message("a/b.lua:1: ...c/d.lua:22: x"))
    -- negative control: text that only looks alike later in the message is kept
    assert.are.equal("trainer: data a.lua:3: bad", recipe.message("trainer: data a.lua:3: bad"))
    assert.are.equal("no location", recipe.message("no location"))
  end)

  local function run_main(body)
    local script = os.tmpname()
    files.write(script, "package.path = 'lua/?.lua;' .. package.path\n"
      .. "local recipe = require 'lucid.recipe'\n" .. body)
    local out, err, rc = run("luajit " .. shell_quote(script))
    os.remove(script)
    return out, err, rc
  end

  it("prints errors without a location, and Ctrl-C's interrupted! as a clean line with the recipe's note", function()
    local _, err, rc = run_main("recipe.run('t', function() error('boom') end)")
    assert.are.equal(1, rc)
    assert.are.equal("t: boom\n", err)
    _, err, rc = run_main("recipe.interrupt_note = function() return 'kept in runs/x' end\n"
      .. "recipe.run('t', function() error('interrupted!') end)")
    if not rc then os.execute("kill -KILL " .. pid .. " 2>/dev/null") end -- never left running
    assert.are.equal(130, rc)
    assert.are.equal("t: interrupted (Ctrl-C); kept in runs/x\n", err)
    -- negative control: a normal run prints nothing and exits 0
    local out
    out, err, rc = run_main("recipe.run('t', function() print('ok') end)")
    assert.are.same({ "ok\n", "", 0 }, { out, err, rc })
  end)
end)

describe("checkpoint.save's failure is worded by its mode", function()
  it("synchronous: 'write of <path> failed'; async: 'background write of <path> failed'", function()
    local checkpoint = require "lucid.checkpoint"
    local set = require("lucid.nn").materialize(require("lucid.nn").Conv(3, 4, 1))
    local bad = "/nonexistent-lucid-dir/x.safetensors"
    local e = err_of(checkpoint.save, bad, { model = set })
    assert.truthy(e:find("lucid io error: write of " .. bad .. " failed: ", 1, true), e)
    assert.is_nil(e:find("background", 1, true), e)
    -- negative control: the background form keeps its word
    checkpoint.save(bad, { model = set }, { async = true })
    e = err_of(checkpoint.wait)
    assert.truthy(e:find("lucid io error: background write of " .. bad .. " failed: ", 1, true), e)
    -- and a good synchronous save works
    local ok = os.tmpname()
    checkpoint.save(ok, { model = set })
    assert.are.equal(0, checkpoint.load(ok).epochs_completed)
    os.remove(ok)
  end)
end)

describe("bin/lucid -e", function()
  it("has the global `lucid`, as the prompt does; script files still get none", function()
    local out, err, rc = run("bin/lucid -e " .. shell_quote("print(lucid.ones({3}):sum():item(), ...)") .. " a")
    assert.are.same({ "3\ta\n", "", 0 }, { out, err, rc })
    local s = os.tmpname()
    files.write(s, "print(rawget(_G, 'lucid'))\n")
    out, _, rc = run("bin/lucid " .. shell_quote(s))
    os.remove(s)
    assert.are.same({ "nil\n", 0 }, { out, rc })
  end)
end)

describe_data("the recipes on bad input (separate processes)", function()
  local tmp
  setup(function() tmp = files.tmpdir() end)
  teardown(function() if tmp then os.execute("rm -rf " .. shell_quote(tmp)) end end)

  local function pose(args)
    return run("luajit recipes/pose_nano.lua device=cpu workers=1 quiet=true project=" .. shell_quote(tmp) .. " " .. args)
  end

  it("pose_nano: errors up front, named, without a location; empty project refused", function()
    local cases = {
      -- (a missing data file: were project= accepted, the run would still stop before writing /<name>)
      { "epochs=1 imgsz=64 data=" .. tmp .. "/none.yaml project= name=lucid-spec-x",
        "pose_nano: recipe: project: empty value; give one" },
      { "epochs=1 cos_lr=x/y", "pose_nano: recipe: cos_lr: expected true or false, got 'x/y'" },
      { "epochs=1 cache=disk", "pose_nano: recipe: cache=disk is not supported" },
      { "epochs=1 lr0=1e999", "pose_nano: recipe: lr0: expected a finite number, got '1e999'" },
      { "epochs=1 max_det=0", "pose_nano: trainer: max_det = 0: expected an integer >= 1" },
      { "epochs=1 imgsz=100000", "pose_nano: trainer: imgsz = 100000: expected at most 23168" },
      { "epochs=1 model=foo", "pose_nano: model = 'foo': expected yolo11 or yolov8" },
      { "epochs=1 device=foo", "pose_nano: trainer: device = 'foo': expected cpu, cuda, cuda:N (N in 0..1024) or auto" },
      { "epochs=1 optimizer=foo", "pose_nano: trainer: optimizer = 'foo': expected auto, SGD, AdamW or MuSGD" },
      { "epochs=1 scale=q", "pose_nano: model: scale: expected one of" },
      { "resume=" .. tmp .. "/none/last.safetensors", "pose_nano: resume: no checkpoint at " },
    }
    for _, c in ipairs(cases) do
      local out, err, rc = pose(c[1])
      assert.are.equal(1, rc, c[1] .. ": " .. err)
      assert.truthy(err:find(c[2], 1, true), c[1] .. ": " .. err)
      no_location(err)
      assert.is_nil(out:find("Starting training", 1, true), out)
    end
    assert.is_nil(io.open("/lucid-spec-x/results.csv", "rb"))
  end)

  it("pose_nano and predict_pose: values past the engine's types are named by key, never by a binding", function()
    local w = tmp .. "/wb.safetensors"
    require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { 17, 3 } }:save(w)
    local img = predict.list_sources(mini .. "/images/val")[1]
    local cases = {
      { "pose_nano", "epochs=1e12", "pose_nano: trainer: epochs = 1000000000000: expected an integer in [1, 2147483647]" },
      { "pose_nano", "nbs=1e12", "pose_nano: trainer: nbs = 1000000000000: expected an integer in [1, 2147483647]" },
      { "pose_nano", "batch=1e12", "pose_nano: trainer: batch = 1000000000000: expected an integer in [1, 2147483647]" },
      { "pose_nano", "max_gt=1e10", "pose_nano: trainer: max_gt = 10000000000: expected an integer in [1, 2147483647]" },
      { "pose_nano", "max_det=1e12", "pose_nano: trainer: max_det = 1000000000000: expected an integer in [1, 2147483647]" },
      { "pose_nano", "seed=1e20", "pose_nano: trainer: seed = 1e+20: expected an integer in [0, 9007199254740991]" },
      { "pose_nano", "clip.max_norm=1e300", "pose_nano: trainer: clip.max_norm = 1e+300: expected a finite number "
        .. "of magnitude at most" },
      { "pose_nano", "augment.degrees=1e300", "pose_nano: trainer: augment.degrees = 1e+300: expected a finite "
        .. "number of magnitude at most" },
      { "predict_pose", "max_det=1e12", "predict_pose: predict: max_det = 1000000000000: expected an integer in "
        .. "[1, 2147483647]" },
      { "predict_pose", "device=gpu", "predict_pose: predict: device = 'gpu': expected cpu, cuda, cuda:N" },
    }
    for _, c in ipairs(cases) do
      local out, err, rc
      if c[1] == "pose_nano" then
        out, err, rc = pose("epochs=1 imgsz=64 name=bind " .. c[2])
      else
        out, err, rc = run("luajit recipes/predict_pose.lua imgsz=64 weights=" .. shell_quote(w) .. " source="
          .. shell_quote(img) .. " out=" .. shell_quote(tmp .. "/pb") .. " " .. c[2])
      end
      assert.are.equal(1, rc, c[2] .. ": " .. err)
      assert.truthy(err:find(c[3], 1, true), c[2] .. ": " .. err)
      assert.is_nil(err:find("lucid%.[%w_.:]+: "), err) -- no binding name (lucid.Context:, lucid.optim...)
      assert.is_nil(err:find("-2147483648", 1, true), err)
      no_location(err)
      -- refused before anything was built, loaded or written
      assert.is_nil(out:find("device ", 1, true), out)
    end
    assert.is_nil(io.open(tmp .. "/bind/results.csv", "rb"))
    assert.is_nil(io.open(tmp .. "/pb/predictions.json", "rb"))
    -- overfit8's own keys (steps is the trainer's epochs, val_every its val_period) by their names
    for _, c in ipairs({
      { "steps=1e12", "overfit8: steps = 1000000000000: expected an integer in [1, 2147483647]" },
      { "val_every=-1", "overfit8: val_every = -1: expected an integer in [0, 2147483647]" },
      { "device=gpu", "overfit8: trainer: device = 'gpu': expected cpu, cuda, cuda:N" },
    }) do
      local out, err, rc = run("luajit recipes/overfit8.lua device=cpu imgsz=64 " .. c[1])
      assert.are.equal(1, rc, c[1] .. ": " .. err)
      assert.truthy(err:find(c[2], 1, true), c[1] .. ": " .. err)
      assert.are.equal("", out, c[1])
    end
    -- negative control: the largest values the engine holds train and
    -- predict (a max_det past the anchor count keeps what the anchor count
    -- keeps; the validator and decode_nms size their buffers by the smaller)
    local out, err, rc = pose("epochs=1 imgsz=64 name=bindok max_det=2147483647 nbs=2147483647 seed=9007199254740991")
    assert.are.equal(0, rc, err)
    assert.truthy(out:find("final:", 1, true), out)
    out, err, rc = run("luajit recipes/predict_pose.lua device=cpu imgsz=64 max_det=2147483647 weights=" .. shell_quote(w)
      .. " source=" .. shell_quote(img) .. " out=" .. shell_quote(tmp .. "/pbok"))
    assert.are.equal(0, rc, err)
    assert.truthy(io.open(tmp .. "/pbok/predictions.json", "rb"))
  end)

  it("pose_nano imgsz=32: a last batch of 1 image is refused before training; batch=5 trains", function()
    local out, err, rc = pose("epochs=1 imgsz=32 name=i32")
    assert.are.equal(1, rc, err)
    assert.truthy(err:find("pose_nano: trainer: imgsz=32 with batch=4 on 137 training images leaves a last batch "
      .. "of 1 image;", 1, true), err)
    no_location(err)
    assert.is_nil(out:find("epoch 1/1", 1, true))
    -- negative control: the suggested batch trains and validates
    out, err, rc = pose("epochs=1 imgsz=32 batch=5 name=i32b")
    assert.are.equal(0, rc, err)
    assert.truthy(out:find("final:", 1, true), out)
  end)

  it("predict_pose: out= and an empty folder are errors, bad keys are named; the input shape is per image", function()
    local pt = tmp .. "/predict"
    os.execute("mkdir -p " .. shell_quote(pt))
    local m = require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { 17, 3 } }
    local w = pt .. "/w.safetensors"
    m:save(w)
    local img = predict.list_sources(mini .. "/images/val")[1]
    os.execute("mkdir -p " .. shell_quote(pt .. "/empty"))
    local function pred(args)
      return run("luajit recipes/predict_pose.lua device=cpu weights=" .. shell_quote(w) .. " " .. args)
    end
    local cases = {
      -- (missing weights: were out= accepted, the run would still stop before writing /predictions.json)
      { "source=" .. img .. " weights=" .. pt .. "/missing.safetensors out=",
        "predict_pose: recipe: out: empty value; give one (the default is out=runs/predict)" },
      { "source=" .. pt .. "/empty out=" .. pt .. "/p0",
        "predict_pose: predict: source = '" .. pt .. "/empty': no images found in the folder (supported formats: "
        .. ".jpg, .jpeg, .png)" },
      { "source=" .. img .. " conf=-1", "predict_pose: predict: conf = -1: expected a confidence threshold in [0, 1]" },
      { "source=" .. img .. " max_det=0", "predict_pose: predict: max_det = 0: expected an integer >= 1" },
      { "source=" .. img .. " imgsz=0", "predict_pose: predict: imgsz = 0: expected a multiple of 32" },
      { "source=" .. img .. " model=foo", "predict_pose: model = 'foo': expected yolo11 or yolov8" },
      { "source=" .. img .. " weights=" .. pt .. "/missing.safetensors", pt .. "/missing.safetensors" },
    }
    for _, c in ipairs(cases) do
      local _, err, rc = pred(c[1])
      assert.are.equal(1, rc, c[1] .. ": " .. err)
      assert.truthy(err:find(c[2], 1, true), c[1] .. ": " .. err)
      no_location(err)
    end
    assert.are.same({ "empty", "w.safetensors" }, files.listdir(pt)) -- nothing written by the refused runs
    assert.is_nil(io.open("/predictions.json", "rb"))
    -- negative control: a real run, with the letterboxed input shape of each image
    local out, err, rc = pred("source=" .. img .. " imgsz=64 out=" .. shell_quote(pt .. "/pred"))
    assert.are.equal(0, rc, err)
    local g = assert(lucid.image.read(img))
    local W, H = g:size(2), g:size(1)
    local geo = lucid.image.geometry(W, H, 64)
    assert.truthy(out:find(string.format(": %dx%d, input (1, 3, 64, 64) with the image resized to %dx%d, ", W, H,
      geo.uw, geo.uh), 1, true), out)
    assert.truthy(out:find("per image (each letterboxed to shape (1, 3, 64, 64))", 1, true), out)
    assert.truthy(io.open(pt .. "/pred/predictions.json"))
  end)

  it("predict_pose: a source that is no image is refused before the model is built or the weights read", function()
    local pt = tmp .. "/psrc"
    os.execute("mkdir -p " .. shell_quote(pt))
    local w = pt .. "/w.safetensors"
    require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { 17, 3 } }:save(w)
    files.write(pt .. "/notes.txt", "not an image\n")
    local img = predict.list_sources(mini .. "/images/val")[1]
    local FORMATS = "(supported formats: .jpg, .jpeg, .png; or a folder of them)"
    local cases = {
      { "source=README.md", "predict_pose: predict: source = 'README.md': not an image file " .. FORMATS },
      { "source=" .. pt .. "/notes.txt", "predict_pose: predict: source = '" .. pt .. "/notes.txt': not an image "
        .. "file " .. FORMATS },
      { "source=" .. pt .. "/none.jpg", "predict_pose: predict: source = '" .. pt .. "/none.jpg': cannot open it "
        .. "(No such file or directory)" },
      { "source=" .. img .. ",README.md", "predict_pose: predict: source = '" .. img .. ",README.md': README.md: "
        .. "not an image file " .. FORMATS },
      -- a missing weights file is named before anything is built too
      { "source=" .. img .. " weights=" .. pt .. "/none.safetensors", "predict_pose: predict: weights = '" .. pt
        .. "/none.safetensors': cannot open it (No such file or directory)" },
    }
    for _, c in ipairs(cases) do
      local out, err, rc = run("luajit recipes/predict_pose.lua device=cpu imgsz=64 weights=" .. shell_quote(w)
        .. " out=" .. shell_quote(pt .. "/out") .. " " .. c[1])
      assert.are.equal(1, rc, c[1] .. ": " .. err)
      assert.are.equal(c[2] .. "\n", err, c[1])
      no_location(err)
      -- nothing built, loaded or written: no configuration listing, no weights line
      assert.are.equal("", out, c[1])
    end
    assert.is_nil(io.open(pt .. "/out/predictions.json", "rb"))
    -- negative control: the image alone predicts
    local _, err, rc = run("luajit recipes/predict_pose.lua device=cpu imgsz=64 weights=" .. shell_quote(w)
      .. " out=" .. shell_quote(pt .. "/out") .. " source=" .. shell_quote(img))
    assert.are.equal(0, rc, err)
    assert.truthy(io.open(pt .. "/out/predictions.json", "rb"))
  end)

  it("Ctrl-C during training: a clean line naming the kept checkpoints, exit status 130", function()
    local rc, err, last = interrupt_run.run(tmp, "int", "INT", "")
    assert.are.equal(130, rc)
    assert.are.equal("pose_nano: interrupted (Ctrl-C); the checkpoints written so far are kept in " .. tmp
      .. "/int/weights; continue with resume=true project=" .. tmp .. " name=int\n", err)
    -- the kept checkpoint resumes
    local ck = require("lucid.checkpoint").load(last)
    assert.is_true(ck.epochs_completed >= 1)
    ck:close()
  end)

  it("resume with quiet=true saved still prints where the run continues", function()
    local cfg = fit_cfg.cfg(tmp, { name = "q", epochs = 1, quiet = true })
    local tr = Trainer.new(cfg)
    tr:fit(fit_cfg.build(tr))
    local printed, stdout = {}, io.stdout
    local function capture()
      printed = {}
      io.stdout = { write = function(self, ...) for _, v in ipairs({ ... }) do printed[#printed + 1] = v end
        return self end, flush = function() end }
    end
    capture()
    local tr2 = Trainer.new(fit_cfg.cfg(tmp, { name = "q", epochs = 2, quiet = true, resume = true }))
    local ok, e = pcall(tr2.fit, tr2, fit_cfg.build(tr2))
    io.stdout = stdout
    assert.is_true(ok, tostring(e))
    assert.are.equal("Continuing the run in " .. tmp .. "/q (its weights/ and results.csv are updated there)\n",
      table.concat(printed))
    -- negative control: a quiet run that does not resume prints nothing
    capture()
    local tr3 = Trainer.new(fit_cfg.cfg(tmp, { name = "q3", epochs = 1, quiet = true }))
    ok, e = pcall(tr3.fit, tr3, fit_cfg.build(tr3))
    io.stdout = stdout
    assert.is_true(ok, tostring(e))
    assert.are.equal("", table.concat(printed))
  end)

  it("val_period=0 and save_period=0: validation and last.safetensors only at the end", function()
    local function rows(name, over)
      local c = fit_cfg.cfg(tmp, { name = name, epochs = 2 })
      for k, v in pairs(over) do c[k] = v end
      local epochs_seen = {}
      local tr = Trainer.new(c)
      tr:add_callback("on_val_end", function(_, ev) epochs_seen[#epochs_seen + 1] = ev.epoch end)
      tr:fit(fit_cfg.build(tr))
      local lines = {}
      for l in io.lines(tmp .. "/" .. name .. "/results.csv") do lines[#lines + 1] = l end
      return #lines - 1, epochs_seen, lines
    end
    local n, seen, lines = rows("vp0", { val_period = 0, save_period = 0 })
    -- a row every epoch (as Ultralytics); the epoch that was not validated
    -- has its training losses and learning rates, and empty metric cells
    assert.are.equal(2, n)
    assert.are.same({ 1 }, seen)
    local c1 = {}
    for v in (lines[2] .. ","):gmatch("([^,]*),") do c1[#c1 + 1] = v end
    assert.are.equal(23, #c1)
    assert.are.equal("1", c1[1])
    assert.truthy(tonumber(c1[3]), lines[2]) -- train/box_loss
    for i = 8, 20 do assert.are.equal("", c1[i], lines[2]) end -- metrics and val losses
    assert.truthy(tonumber(c1[21]), lines[2]) -- lr/pg0
    assert.truthy(tonumber(lines[3]:match("^2,[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,([^,]*)")), lines[3])
    -- negative control: every epoch
    n, seen = rows("vp1", { val_period = 1, save_period = 1 })
    assert.are.equal(2, n)
    assert.are.same({ 0, 1 }, seen)
  end)
end)

-- ---------------------------------------------------------------------------
-- A fresh user's tryout (items 1-8 of its report): each fix with its negative
-- control. The library-level checks first, then the recipes as processes.

describe("tryout: recipe keys, numbers and names", function()
  local defaults = { epochs = 10, batch = 4, seed = 0, lr0 = 0.01, name = "x", optimizer = "auto" }

  it("an unknown key is matched case-insensitively for 'did you mean'", function()
    assert.are.equal("recipe: unknown key 'EPOCHS' (did you mean 'epochs'?)",
      err_of(recipe.resolve, defaults, { "EPOCHS=1" }))
    assert.are.equal("recipe: unknown key 'Batch' (did you mean 'batch'?)",
      err_of(recipe.resolve, defaults, { "Batch=2" }))
    -- negative control: a key like none of them gets no suggestion; the right key resolves
    assert.are.equal("recipe: unknown key 'zzzzzz'", err_of(recipe.resolve, defaults, { "zzzzzz=1" }))
    assert.are.equal(1, recipe.resolve(defaults, { "epochs=1" }).epochs)
  end)

  it("an integer typed past 2^53 is refused as typed; numbers in messages are printed exactly", function()
    assert.are.equal("recipe: seed: 9007199254740993 is not held exactly by a number (integers are exact up to "
      .. "2^53 = 9007199254740992; it would be read as 9007199254740992)",
      err_of(recipe.resolve, defaults, { "seed=9007199254740993" }))
    -- the trainer's range message prints the integer, not 9.007199254741e+15
    assert.are.equal("trainer: seed = 9007199254740992: expected an integer in [0, 9007199254740991] (the largest "
      .. "integer a Lua number holds exactly)", err_of(Trainer.check_config, fit_cfg.cfg("/tmp/unused", { seed = 2 ^ 53 })))
    assert.are.equal("9007199254740992", recipe.show(2 ^ 53))
    assert.are.equal("1000000000000", recipe.show(1e12))
    assert.are.equal("0.01", recipe.show(0.01))
    assert.are.equal("1e-50", recipe.show(1e-50))
    assert.are.equal("0.30000000000000004", recipe.show(0.1 + 0.2))
    assert.are.equal("'x'", recipe.show("x"))
    -- negative control: the largest exact integer, and long integers that are exact, resolve as typed
    assert.are.equal(9007199254740991, recipe.resolve(defaults, { "seed=9007199254740991" }).seed)
    assert.are.equal(2 ^ 60, recipe.resolve(defaults, { "seed=1152921504606846976" }).seed)
    assert.are.equal(1e20, recipe.resolve(defaults, { "seed=1e20" }).seed)
  end)

  it("trainer: a non-zero value that is 0 or subnormal in f32 is refused by key", function()
    local function e(over) return err_of(Trainer.check_config, fit_cfg.cfg("/tmp/unused", over)) end
    local tail = ": expected 0 or a magnitude of at least 1.1754944e-38 (the smallest normal f32; the engine "
      .. "computes in f32, where this value would be 0 or subnormal)"
    assert.are.equal("trainer: lr0 = 1e-50" .. tail, e({ lr0 = 1e-50 }))
    assert.are.equal("trainer: lrf = 1e-40" .. tail, e({ lrf = 1e-40 }))
    assert.are.equal("trainer: momentum = 1e-45" .. tail, e({ momentum = 1e-45 }))
    assert.are.equal("trainer: weight_decay = 1e-39" .. tail, e({ weight_decay = 1e-39 }))
    assert.are.equal("trainer: warmup_bias_lr = 1e-300" .. tail, e({ warmup_bias_lr = 1e-300 }))
    assert.are.equal("trainer: loss.pose = 1e-320" .. tail, e({ loss = { box = 7.5, cls = 0.5, dfl = 1.5,
      pose = 1e-320, kobj = 1 } }))
    -- negative control: the smallest normal f32, zero where zero is allowed
    for _, over in ipairs({ { lr0 = 2 ^ -126 }, { lr0 = 1.2e-38 }, { weight_decay = 0 }, { momentum = 0 },
      { lrf = 1e-30 }, { warmup_bias_lr = 0 } }) do
      assert.has_no.errors(function() Trainer.check_config(fit_cfg.cfg("/tmp/unused", over)) end)
    end
  end)

  it("optimizer names are case-insensitive (as Ultralytics' build_optimizer); the message says so", function()
    local function e(name) return err_of(Trainer.check_config, fit_cfg.cfg("/tmp/unused", { optimizer = name })) end
    assert.are.equal("trainer: optimizer = 'foo': expected auto, SGD, AdamW or MuSGD (any case, as Ultralytics)",
      e("foo"))
    -- Ultralytics' other names: not implemented here, said as such
    for _, n in ipairs({ "adam", "Adam", "Adamax", "NAdam", "radam", "RMSProp" }) do
      local want = ({ adam = "Adam", radam = "RAdam" })[n] or n
      assert.are.equal("trainer: optimizer = '" .. n .. "': expected auto, SGD, AdamW or MuSGD (any case, as "
        .. "Ultralytics); Ultralytics' " .. want .. " is not implemented in lucid", e(n))
    end
    -- negative control: every spelling of the four, and the name handed to lucid.optim.build
    for n, want in pairs({ auto = "auto", Auto = "auto", AUTO = "auto", sgd = "SGD", SGD = "SGD", Adamw = "AdamW",
                           adamw = "AdamW", ADAMW = "AdamW", musgd = "MuSGD", MuSGD = "MuSGD" }) do
      assert.has_no.errors(function() Trainer.check_config(fit_cfg.cfg("/tmp/unused", { optimizer = n })) end)
      assert.are.equal(want, Trainer.optimizer_name(n), n)
    end
    assert.are.equal("auto", Trainer.optimizer_name(nil))
  end)

  it("recipe.help_requested and recipe.usage: every key, its default and its description", function()
    for _, a in ipairs({ "--help", "-h", "help" }) do
      assert.is_true(recipe.help_requested({ [0] = "r.lua", "epochs=1", a }), a)
    end
    assert.is_false(recipe.help_requested({ [0] = "r.lua", "epochs=1" }))
    assert.is_false(recipe.help_requested({ [0] = "--help", [-1] = "-h" })) -- only the arguments count
    local text = recipe.usage("recipes/r.lua", { epochs = 10, clip = { max_norm = 10.0 }, name = "r", source = "" },
      { epochs = "passes over the training set", ["clip.max_norm"] = "gradient-norm limit" }, "Trains r.")
    assert.truthy(text:find("^usage: luajit recipes/r%.lua %[key=value %.%.%.%]\n"), text)
    assert.truthy(text:find("Trains r.", 1, true), text)
    assert.truthy(text:find("\n  epochs%s+10%s+passes over the training set\n"), text)
    assert.truthy(text:find("\n  clip%.max_norm%s+10%s+gradient%-norm limit\n"), text)
    assert.truthy(text:find("\n  name%s+r\n"), text)        -- no description: key and default only
    assert.truthy(text:find("\n  source%s+%(none%)\n"), text) -- an empty default: none
  end)

  it("trainer: a missing setting is named as missing, with where the defaults are", function()
    local e = err_of(Trainer.check_config, { epochs = 1, imgsz = 64, device = "cpu" })
    assert.are.equal("trainer: missing settings: data, batch, lr0, lrf, momentum, weight_decay, warmup_epochs, "
      .. "warmup_momentum, warmup_bias_lr (Trainer.new takes a resolved recipe table: every key of recipes/"
      .. "pose_nano.lua's defaults, listed with their values by luajit recipes/pose_nano.lua --help)", e)
    e = err_of(Trainer.new, { epochs = 1, imgsz = 64, device = "cpu" })
    assert.truthy(e:find("trainer: missing settings: data, batch, ", 1, true), e)
    assert.is_nil(e:find("nil", 1, true), e)
    -- negative control: the full table passes
    assert.has_no.errors(function() Trainer.check_config(fit_cfg.cfg("/tmp/unused", {})) end)
  end)
end)

describe("tryout: predict sources, folders and weights", function()
  it("predict.split_sources trims the entries of a comma list", function()
    assert.are.same({ "a.jpg", "b.jpg" }, predict.split_sources("a.jpg, b.jpg"))
    assert.are.same({ "a.jpg", "b c.jpg", "d" }, predict.split_sources("  a.jpg ,b c.jpg,\td ,, "))
    assert.are.same({}, predict.split_sources(" , "))
    -- negative control: one path, kept as it is
    assert.are.same({ "dir/x.png" }, predict.split_sources("dir/x.png"))
  end)

  it("predict.check_images: every image's first bytes are checked up front (JPEG or PNG, as the decoder)", function()
    local d = files.tmpdir()
    files.write(d .. "/fake.jpg", "not an image\n")
    files.write(d .. "/empty.png", "")
    files.write(d .. "/ok.jpg", "\255\216\255\224rest")
    files.write(d .. "/ok.png", "\137PNG\r\n\26\nrest")
    assert.are.equal("predict: source = '" .. d .. "': " .. d .. "/fake.jpg: not a JPEG or PNG image (first bytes "
      .. "6e 6f 74 20, 13 bytes)", err_of(predict.check_images, { d .. "/ok.jpg", d .. "/fake.jpg" }, "source", d))
    assert.are.equal("predict: source = '" .. d .. "/empty.png': an empty file (0 bytes), not an image",
      err_of(predict.check_images, { d .. "/empty.png" }, "source", d .. "/empty.png"))
    -- negative control: JPEG and PNG signatures pass, whatever the extension says
    assert.has_no.errors(function() predict.check_images({ d .. "/ok.jpg", d .. "/ok.png" }, "source", d) end)
    os.execute("rm -rf " .. shell_quote(d))
  end)

  it("recipe.check_folder and recipe.make_folder: a file in the way, or a failed mkdir, named by key", function()
    local d = files.tmpdir()
    files.write(d .. "/fake.jpg", "x")
    assert.are.equal("predict: out = '" .. d .. "/fake.jpg': exists and is not a folder (where the output goes)",
      err_of(recipe.check_folder, d .. "/fake.jpg", "out", "predict", "where the output goes"))
    assert.are.equal("trainer: project = '" .. d .. "/fake.jpg/runs': " .. d .. "/fake.jpg exists and is not a folder "
      .. "(the run folders go under it)",
      err_of(recipe.check_folder, d .. "/fake.jpg/runs", "project", "trainer", "the run folders go under it"))
    local e = err_of(recipe.make_folder, "/proc/lucid-spec-x/y", "out", "predict")
    assert.are.equal("predict: out = '/proc/lucid-spec-x/y': cannot create the folder (No such file or directory)", e)
    -- negative control: a new folder (with a space and a quote) is created; an existing one is fine
    local new = d .. "/a b/it's"
    assert.has_no.errors(function() recipe.check_folder(new, "out", "predict") end)
    assert.has_no.errors(function() recipe.make_folder(new, "out", "predict") end)
    assert.are.same({ "it's" }, files.listdir(d .. "/a b"))
    assert.has_no.errors(function() recipe.check_folder(new, "out", "predict") end)
    assert.has_no.errors(function() recipe.make_folder(new, "out", "predict") end)
    os.execute("rm -rf " .. shell_quote(d))
  end)
end)

describe_data("tryout: the recipes as a new user runs them (separate processes)", function()
  local tmp
  setup(function() tmp = files.tmpdir() end)
  teardown(function() if tmp then os.execute("rm -rf " .. shell_quote(tmp)) end end)
  local q = shell_quote

  local function pose(args)
    return run("luajit recipes/pose_nano.lua device=cpu workers=1 quiet=true project=" .. q(tmp) .. " " .. args)
  end

  it("batch larger than the training images: batches of all the images, with a warning (Ultralytics' build_dataloader)", function()
    local n = #assert(data.open(data.load_descriptor("coco_pose_mini"), "train", { imgsz = 64 }))
    local out, err, rc = run("LUCID_PROGRESS=plain luajit recipes/pose_nano.lua device=cpu workers=1 epochs=1 "
      .. "imgsz=64 batch=100000 name=bigbatch project=" .. q(tmp))
    assert.are.equal(0, rc, err .. out)
    assert.truthy(out:find(string.format("WARNING: batch=100000 is more than the %d training images; the loader "
      .. "makes batches of %d", n, n), 1, true), out)
    -- one batch, one step per epoch (not 100000-image buffers)
    assert.truthy(out:find("1/1", 1, true), out)
  end)

  it("--help, -h and help print every key with its default and description, and exit 0", function()
    local keys = {}
    local function walk(t, prefix)
      for k, v in pairs(t) do
        local name = prefix and (prefix .. "." .. k) or k
        if type(v) == "table" and next(v) ~= nil and #v == 0 then walk(v, name) else keys[#keys + 1] = name end
      end
    end
    walk(assert(loadfile("recipes/pose_nano.lua"))("--defaults"))
    for _, a in ipairs({ "--help", "-h", "help", "epochs=3 --help" }) do
      local out, err, rc = run("luajit recipes/pose_nano.lua " .. a)
      assert.are.same({ 0, "" }, { rc, err }, a)
      assert.truthy(out:find("^usage: luajit recipes/pose_nano%.lua %[key=value %.%.%.%]\n"), out)
      for _, k in ipairs(keys) do
        -- key, default, and a description (every pose_nano key has one)
        assert.truthy(out:find("\n  " .. k:gsub("%p", "%%%0") .. " +%S+ +%S[^\n]*\n"), k .. "\n" .. out)
      end
      assert.is_nil(out:find("configuration:", 1, true)) -- nothing run
    end
    assert.truthy(select(1, run("luajit recipes/pose_nano.lua --help")):find("\n  epochs +10 +", 1, false))
    for _, r in ipairs({ "predict_pose", "overfit8" }) do
      local out, err, rc = run("luajit recipes/" .. r .. ".lua --help")
      assert.are.same({ 0, "" }, { rc, err }, r)
      assert.truthy(out:find("^usage: luajit recipes/" .. r .. "%.lua"), out)
    end
    local out = run("luajit recipes/predict_pose.lua -h")
    assert.truthy(out:find("\n  conf +0%.25 +%S"), out)
    -- negative control: a real key=value run is not mistaken for help
    local _, err, rc = pose("epochs=1 imgsz=64 model=foo")
    assert.are.equal(1, rc)
    assert.truthy(err:find("model = 'foo'", 1, true), err)
  end)

  it("pose_nano: keys, seeds, tiny floats and optimizer names as the user typed them", function()
    local cases = {
      { "EPOCHS=1", "pose_nano: recipe: unknown key 'EPOCHS' (did you mean 'epochs'?)" },
      { "seed=9007199254740993", "pose_nano: recipe: seed: 9007199254740993 is not held exactly by a number" },
      { "seed=9007199254740992", "pose_nano: trainer: seed = 9007199254740992: expected an integer in [0, " },
      { "optimizer=SGD lr0=1e-50", "pose_nano: trainer: lr0 = 1e-50: expected 0 or a magnitude of at least " },
      { "optimizer=adam", "pose_nano: trainer: optimizer = 'adam': expected auto, SGD, AdamW or MuSGD (any case, "
        .. "as Ultralytics); Ultralytics' Adam is not implemented in lucid" },
    }
    for _, c in ipairs(cases) do
      local out, err, rc = pose("epochs=1 imgsz=64 name=t5 " .. c[1])
      assert.are.equal(1, rc, c[1] .. ": " .. err)
      assert.truthy(err:find(c[2], 1, true), c[1] .. ": " .. err)
      assert.is_nil(err:find("e+15", 1, true), err)
      assert.are.equal("", out, c[1])
    end
    -- negative control: Auto and Adamw train (the name reaches lucid.optim.build in its canonical spelling)
    for _, n in ipairs({ "Auto", "Adamw" }) do
      local out, err, rc = pose("epochs=1 imgsz=64 quiet=false name=opt" .. n .. " optimizer=" .. n)
      assert.are.equal(0, rc, n .. ": " .. err)
      assert.truthy(out:find("final:", 1, true), out)
      assert.truthy(out:find(n == "Auto" and "'optimizer=auto' found" or "AdamW(lr=", 1, true), out)
    end
  end)

  it("pose_nano: project= that is a file, or cannot be created, is named without mkdir's raw output", function()
    local f = tmp .. "/fake.jpg"
    files.write(f, "x")
    local out, err, rc = pose("epochs=1 imgsz=64 name=pf project=" .. q(f))
    assert.are.equal(1, rc, err)
    assert.are.equal("pose_nano: trainer: project = '" .. f .. "': exists and is not a folder (the run folders go "
      .. "under it)\n", err)
    assert.are.equal("", out) -- refused before anything was built or opened
    files.write(tmp .. "/pfn", "x")
    _, err, rc = pose("epochs=1 imgsz=64 name=pfn")
    assert.are.equal(1, rc, err)
    assert.are.equal("pose_nano: trainer: name = 'pfn': " .. tmp .. "/pfn exists and is not a folder (the run "
      .. "folder under project)\n", err)
    os.execute("mkdir -p " .. q(tmp .. "/pw"))
    files.write(tmp .. "/pw/weights", "x")
    _, err, rc = pose("epochs=1 imgsz=64 name=pw exist_ok=true")
    assert.are.equal(1, rc, err)
    assert.are.equal("pose_nano: trainer: name = 'pw': " .. tmp .. "/pw/weights exists and is not a folder (the "
      .. "run's checkpoints go there)\n", err)
    _, err, rc = pose("epochs=1 imgsz=64 name=px project=/proc/lucid-spec-x")
    assert.are.equal(1, rc, err)
    assert.are.equal("pose_nano: trainer: project = '/proc/lucid-spec-x': cannot create the run folder "
      .. "/proc/lucid-spec-x/px/weights (No such file or directory); check project= and name=\n", err)
    assert.is_nil(err:find("mkdir:", 1, true), err)
  end)

  it("predict_pose: weights of another scale (no partial= hint), trimmed lists, out= and weights= checked up front, "
    .. "plural counts", function()
    local pt = tmp .. "/pp"
    os.execute("mkdir -p " .. q(pt .. "/src"))
    local w = pt .. "/n.safetensors"
    require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { 17, 3 } }:save(w)
    local imgs = predict.list_sources(mini .. "/images/val")
    local function pred(args)
      return run("luajit recipes/predict_pose.lua device=cpu imgsz=64 weights=" .. q(w) .. " " .. args)
    end
    -- 1. weights of scale n with scale=s: the hint names only predict_pose's keys
    local out, err, rc = pred("scale=s source=" .. q(imgs[1]) .. " out=" .. q(pt .. "/o1"))
    assert.are.equal(1, rc, err)
    assert.truthy(err:find("predict_pose: predict: weights = '" .. w .. "' does not fit the model (model=yolo11 "
      .. "scale=s): ", 1, true), err)
    assert.truthy(err:find("; check model= and scale= (they must be those the weights were trained with)\n", 1, true), err)
    assert.is_nil(err:find("partial", 1, true), err)
    local keys = assert(loadfile("recipes/predict_pose.lua"))("--defaults")
    for k in err:gmatch("(%w+)=") do assert.is_not_nil(keys[k], k .. " is not a predict_pose key: " .. err) end
    no_location(err)
    -- 3. out= an existing file, weights= a folder, a fake .jpg in a source folder: before the model is built
    files.write(pt .. "/fake.jpg", "x")
    files.write(pt .. "/src/a.jpg", "not a jpeg")
    local cases = {
      { "source=" .. q(imgs[1]) .. " out=" .. q(pt .. "/fake.jpg"), "predict_pose: predict: out = '" .. pt
        .. "/fake.jpg': exists and is not a folder (the annotated images and predictions.json go into it)\n" },
      { "source=" .. q(imgs[1]) .. " out=" .. q(pt .. "/fake.jpg/sub"), "predict_pose: predict: out = '" .. pt
        .. "/fake.jpg/sub': " .. pt .. "/fake.jpg exists and is not a folder (the annotated images and "
        .. "predictions.json go into it)\n" },
      { "source=" .. q(imgs[1]) .. " out=" .. q(pt .. "/o3") .. " weights=" .. q(pt), "predict_pose: predict: "
        .. "weights = '" .. pt .. "': a folder, not a weights file (a training checkpoint or a model:save file)\n" },
      { "source=" .. q(pt .. "/src") .. " out=" .. q(pt .. "/o4"), "predict_pose: predict: source = '" .. pt
        .. "/src': " .. pt .. "/src/a.jpg: not a JPEG or PNG image (first bytes 6e 6f 74 20, 10 bytes)\n" },
    }
    for _, c in ipairs(cases) do
      out, err, rc = pred(c[1])
      assert.are.equal(1, rc, c[1] .. ": " .. err)
      assert.are.equal(c[2], err, c[1])
      assert.are.equal("", out, c[1]) -- nothing listed, built or loaded
    end
    for _, d in ipairs({ "o3", "o4" }) do assert.is_nil(io.open(pt .. "/" .. d, "rb"), d) end
    -- out= where nothing can be made: a clean line naming out, no raw mkdir output, before the
    -- model is built (recipe.check_writable, ninth session)
    out, err, rc = pred("source=" .. q(imgs[1]) .. " out=/proc/lucid-spec-x")
    assert.are.equal(1, rc, err)
    assert.are.equal("predict_pose: predict: out = '/proc/lucid-spec-x': cannot write in /proc (No such file or "
      .. "directory) (the annotated images and predictions.json go into it)\n", err)
    -- 2 and 8. "a, b": both images (trimmed), plural counts; one image: singular
    out, err, rc = pred("source=" .. q(imgs[1] .. ", " .. imgs[2]) .. " out=" .. q(pt .. "/two"))
    assert.are.equal(0, rc, err)
    assert.truthy(out:find("image 2/2 " .. imgs[2] .. ":", 1, true), out)
    assert.truthy(out:find(("Results saved to " .. pt .. "/two (2 images, "):gsub("%p", "%%%0") .. "%d+ detections? in "),
      out)
    out, err, rc = pred("source=" .. q(" " .. imgs[1] .. " ") .. " out=" .. q(pt .. "/one"))
    assert.are.equal(0, rc, err)
    assert.truthy(out:find("Results saved to " .. pt .. "/one (1 image, ", 1, true), out)
    local n = tonumber(out:match("%(1 image, (%d+) detection"))
    assert.truthy(out:find(string.format("(1 image, %d %s in", n, n == 1 and "detection" or "detections"), 1, true), out)
  end)

  it("predict_pose: a truncated JPEG of a folder is skipped with one stderr line and counted; one such file is an "
    .. "error; imgsz defaults to the checkpoint's training imgsz", function()
    local pt = tmp .. "/mid"
    os.execute("mkdir -p " .. q(pt .. "/src"))
    local imgs = predict.list_sources(mini .. "/images/val")
    local good = files.read(imgs[1])
    files.write(pt .. "/src/a.jpg", good)
    files.write(pt .. "/src/b.jpg", good:sub(1, math.floor(#good / 3))) -- a real JPEG cut short
    local model = require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { 17, 3 } }
    local ck = pt .. "/ck.safetensors"
    require("lucid.checkpoint").save(ck, { model = model, epoch = 0, config = { imgsz = 96 } })
    local function pred(args) return run("luajit recipes/predict_pose.lua device=cpu weights=" .. q(ck) .. " " .. args) end
    -- the folder: b is skipped (one line on stderr, the file and libjpeg's reason), a is predicted at
    -- the checkpoint's imgsz 96
    local out, err, rc = pred("source=" .. q(pt .. "/src") .. " out=" .. q(pt .. "/out"))
    assert.are.equal(0, rc, err)
    assert.are.equal("WARNING: predict: skipping image 2/2 " .. pt .. "/src/b.jpg: corrupt or truncated JPEG: "
      .. "Premature end of JPEG file\n", err)
    assert.truthy(out:find("imgsz 96 (the imgsz the weights were trained at)", 1, true), out)
    assert.truthy(out:find("image 1/2 " .. pt .. "/src/a.jpg: ", 1, true), out)
    assert.truthy(out:find("input (1, 3, 96, 96)", 1, true), out)
    assert.truthy(out:find("; 1 image skipped (could not be read; each named in a WARNING line on stderr)\n", 1, true),
      out)
    assert.are.same({ "a.png", "predictions.json" }, files.listdir(pt .. "/out"))
    -- an explicit imgsz wins
    out, err, rc = pred("imgsz=64 source=" .. q(pt .. "/src") .. " out=" .. q(pt .. "/out64"))
    assert.are.equal(0, rc, err)
    assert.truthy(out:find("imgsz 64 (given)", 1, true), out)
    assert.truthy(out:find("input (1, 3, 64, 64)", 1, true), out)
    -- the truncated file alone: an error naming it, nothing predicted
    out, err, rc = pred("source=" .. q(pt .. "/src/b.jpg") .. " out=" .. q(pt .. "/out1"))
    assert.are.equal(1, rc, err)
    assert.are.equal("predict_pose: predict: cannot read image " .. pt .. "/src/b.jpg: corrupt or truncated JPEG: "
      .. "Premature end of JPEG file\n", err)
    no_location(err)
    assert.are.same({}, files.listdir(pt .. "/out1"))
    -- the help names the default
    out = run("luajit recipes/predict_pose.lua --help")
    assert.truthy(out:find("\n  imgsz +auto +network input side .*auto: the checkpoint's training imgsz, else 640\n"),
      out)
  end)

  it("overfit8 under a datasets folder with a space; its temporary folder is removed, also on error", function()
    local root = tmp .. "/my data"
    local tmpd = tmp .. "/t dir"
    os.execute("mkdir -p " .. q(root) .. " " .. q(tmpd))
    os.execute("ln -s " .. q(mini) .. " " .. q(root .. "/coco-pose-mini"))
    local env = "LUCID_DATASETS=" .. q(root) .. " TMPDIR=" .. q(tmpd) .. " "
    local out, err, rc = run(env .. "luajit recipes/overfit8.lua steps=3 imgsz=64 device=cpu workers=1 name=o8 "
      .. "val_every=0 project=" .. q(tmp))
    -- 3 steps cannot overfit: the check fails, status 3, and says so
    assert.are.equal(3, rc, err)
    assert.truthy(out:find("overfit8 result:", 1, true), out)
    assert.are.equal("overfit8: check failed: box mAP50 >= 0.9 and pose mAP50 >= 0.5 not both reached "
      .. "(exit status 3)\n", err)
    assert.are.same({}, files.listdir(tmpd))
    -- an error after the folder was made (a label file missing): a clean message, the folder removed
    local bad = tmp .. "/bad data/coco-pose-mini"
    os.execute("mkdir -p " .. q(bad .. "/images/train") .. " " .. q(bad .. "/labels/train"))
    for i, img in ipairs(predict.list_sources(mini .. "/images/train")) do
      if i <= 8 then files.write(bad .. "/images/train/" .. img:match("[^/]+$"), files.read(img)) end
    end
    out, err, rc = run("LUCID_DATASETS=" .. q(tmp .. "/bad data") .. " TMPDIR=" .. q(tmpd) .. " luajit "
      .. "recipes/overfit8.lua steps=3 imgsz=64 device=cpu workers=1 name=o8b project=" .. q(tmp))
    assert.are.equal(1, rc, err)
    assert.truthy(err:find("^overfit8: cannot copy "), err)
    assert.is_nil(err:find("cp:", 1, true), err)
    assert.are.same({}, files.listdir(tmpd))
  end)
end)

-- ---------------------------------------------------------------------------
-- The ninth session's tryout: each fix with its negative control.

describe("tryout (ninth session): keys of nested groups", function()
  local defaults = { epochs = 10, augment = { fliplr = 0.5, mosaic = 1.0 }, loss = { box = 7.5 },
    clip = { max_norm = 10.0 }, other = { box = 1 } }

  it("a flat Ultralytics key suggests the one nested key ending in it (fliplr -> augment.fliplr)", function()
    assert.are.equal("recipe: unknown key 'fliplr' (did you mean 'augment.fliplr'?)",
      err_of(recipe.resolve, defaults, { "fliplr=0.2" }))
    assert.are.equal("recipe: unknown key 'MAX_NORM' (did you mean 'clip.max_norm'?)",
      err_of(recipe.resolve, defaults, { "MAX_NORM=3" }))
    -- two nested keys end in it: no single answer, no suggestion
    assert.are.equal("recipe: unknown key 'box'", err_of(recipe.resolve, defaults, { "box=2" }))
    -- negative control: the nested key itself resolves
    assert.are.equal(0.2, recipe.resolve(defaults, { "augment.fliplr=0.2" }).augment.fliplr)
  end)
end)

describe_data("tryout (ninth session): the recipes as processes", function()
  local tmp
  setup(function() tmp = files.tmpdir() end)
  teardown(function() if tmp then os.execute("rm -rf " .. shell_quote(tmp)) end end)
  local q = shell_quote

  it("quiet=true still shows the warnings for rejected files, on stderr", function()
    -- a dataset of 14 train images, one with a label row of 7 columns, 2 val images
    local root = tmp .. "/qset"
    for _, sub in ipairs({ "images/train", "labels/train", "images/val", "labels/val" }) do
      os.execute("mkdir -p " .. q(root .. "/" .. sub))
    end
    local function copy(split, n)
      local k = 0
      for _, img in ipairs(predict.list_sources(mini .. "/images/" .. split)) do
        local stem = img:match("([^/]+)%.%w+$")
        local lab = files.read(mini .. "/labels/" .. split .. "/" .. stem .. ".txt")
        if lab and lab ~= "" then
          files.write(root .. "/images/" .. split .. "/" .. img:match("[^/]+$"), files.read(img))
          files.write(root .. "/labels/" .. split .. "/" .. stem .. ".txt", lab)
          k = k + 1
          if k == n then return stem end
        end
      end
    end
    local last = copy("train", 14)
    copy("val", 2)
    files.write(root .. "/labels/train/" .. last .. ".txt", "0 0.5 0.5 0.2 0.2 0.1 0.1\n")
    files.write(root .. "/data.yaml", "path: " .. root .. "\ntrain: images/train\nval: images/val\n"
      .. "kpt_shape: [17, 3]\nflip_idx: [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]\n"
      .. "names:\n  0: person\n")
    local base = "luajit recipes/pose_nano.lua device=cpu workers=1 epochs=1 imgsz=64 batch=4 data="
      .. q(root .. "/data.yaml") .. " project=" .. q(tmp)
    local out, err, rc = run(base .. " name=quiet quiet=true")
    assert.are.equal(0, rc, err)
    assert.truthy(err:find("WARNING: train: ignoring .*" .. last .. "%.txt:1: 7 columns"), err)
    assert.truthy(err:find("WARNING: train: .*1 rejected"), err)
    assert.is_nil(out:find("WARNING", 1, true), out)
    -- negative control: without quiet the same warnings go to stdout, with the run's other lines
    out, err, rc = run(base .. " name=loud")
    assert.are.equal(0, rc, err)
    assert.truthy(out:find("WARNING: train: ignoring .*" .. last .. "%.txt:1: 7 columns"), out)
    assert.is_nil(err:find("WARNING", 1, true), err)
  end)

  it("predict_pose: out= where no file can be made is refused before the model is built", function()
    local w = tmp .. "/w.safetensors"
    require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { 17, 3 } }:save(w)
    local img = predict.list_sources(mini .. "/images/val")[1]
    -- /proc takes no new file, for root too
    local out, err, rc = run("luajit recipes/predict_pose.lua device=cpu imgsz=64 weights=" .. q(w)
      .. " source=" .. q(img) .. " out=/proc/lucid-spec-out")
    assert.are.equal(1, rc, err)
    assert.truthy(err:find("^predict_pose: predict: out = '/proc/lucid%-spec%-out': cannot write in /proc %("), err)
    assert.is_nil(out:find("device ", 1, true), out) -- nothing built, nothing predicted
    -- negative control: a writable out is made and filled
    out, err, rc = run("luajit recipes/predict_pose.lua device=cpu imgsz=64 weights=" .. q(w)
      .. " source=" .. q(img) .. " out=" .. q(tmp .. "/pred/new"))
    assert.are.equal(0, rc, err)
    assert.truthy(files.read(tmp .. "/pred/new/predictions.json"), "no predictions.json")
  end)
end)
