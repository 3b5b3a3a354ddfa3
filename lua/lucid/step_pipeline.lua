--[[
lucid.step_pipeline — the pipelined recorded route of lucid.Step
(docs/PIPELINE.md; lucid.Step{pipeline = true} or LUCID_PIPELINE=1): micro-
step k+1's forward runs beside micro-step k's backward.

Within an accumulation window the weights do not move, so the forward of
step k+1 depends on step k only through the BatchNorm running statistics
(the forwards stay in order), not on its backward. Two lanes run the steps
in turn, each on its own lucid context (its own stream, scratch, arenas,
branch lanes, cuBLAS/cuDNN handles):
  lane A  the step object itself: the model, self.ctx, the eager step's
          buffers, staging and events (the even recorded steps);
  lane B  a table whose reads fall back to the step object, with its own
          ctx (a second context of the same device), the model's twin
          (Model:twin: its own activations, saved statistics, weight
          shadows and column caches; the SAME parameters, BatchNorm buffers
          and gradients), an eager step for its buffers and loss plan,
          staging and events (the odd recorded steps).
Each lane records two graphs: F (model forward) and B (loss forward and
backward, model backward, running losses on lane A), the latter with
LUCID_CAPTURE_CONTINUE so the filter gradients reuse F's im2col columns.
One step on lane X (the other lane Y):
  X: staging -> device (side copies, as the one-lane route), input kernel
  X waits for Y's evF   (F_k+1 after F_k: the running statistics; after an
                         optimizer step, lane A re-records evF after it)
  X: weight shadows cast (the ones written since), F, record X.evF
  X waits for the targets' upload, and for Y's evB (B_k+1 after B_k: the
     gradients accumulate in order; after an optimizer step: zero_grad)
  lane A only: running losses += lane B's last items (the sum in step order)
  X: B, record X.evB and X.ev_fb (the targets may be replaced)
  at an optimizer step: lane A waits for lane B (join), the optimizer
  segment on lane A, then A.evF and A.evB recorded after it.
Every wait is a stream wait queued between graph launches (its record is
the one before the call: cudaStreamWaitEvent), so the host may run ahead.
Each buffer sees the same kernels in the same order as on the eager route:
the same bits (spec/step_pipeline_spec.lua on the CPU with the fake
recorder; spec/step_gpu_spec.lua's pipelined fit on the GPU).

Lane A's stream does not wait for lane B's last step by itself: RS:join()
does (before the eager short batch, a warm-up, an optimizer step, reading
the running losses, validation, a retirement and release; the Trainer calls
it before its epoch fence and before on_batch_end callbacks). Nor does lane
B wait for work queued on lane A between steps: RS:handoff() makes it (after
the short batch, a warm-up, an optimizer step; the Trainer calls it after
on_batch_end callbacks). A caller driving the step itself and touching the
model between steps calls step:join() before and step:handoff() after.
]]
local lucid = require "lucid"
local step_mod = require "lucid.step"

local M = {}

-- Eager calls of lane B before it records (its twin's first forward
-- allocates the module outputs, column caches and the loss plan's scratch).
local LANE_B_WARMUP = 2

--- Whether the pipelined route can run for step object rs, and why not.
function M.refused(rs)
  if not rs.prefetch then return "the input prefetch is off (LUCID_INPUT_PREFETCH=0)" end
  if rs.fb_event then return "LUCID_FB_EVENT=graph" end
  if rs.graph_wcast then return "LUCID_GRAPH_WCAST=1" end
  if type(rs.model.twin) ~= "function" then return "the model has no twin (Model:twin)" end
  return nil
end

-- nil when the twin's module tree runs the model's code: the same classes
-- and children everywhere, the same C module presence, and no instance
-- override of forward/backward on the model's side (a twin is built from
-- the model's configuration: Model:twin; an override, replace_forward or a
-- module added to the model after construction would not be in it, and
-- lane B would run other kernels than lane A). Else the first difference.
local function twin_differs(a, b, path)
  if getmetatable(a) ~= getmetatable(b) then return path .. ": another class" end
  if rawget(a, "forward") ~= nil or rawget(a, "backward") ~= nil then
    return path .. ": an instance override of forward/backward"
  end
  if (a._c == nil) ~= (b._c == nil) then return path .. ": another C module" end
  local ma, mb = a._modules or {}, b._modules or {}
  local ha, hb = a._hidden or {}, b._hidden or {}
  if #ma ~= #mb or #ha ~= #hb then return path .. ": other children" end
  for i, e in ipairs(ma) do
    local why = twin_differs(e.module, mb[i].module, path .. "." .. tostring(e.name or i))
    if why then return why end
  end
  for i, h in ipairs(ha) do
    local why = twin_differs(h, hb[i], path .. ".<hidden " .. i .. ">")
    if why then return why end
  end
  return nil
