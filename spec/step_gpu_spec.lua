-- step_gpu_spec.lua — the recorded step with real CUDA graphs (#gpu: make
-- test-gpu on the GPU machine; `make test` lists these as skipped).
-- Every check is self-contained: eager and recorded stacks are built from
-- the same seed and compared element by element (parameters, gradients,
-- buffers, optimizer state, EMA, every step's losses).
package.path = "spec/support/?.lua;" .. package.path
local lucid = require "lucid"
local H = require "step_harness"
local data = require "lucid.data"

local gpu = lucid.cuda_available and lucid.cuda_available() or (lucid.Context{ device = "auto" }:device():sub(1, 4) == "cuda")
local describe_gpu = gpu and describe or pending

local S, B = 128, 4

local function pair(o)
  local a = {}
  for k, v in pairs(o or {}) do a[k] = v end
  a.device = "cuda"
  local e = H.stack(a)
  a.recorded, a.trainer = true, a.trainer or {}
  local r = H.stack(a)
  return e, r
end

local function both(e, r, bt, do_opt)
  e.step:run(bt, do_opt)
  r.step:run(bt, do_opt)
end

describe_gpu("recorded step on CUDA #gpu", function()
  it("bf16: recorded == eager bitwise over warm-up, record and replays", function()
    local e, r = pair{ precision = "bf16", B = B, S = S }
    for i = 1, 10 do both(e, r, H.batch(B, S, i), i % 2 == 0) end
    local s = r.step:stats()
    assert.are.equal("eager clip", s.route)
    assert.is_true(s.recorded >= 2 and s.replays >= 6, "recorded " .. s.recorded .. " replays " .. s.replays)
    assert.are.equal(0, s.retirements)
    print(string.format("contract check %.2f us/step", s.contract_check_us))
    H.same(e, r, "bf16")
    r.step:release(); e.step:release()
  end)

  it("gradient accumulation over several recorded backward passes equals eager", function()
    local e, r = pair{ precision = "bf16", B = B, S = S }
    for i = 1, 12 do both(e, r, H.batch(B, S, i), i % 4 == 0) end
    for i = 13, 15 do both(e, r, H.batch(B, S, i), false) end -- grads accumulated, not applied
    H.same(e, r, "accumulation")
    r.step:release(); e.step:release()
  end)

  it("fp16 + loss scaling with an injected overflow skips the same step on both routes", function()
    local e, r = pair{ precision = "fp16", B = B, S = S }
    for i = 1, 6 do both(e, r, H.batch(B, S, i), true) end
    for _, st in ipairs({ e, r }) do
      -- a huge value in one gradient: FB accumulates into it, unscale finds Inf
      st.model.params:find("model.0.conv.weight"):grad():fill_(1e38)
    end
    both(e, r, H.batch(B, S, 7), true)
    assert.is_true(e.opt.block:state().skipped_steps >= 1)
    assert.are.equal(e.opt.block:state().skipped_steps, r.opt.block:state().skipped_steps)
    assert.are.equal(e.scaler:get_scale(), r.scaler:get_scale())
    for i = 8, 10 do both(e, r, H.batch(B, S, i), true) end
    H.same(e, r, "fp16 overflow")
    r.step:release(); e.step:release()
  end)

  for _, case in ipairs({ { "finite", 1e-3 }, { "huge", 1e30 }, { "non-finite", 0 / 0 } }) do
    it("recorded clip == eager clip, " .. case[1] .. " gradients (capture_gradient_norm)", function()
      local e, r = pair{ precision = "bf16", B = B, S = S, clip = { max_norm = 1.0, capture_gradient_norm = true } }
      assert.are.equal("recorded clip", r.step.route)
      for i = 1, 5 do both(e, r, H.batch(B, S, i), true) end
      for _, st in ipairs({ e, r }) do
        st.model.params:find("model.2.cv1.conv.weight"):grad():fill_(case[2])
      end
      both(e, r, H.batch(B, S, 6), true)
      assert.are.equal(tostring(e.opt:last_norm()), tostring(r.opt:last_norm())) -- NaN-safe
      for i = 7, 8 do both(e, r, H.batch(B, S, i), true) end
      if case[1] ~= "non-finite" then H.same(e, r, "clip " .. case[1]) end
      r.step:release(); e.step:release()
    end)
  end

  it("short last batch (n = 1) runs eagerly between replays; identical", function()
    local e, r = pair{ precision = "bf16", B = B, S = S }
    for i = 1, 5 do both(e, r, H.batch(B, S, i), true) end
    both(e, r, H.batch(B, S, 50, 1), true)
    for i = 6, 8 do both(e, r, H.batch(B, S, i), true) end
    assert.are.equal(0, r.step.retirements)
    H.same(e, r, "short batch")
    r.step:release(); e.step:release()
  end)

  it("contract changes retire exactly once each and stay identical to eager", function()
    local e, r = pair{ precision = "bf16", B = B, S = S }
    for i = 1, 5 do both(e, r, H.batch(B, S, i), true) end
    for _, st in ipairs({ e, r }) do st.model.params:find("model.0.conv.weight").trainable = false end
    for i = 6, 10 do both(e, r, H.batch(B, S, i), false) end
    assert.are.equal(1, r.step.retirements)
    for _, st in ipairs({ e, r }) do st.model.layers[2].module.bn:train(false) end
    for i = 11, 13 do both(e, r, H.batch(B, S, i), false) end
    assert.are.equal(2, r.step.retirements)
    assert.are.equal("eager", r.step.route)
    H.same(e, r, "contract drift")
    r.step:release(); e.step:release()
  end)

  it("input shape change retires (different imgsz batches)", function()
    local _, r = pair{ precision = "bf16", B = B, S = S }
    for i = 1, 5 do r.step:run(H.batch(B, S, i), true) end
    local ok = pcall(r.step.run, r.step, H.batch(B, S + 32, 6), true)
    assert.are.equal(1, r.step.retirements)
    assert.are.equal("input shapes changed", r.step.last_retire_reason)
    r.step:release()
    assert.is_true(ok)
  end)

  it("release returns the memory of the recording (allocator stats)", function()
    local _, r = pair{ precision = "bf16", B = B, S = S }
    for i = 1, 6 do r.step:run(H.batch(B, S, i), true) end
    r.ctx:synchronize()
    local before = r.ctx:memory_stats().allocated
    r.step:release()
    r.model:release_recordings()
    collectgarbage(); collectgarbage()
    r.ctx:synchronize()
    local after = r.ctx:memory_stats().allocated
    assert.is_true(after < before, string.format("allocated %d -> %d", before, after))
    assert.is_false(lucid.graph.capturing(r.ctx))
  end)

  it("an allocation during capture is refused with 'allocation during graph capture' and the stream is freed", function()
    local ctx = lucid.Context{ device = "cuda" }
    lucid.graph.capture_begin(ctx)
    local ok, err = pcall(lucid.zeros, { 1024 }, { ctx = ctx })
    lucid.graph.capture_discard(ctx)
    assert.is_false(ok)
    assert.matches("allocation during graph capture", tostring(err))
    assert.is_false(lucid.graph.capturing(ctx))
    local t = lucid.ones({ 4 }, { ctx = ctx }) -- the stream works again
    assert.are.equal(4, t:sum():item())
  end)
end)

local have_data = data.find_dataset and data.find_dataset("coco-pose-mini") ~= nil
local describe_fit = (gpu and have_data) and describe or pending

describe_fit("Trainer fit, recorded vs eager #gpu", function()
  local Trainer = require "lucid.trainer"
  local tmp = os.tmpname(); os.remove(tmp)
  local function cfg(over)
    local c = { name = "g", project = tmp, exist_ok = true, device = "cuda", seed = 0, workers = 2, quiet = true,
      data = "coco_pose_mini", imgsz = 128, batch = 8, cache = true, max_gt = "auto", epochs = 2, optimizer = "SGD",
      lr0 = 0.01, lrf = 0.01, momentum = 0.937, weight_decay = 5e-4, nbs = 16, warmup_epochs = 1,
      warmup_momentum = 0.8, warmup_bias_lr = 0.1, precision = "bf16", clip = { max_norm = 10.0 },
      loss = { box = 7.5, cls = 0.5, dfl = 1.5, pose = 12.0, kobj = 1.0 }, augment = { mosaic = 1.0 },
      conf = 0.001, iou = 0.7, max_det = 300, record_losses = true }
    for k, v in pairs(over or {}) do c[k] = v end
    return c
  end
  local function build(tr)
    return require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { 17, 3 }, ctx = tr.ctx,
      device = tr.device }
  end

  it("2 epochs (short last batch, validation between): losses, metrics and weights identical", function()
    local te = Trainer.new(cfg{ name = "eager" })
    local me = build(te)
    local re = te:fit(me)
    local tr = Trainer.new(cfg{ name = "rec", record = true })
    local mr = build(tr)
    local rr = tr:fit(mr)
    assert.are.equal("eager clip", rr.step.route)
    assert.are.equal(0, rr.step.retirements)
    assert.is_true(rr.step.replays > 0)
    assert.are.equal(#re.losses, #rr.losses)
    for i = 1, #re.losses do
      assert.are.equal(0, (H.host(re.losses[i]) - H.host(rr.losses[i])):abs():max():item(), "loss " .. i)
    end
    assert.are.equal(re.metrics.pose.map50_95, rr.metrics.pose.map50_95)
    assert.are.equal(0, (H.host(me.params:flat_params()) - H.host(mr.params:flat_params())):abs():max():item())
  end)

  it("an error from a callback mid-epoch reaches the caller unchanged; the recording is released", function()
    local tr = Trainer.new(cfg{ name = "fail", record = true })
    local m = build(tr)
    local sentinel = setmetatable({}, { __tostring = function() return "callback error" end })
    tr:add_callback("on_batch_end", function(_, ev) if ev.epoch == 1 and ev.i == 3 then error(sentinel) end end)
    local ok, err = pcall(tr.fit, tr, m)
    assert.is_false(ok)
    assert.are.equal(sentinel, err)
    assert.is_nil(next(m._recordings or {}))
    assert.is_false(lucid.graph.capturing(tr.ctx))
  end)
end)
