-- input_spec.lua — lucid.input_prepare (engine/data/input.h) from Lua, on
-- the CPU: x = images / 255 in the activation dtype, argument errors, and
-- the device-HSV contract on real loader batches: a batch made with
-- hsv_on_cpu = false and passed through input_prepare with its gains equals
-- the batch made with hsv_on_cpu = true and a plain /255 conversion, bit for
-- bit; and a training step fed each kind of batch (device_hsv false / true)
-- ends in the same state, eager on the CPU and, #gpu, eager (CPU HSV)
-- against recorded (device HSV) on CUDA. (spec/c/test_input.c checks the
-- CUDA kernel itself.)
package.path = "spec/support/?.lua;" .. package.path
local lucid = require "lucid"
local data = require "lucid.data"
local H = require "step_harness"

local gpu = lucid.cuda_available and lucid.cuda_available()
  or (lucid.Context{ device = "auto" }:device():sub(1, 4) == "cuda")

local function same(a, b)
  return (a:double() - b:double()):abs():max():item() == 0
end

-- the plain conversion: u8 -> f32 (exact), / 255 in f32, one rounding to dt
local function plain(images, dt)
  local x = images:to("f32"):div(255)
  return dt == "f32" and x or x:to(dt)
end

describe("lucid.input_prepare", function()
  it("writes images / 255 in f32, bf16, f16 and f64", function()
    local rows = {}
    for c = 1, 3 do
      rows[c] = {}
      for y = 1, 16 do
        rows[c][y] = {}
        for x = 1, 16 do rows[c][y][x] = ((c - 1) * 256 + (y - 1) * 16 + x - 1) * 7 % 256 end
      end
    end
    local im = lucid.tensor({ rows }, { dtype = "u8" })
    for _, dt in ipairs({ "f32", "bf16", "f16", "f64" }) do
      local x = lucid.empty({ 1, 3, 16, 16 }, { dtype = dt })
      assert.are.equal(x, lucid.input_prepare(x, im))
      local want = dt == "f64" and im:to("f64"):div(255) or plain(im, dt)
      assert.is_true(same(x, want), dt)
    end
  end)

  it("zero gains leave an image as it is; others change it", function()
    local im = lucid.rand({ 2, 3, 8, 8 }):mul(255):to("u8")
    local g = lucid.tensor({ { 0, 0, 0 }, { 0.01, 0.5, -0.3 } })
    local x = lucid.empty({ 2, 3, 8, 8 })
    lucid.input_prepare(x, im, g)
    local want = plain(im, "f32")
    assert.is_true(same(x:narrow(1, 1, 1), want:narrow(1, 1, 1)))
    assert.is_false(same(x:narrow(1, 2, 1), want:narrow(1, 2, 1)))
  end)

  it("rejects bad arguments by name", function()
    local im = lucid.zeros({ 2, 3, 8, 8 }, { dtype = "u8" })
    local x = lucid.empty({ 2, 3, 8, 8 })
    assert.has_error(function() lucid.input_prepare(lucid.empty({ 2, 3, 8, 4 }), im) end)
    assert.has_error(function() lucid.input_prepare(x, im:to("f32")) end)
    assert.has_error(function() lucid.input_prepare(x, im, lucid.zeros({ 2, 2 })) end)
    assert.has_error(function() lucid.input_prepare(lucid.empty({ 2, 3, 8, 8 }, { dtype = "i32" }), im) end)
    assert.has_error(function() lucid.input_prepare(x, "images") end)
    local ok, err = pcall(lucid.input_prepare, x, im, lucid.zeros({ 3, 3 }))
    assert.is_false(ok)
    assert.truthy(tostring(err):find("input_prepare", 1, true))
  end)
end)

local mini = data.find_dataset("coco-pose-mini")