end
M.twin_differs = twin_differs

--- Install the pipelined route's methods on the step class RS.
function M.install(RS)
  -- Lane A's events (created once; a wait on a never-recorded event is a no-op).
  function RS:_pipe_init()
    local R = self.recorder
    self.pipe = { parity = 0, lane_b = nil, b_unjoined = false, items_pending = false, items_b = nil,
      items_idx = nil, replays_b = 0,
      -- lane B's counters and memory peaks over the lanes dropped so far
      hist = { stage_wait_s = 0, stage_waits = 0, precasts = 0, peak_allocated = 0, peak_reserved = 0 } }
    self.evF, self.evB = R.event(self.ctx), R.event(self.ctx)
    self.f_keeps, self.pcalls = false, 0
  end

  -- Lane B, made on its first turn (again after a retirement).
  function RS:_lane_b()
    local p = self.pipe
    if p.lane_b then return p.lane_b end
    local R = self.recorder
    local ctx = lucid.Context{ device = self.ctx:device() }
    local twin = self.model:twin(ctx)
    local eo = {}
    for k, v in pairs(self.eager_opts) do eo[k] = v end
    eo.ctx, eo.model, eo.keep_grads, eo.record = ctx, twin, true, nil
    -- the input shapes lane A follows now (RS:_reshape after a retirement)
    eo.imgsz, eo.max_gt = self.eager.imgsz, self.eager.max_gt
    local L = setmetatable({
      ctx = ctx, model = twin, eager = step_mod.new(eo), graphs = {},
      -- per-lane fields the shared segment functions (RS:_stage, _h2d)
      -- write: false, not nil, so that reads do not fall back to lane A's
      stage = false, stages = false, stage_i = 1, ev_prep = false, ev_fb = false,
      stage_wait_s = 0, stage_waits = 0, precasts = 0, f_keeps = false, pcalls = 0,
      evF = R.event(ctx), evB = R.event(ctx),
    }, { __index = self })
    p.lane_b = L
    return L
  end

  -- Lane A's recording call: make lane B and check that its twin runs the
  -- model's code; if not, the pipeline is dropped for the rest of this
  -- step's life (logged) and the call goes on on the one-lane route.
  -- Returns true when the pipeline stays.
  function RS:_pipe_prepare()
    local ok, L = pcall(self._lane_b, self)
    local why
    if not ok then
      -- a second context, the twin or its buffers could not be made (device
      -- memory, say): the one-lane route needs none of them
      why = "lane B could not be made: " .. tostring(L)
    else
      why = twin_differs(self.model, L.model, "model")
      if why then why = "the twin would not run the model's code (" .. why .. ")" end
    end
    if not why then return true end
    self:_pipe_drop()
    self.pipe = nil
    self.pipeline_refused = why
    self.log("recorded step: pipeline refused: " .. self.pipeline_refused)
    return false
  end

  --- step:join(): lane A's stream waits for lane B's last step, and lane
  -- B's last loss items join the running losses (in step order). A no-op
  -- off the pipelined route. Queued on the device; the host does not wait.
  function RS:join()
    local p = self.pipe
    if not p or not p.lane_b then return end
    if p.b_unjoined then
      p.lane_b.evB:wait(self.ctx)
      p.b_unjoined = false
    end
    if p.items_pending or p.items_idx then
      self:_take_items()
      self.evB:record()
    end
  end

  -- Lane A's stream, after its wait for lane B's last backward: lane B's
  -- loss items join the running losses (in step order), and its entry in
  -- recorded_losses (a clone on lane B's context, RS:_count) is replaced by
  -- a copy on lane A's context, so that nothing the fit keeps holds lane B's
  -- context alive once it is dropped. Both read lane B's items buffer,
  -- which its next backward (after lane A's evB) overwrites.
  function RS:_take_items()
    local p = self.pipe
    if p.items_pending then
      self.eager.running:add_(p.items_b)
      p.items_pending = false
    end
    local l, i = self.recorded_losses, p.items_idx
    if l and i then
      local t = lucid.empty(p.items_b:shape(), { ctx = self.ctx, dtype = p.items_b:dtype() })
      t:copy_(p.items_b)
      l[i] = t
    end
    p.items_idx = nil
  end

  -- The largest allocator peaks of lane B's contexts (memory_stats).
  function RS:_lane_b_memory()
    local p = self.pipe
    local h, L = p.hist, p.lane_b
    local m = L and L.ctx.memory_stats and L.ctx:memory_stats() or {}
    return { peak_allocated = math.max(h.peak_allocated, m.peak_allocated or 0),
      peak_reserved = math.max(h.peak_reserved, m.peak_reserved or 0) }
  end

  --- step:handoff(): lane B's next forward and backward wait for
  -- everything queued on lane A's stream so far: eager work of lane A (the
  -- short batch, a warm-up call, the optimizer segment) and a caller's own
  -- work on the model between steps (a callback that edits a gradient or a
  -- weight on the step's context: the Trainer calls step:join() before its
  -- on_batch_end callbacks and step:handoff() after them). A no-op off the
  -- pipelined route.
  function RS:handoff()
    if not self.pipe then return end
    self.evF:record()
    self.evB:record()
  end

  -- Lane B's captures left open by a failure are discarded (before the
  -- drop synchronises its context).
  function RS:_pipe_discard()
    local L = self.pipe and self.pipe.lane_b
    if L and self.recorder.available(L.ctx) and lucid.graph then
      pcall(lucid.graph.capture_discard, L.ctx)
    end
  end

  -- Drop lane B (graphs, twin, buffers, staging, events) and lane A's
  -- pipelined recording state. Lane A's F/B graphs are in self.graphs
  -- (freed by RS:_drop).
  function RS:_pipe_drop()
    local p = self.pipe
    if not p then return end
    pcall(self.join, self)
    local L = p.lane_b
    if L then
      -- its graphs and buffers may still be in use on the device
      pcall(function() L.ctx:synchronize() end)
      local h = p.hist
      local ok, m = pcall(self._lane_b_memory, self)
      if ok then h.peak_allocated, h.peak_reserved = m.peak_allocated, m.peak_reserved end
      h.stage_wait_s, h.stage_waits = h.stage_wait_s + L.stage_wait_s, h.stage_waits + L.stage_waits
      h.precasts = h.precasts + L.precasts
      for k, g in pairs(L.graphs) do
        pcall(g.free, g)
        L.graphs[k] = nil
      end
      if L.stages then pcall(RS._free_stages, L) end
      for _, k in ipairs({ "ev_prep", "ev_fb", "evF", "evB" }) do
        local e = rawget(L, k)
        if e then pcall(e.free, e) end
      end
      pcall(L.eager.release, L.eager)
    end
    p.lane_b, p.parity, p.b_unjoined, p.items_pending, p.items_b, p.items_idx = nil, 0, false, false, nil, nil
    self.f_keeps, self.pcalls = false, 0
    -- the twin, its buffers and its context go now, not at some later
    -- collection (its memory back before a new lane B is made)
    if L then
      L = nil
      collectgarbage()
    end
  end

  -- One segment of lane X, "f" (RS:_f) or "b" (RS:_b): replayed, run
  -- eagerly (lane B's warm-up) or recorded and run once (RS:_record; B as
  -- a continuation of F's capture). The closures are made only when the
  -- segment is not replayed.
  local function segment(self, X, name, b, lane_a)
    local g = X.graphs[name]
    if g then
      g:launch()
      if name == "b" then
        self.replays = self.replays + 1
        if not lane_a then self.pipe.replays_b = self.pipe.replays_b + 1 end
      end
      return
    end
    local fn
    if name == "f" then
      fn = function() RS._f(X, b) end
    else
      fn = function() RS._b(X, b, lane_a) end
    end
    if X.pcalls <= (lane_a and 0 or LANE_B_WARMUP) then return fn() end
    local precast = name == "f" and function() X.model:cast_weights(b.x) end or nil
    self:_record(name, fn, precast, X, name == "b")
  end

  -- One step on lane X (the other lane Y) after the staging took the batch
  -- (see the file comment for the order of the waits).
  local function lane_step(self, X, Y, replay, do_opt)
    local p = self.pipe
    local lane_a = X == self
    local model = self.model
    if lane_a and replay and model.output ~= self.out_seen then
      -- an eager forward ran since the last replay (see RS:run)
      self.restored = self.restored + self.refs:restore()
    end
    local b = X.eager:_bufs(self.batch)
    RS._h2d(X, b)
    lucid.input_prepare(b.x, X.stage.dev_images, X.stage.dev_hsv)
    X.ev_prep:record()
    Y.evF:wait(X.ctx)
    X.pcalls = X.pcalls + 1
    local live = X.graphs.f ~= nil
    if live and X.f_keeps then
      X.model:cast_weights(b.x)
      X.precasts = X.precasts + 1
    end
    segment(self, X, "f", b, lane_a)
    if not live and X.graphs.f then
      local g = X.graphs.f
      X.f_keeps = g.keeps_shadows ~= nil and g:keeps_shadows() or false
    end
    X.evF:record()
    X.stage.ev:wait() -- the targets (RS:_h2d), before the loss reads them
    Y.evB:wait(X.ctx)
    if lane_a then
      p.b_unjoined = false
      if p.items_pending or p.items_idx then self:_take_items() end
    end
    segment(self, X, "b", b, lane_a)
    X.evB:record()
    X.ev_fb:record()
    if lane_a then
      if not replay and self.graphs.b then self:_contract(b, "recording fb") end
      self.out_seen = model.output
    else
      p.b_unjoined, p.items_pending, p.items_b = true, true, b.items
    end
    if do_opt then
      self:join()
      self:_opt(self.graphs.b ~= nil)
      self:handoff()
      -- an OPT graph wrote the weights behind the storage versions: lane
      -- B's shadows are recast before its next forward
      if self.route == "recorded clip" and p.lane_b and lucid.graph and lucid.graph.shadows_stale
        and self.recorder.available(p.lane_b.ctx) and self.graphs.opt then
        lucid.graph.shadows_stale(p.lane_b.ctx)
      end
    end
    if self.graphs.b then p.parity = 1 - p.parity end
    self:_count(b, do_opt)
    -- lane B's entry of recorded_losses: replaced at lane A's next wait for it
    if not lane_a and self.recorded_losses then p.items_idx = #self.recorded_losses end
  end

  --- One recorded-route call on the pipelined route (RS:run, after the
  -- contract check; `replay`: lane A's graphs exist).
  function RS:_pipe_run(batch, do_opt, replay)
    local p = self.pipe
    if not self.prefetch then
      error("lucid.Step: the pipelined route needs the input prefetch (step.prefetch was switched off "
        .. "after the step was made; LUCID_INPUT_PREFETCH=0 or pipeline=false at construction)", 2)
    end
    local X = (replay and p.parity == 1) and p.lane_b or self
    local Y = (X == self) and p.lane_b or self
    local lane_a = X == self
    -- lane B's first staging (its pinned sets, its device image buffer) is
    -- part of its warm-up: a failure there takes the failure path below
    local staged
    if not lane_a and not X.graphs.b then
      local ok, r = pcall(RS._stage, X, batch)
      if not ok then return self:_fail(r, "lane B warm-up") end
      staged = r
    else
      staged = RS._stage(X, batch)
    end
    if not staged then
      if replay then return self:_retire_run("input shapes changed", batch, do_opt) end
      self:_pipe_drop() -- a lane B of the old shapes (none normally)
      self.calls = 1 -- not recorded yet: warm up again with the new shapes
      return self:_run_warm(batch, do_opt)
    end
    -- lane A's recording call: lane B (the twin) is made here, after the
    -- staging took the batch and before the contract's snapshot (the twin's
    -- construction moves the module edit count and the contract epoch,
    -- which would cost the first replay a full check)
    if not replay then
      -- a twin that would not run the model's code: the one-lane route
      -- (it stages the batch again, into the next set)
      if not self:_pipe_prepare() then return self:_run_one(batch, do_opt, replay) end
      Y = p.lane_b
    end
    -- a failure while lane A records or lane B warms up or records: the
    -- eager route, nothing recorded kept, the original error raised
    -- (RS:_fail, as the one-lane route's warm-up and recording); a failing
    -- replay raises as on the one-lane route
    local phase = (not replay and "recording (pipelined)") or (not lane_a and not X.graphs.b and "lane B warm-up")
      or nil
    if not phase then return lane_step(self, X, Y, replay, do_opt) end
    local ok, err = pcall(lane_step, self, X, Y, replay, do_opt)
    if not ok then
      if self.route == "eager" then error(err, 0) end -- a recording failed: RS:_fail ran
      self:_fail(err, phase)
    end
  end
end

return M
