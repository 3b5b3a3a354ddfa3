-- step_pipeline_spec.lua — the pipelined recorded route
-- (lua/lucid/step_pipeline.lua, docs/PIPELINE.md) on the CPU with the fake
-- recorder (graphs are Lua closures, events record their calls): the lanes
-- take the steps in turn, each waits for the other lane's forward before
-- its forward and for the other lane's backward before its backward, and
-- the results are bitwise the eager step's (parameters, gradients, buffers,
-- optimizer state, EMA, every loss, the running losses). The real graphs
-- on two CUDA contexts: spec/step_pipeline_gpu_spec.lua (#gpu).
package.path = "spec/support/?.lua;" .. package.path
local lucid = require "lucid"
local H = require "step_harness"
local RS = require "lucid.recorded_step"

local S, B = 64, 2

local function pair(o)
  return H.pair(o, { trainer = {}, pipeline = (o.pipeline == nil) and true or o.pipeline,
    recorder = o.recorder or RS.fake_recorder() })
end
local both = H.both

-- LUCID_PIPELINE=0 (an A/B setting) switches the route off whatever the
-- step's field says: these cases are then not run
local describe_p = os.getenv("LUCID_PIPELINE") == "0" and pending or describe

describe_p("pipelined recorded step (fake recorder)", function()
  it("alternates the lanes after recording, windows closing on either lane and a short batch; bitwise eager", function()
    local e, r = pair{ B = B, S = S, warmup = 2 }
    assert.matches("pipelined %(two contexts%)", table.concat(r.logs, "\n"))
    for i = 1, 9 do both(e, r, H.batch(B, S, i), i % 4 == 0 or i == 7) end
    both(e, r, H.batch(B, S, 50, 1), true) -- n = 1: eager on lane A, after a join
    for i = 10, 14 do both(e, r, H.batch(B, S, i), i % 4 == 0) end
    local s = r.step:stats()
    assert.is_true(s.pipelined)
    assert.are.equal(4, s.recorded)
    -- lane B: calls 4, 6 eager (its warm-up), 8 recorded, then replays
    assert.is_true(s.lane_b_replays >= 3, tostring(s.lane_b_replays))
    assert.are.equal(15, s.steps)
    assert.is_true(r.step.pipe.lane_b.ctx ~= r.ctx, "lane B has its own context")
    H.same(e, r, "pipelined")
    local a, b = e.step:running_losses(), r.step:running_losses()
    for i = 1, 5 do assert.are.equal(a[i], b[i]) end
    r.step:release(); e.step:release()
    assert.is_nil(r.step.pipe.lane_b, "release drops lane B")
  end)

  it("each lane waits for the other's forward before its forward and for the other's backward before its backward", function()
    local R = RS.fake_recorder()
    local log = {}
    local mk = R.event
    R.event = function(ctx)
      local ev = mk(ctx)
      ev.owner = ctx
      ev.record = function(self) log[#log + 1] = { "record", self } end
      ev.wait = function(self, waiter) log[#log + 1] = { "wait", self, waiter or self.owner } end
      return ev
    end
    local record = R.record
    R.record = function(ctx, fn, precast, continue)
      local g = record(ctx, fn, precast, continue)
      local kind = continue and "b" or "f"
      local launch = g.launch
      g.launch = function() log[#log + 1] = { "launch", kind, ctx }; launch() end
      return g
    end
    local e, r = pair{ B = B, S = S, warmup = 2, recorder = R }
    for i = 1, 12 do both(e, r, H.batch(B, S, i), i % 4 == 0) end
    local st = r.step
    local A, L = st, st.pipe.lane_b
    local lane = { [A.ctx] = A, [L.ctx] = L }
    local checked, launches = 0, 0
    -- for every launch: since that lane's previous launch, a wait of its
    -- context on the other lane's evF (F) or evB (B)
    local since = { [A.ctx] = {}, [L.ctx] = {} }
    for _, x in ipairs(log) do
      if x[1] == "wait" then
        local w = since[x[3]]
        if w then w[x[2]] = true end
      elseif x[1] == "launch" then
        local ctx, kind = x[3], x[2]
        local other = lane[ctx] == A and L or A
        local need = kind == "f" and other.evF or other.evB
        -- lane A's recording call (its F and B) ran before lane B existed
        launches = launches + 1
        if launches > 2 then
          assert.is_true(since[ctx][need] == true, string.format("launch %s on lane %s without the wait", kind,
            lane[ctx] == A and "A" or "B"))
          checked = checked + 1
        end
        since[ctx] = {}
      end
    end
    assert.is_true(checked >= 10, "launches checked: " .. checked)
    -- a caller's edit between steps (a Trainer callback): join before it
    -- (lane A waits for lane B's last backward), handoff after it (lane A's
    -- evF and evB recorded after the edit: lane B's next waits take them)
    local n0 = #log
    st:join()
    local g = st.model.params:find("model.0.conv.weight"):grad()
    g:mul_(0.5); e.model.params:find("model.0.conv.weight"):grad():mul_(0.5)
    st:handoff()
    local recs = {}
    for j = n0 + 1, #log do
      if log[j][1] == "record" then recs[log[j][2]] = j end
    end
    assert.is_truthy(recs[A.evF] and recs[A.evB], "handoff records lane A's evF and evB")
    both(e, r, H.batch(B, S, 13), false)
    H.same(e, r, "ordering")
    r.step:release(); e.step:release()
  end)

  it("a contract change retires once and rebuilds lane B's twin with the model's modes; identical", function()
    local e, r = pair{ B = B, S = S, warmup = 2 }
    for i = 1, 8 do both(e, r, H.batch(B, S, i), i % 4 == 0) end
    local twin0 = r.step.pipe.lane_b.model
    for _, st in ipairs({ e, r }) do st.model.layers[2].module.bn:train(false) end
    for i = 9, 18 do both(e, r, H.batch(B, S, i), i % 4 == 0) end
    assert.are.equal(1, r.step.retirements)
    local twin1 = r.step.pipe.lane_b.model
    assert.are_not.equal(twin0, twin1)
    assert.is_false(twin1.layers[2].module.bn.training)
    H.same(e, r, "retired")
    r.step:release(); e.step:release()
  end)

  it("input shapes changed after recording or on the recording call: lane B follows the new shapes; identical", function()
    for _, at in ipairs({ 7, 3 }) do -- a retirement after recording; the recording call itself
      local e, r = pair{ B = B, S = S, warmup = 2 }
      for i = 1, at - 1 do both(e, r, H.batch(B, S, i), i % 3 == 0) end
      H.reshape(e, S, 16) -- the eager stack follows, as the recorded step does
      for i = at, at + 13 do both(e, r, H.batch(B, S, i, nil, 16), i % 3 == 0) end
      assert.are.equal(16, r.step.pipe.lane_b.eager.max_gt)
      assert.is_true(r.step:stats().lane_b_replays >= 2)
      H.same(e, r, "new max_gt at call " .. at)
      r.step:release(); e.step:release()
    end
  end)

  it("a failure in lane B's warm-up leaves the eager route and re-raises the original error", function()
    local _, r = pair{ B = B, S = S, warmup = 2 }
    for i = 1, 3 do r.step:run(H.batch(B, S, i), false) end -- call 3: lane A records, lane B made
    local sentinel = setmetatable({}, { __tostring = function() return "boom" end })
    r.step.pipe.lane_b.model.forward = function() error(sentinel) end
    local ok, err = pcall(r.step.run, r.step, H.batch(B, S, 4), false)
    assert.is_false(ok)
    assert.are.equal(sentinel, err)
    assert.are.equal("eager", r.step.route)
    assert.matches("lane B warm%-up failed", r.step:stats().eager_reason)
    assert.is_nil(r.step.pipe.lane_b)
    r.step:run(H.batch(B, S, 5), false) -- carries on eagerly
    r.step:release()
  end)

  it("a model whose twin would run other code (an instance override) keeps the one-lane route; identical", function()
    local Leaf = require("lucid.nn.prim").Leaf
    local function plain(self, x) return Leaf.forward(self, x) end
    local e, r = pair{ B = B, S = S, warmup = 2 }
    for _, st in ipairs({ e, r }) do st.model:replace_forward(st.model.layers[1].module.act, plain) end
    for i = 1, 8 do both(e, r, H.batch(B, S, i), i % 4 == 0) end
    assert.is_nil(r.step.pipe)
    assert.matches("instance override", r.step:stats().pipeline_refused)
    assert.matches("pipeline refused: the twin would not run the model's code", table.concat(r.logs, "\n"))
    assert.is_truthy(r.step.graphs.fb) -- the one-lane recording
    H.same(e, r, "override")
    r.step:release(); e.step:release()
  end)

  it("lane B that cannot be made (the twin raises) keeps the one-lane route, logged; identical", function()
    local Model = require "lucid.model"
    local twin = Model.twin
    local e, r = pair{ B = B, S = S, warmup = 2 }
    Model.twin = function() error("cannot build the twin") end
    local ok, err = pcall(function()
      for i = 1, 6 do both(e, r, H.batch(B, S, i), i % 3 == 0) end
    end)
    Model.twin = twin
    assert(ok, err)
    assert.is_nil(r.step.pipe)
    assert.matches("lane B could not be made: .*cannot build the twin", r.step:stats().pipeline_refused)
    assert.are.equal("eager clip", r.step.route)
    assert.is_truthy(r.step.graphs.fb)
    H.same(e, r, "twin refused")
    r.step:release(); e.step:release()
  end)

  it("a failure in lane B's first staging (its warm-up) leaves the eager route with the original error", function()
    local _, r = pair{ B = B, S = S, warmup = 2 }
    for i = 1, 3 do r.step:run(H.batch(B, S, i), false) end
    local P = lucid.graph.pinned
    lucid.graph.pinned = function(shape, dt, ctx)
      if ctx ~= r.ctx then error("pinned alloc failed") end
      return P(shape, dt, ctx)
    end
    local ok, err = pcall(r.step.run, r.step, H.batch(B, S, 4), false)
    lucid.graph.pinned = P
    assert.is_false(ok)
    assert.matches("pinned alloc failed", tostring(err))
    assert.are.equal("eager", r.step.route)
    assert.matches("lane B warm%-up failed", r.step:stats().eager_reason)
    r.step:release()
  end)

  it("a dropped lane B leaves nothing on its context: the loss items of its steps are copied to lane A's", function()
    local e, r = pair{ B = B, S = S, warmup = 2 }
    for i = 1, 10 do both(e, r, H.batch(B, S, i), i % 4 == 0) end
    local old = r.step.pipe.lane_b.ctx
    assert.is_true(old:memory_stats().allocated > 0)
    r.step:retire("test")
    collectgarbage(); collectgarbage()
    assert.are.equal(0, old:memory_stats().allocated, "bytes left on the dropped lane B's context")
    assert.are.equal(10, #r.step.recorded_losses)
    for i = 11, 18 do both(e, r, H.batch(B, S, i), i % 4 == 0) end
    H.same(e, r, "after a dropped lane B") -- the losses of both lane Bs included
    r.step:release(); e.step:release()
  end)

  it("is refused, visibly, where it cannot run; off by default", function()
    local _, r = pair{ B = B, S = S, fb_event = true }
    assert.matches("pipeline refused: LUCID_FB_EVENT=graph", table.concat(r.logs, "\n"))
    assert.is_nil(r.step.pipe)
    assert.are.equal("LUCID_FB_EVENT=graph", r.step:stats().pipeline_refused)
    r.step:release()
    local _, r2 = pair{ B = B, S = S, graph_wcast = true }
    assert.matches("LUCID_GRAPH_WCAST=1", r2.step:stats().pipeline_refused)
    r2.step:release()
    if os.getenv("LUCID_PIPELINE") ~= "1" then
      local _, r3 = pair{ B = B, S = S, pipeline = false }
      assert.is_nil(r3.step.pipe)
      assert.is_false(r3.step:stats().pipelined)
      r3.step:release()
    end
  end)

  it("the join adds lane B's last losses to the running losses in step order (running_losses joins)", function()
    local e, r = pair{ B = B, S = S, warmup = 2 }
    for i = 1, 8 do both(e, r, H.batch(B, S, i), false) end
    -- call 8 ran on lane B: its items wait for a join
    assert.is_true(r.step.pipe.items_pending)
    local a, b = e.step:running_losses(), r.step:running_losses()
    assert.is_false(r.step.pipe.items_pending)
    for i = 1, 5 do assert.are.equal(a[i], b[i]) end
    r.step:release(); e.step:release()
  end)
end)