describe("device HSV on loader batches", function()
  if not mini then
    it("needs the mini dataset", function()
      pending("coco-pose-mini not found ($LUCID_DATASETS, ../shared/datasets, datasets)")
    end)
    return
  end
  local desc = data.load_descriptor("coco_pose_mini")

  it("hsv_on_cpu=false + input_prepare(gains) == hsv_on_cpu=true + /255, bitwise", function()
    local ds = assert(data.open(desc, "train", { imgsz = 320 }))
    local ld = data.loader(ds, { batch = 4, threads = 2, max_gt = 64, seed = 5 })
    local base = data.schedule({}, 10)(0)
    local function run(epoch, on_cpu, fn)
      local aug = {}
      for k, v in pairs(base) do aug[k] = v end
      aug.hsv_on_cpu = on_cpu
      local k = 0
      for b in data.batches(ld, epoch, aug) do
        k = k + 1
        if k > 4 then break end
        fn(k, b)
      end
    end
    for _, epoch in ipairs({ 0, 3 }) do
      local ref = {}
      run(epoch, true, function(k, b)
        ref[k] = { bf16 = plain(b.images, "bf16"), f32 = plain(b.images, "f32"), raw = b.images:clone(),
                   hsv = b.hsv:clone() }
      end)
      local n = 0
      run(epoch, false, function(k, b)
        n = n + 1
        assert.is_true(same(b.hsv, ref[k].hsv), "the same gains are drawn")
        assert.is_true(b.hsv:abs():max():item() > 0)
        assert.is_false(same(b.images, ref[k].raw), "HSV was left to the device")
        for _, dt in ipairs({ "bf16", "f32" }) do
          local x = lucid.empty(b.images:shape(), { dtype = dt })
          lucid.input_prepare(x, b.images, b.hsv)
          assert.is_true(same(x, ref[k][dt]), string.format("epoch %d batch %d %s", epoch, k, dt))
        end
      end)
      assert.are.equal(4, n)
    end
    ld:free()
    ds:free()
  end)

  -- Loader batches at imgsz 64, batch 2, max_gt H.G (overflow truncates):
  -- pairs (CPU HSV, device HSV) of the same samples.
  local function batch_pairs(epoch, count)
    local ds = assert(data.open(desc, "train", { imgsz = 64 }))
    local out = {}
    local base = data.schedule({}, 10)(0)
    for _, on_cpu in ipairs({ true, false }) do
      local ld = data.loader(ds, { batch = 2, threads = 2, max_gt = H.G, seed = 9 })
      local aug = {}
      for k, v in pairs(base) do aug[k] = v end
      aug.hsv_on_cpu = on_cpu
      local k = 0
      for b in data.batches(ld, epoch, aug) do
        k = k + 1
        if k > count then break end
        local c = { n = b.n, overflow = 0, max_count = b.max_count }
        for _, f in ipairs({ "images", "cls", "boxes", "kpts", "mask", "hsv" }) do c[f] = b[f]:clone() end
        out[k] = out[k] or {}
        out[k][on_cpu and 1 or 2] = c
      end
      ld:free()
    end
    ds:free()
    return out
  end

  it("a CPU step on device-HSV batches (device_hsv = true) equals one on CPU-HSV batches", function()
    local pairs_ = batch_pairs(1, 2)
    local a = H.stack{ B = 2, S = 64 }
    local b = H.stack{ B = 2, S = 64 }
    b.step.device_hsv = true
    for i, p in ipairs(pairs_) do
      a.step:run(p[1], i == 2)
      b.step:run(p[2], i == 2)
    end
    H.same(a, b, "device_hsv on the cpu")
    a.step:release(); b.step:release()
  end)

  local it_gpu = gpu and it or pending
  it_gpu("#gpu CUDA bf16: recorded step with device HSV == eager step on CPU-HSV batches, bitwise", function()
    local pairs_ = batch_pairs(2, 8)
    local e = H.stack{ device = "cuda", precision = "bf16", B = 2, S = 64 }
    local r = H.stack{ device = "cuda", precision = "bf16", B = 2, S = 64, recorded = true, trainer = {} }
    r.step.eager.device_hsv = true -- before the first call: the staging gets the gains
    for i, p in ipairs(pairs_) do
      e.step:run(p[1], i % 2 == 0)
      r.step:run(p[2], i % 2 == 0)
    end
    local s = r.step:stats()
    assert.is_true(s.replays >= 3, "replays " .. tostring(s.replays))
    H.same(e, r, "device HSV recorded vs CPU HSV eager")
    r.step:release(); e.step:release()
  end)
end)
