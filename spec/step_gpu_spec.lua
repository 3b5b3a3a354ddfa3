-- step_gpu_spec.lua — the recorded step with real CUDA graphs (#gpu: make
-- test-gpu on the GPU machine; `make test` lists these as skipped).
--
-- Time budget (about 3 minutes on the H200): a new context pays cuDNN plan
-- creation for every conv shape of every (batch size, image size, dtype) it
-- meets, about half a minute per set. So the whole file runs on ONE context
-- and meets few sets: B = 4 at 128 px in bf16 (also the Trainer fits: batch
-- 4, validation batch 4), n = 1 in bf16 (short batches), fp16 B = 4 and
-- n = 1, f32 B = 4 (the fp32 clip). Models are built once per route and put
-- back to one saved initial state (model:load of a temporary safetensors
-- file) by every test instead of being rebuilt; a test that replaces a
-- parameter tensor builds its own (cheap on a warm context: the plans are
-- the context's). Input-shape drift is tested by max_gt (a loss-plan
-- change, no new conv shapes); the image-size drift is covered on the CPU
-- (spec/step_spec.lua).
--
-- Every comparison is of value bytes (lucid.hash_tensor): parameters,
-- gradients, buffers, optimizer state, EMA, every step's losses.
package.path = "spec/support/?.lua;" .. package.path
local lucid = require "lucid"
local H = require "step_harness"
local RS = require "lucid.recorded_step"
local data = require "lucid.data"
local step_mod = require "lucid.step"

local gpu = lucid.cuda_available and lucid.cuda_available() or (lucid.Context{ device = "auto" }:device():sub(1, 4) == "cuda")
local describe_gpu = gpu and describe or pending

local S, B = 128, 4

-- the shared context, the two models and their initial state (lazily)
local shared = {}
local function ctx_()
  if not shared.ctx then
    shared.ctx = lucid.Context{ device = "cuda", seed = 7 }
    shared.rng = { lucid.rng_state(shared.ctx) }
  end
  return shared.ctx
end
local function init_()
  if not shared.init then
    local m = H.model(ctx_())
    shared.init = os.tmpname() .. ".safetensors"
    m:save(shared.init)
    shared.models = { m, H.model(ctx_()) } -- eager, recorded
  end
  return shared.init
end

-- full collections: a userdata's finalizer runs one cycle after it became
-- unreachable and what it held goes a cycle later (chains need more)
local function collect()
  for _ = 1, 8 do collectgarbage("collect") end
end

-- An eager and a recorded stack on the shared context, from the initial
-- state. o.fresh: new models (a test that damages them).
local function pair(o)
  local init = init_()
  local a = {}
  for k, v in pairs(o or {}) do a[k] = v end
  a.ctx, a.init, a.B, a.S = ctx_(), init, a.B or B, a.S or S
  a.model = not a.fresh and shared.models[1] or nil
  local e = H.stack(a)
  a.recorded, a.trainer = true, a.trainer or {}
  a.model = not a.fresh and shared.models[2] or nil
  local r = H.stack(a)
  return e, r
end

local both = H.both

local function release(...)
  for _, st in ipairs({ ... }) do st.step:release() end
  collect()
end

