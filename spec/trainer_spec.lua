-- The whole training path on the CPU on real images: data -> step ->
-- validation -> checkpoint -> resume, callbacks, failure path, and a
-- Trainer reused for two models. Small image size so CI stays fast.
local lucid = require "lucid"
local Trainer = require "lucid.trainer"
local data = require "lucid.data"
local checkpoint = require "lucid.checkpoint"

local have_data = data.find_dataset("coco-pose-mini") ~= nil
local tmp = os.tmpname()
os.remove(tmp)

local fit_cfg = require "support.fit_cfg"
local function cfg(over) return fit_cfg.cfg(tmp, over) end
local build = fit_cfg.build

-- every tensor of a checkpoint file, as raw bytes by name
local function tensors(path)
  local f = lucid.io.safetensors_open(path)
  local out = {}
  for _, name in ipairs(f:names()) do
    local t = lucid.empty(f:info(name).shape, { dtype = f:info(name).dtype })
    f:load(name, t)
    out[name] = t
  end
  f:close()
  return out
end

local function read_bytes(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function write_bytes(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

local function read_lines(path)
  local t = {}
  for l in io.lines(path) do t[#t + 1] = l end
  return t
end

local describe_data = have_data and describe or pending

describe_data("Trainer on real images (CPU, imgsz 64)", function()
  -- the runs of this file (about half a GB of checkpoints) go when it ends
  teardown(function() os.execute("rm -rf '" .. tmp .. "'") end)
  local full

  it("fits 3 epochs: losses fall, results.csv, last/best checkpoints, metrics in range", function()
    local tr = Trainer.new(cfg{ name = "full" })
    local model = build(tr)
    local seen = {}
    tr:add_callback("on_epoch_end", function(_, ev) seen[#seen + 1] = ev.epoch end)
    full = tr:fit(model)
    assert.are.same({ 0, 1, 2 }, seen)
    assert.are.equal(3, full.epochs)
    local m = full.metrics
    for _, k in ipairs({ "precision", "recall", "map50", "map50_95" }) do
      assert.is_true(m.box[k] >= 0 and m.box[k] <= 1, "box " .. k)
      assert.is_true(m.pose[k] >= 0 and m.pose[k] <= 1, "pose " .. k)
    end
    assert.are.equal(32, m.images)
    assert.are.equal(68, m.box.instances)
    local lines = read_lines(full.save_dir .. "/results.csv")
    assert.are.equal(4, #lines)
    assert.matches("^epoch,time,train/box_loss,train/pose_loss,train/kobj_loss,train/cls_loss,train/dfl_loss,", lines[1])
    local function split(l)
      local t = {}
      for v in (l .. ","):gmatch("([^,]*),") do t[#t + 1] = v end
      return t
    end
    local first, last = split(lines[2]), split(lines[4])
    -- total training loss of epoch 3 below epoch 1
    local s1, s3 = 0, 0
    for c = 3, 7 do s1 = s1 + tonumber(first[c]); s3 = s3 + tonumber(last[c]) end
    assert.is_true(s3 < s1, string.format("loss %g -> %g", s1, s3))
    local f = io.open(full.save_dir .. "/weights/last.safetensors", "rb")
    assert.is_truthy(f); f:close()
    f = io.open(full.save_dir .. "/weights/best.safetensors", "rb")
    assert.is_truthy(f); f:close()
  end)

  it("a run stopped after epoch 2 and resumed ends bitwise equal to the uninterrupted run", function()
    assert.is_truthy(full, "needs the previous test")
    local tr = Trainer.new(cfg{ name = "killed" })
    local model = build(tr)
    tr:add_callback("on_epoch_start", function(_, ev)
      if ev.epoch == 2 then error("simulated kill at epoch 3") end
    end)
    local ok, err = pcall(tr.fit, tr, model)
    assert.is_false(ok)
    assert.matches("simulated kill at epoch 3", err)
    -- the checkpoint left by the kill: epoch 2/3 completed, stored 0-based
    -- as Ultralytics does (epoch = 1) and 1-based as epochs_completed
    local left = checkpoint.load(tmp .. "/killed/weights/last.safetensors")
    assert.are.same({ 1, 2, 3 }, { left.epoch, left.epochs_completed, left.epochs })
    left:close()
    -- a fresh trainer and a fresh model resume from weights/last.safetensors
    -- (printing: the resume line and the progress use the same 1-based numbers)
    local tr2 = Trainer.new(cfg{ name = "killed", resume = true, quiet = false })
    local printed, stdout = {}, io.stdout
    io.stdout = { write = function(self, ...) for _, v in ipairs({ ... }) do printed[#printed + 1] = v end
      return self end, flush = function() end }
    local rok, res = pcall(tr2.fit, tr2, build(tr2))
    io.stdout = stdout
    assert.is_true(rok, tostring(res))
    local text = table.concat(printed)
    assert.truthy(text:find("Resuming training from " .. tmp .. "/killed/weights/last.safetensors: epoch 2/3 "
      .. "completed, continuing with epoch 3/3\nContinuing the run in " .. tmp .. "/killed (its weights/ and "
      .. "results.csv are updated there)\n", 1, true), text)
    assert.truthy(text:find("\nepoch 3/3 "), text)
    assert.falsy(text:find("\nepoch [12]/3 "), text) -- no progress line of a completed epoch
    assert.are.equal(3, #read_lines(res.save_dir .. "/results.csv") - 1)
    local a = tensors(full.save_dir .. "/weights/last.safetensors")
    local b = tensors(res.save_dir .. "/weights/last.safetensors")
    local n = 0
    for name, t in pairs(a) do
      assert.is_truthy(b[name], name)
      local d = (t:to("f64") - b[name]:to("f64")):abs():max():item()
      assert.are.equal(0, d, name)
      n = n + 1
    end
    assert.is_true(n > 1000) -- model, ema and optimizer tensors
  end)

  it("resume refuses a corrupt checkpoint and leaves the good last checkpoint as it was", function()
    assert.is_truthy(full, "needs the first test")
    local last = full.save_dir .. "/weights/last.safetensors"
    local good, csv = read_bytes(last), read_bytes(full.save_dir .. "/results.csv")
    -- one changed byte in the middle of the data section
    local n = 0
    for i = 8, 1, -1 do n = n * 256 + good:byte(i) end
    local k = 8 + n + math.floor((#good - 8 - n) / 2)
    local corrupt = tmp .. "/corrupt.safetensors"
    write_bytes(corrupt, good:sub(1, k) .. string.char((good:byte(k + 1) + 1) % 256) .. good:sub(k + 2))
    -- resume=<that file> into the good run: refused, nothing written
    local tr = Trainer.new(cfg{ name = "full", resume = corrupt, epochs = 4 })
    local ok, err = pcall(tr.fit, tr, build(tr))
    assert.is_false(ok)
    assert.truthy(tostring(err):find(corrupt .. ": checksum mismatch: tensor '", 1, true), tostring(err))
    assert.are.equal(good, read_bytes(last))
    assert.are.equal(csv, read_bytes(full.save_dir .. "/results.csv"))
    -- a run whose own last checkpoint is corrupt: refused, the file is kept
    -- as it is (not overwritten by a fresh run)
    os.execute(string.format("rm -rf '%s/bitrot' && cp -r '%s' '%s/bitrot'", tmp, full.save_dir, tmp))
    write_bytes(tmp .. "/bitrot/weights/last.safetensors", read_bytes(corrupt))
    tr = Trainer.new(cfg{ name = "bitrot", resume = true, epochs = 4 })
    ok, err = pcall(tr.fit, tr, build(tr))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("bitrot/weights/last.safetensors: checksum mismatch", 1, true), tostring(err))
    assert.are.equal(read_bytes(corrupt), read_bytes(tmp .. "/bitrot/weights/last.safetensors"))
    assert.are.equal(csv, read_bytes(tmp .. "/bitrot/results.csv"))
    -- and a finished run says so in the numbers the log uses
    tr = Trainer.new(cfg{ name = "full", resume = true, epochs = 3 })
    ok, err = pcall(tr.fit, tr, build(tr))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("has completed 3 epochs and epochs=3; nothing to resume", 1, true), tostring(err))
    assert.are.equal(good, read_bytes(last))
  end)

  it("an error raised in a callback reaches the caller unchanged and keeps the last checkpoint", function()
    -- runs/fails is taken: this run gets fails2 (Ultralytics increment_path)
    os.execute("mkdir -p '" .. tmp .. "/fails'")
    write_bytes(tmp .. "/fails/results.csv", "another run\n")
    local tr = Trainer.new(cfg{ name = "fails", epochs = 2, exist_ok = false })
    local model = build(tr)
    local sentinel = setmetatable({}, { __tostring = function() return "my error object" end })
    local err_seen
    tr:add_callback("on_batch_end", function(_, ev)
      if ev.epoch == 1 and ev.i == 3 then error(sentinel) end
    end)
    tr:add_callback("on_fit_error", function(_, ev) err_seen = ev.error end)
    local ok, err = pcall(tr.fit, tr, model)
    assert.is_false(ok)
    assert.are.equal(sentinel, err)
    assert.are.equal(sentinel, err_seen)
    local lines = read_lines(tmp .. "/fails2/results.csv")
    assert.are.equal(2, #lines) -- header + epoch 1
    assert.is_truthy(tensors(tmp .. "/fails2/weights/last.safetensors")["model.0.conv.weight"])
  end)

  it("a copied checkpoint resumes into the run folder its settings name, and the trainer says which", function()
    local src = tmp .. "/fails2/weights/last.safetensors"
    assert.is_truthy(io.open(src, "rb"), "needs the previous test")
    -- the settings saved in it name the folder the run wrote, not the name asked for
    local ck = checkpoint.load(src)
    assert.are.equal("fails2", ck.config.name)
    ck:close()
    os.execute("mkdir -p '" .. tmp .. "/elsewhere'")
    local copy = tmp .. "/elsewhere/copy.safetensors"
    write_bytes(copy, read_bytes(src))
    -- what the recipes do: the saved settings, then the allowed command-line overrides
    local recipe = require "lucid.recipe"
    local rcfg = recipe.apply_resume(cfg{ resume = copy }, cfg{}, { "quiet=false" }, checkpoint.load)
    assert.are.equal("fails2", rcfg.name)
    local tr = Trainer.new(rcfg)
    local printed, stdout = {}, io.stdout
    io.stdout = { write = function(self, ...) for _, v in ipairs({ ... }) do printed[#printed + 1] = v end
      return self end, flush = function() end }
    local ok, res = pcall(tr.fit, tr, build(tr))
    io.stdout = stdout
    assert.is_true(ok, tostring(res))
    local text = table.concat(printed)
    assert.truthy(text:find("\nContinuing the run in " .. tmp .. "/fails2 (its weights/ and results.csv are updated "
      .. "there; the checkpoint " .. copy .. " lies outside it: a resumed run continues in the folder its project= "
      .. "and name= settings give)\n", 1, true), text)
    assert.are.equal(tmp .. "/fails2", res.save_dir)
    assert.are.equal(3, #read_lines(tmp .. "/fails2/results.csv")) -- header + epochs 1 and 2
    -- nothing written beside the copy, nor into the other run's folder
    local p = io.popen("ls -A '" .. tmp .. "/elsewhere'")
    assert.are.equal("copy.safetensors\n", p:read("*a"))
    p:close()
    assert.are.equal("another run\n", read_bytes(tmp .. "/fails/results.csv"))
  end)

  it("reuses one Trainer for two models; a callback left for the first is not called for the second", function()
    local tr = Trainer.new(cfg{ name = "reuse", epochs = 1 })
    local calls = 0
    tr:add_callback("on_epoch_end", function() calls = calls + 1 end)
    tr:fit(build(tr))
    assert.are.equal(1, calls)
    local r2 = tr:fit(require("lucid.models.yolov8_pose"){ scale = "n", nc = 1, kpt_shape = { 17, 3 },
      ctx = tr.ctx, device = tr.device })
    assert.are.equal(1, calls) -- stale callback not called
    assert.are.equal(1, r2.epochs)
  end)
end)

describe("Trainer.GC_EVERY (LUCID_GC_EVERY)", function()
  -- read once when lucid.trainer loads: a child process per value
  local function gc_every(v)
    local env = v and ("LUCID_GC_EVERY='" .. v .. "' ") or ""
    local p = assert(io.popen(env .. "luajit -e 'package.path=\"lua/?.lua;lua/?/init.lua;\"..package.path;"
      .. " package.cpath=\"./?.so;\"..package.cpath; io.write(require(\"lucid.trainer\").GC_EVERY)' 2>&1"))
    local out = p:read("*a")
    p:close()
    return out
  end
  it("is 8 by default, a whole number >= 1 from the environment, 8 for anything else", function()
    assert.are.equal("8", gc_every(nil))
    assert.are.equal("64", gc_every("64"))
    assert.are.equal("1", gc_every("1"))
    for _, bad in ipairs({ "0", "-3", "2.5", "x", "" }) do assert.are.equal("8", gc_every(bad), bad) end
  end)
end)
