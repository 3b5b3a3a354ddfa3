-- step_pipeline_gpu_spec.lua — the pipelined recorded route
-- (lua/lucid/step_pipeline.lua, docs/PIPELINE.md) with real CUDA graphs on
-- two contexts (#gpu: make test-gpu). Every comparison is of value bytes
-- against the eager step on the same context: parameters, gradients,
-- BatchNorm buffers, optimizer state, EMA, every step's losses, and the
-- running losses.
--
-- What it covers: accumulation windows that close on either lane (the
-- optimizer joins lane B, then both lanes wait for it), a short batch (n =
-- 1) between replays, a contract change that retires (the twin and lane B
-- are rebuilt with the new modes), the route "recorded clip" (its OPT graph
-- writes the weights behind the storage versions: lane B's shadows are
-- made stale), and fp16 with loss scaling. Time: lane B's context pays its
-- own cuDNN plans (about half a minute per shape set, step_gpu_spec.lua),
-- so the whole file uses one shape set (B = 4, 128 px) per precision.
package.path = "spec/support/?.lua;" .. package.path
local lucid = require "lucid"
local H = require "step_harness"

local gpu = lucid.cuda_available and lucid.cuda_available() or (lucid.Context{ device = "auto" }:device():sub(1, 4) == "cuda")
-- LUCID_PIPELINE=0 (an A/B setting) switches the route off: not run then
local describe_gpu = (gpu and os.getenv("LUCID_PIPELINE") ~= "0") and describe or pending

local S, B = 128, 4

local shared = {}
local function pair(o)
  if not shared.ctx then
    shared.ctx = lucid.Context{ device = "cuda", seed = 7 }
    local m = H.model(shared.ctx)
    shared.init = os.tmpname() .. ".safetensors"
    m:save(shared.init)
  end
  local a = {}
  for k, v in pairs(o or {}) do a[k] = v end
  a.ctx, a.init, a.B, a.S = shared.ctx, shared.init, B, S
  return H.pair(a, { trainer = a.trainer or {}, pipeline = true })
end
local both = H.both

local function running_same(e, r)
  local a, b = e.step:running_losses(), r.step:running_losses()
  for i = 1, 5 do
    assert.are.equal(a[i], b[i], "running loss " .. i .. " differs")
  end
end

local function release(...)
  for _, st in ipairs({ ... }) do st.step:release() end
  for _ = 1, 8 do collectgarbage("collect") end
end

describe_gpu("#gpu pipelined recorded step (two contexts)", function()
  teardown(function() if shared.init then os.remove(shared.init) end end)

  it("bf16: windows closing on either lane, a short batch between replays; bitwise the eager step", function()
    local e, r = pair{ precision = "bf16" }
    assert.matches("pipelined", table.concat(r.logs, "\n"))
    local k = 0
    local function steps(n)
      for _ = 1, n do
        k = k + 1
        -- windows of 4, and one of 3: the optimizer after lane A's step and after lane B's
        both(e, r, H.batch(B, S, k), k % 4 == 0 or k == 11)
      end
    end
    steps(10)
    both(e, r, H.batch(B, S, 90, 1), false) -- n = 1: eager, between the lanes
    steps(9)
    local s = r.step:stats()
    assert.is_true(s.pipelined)
    assert.are.equal(4, s.recorded) -- F and B of each lane
    assert.is_true(s.lane_b_replays >= 5, "lane B replays " .. tostring(s.lane_b_replays))
    assert.are.equal(0, s.retirements)
    H.same(e, r, "pipelined bf16")
    running_same(e, r)
    release(e, r)
  end)

  it("a contract change (a module's mode) retires once, rebuilds lane B with the new mode; identical", function()
    local e, r = pair{ precision = "bf16" }
    for i = 1, 8 do both(e, r, H.batch(B, S, i), i % 4 == 0) end
    local twin0 = r.step.pipe.lane_b and r.step.pipe.lane_b.model
    assert.is_truthy(twin0, "lane B made")
    for _, st in ipairs({ e, r }) do st.model.layers[2].module.bn:train(false) end
    for i = 9, 20 do both(e, r, H.batch(B, S, i), i % 4 == 0) end
    assert.are.equal(1, r.step.retirements)
    assert.matches("mode", r.step.last_retire_reason)
    local twin1 = r.step.pipe.lane_b and r.step.pipe.lane_b.model
    assert.is_truthy(twin1)
    assert.are_not.equal(twin0, twin1)
    assert.is_false(twin1.layers[2].module.bn.training)
    assert.is_true(r.step:stats().lane_b_replays >= 1)
    H.same(e, r, "mode change")
    running_same(e, r)
    release(e, r)
  end)

  it("route 'recorded clip' (OPT graph): lane B recasts its weight shadows after each optimizer step; identical", function()
    local clip = { max_norm = 10.0, capture_gradient_norm = true }
    local e, r = pair{ precision = "bf16", clip = clip }
    assert.are.equal("recorded clip", r.step.route)
    for i = 1, 16 do both(e, r, H.batch(B, S, i), i % 3 == 0) end
    assert.is_truthy(r.step.graphs.opt)
    assert.is_true(r.step:stats().lane_b_replays >= 3)
    H.same(e, r, "recorded clip")
    release(e, r)
  end)

  it("fp16 with loss scaling: identical", function()
    local e, r = pair{ precision = "fp16" }
    for i = 1, 14 do both(e, r, H.batch(B, S, i), i % 4 == 0) end
    assert.is_true(r.step:stats().lane_b_replays >= 3)
    H.same(e, r, "fp16")
    running_same(e, r)
    release(e, r)
  end)
end)