describe_gpu("recorded step on CUDA #gpu", function()
  it("bf16: recorded == eager bitwise over warm-up, record and replays", function()
    local e, r = pair{ precision = "bf16" }
    for i = 1, 10 do both(e, r, H.batch(B, S, i), i % 2 == 0) end
    local s = r.step:stats()
    assert.are.equal("eager clip", s.route)
    -- fb; on this route the optimizer segment (one fused engine call) runs eagerly
    assert.is_true(s.recorded >= 1 and s.replays >= 6, "recorded " .. s.recorded .. " replays " .. s.replays)
    assert.are.equal(0, s.retirements)
    assert.are.equal(0, s.full_checks)
    print(string.format("\n    contract check %.2f us/step over %d checks (JIT cold at first)", s.contract_check_us,
      s.contract_checks))
    H.same(e, r, "bf16")
    release(e, r)
  end)

  it("the conv weight casts stay out of the FB graph: it keeps the shadows, a replay casts only after a weight write, an edit in place between replays reaches the replay; identical to eager, and to the casts inside the graph", function()
    local lib = require("support.ffi_lib").lib_with("lucid_cuda_wcast_launch_count",
      "unsigned long lucid_cuda_wcast_launch_count(void);")
    assert.is_not_nil(lib, "the cast launch counter (lucid_cuda_wcast_launch_count)")
    local function casts(fn)
      local c0 = tonumber(lib.lucid_cuda_wcast_launch_count())
      fn()
      return tonumber(lib.lucid_cuda_wcast_launch_count()) - c0
    end
    local function edit(st) -- every conv weight, in place (bumps the storage version)
      for _, p in ipairs(st.model.params:list()) do
        if p.name:match("conv%.weight$") then p:data():mul_(0.75) end
      end
    end
    local hashes = {}
    for _, inside in ipairs({ false, true }) do
      local e, r = pair{ precision = "bf16", graph_wcast = inside }
      for i = 1, 4 do both(e, r, H.batch(B, S, i), i == 2) end -- 2 warm-ups, the recording, a replay
      local s = r.step:stats()
      assert.are.equal(1, s.recorded)
      assert.are.equal(not inside, s.fb_keeps_shadows)
      -- no weight written since the last replay: nothing to cast (inside the graph: nothing eager either)
      assert.are.equal(0, casts(function() r.step:run(H.batch(B, S, 5), true) end))
      e.step:run(H.batch(B, S, 5), true)
      -- after that optimizer step: one group cast (plain + gathers) before the replay, or none (inside)
      local n = casts(function() r.step:run(H.batch(B, S, 6), false) end)
      e.step:run(H.batch(B, S, 6), false)
      if inside then assert.are.equal(0, n) else assert.is_true(n >= 1, "casts after the update: " .. n) end
      edit(e); edit(r)
      for i = 7, 9 do both(e, r, H.batch(B, S, i), i == 8) end
      assert.are.equal(0, r.step:stats().retirements)
      assert.is_true(r.step:stats().replays >= 5)
      H.same(e, r, "graph_wcast " .. tostring(inside))
      hashes[#hashes + 1] = lucid.hash_tensor(r.model.params:flat_params())
      release(e, r)
    end
    assert.are.equal(hashes[1], hashes[2])
  end)

  it("the upload on the side copy stream: bf16 recorded == eager with the prefetch on and off; side_copy orders by its events and checks its arguments", function()
    local e, r = pair{ precision = "bf16" }
    assert.is_true(r.step.prefetch)
    for i = 1, 8 do both(e, r, H.batch(B, S, i), i % 2 == 0) end
    H.same(e, r, "prefetch on")
    release(e, r)
    local e2, r2 = pair{ precision = "bf16" }
    r2.step.prefetch = false
    for i = 1, 8 do both(e2, r2, H.batch(B, S, i), i % 2 == 0) end
    H.same(e2, r2, "prefetch off")
    release(e2, r2)
    -- ev_fb inside the FB graph after the loss (fb_event, LUCID_FB_EVENT):
    -- the targets of step k+1 upload during replay k's backward; the bits
    -- stay those of eager, and of one staging set
    for _, n in ipairs({ 2, 1 }) do
      local e3, r3 = pair{ precision = "bf16", fb_event = true, input_stages = n }
      assert.is_true(r3.step:stats().fb_event)
      for i = 1, 8 do both(e3, r3, H.batch(B, S, i), i % 2 == 0) end
      H.same(e3, r3, "fb_event, " .. n .. " staging sets")
      release(e3, r3)
    end
    -- the primitive record_node: recorded inside a graph as an external
    -- event node, a side copy that waits for it runs after the replay
    -- reached it (the chain before it, not the one after)
    do
      local ctx = ctx_()
      local G = lucid.graph
      local src = lucid.ones({ 1048576 }, { ctx = ctx })
      local acc = lucid.zeros({ 1048576 }, { ctx = ctx })
      local ev = G.Event(ctx)
      G.capture_begin(ctx)
      for _ = 1, 20 do acc:add_(src) end
      ev:record_node()
      local g = G.capture_end(ctx)
      g:launch()
      local host = G.pinned({ 1048576 }, "f32", ctx)
      host:fill_(3)
      local done = G.Event(ctx)
      G.side_copy({ src }, { host }, ev, done) -- overwrites what the 20 adds read
      done:wait()
      acc:add_(src)
      assert.are.equal((20 + 3) * 1048576, acc:sum():item())
      g:free(); ev:free(); done:free()
      for _, x in ipairs({ src, acc, host }) do x:free() end
    end
    -- the primitive: a long compute-stream chain, an event after it, a side
    -- copy that waits for it and overwrites what the chain read; the host
    -- values land only after the chain, and the compute stream sees them
    -- after waiting for `done`
    local ctx = ctx_()
    local G = lucid.graph
    local dev = lucid.zeros({ 1048576 }, { ctx = ctx })
    local acc = lucid.zeros({ 1048576 }, { ctx = ctx })
    for _ = 1, 50 do acc:add_(dev) end -- reads dev 50 times: all zeros
    local after, done = G.Event(ctx), G.Event(ctx)
    after:record()
    local host = G.pinned({ 1048576 }, "f32", ctx)
    host:fill_(2)
    G.side_copy({ dev }, { host }, after, done)
    done:wait()
    acc:add_(dev)
    assert.are.equal(2 * 1048576, acc:sum():item()) -- 50 zero adds, then one add of the copy
    assert.has_error(function() G.side_copy({ dev }, { lucid.zeros({ 3 }) }) end)
    assert.has_error(function() G.side_copy({ dev }, {}) end)
    for _, x in ipairs({ dev, acc, host }) do x:free() end
    after:free(); done:free()
  end)

  it("the lanes (parameter gradients, head branches) give the bits of one stream: outputs, two accumulated backwards", function()
    local ctx = ctx_()
    local init = init_()
    local model = H.reset(shared.models[1], init)
    local head = model.head
    local hctx = rawget(head, "_lane_ctx")
    assert.is_not_nil(hctx) -- the context of materialize: the head's branches use its lanes
    local dt = "bf16"
    local x = lucid.rand({ B, 3, S, S }, { ctx = ctx, dtype = dt })
    local out = model:forward(x)
    local g = {}
    for _, k in ipairs({ "boxes", "scores", "kpts" }) do
      g[k] = lucid.rand(out[k]:shape(), { ctx = ctx, dtype = dt }) - 0.5
    end
    local function two(lane)
      rawset(head, "_lane_ctx", lane and hctx or nil)
      model:zero_grad()
      local outs = {}
      for _ = 1, 2 do
        local o = model:forward(x)
        for _, k in ipairs({ "boxes", "scores", "kpts" }) do outs[#outs + 1] = o[k]:clone() end
        if lane then
          step_mod.lane_backward(ctx, model, x, g)
        else
          assert.is_false(ctx:grad_lane())
          model:backward(x, g)
        end
      end
      rawset(head, "_lane_ctx", hctx)
      return model.params:flat_grads():clone(), outs
    end
    local off, oo = two(false)
    local on, oa = two(true)
    assert.is_false(ctx:grad_lane()) -- lane_backward turned it off (joined)
    assert.is_nil(H.differs(off, on))
    for i = 1, #oo do assert.is_nil(H.differs(oo[i], oa[i]), "output " .. i) end
    assert.is_true(off:abs():sum():item() > 0)
    -- a raising backward leaves the lane off
    local other = lucid.rand({ 1, 3, S, S }, { ctx = ctx, dtype = dt })
    assert.has_error(function() step_mod.lane_backward(ctx, model, other, g) end)
    assert.is_false(ctx:grad_lane())
    -- a raising branch closes its fork and joins: the context stays usable
    local lanes = require "lucid.nn.lanes"
    assert.has_error(function()
      lanes.run(ctx, 3, function(b) if b == 2 then error("branch 2 failed", 0) end end)
    end, "branch 2 failed")
    assert.is_true(ctx:branch_fork(1))
    ctx:branch_return()
    ctx:branch_join()
    ctx:synchronize()
    H.reset(model, init)
  end)

  it("gradient accumulation over several recorded backward passes equals eager", function()
    local e, r = pair{ precision = "bf16" }
    for i = 1, 12 do both(e, r, H.batch(B, S, i), i % 4 == 0) end
    for i = 13, 15 do both(e, r, H.batch(B, S, i), false) end -- grads accumulated, not applied
    assert.is_true(r.step.replays >= 6)
    H.same(e, r, "accumulation")
    release(e, r)
  end)

  it("fp16 + loss scaling with an injected overflow skips the same step on both routes", function()
    local e, r = pair{ precision = "fp16" }
    for i = 1, 6 do both(e, r, H.batch(B, S, i), true) end
    assert.is_true(r.step.replays >= 1)
    for _, st in ipairs({ e, r }) do
      -- Inf in one gradient: FB accumulates into it, unscale finds it
      st.model.params:find("model.0.conv.weight"):grad():fill_(1 / 0)
    end
    both(e, r, H.batch(B, S, 7), true)
    assert.is_true(e.opt.block:state().skipped_steps >= 1)
    assert.are.equal(e.opt.block:state().skipped_steps, r.opt.block:state().skipped_steps)
    assert.are.equal(e.scaler:get_scale(), r.scaler:get_scale())
    for i = 8, 10 do both(e, r, H.batch(B, S, i), true) end
    H.same(e, r, "fp16 overflow")
    release(e, r)
  end)

  -- one pair per gradient precision; finite, huge, then non-finite
  -- gradients injected into one layer before a step (non-finite last: with
  -- no loss scaler it poisons the weights on both routes alike)
  for _, prec in ipairs({ "bf16", "fp16", "fp32" }) do
    it("recorded clip == eager clip (capture_gradient_norm), " .. prec .. ": finite, huge and non-finite gradients", function()
      local e, r = pair{ precision = prec, clip = { max_norm = 1.0, capture_gradient_norm = true } }
      assert.are.equal("recorded clip", r.step.route)
      local i = 0
      local function steps(n) for _ = 1, n do i = i + 1; both(e, r, H.batch(B, S, i), true) end end
      steps(4)
      for _, case in ipairs({ { "finite", 1e-3 }, { "huge", 1e30 }, { "non-finite", 0 / 0 } }) do
        for _, st in ipairs({ e, r }) do
          st.model.params:find("model.2.cv1.conv.weight"):grad():fill_(case[2])
        end
        steps(1)
        assert.are.equal(tostring(e.opt:last_norm()), tostring(r.opt:last_norm()), case[1]) -- NaN-safe
        H.same(e, r, prec .. " clip, " .. case[1])
        if case[1] ~= "non-finite" then steps(1) end
      end
      assert.are.equal(0, r.step.retirements)
      assert.is_true(r.step.replays >= 4)
      release(e, r)
    end)
  end

  it("short last batch (n = 1) runs eagerly between replays; identical", function()
    local e, r = pair{ precision = "bf16" }
    for i = 1, 5 do both(e, r, H.batch(B, S, i), true) end
    both(e, r, H.batch(B, S, 50, 1), true)
    for i = 6, 8 do both(e, r, H.batch(B, S, i), true) end
    assert.are.equal(0, r.step.retirements)
    assert.is_true(r.step:stats().buffers_restored > 0)
    H.same(e, r, "short batch")
    release(e, r)
  end)

  -- Every kind of contract change, each on a new step pair (one step object
  -- per fit): it retires exactly once, the step re-records, and both routes
  -- stay identical.
  local kinds = {
    { "freeze a layer", "trainable 1 %-> 0", function(st)
      st.model.params:find("model.0.conv.weight").trainable = false end, false },
    { "change a module's mode", "mode train %-> eval", function(st)
      st.model.layers[2].module.bn:train(false) end, true },
    { "replace a parameter tensor", "tensor replaced", function(st)
      lucid.graph._test_replace_param(st.model.params, "model.10.m.0.attn.qkv.conv.weight") end, false, true },
    { "change the input shape (max_gt 8 -> 16)", "input shapes changed", function(st)
      if st.step.eager == nil then H.reshape(st, S, 16) end end, true, false, 16 },
    { "change the clipping policy", "clipping policy changed", function(st)
      st.step.clip = { max_norm = 1.0 } end, true },
    { "add a hook (announced with bump_version)", "a hook was added", function(st)
      st.model:bump_version("a hook was added") end, true },
  }
  for _, k in ipairs(kinds) do
    local name, reason, change, do_opt, fresh, G = k[1], k[2], k[3], k[4], k[5], k[6]
    it("contract change '" .. name .. "' retires exactly once, re-records, and stays identical to eager", function()
      local e, r = pair{ precision = "bf16", fresh = fresh }
      for i = 1, 4 do both(e, r, H.batch(B, S, i), true) end
      assert.is_truthy(r.step.graphs.fb)
      local rec0 = r.step.recorded
      change(e); change(r)
      -- freezing / replacing change the optimizer's layout: FB-only steps
      for i = 5, 10 do both(e, r, H.batch(B, S, i, nil, G), do_opt) end
      assert.are.equal(1, r.step.retirements)
      assert.matches(reason, r.step.last_retire_reason)
      assert.are_not.equal("eager", r.step.route)
      assert.is_true(r.step.recorded > rec0, "re-recorded")
      assert.is_true(r.step.replays >= 1)
      H.same(e, r, name)
      release(e, r)
    end)
  end

  it("a second drift in the same fit keeps the eager route for the rest of it; identical", function()
    local e, r = pair{ precision = "bf16" }
    for i = 1, 4 do both(e, r, H.batch(B, S, i), true) end
    for _, st in ipairs({ e, r }) do st.model.layers[2].module.bn:train(false) end
    for i = 5, 8 do both(e, r, H.batch(B, S, i), true) end
    assert.are.equal(1, r.step.retirements)
    for _, st in ipairs({ e, r }) do st.model:bump_version("a hook was added") end
    local n = r.step.recorded
    for i = 9, 12 do both(e, r, H.batch(B, S, i), true) end
    assert.are.equal(2, r.step.retirements)
    assert.are.equal("eager", r.step.route)
    assert.matches("second contract drift", r.step:stats().eager_reason)
    assert.are.equal(n, r.step.recorded)
    H.same(e, r, "two drifts")
    release(e, r)
  end)

  pending("contract change 'switch streams': lucid has no API to change a context's compute stream "
    .. "(docs/STEP.md); the context is compared instead")

  it("release returns the memory of the recording; a model copy releases it too (allocator stats)", function()
    local _, r = pair{ precision = "bf16" }
    for i = 1, 6 do r.step:run(H.batch(B, S, i), true) end
    collect()
    r.ctx:synchronize()
    local before = r.ctx:memory_stats().allocated
    assert.are.equal(1, r.model:release_recordings())   -- what a model copy calls
    assert.is_nil(r.step.refs)
    assert.are.equal("model copied", r.step.last_release_reason)
    r.step:release()
    collect()
    r.ctx:synchronize()
    local after = r.ctx:memory_stats().allocated
    assert.is_true(after < before, string.format("allocated %d -> %d", before, after))
    assert.is_false(lucid.graph.capturing(r.ctx))
    assert.is_nil(next(r.model._recordings or {}))
  end)

  for _, when in ipairs({ "warm-up", "recording fb", "recording opt" }) do
    it("a failure during " .. when .. " re-raises the original error, leaves the eager route, keeps nothing recorded", function()
      -- the optimizer segment is recorded on the "recorded clip" route
      local e, r = pair{ precision = "bf16",
        clip = when == "recording opt" and { max_norm = 10.0, capture_gradient_norm = true } or nil }
      local sentinel = setmetatable({}, { __tostring = function() return "injected failure" end })
      local step = r.step
      local orig_fb, orig_b = step._fb, step._optimizer
      local armed = true
      if when == "warm-up" then
        step._fb = function(self, b) if armed then armed = false; error(sentinel) end; return orig_fb(self, b) end
      elseif when == "recording fb" then
        step._fb = function(self, b)
          if lucid.graph.capturing(self.ctx) then error(sentinel) end
          return orig_fb(self, b)
        end
      else
        step._optimizer = function(self)
          if lucid.graph.capturing(self.ctx) then error(sentinel) end
          return orig_b(self)
        end
      end
      local failed_at
      for i = 1, 6 do
        e.step:run(H.batch(B, S, i), true)
        if not failed_at then
          local ok, err = pcall(step.run, step, H.batch(B, S, i), true)
          if not ok then
            assert.are.equal(sentinel, err)             -- unchanged, never masked
            failed_at = i
            assert.are.equal("eager", step.route)
            assert.matches(when:gsub("%-", "%%-") .. " failed", step:stats().eager_reason)
            assert.is_nil(next(step.graphs))
            assert.is_nil(step.refs)
            assert.is_false(lucid.graph.capturing(r.ctx))
          end
        else
          step:run(H.batch(B, S, i), true)              -- carries on eagerly
        end
      end
      assert.is_truthy(failed_at, "the injected failure never fired")
      step._fb, step._optimizer = nil, nil
      assert.is_nil(next(r.model._recordings or {}))
      release(e, r)
    end)
  end

  it("an allocation during capture is refused with 'allocation during graph capture' and the stream is freed", function()
    local ctx = ctx_()
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
    -- batch 4 at 128 and validation batch 4: the conv shapes of the step
    -- tests (137 training images: 34 batches of 4 and a last batch of 1;
    -- nbs 16: gradient accumulation over 4 batches after the warmup)
    local c = { name = "g", project = tmp, exist_ok = true, device = "cuda", seed = 0, workers = 2, quiet = true,
      data = "coco_pose_mini", imgsz = S, batch = B, val_batch = B, cache = true, max_gt = "auto", epochs = 2,
      optimizer = "SGD", lr0 = 0.01, lrf = 0.01, momentum = 0.937, weight_decay = 5e-4, nbs = 16,
      warmup_epochs = 1, warmup_momentum = 0.8, warmup_bias_lr = 0.1, precision = "bf16", clip = { max_norm = 10.0 },
      loss = { box = 7.5, cls = 0.5, dfl = 1.5, pose = 12.0, kobj = 1.0 }, augment = { mosaic = 1.0 },
      conf = 0.001, iou = 0.7, max_det = 300, record_losses = true,
      -- the recorded fits take the pipelined route, as the main job does
      -- (recipes/pose_nano.lua; the one-lane route: the step tests above)
      pipeline = true }
    for k, v in pairs(over or {}) do c[k] = v end
    return c
  end
  -- a Trainer on the shared context (a Trainer makes its own; its plans
  -- would be made again)
  local function trainer(over)
    local tr = Trainer.new(cfg(over))
    tr.ctx = ctx_()
    tr.device = tr.ctx:device()
    return tr
  end
  local fit_models = {}
  local function model(k)
    init_()
    fit_models[k] = fit_models[k] or H.model(ctx_())
    return H.reset(fit_models[k], shared.init)
  end
  local function fit(tr, m)
    lucid.set_rng_state(shared.rng[1], shared.rng[2], tr.ctx) -- same context RNG for every fit
    return tr:fit(m)
  end
  -- every step's losses, the metrics, the weights, the EMA and the optimizer state
  local function same_fit(re, me, rr, mr, what)
    assert.are.equal(#re.losses, #rr.losses)
    local a, b = {}, {}
    for i = 1, #re.losses do a["loss" .. i], b["loss" .. i] = re.losses[i], rr.losses[i] end
    a.params, b.params = me.params:flat_params(), mr.params:flat_params()
    a.ema, b.ema = re.ema:flat(), rr.ema:flat()
    for k, t in pairs(re.optimizer:state_tensors()) do a["opt." .. k] = t end
    for k, t in pairs(rr.optimizer:state_tensors()) do b["opt." .. k] = t end
    H.same_tensors(a, b, what)
    for _, kind in ipairs({ "box", "pose" }) do
      for _, k in ipairs({ "map50", "map50_95" }) do
        assert.are.equal(re.metrics[kind][k], rr.metrics[kind][k], what .. ": " .. kind .. " " .. k)
      end
    end
  end
  local function allocated(ctx)
    collect()
    ctx:synchronize()
    return ctx:memory_stats().allocated
  end

  it("bf16, 2 epochs (accumulation, short last batch, validation between), one Trainer reused for two models, "
    .. "stale callbacks; then a failing fit: identical results, recordings released, memory back", function()
    local tr = trainer{ name = "bf16" }
    local ma, mb = model("a"), model("b")
    -- fit 1, eager, model a; its callbacks are left behind on the Trainer
    local stale = { batch = 0, err = 0 }
    tr:add_callback("on_batch_end", function() stale.batch = stale.batch + 1 end)
    tr:add_callback("on_fit_error", function() stale.err = stale.err + 1 end)
    tr.cfg.record = false
    local re = fit(tr, ma)
    assert.is_true(stale.batch > 0)
    local n1 = stale.batch
    -- fit 2, recorded, model b: the stale callbacks do nothing
    tr.cfg.record = true
    local rec
    tr:add_callback("on_fit_start", function(t) rec = t.state.step end)
    local rr = fit(tr, mb)
    assert.are.equal(n1, stale.batch)
    assert.are.equal("eager clip", rr.step.route)
    if os.getenv("LUCID_PIPELINE") ~= "0" then -- (an A/B setting switches it off)
      assert.is_true(rr.step.pipelined, "the pipelined route")
      assert.is_true(rr.step.lane_b_replays > 0)
    end
    assert.are.equal(0, rr.step.retirements)
    assert.is_true(rr.step.recorded >= 1 and rr.step.replays > 0)
    same_fit(re, ma, rr, mb, "bf16 fit")
    -- released after success: graphs, references, staging, the step's buffers
    assert.is_true(rec.released)
    assert.is_nil(rec.refs)
    assert.is_nil(rec.stage)
    assert.is_nil(next(rec.graphs))
    assert.is_nil(next(mb._recordings or {}))
    assert.is_false(lucid.graph.capturing(tr.ctx))
    re, rr, rec = nil, nil, nil
    -- memory: a second identical recorded fit of model b leaves no more
    -- allocated than the first (the model's own persistent buffers exist
    -- after the first one; anything more is the fit's leak)
    local a2 = allocated(tr.ctx)
    H.reset(mb, shared.init)
    fit(tr, mb)
    local a2b = allocated(tr.ctx)
    assert.is_true(a2b <= a2, string.format("allocated %d after a recorded fit, %d after the same again", a2, a2b))
    -- fit 3 (and 4), recorded, model b again: an error raised by a callback
    -- mid-epoch reaches the caller unchanged; twice, for the memory
    local sentinel = setmetatable({}, { __tostring = function() return "callback error" end })
    local after = {}
    for k = 1, 2 do
      H.reset(mb, shared.init)
      tr:add_callback("on_batch_end", function(_, ev) if ev.epoch == 0 and ev.i == 10 then error(sentinel) end end)
      tr:add_callback("on_fit_start", function(t) rec = t.state.step end)
      local ok, err = pcall(fit, tr, mb)
      assert.is_false(ok)
      assert.are.equal(sentinel, err)                  -- unchanged, never masked by cleanup
      assert.are.equal(0, stale.err)                   -- fit 1's error hook stays silent
      assert.is_true(rec.replays > 0, "the error came before any replay")
      assert.is_true(rec.released and rec.refs == nil and rec.stage == nil and next(rec.graphs) == nil)
      assert.is_nil(next(mb._recordings or {}))       -- released after failure
      assert.is_false(lucid.graph.capturing(tr.ctx))
      rec = nil
      after[k] = allocated(tr.ctx)
    end
    assert.is_true(after[2] <= after[1], string.format("allocated %d after a failed fit, %d after the same again",
      after[1], after[2]))
  end)

  it("fp16 + loss scaling, 2 epochs, an overflow injected mid-epoch: identical results, the same skipped step", function()
    local tr = trainer{ name = "fp16", precision = "fp16" }
    local function inject(m)
      tr:add_callback("on_batch_end", function(_, ev)
        if ev.epoch == 0 and ev.i == 9 then m.params:find("model.0.conv.weight"):grad():fill_(1 / 0) end
      end)
    end
    local ma, mb = model("a"), model("b")
    tr.cfg.record = false
    inject(ma)
    local re = fit(tr, ma)
    tr.cfg.record = true
    inject(mb)
    local rr = fit(tr, mb)
    assert.are.equal(0, rr.step.retirements)
    assert.is_true(rr.step.replays > 0)
    -- the injection (a callback's eager fill on the trainer's context) is
    -- handed off to lane B's next backward
    assert.is_true(os.getenv("LUCID_PIPELINE") == "0" or (rr.step.pipelined and rr.step.lane_b_replays > 0))
    local se, sr = re.optimizer.block:state().skipped_steps, rr.optimizer.block:state().skipped_steps
    assert.is_true(se >= 1, "no step was skipped")
    assert.are.equal(se, sr)
    same_fit(re, ma, rr, mb, "fp16 fit")
  end)
end)
