--[[
lucid.recorded_step — the capturable training step (lucid.Step): the eager
step of lucid.step, recorded as CUDA graphs after a warm-up and replayed.
Design and contracts: docs/STEP.md.

  local RS = require "lucid.recorded_step"
  local step = RS.new{ <the fields of lucid.step.new>, warmup = 3,
                       recorder = nil, log = function(line) end }
  step:run(batch, do_opt)      -- same interface as the eager step
  step:running_losses(), step:predict(vb), step:reset_running()
  step:stats()                 -- route, recorded, replays, retirements, ...
  step:retire(reason), step:release()
  step.recorded, step.replays, step.retirements, step.last_retire_reason,
  step.route                   -- "recorded clip" | "eager clip" | "eager"

Segments of one call with n == batch images, once recorded:
  host   : batch -> fixed staging (CPU copies; pinned memory on CUDA)
  eager  : staging -> device (u8 images, f32/u8 targets, the f32 HSV gains
           when device_hsv: one async memcpy each). On CUDA they run on the
           side copy stream (lucid.graph.side_copy), so the upload of batch
           k+1 overlaps step k: the images once step k's input_prepare has
           read the device copies, the targets once step k's FB (its loss)
           is done; the compute stream waits for the images before
           input_prepare (RS:_h2d) and for the targets after it
           (RS:_prepare).
           Two host staging sets (LUCID_INPUT_STAGES=1: one) let the host
           run up to two replays ahead (RS:_staging).
           LUCID_INPUT_PREFETCH=0 (read once): on the compute stream, in
           line, as before (A/B; the same bits either way).
  eager  : lucid.input_prepare (u8 -> HSV when device_hsv -> /255 in the
           activation dtype; one kernel)
  eager  : Model:cast_weights when the FB graph kept the conv weight
           shadows (the default; GRAPH_WCAST below): the casts of the
           weights written since their last cast (none between optimizer
           steps)
  FB     : graph  — forward, loss, loss backward
                    (seed x loss scale), model backward (+= into the flat
                    gradients), running losses += items
  at an optimizer step (do_opt), the calls of lucid.step's Step:_optimizer:
  one fused engine call (opt:step_fused -> lucid_optim_step_fused: unscale,
  norm clip, value clip, update skipped on the device when found_inf,
  scaler update, EMA of parameters and BN buffers) then zero_grad; with a
  user clip.fn: scaler:unscale_, clip.fn, then the fused call for the rest.
  route "recorded clip": eager parameter-block upload (host staging ->
                    device), then OPT graph = those calls
  route "eager clip":  those calls, eagerly (the fused call holds the
                    gradient-norm pass and the update together, so keeping
                    the norm out of the graph keeps the update out too)
Before every replay the contract is checked: the cheap path is one C call
(the contract epoch, the exact count of modules out of their recorded mode,
the watched block inputs) and the clipping policy's fields, O(1) in the
size of the model, validation's eval/train included; the full check only
when something else moved. The first calls (warm-up), a short batch
(n < batch), and every call after a second drift run the eager segments, in
the same order with the same kernels, so both routes give the same bits.
]]
local lucid = require "lucid"
local step_mod = require "lucid.step"
local Model = require "lucid.model"
local Module = require "lucid.nn.module"
local pipeline = require "lucid.step_pipeline"

local M = {}
local RS = {}
RS.__index = RS

-- ------------------------------------------------------------- recorders
-- A recorder turns a segment function into a replayable graph. The real one
-- captures the CUDA work the function queues (nothing runs during the
-- capture; launch runs it). Tests on the CPU pass a fake whose graph calls
-- the function again on launch: record + launch is one execution either
-- way, so the state machine is the same code on both.

local function real_recorder()
  local G = lucid.graph
  local R = {}
  function R.available(ctx) return G ~= nil and G.available(ctx) end
  -- precast (optional): the conv weight casts, queued eagerly between
  -- making every shadow stale and a capture that keeps them (graph.h's
  -- protocol: lucid_ctx_capture_begin_ex with LUCID_CAPTURE_KEEP_SHADOWS).
  -- continue (optional): the graph will always run right after the last
  -- one recorded on ctx (the pipelined route's B after its F): the shadows
  -- as they are and that capture's conv column caches stay fresh
  -- (LUCID_CAPTURE_KEEP_SHADOWS | LUCID_CAPTURE_CONTINUE).
  -- The Lua collector is stopped while a capture is open: a finalizer run
  -- inside it (a tensor or a context that became garbage, e.g. the second
  -- context of a retired pipelined recording) makes CUDA calls that a
  -- capture in progress forbids (a stream synchronisation, cudaFree), and
  -- the capture is invalidated (seen on the H200: cudaErrorStreamCapture-
  -- Invalidated at the next lane fork). Restarted after, also on errors.
  function R.record(ctx, fn, precast, continue)
    if precast then
      G.shadows_stale(ctx)
      precast()
    end
    local gc_on = collectgarbage("isrunning")
    collectgarbage("stop")
    local ok, g = pcall(function()
      if precast then
        G.capture_begin(ctx, true, continue)
      elseif continue then
        G.capture_begin(ctx, true, true)
      else
        G.capture_begin(ctx)
      end
      local ok1, err = pcall(fn)
      if not ok1 then
        pcall(G.capture_discard, ctx)
        error(err, 0)
      end
      local ok2, gr = pcall(G.capture_end, ctx)
      if not ok2 then
        pcall(G.capture_discard, ctx)
        error(gr, 0)
      end
      return gr
    end)
    if gc_on then collectgarbage("restart") end
    if not ok then error(g, 0) end
    return g
  end
  function R.refs(set, modules) return G.Refs(set, modules) end
  function R.event(ctx) return G.Event(ctx) end
  R.side_copy = G.side_copy
  R.clock = G and G.clock or lucid.wall_time
  return R
end

--- A recorder for CPU tests: graphs are Lua closures (launch runs the
-- segment again), refs are the real C reference sets (lucid.graph.Refs).
function M.fake_recorder()
  local G = lucid.graph
  local R = { recorded = 0, launched = 0 }
  function R.available() return true end
  function R.record(_, fn, precast, continue)
    if precast then -- before the capture, as the real recorder
      R.precasts = (R.precasts or 0) + 1
      precast()
    end
    R.recorded = R.recorded + 1
    local keeps = precast ~= nil or continue == true
    return { launch = function() R.launched = R.launched + 1; fn() end, free = function() end,
      keeps_shadows = function() return keeps end }
  end
  function R.refs(set, modules) return G.Refs(set, modules) end
  function R.event()
    return { record = function() end, record_node = function() end, synchronize = function() end,
      wait = function() end, free = function() end }
  end
  -- one stream: the copies in line (the ordering they need holds trivially)
  function R.side_copy(dst, src)
    R.side_copies = (R.side_copies or 0) + 1
    for i = 1, #dst do dst[i]:copy_(src[i]) end
  end
  R.clock = G and G.clock or lucid.wall_time
  return R
end

-- --------------------------------------------------------------- helpers

-- Every C module of a Lua module tree (children and hidden helpers), every
-- Lua module whose forward/backward is an instance override ("custom"), and
-- the classes of the tree with the forward/backward they resolve to.
-- Fourth result: true when a module enumerates its parameters its own way
-- (parameters/buffers other than Module's): what is derived from the tree
-- cannot be trusted to stay put for such a model (full check every time).
local function collect(model)
  local cmods, custom, classes, seen = {}, {}, {}, {}
  local enum = false
  local function visit(m)
    if seen[m] then return end
    seen[m] = true
    if m._c then cmods[#cmods + 1] = m._c end
    if rawget(m, "forward") ~= nil or rawget(m, "backward") ~= nil then
      custom[#custom + 1] = { m = m, fwd = rawget(m, "forward"), bwd = rawget(m, "backward") }
    end
    if m.parameters ~= Module.parameters or m.buffers ~= Module.buffers then enum = true end
    local cls = getmetatable(m)
    if cls and not classes[cls] then classes[cls] = true end
    for _, e in ipairs(m._modules or {}) do visit(e.module) end
    for _, h in ipairs(m._hidden or {}) do visit(h) end
  end
  visit(model)
  local cl = {}
  for cls in pairs(classes) do cl[#cl + 1] = { cls = cls, fwd = cls.forward, bwd = cls.backward } end
  return cmods, custom, cl, enum
end

local function clip_policy(clip)
  clip = clip or {}
  return { max_norm = clip.max_norm, value = clip.value, fn = clip.fn,
    capture = clip.capture_gradient_norm and true or false }
end

-- ------------------------------------------------------------------ new

-- The policy objects a recording compares by identity (scaler, ema, ctx)
-- live in a side table of each step object, between the object and RS: a
-- reassignment (step.ema = other) goes through __newindex, which clears
-- the "policy objects as recorded" slot of the cheap path's guard, so the
-- cheap path reads none of them (the clipping policy table is read by run
-- anyway). getmetatable(step) is RS.
local POLICY_KEYS = { scaler = true, ema = true, ctx = true }
local CHAIN = { __index = RS }
local function new_object()
  local pol = setmetatable({}, CHAIN)
  local mt = { __index = pol, __metatable = RS }
  function mt.__newindex(t, k, v)
    if POLICY_KEYS[k] then
      pol[k] = v
      local g = rawget(t, "guard")
      if g then g[3] = false end
    else
      rawset(t, k, v)
    end
  end
  return setmetatable({}, mt)
end

-- Host staging sets (LUCID_INPUT_STAGES, read when this module loads: "1"
-- gives one set, anything else two; RS.new's input_stages field overrides it).
-- With two, the step fills set k % 2 while the upload of the other one may
-- still be queued, so the host waits (RS:_stage) for the upload of two steps
-- ago instead of the last one: it may run up to two replays ahead of the
-- device, and a host pause (the trainer's full Lua collection every 8
-- steps, 0.5-2 ms) no longer leaves the device idle. Measured before it
-- (H200, 2026-11-30, CUPTI timeline of a recorded fit): the replay after
-- such a pause started 0.5-1.9 ms after its input_prepare, every 8 steps.
local INPUT_STAGES = tonumber(os.getenv("LUCID_INPUT_STAGES") or "") == 1 and 1 or 2

-- Where ev_fb (the targets may be replaced) is recorded on the recorded
-- route (LUCID_FB_EVENT, read when this module loads; RS.new's fb_event
-- field overrides it): "graph" records it inside the FB graph right after
-- the loss backward (Event:record_node: an external event record node, no
-- lane join), so the next batch's targets upload while the replay's model
-- backward runs, and the next input kernel need not wait for that upload
-- after the replay (13-25 us per step between replays on the H200,
-- fourteenth session); anything else, after the FB launch, as before.
-- Opt-in: measured slower on the H200 (fifteenth session: the replay span
-- +30 us, the launch's host time 10.7 -> 41.6 us; docs/STEP.md).
local FB_EVENT = os.getenv("LUCID_FB_EVENT") == "graph"

-- The conv weight casts of the FB segment (Model:cast_weights, read when
-- this module loads; RS.new's graph_wcast field overrides it). By default
-- they stay out of the FB graph: the recording casts them eagerly first
-- and captures with the shadows kept (lucid.graph.capture_begin(ctx,
-- true)), and each replay is preceded by Model:cast_weights, which queues
-- casts only for the weights written since their last cast (the storage
-- version moved: after an optimizer step, 1 step in `accumulate`, or a
-- user's edit), or for all of them after something made the shadows stale
-- (another graph's launch: the OPT graph of route "recorded clip" every
-- optimizer step; another capture). Why: inside the graph the casts (2713
-- + 2295 blocks) ran on every replay beside layers 0-1, which started ~14
-- us late and ran slower beside them (the head of the replay: the first GEMM of layer
-- 1 at ~97 us; H200 CUPTI trace, fifteenth session). LUCID_GRAPH_WCAST=1:
-- inside the graph, every replay, as before (A/B; the same bits).
local GRAPH_WCAST = os.getenv("LUCID_GRAPH_WCAST") == "1"

-- The pipelined route (lua/lucid/step_pipeline.lua, docs/PIPELINE.md):
-- micro-step k+1's forward beside micro-step k's backward, on a second
-- context with a twin of the model. RS.new's pipeline field (the recipe's
-- `pipeline`, default true in recipes/pose_nano.lua); off when nil.
-- LUCID_PIPELINE=0|1 (read when this module loads), when set, wins over
-- the field: A/B measurements of one recipe.
local PIPELINE_ENV
if os.getenv("LUCID_PIPELINE") == "1" then PIPELINE_ENV = true
elseif os.getenv("LUCID_PIPELINE") == "0" then PIPELINE_ENV = false
end

--- RS.new(o): o holds the fields of lucid.step.new (model, optimizer, ema,
-- scaler, ctx, batch, imgsz, max_gt, nc, nkpt, act_dtype, gains, clip,
-- accumulate, record_losses, trainer) plus warmup (eager calls before
-- recording, default 3), input_stages (host staging sets, 1 or 2; default
-- LUCID_INPUT_STAGES's, RS:_staging), fb_event (boolean; default
-- LUCID_FB_EVENT=graph's: ev_fb recorded inside the FB graph after the
-- loss), graph_wcast (boolean; default LUCID_GRAPH_WCAST=1's: the conv
-- weight casts inside the FB graph), pipeline (boolean, default false: the
-- pipelined route, lua/lucid/step_pipeline.lua; LUCID_PIPELINE=0|1 wins),
-- recorder (tests), log (function(line): where the route is reported once;
-- default stderr).
-- The fields lucid.Step / M.new cannot do without, and what each must be.
local REQUIRED = {
  { "ctx", "userdata", "a lucid.Context" }, { "model", "table", "the model (lucid.model)" },
  { "optimizer", "userdata", "a lucid optimizer (lucid.SGD, lucid.AdamW, ...)" },
  { "batch", "number", "the batch size (images per step)" }, { "imgsz", "number", "the image size in pixels" },
  { "max_gt", "number", "the instance slots per image" }, { "nkpt", "number", "the keypoints per instance (17)" },
}

function M.new(o)
  if type(o) ~= "table" then
    error(string.format("lucid.Step: expected a table of fields, got %s", type(o)), 2)
  end
  for _, f in ipairs(REQUIRED) do
    local v = o[f[1]]
    if type(v) ~= f[2] then
      error(string.format("lucid.Step: field '%s' must be %s, got %s", f[1], f[3],
        v == nil and "nothing" or type(v)), 2)
    end
  end
  local self = new_object()
  local eo = {}
  for k, v in pairs(o) do eo[k] = v end
  if o.input_stages ~= nil and o.input_stages ~= 1 and o.input_stages ~= 2 then
    error(string.format("lucid.Step: field 'input_stages' must be 1 or 2, got %s", tostring(o.input_stages)), 2)
  end
  eo.record, eo.warmup, eo.recorder, eo.log, eo.record_losses = o.record_losses, nil, nil, nil, nil
  eo.input_stages, eo.fb_event, eo.graph_wcast, eo.pipeline = nil, nil, nil, nil
  self.eager_opts = eo -- lane B's eager step is made from them (step_pipeline.lua)
  self.eager = step_mod.new(eo)
  -- every step's loss items (cfg.record_losses): one list for both routes
  self.recorded_losses = self.eager.recorded_losses
  self.model, self.optimizer, self.ema, self.scaler = o.model, o.optimizer, o.ema, o.scaler
  self.ctx, self.batch, self.trainer = o.ctx, o.batch, o.trainer
  self.clip = o.clip or {}
  self.policy = clip_policy(self.clip)
  self.warmup = o.warmup or 3
  self.input_stages = o.input_stages or INPUT_STAGES
  if o.fb_event == nil then self.fb_event = FB_EVENT else self.fb_event = o.fb_event and true or false end
  if o.graph_wcast == nil then self.graph_wcast = GRAPH_WCAST else self.graph_wcast = o.graph_wcast and true or false end
  self.fb_keeps = false -- the FB graph kept the weight shadows (RS:run casts before each replay)
  self.precasts = 0     -- those casts' calls (each queues work only for weights written since)
  self.log = o.log or function(line) io.stderr:write(line, "\n") end
  self.recorder = o.recorder or real_recorder()
  -- the next batch's upload on the side copy stream (file comment)
  self.prefetch = os.getenv("LUCID_INPUT_PREFETCH") ~= "0" and self.recorder.side_copy ~= nil
  self.recorded, self.replays, self.retirements = 0, 0, 0
  self.last_retire_reason = nil
  self.calls = 0          -- calls with n == batch since the last (re)start
  self.opt_warm = 0       -- eager optimizer segments run since then
  self.check_s, self.checks = 0, 0                 -- cheap path
  self.mode_check_s, self.mode_checks = 0, 0       -- after a mode round trip
  self.full_check_s, self.full_checks = 0, 0       -- full checks
  self.restored = 0
  self.launch_s, self.launch_n, self.launch_max_s = 0, 0, 0 -- host time of the FB replays' launches (RS:run)
  self.stage_wait_s, self.stage_waits = 0, 0 -- host time waiting for a staging set's last upload (RS:_stage)
  self.graphs = {}
  local device = o.ctx:device()
  if device:sub(1, 4) ~= "cuda" and not o.recorder then
    self.route, self.eager_reason = "eager", "no CUDA"
  elseif not self.recorder.available(o.ctx) then
    self.route, self.eager_reason = "eager", "CUDA graphs unavailable in this build"
  else
    self.route = self:_clip_route()
  end
  local want = o.pipeline
  if PIPELINE_ENV ~= nil then want = PIPELINE_ENV end
  if want and self.route ~= "eager" then
    self.pipeline_refused = pipeline.refused(self)
    if not self.pipeline_refused then self:_pipe_init() end
  end
  self:_say()
  return self
end

-- "recorded clip" when capture_gradient_norm is honoured, else "eager clip".
function RS:_clip_route()
  local p = self.policy
  if not p.capture then return "eager clip" end
  local why
  if p.value then why = "value clipping"
  elseif p.fn then why = "a user clipping function"
  elseif not self.trainer then why = "the optimizer is not driven by a Trainer"
  end
  if why then
    self.capture_refused = "capture_gradient_norm ignored: " .. why
    return "eager clip"
  end
  return "recorded clip"
end

function RS:_say()
  if self._said == self.route then return end
  self._said = self.route
  local msg = "recorded step: route " .. self.route
  if self.eager_reason then msg = msg .. " (" .. self.eager_reason .. ")" end
  if self.capture_refused then msg = msg .. "; " .. self.capture_refused end
  if self.route ~= "eager" and self.pipe then msg = msg .. "; pipelined (two contexts)" end
  if self.route ~= "eager" and self.pipeline_refused then
    msg = msg .. "; pipeline refused: " .. self.pipeline_refused
  end
  self.log(msg)
end

-- ------------------------------------------------------------- segments

-- Fixed staging (host) buffers and the device u8 image buffer, for n ==
-- batch (created on the first call, and again after the input shapes
-- changed): self.stage is the set in use, self.stages all of them (each
-- with its upload event `ev` once used); the device buffers (dev_images,
-- dev_hsv) are one pair, shared by the sets.
function RS:_staging(batch)
  local s = self.stage
  if s then return s end
  -- new device buffers (here and the eager step's, after new input shapes)
  -- may reuse blocks that work queued on the compute stream still reads:
  -- the side copies into them wait for everything queued so far
  if self.ev_prep then self.ev_prep:record() end
  if self.ev_fb then self.ev_fb:record() end
  local ctx, P = self.ctx, lucid.graph.pinned
  local function like(t) return P(t:shape(), t:dtype(), ctx) end
  local dev_images = lucid.empty(batch.images:shape(), { ctx = ctx, dtype = "u8" })
  local dev_hsv = nil
  if self.eager.device_hsv then
    dev_hsv = lucid.empty(batch.hsv:shape(), { ctx = ctx, dtype = batch.hsv:dtype() })
  end
  self.stages = {}
  for i = 1, self.input_stages do
    s = { images = like(batch.images), cls = like(batch.cls), boxes = like(batch.boxes), kpts = like(batch.kpts),
      mask = like(batch.mask), dev_images = dev_images, dev_hsv = dev_hsv }
    -- the loader left HSV to the device: its per-image gains [B, 3] travel too
    if dev_hsv then s.hsv = like(batch.hsv) end
    self.stages[i] = s
  end
  self.stage_i = 1
  self.stage = self.stages[1]
  return self.stage
end

-- Free every staging set (pinned buffers, upload events, the shared device
-- buffers once).
function RS:_free_stages()
  local freed = {}
  for _, st in ipairs(self.stages) do
    for k, t in pairs(st) do
      if k == "ev" or k == "ev_img" then pcall(t.free, t)
      elseif type(t) ~= "table" and not freed[t] then
        freed[t] = true
        pcall(t.free, t)
      end
    end
  end
  self.stage, self.stages = nil, nil
end

local STAGED = { "images", "cls", "boxes", "kpts", "mask", "hsv" }

local function copy_in(s, batch)
  s.images:copy_(batch.images)
  s.cls:copy_(batch.cls)
  s.boxes:copy_(batch.boxes)
  s.kpts:copy_(batch.kpts)
  s.mask:copy_(batch.mask)
  if s.hsv then s.hsv:copy_(batch.hsv) end
end

-- Whether every staged tensor has the batch's shape (dims compared one by
-- one, nothing allocated). copy_ cannot decide it: it also copies between
-- contiguous tensors of another shape with the same element count
-- (Torch7's copy), e.g. a batch of 1 at 640 px and a batch of 4 at 320 px.
local function shapes_match(s, batch)
  for _, k in ipairs(STAGED) do
    local a, b = s[k], batch[k]
    if a and b then
      local n = a:dim()
      if n ~= b:dim() then return false end
      for i = 1, n do
        if a:size(i) ~= b:size(i) then return false end
      end
    end
  end
  return true
end
M.shapes_match = shapes_match

-- host: loader batch -> the next staging set, once the upload that last
-- read that set (one step ago with one set, two with two) is done.
-- The shape comparison is the input-shape part of the contract check:
-- returns nil, copying nothing, when a batch tensor's shape differs from
-- the staging (input shapes changed: images, max_gt, keypoints); a failing
-- copy is raised.
function RS:_stage(batch)
  self:_staging(batch)
  -- the next set: its last upload (one or two steps ago) must be done
  self.stage_i = self.stage_i % #self.stages + 1
  local s = self.stages[self.stage_i]
  self.stage = s
  if s.ev then
    -- timed: how long the device keeps the host waiting (stats' stage_wait_us)
    local clock = self.recorder.clock
    local t0 = clock()
    s.ev:synchronize()
    self.stage_wait_s, self.stage_waits = self.stage_wait_s + (clock() - t0), self.stage_waits + 1
  end
  if not shapes_match(s, batch) then return nil end
  copy_in(s, batch)
  return s
end

-- New input shapes: drop the staging, and point the eager step at the new
-- image size / max_gt (its buffers and loss plans are rebuilt on next use).
-- Also used by the specs on a plain eager step (M.reshape_eager).
local function reshape_eager(e, S, G)
  if e.imgsz ~= S or e.max_gt ~= G then
    e.imgsz, e.max_gt = S, G
    e.bufs = {} -- dropped, not freed: a recording being retired may still be in flight
  end
end
M.reshape_eager = reshape_eager

function RS:_reshape(batch)
  if self.stage then self:_free_stages() end
  reshape_eager(self.eager, batch.images:size(3), batch.cls:size(2))
end

-- eager: staging -> device buffers (async memcpys), then the set's event
-- (stage.ev). With the prefetch (see the file comment) they go to the side
-- copy stream: images (+ HSV gains) after the previous step's input_prepare
-- (ev_prep), then stage.ev_img; targets after the previous FB (ev_fb), then
-- stage.ev (after both: the side stream is in order). The compute stream
-- waits for stage.ev_img before input_prepare and for stage.ev after it
-- (RS:_prepare), before FB: the targets' upload, which can start only when
-- the previous FB is done, runs beside input_prepare instead of before it
-- (the input kernel started 17-23 us after the previous replay, waiting for
-- it: H200 CUPTI traces, fifteenth session). Without the prefetch, in line
-- on the compute stream.
function RS:_h2d(b)
  local s, R = self.stage, self.recorder
  s.ev = s.ev or R.event(self.ctx) -- this set's uploads done (RS:_stage waits for it)
  if self.prefetch then
    self.ev_prep = self.ev_prep or R.event(self.ctx)
    self.ev_fb = self.ev_fb or R.event(self.ctx)
    s.ev_img = s.ev_img or R.event(self.ctx)
    local dst, src = { s.dev_images }, { s.images }
    if s.dev_hsv then dst[2], src[2] = s.dev_hsv, s.hsv end
    R.side_copy(dst, src, self.ev_prep, s.ev_img)
    R.side_copy({ b.tg.cls, b.tg.boxes, b.tg.kpts, b.tg.mask }, { s.cls, s.boxes, s.kpts, s.mask }, self.ev_fb,
      s.ev)
    s.ev_img:wait()
    return
  end
  s.dev_images:copy_(s.images)
  b.tg.cls:copy_(s.cls)
  b.tg.boxes:copy_(s.boxes)
  b.tg.kpts:copy_(s.kpts)
  b.tg.mask:copy_(s.mask)
  if s.dev_hsv then s.dev_hsv:copy_(s.hsv) end
  s.ev:record()
end

-- The input segment's kernel: u8 staging copy -> b.x (lucid.step's
-- Step:_inputs does the same); with the prefetch, ev_prep then tells the
-- next upload that the device copies have been read.
-- precast: a replay of an FB graph that kept the conv weight shadows
-- follows; the weights written since their last cast (none between
-- optimizer steps) are cast after the input kernel's ev_prep (whose record
-- joins the lanes: a cast queued before it would hold the next batch's
-- image upload back) and before the targets' wait (so it does not wait for
-- that upload).
function RS:_prepare(b, precast)
  lucid.input_prepare(b.x, self.stage.dev_images, self.stage.dev_hsv)
  if self.prefetch then self.ev_prep:record() end
  if precast then
    self.model:cast_weights(b.x)
    self.precasts = self.precasts + 1
  end
  if self.prefetch then self.stage.ev:wait() end -- the targets (RS:_h2d), before FB reads them
end

-- FB: the compute part of lucid.step's run after the input (keep the two
-- in step).
function RS:_fb(b)
  self:_f(b)
  self:_b(b, true)
end

-- F: the model's forward of the input buffer (b.out). The pipelined
-- route's F segment (step_pipeline.lua; self may be its lane B).
function RS:_f(b)
  b.out = self.model:forward(b.x)
end

-- B: loss forward and backward, model backward (+= into the flat
-- gradients), with add_running the running losses += items; b.items. The
-- pipelined route's B segment (its lane B adds nothing: lane A adds lane
-- B's items later, in step order).
function RS:_b(b, add_running)
  local e = self.eager
  local out = b.out
  local _, items = b.crit:forward(out.boxes, out.scores, out.kpts, b.tg)
  local gs
  if e.scaler then
    b.scale:fill_(1)
    e.scaler:scale(b.scale)
    gs = b.scale
  end
  local gb, gc, gk = b.crit:backward(gs)
  -- the loss has read the targets: with fb_event they may be replaced from
  -- here on (inside the graph when recording, eagerly in a warm-up call)
  if self.fb_event and self.prefetch and self.ev_fb then self.ev_fb:record_node() end
  step_mod.lane_backward(self.ctx, self.model, b.x, { boxes = gb, scores = gc, kpts = gk })
  if add_running then e.running:add_(items) end
  b.items = items
end

-- The optimizer segment: exactly the calls of lucid.step's Step:_optimizer
-- (one fused engine call + zero_grad; clip.fn: unscale, fn, fused call), with
-- this step's clipping policy.
function RS:_optimizer()
  self.eager:_optimizer(self.clip)
end

-- Host bookkeeping of one call (what lucid.step's run counts).
function RS:_count(b, do_opt)
  local e = self.eager
  e.nrun = e.nrun + 1
  e.steps = e.steps + 1
  if do_opt then e.opt_steps = e.opt_steps + 1 end
  local l = self.recorded_losses
  if l then l[#l + 1] = b.items:clone() end
end

-- --------------------------------------------------------------- contract
--
-- What a recording baked in (docs/STEP.md "Contract", DESIGN decision 5)
-- and how each part is checked before a replay.
--
-- The cheap path (every replay; inline in RS:run, RS:_cheap for callers)
-- is O(1) in the size of the model, allocates nothing, builds no string and
-- makes one C call, the refs' guard closure (lua_graph.c,
-- lucid_graph_refs_quick), which says "unchanged" when
--   * the contract epoch (engine/nn/nn.h) is the one of the last clean
--     check: it moves on every version bump of any parameter set (a
--     parameter or buffer tensor replaced, a trainable flag, a load in
--     place) and on what the Lua library announces (Model:bump_version,
--     replace_forward, Module:add and helper, an instance override of
--     forward/backward: Module's __newindex);
--   * no recorded C module is out of its recorded mode (training,
--     need_grad_input): an exact count kept by the modules' mode setters
--     (engine/nn/module.c), so a switch and back moves nothing and a mode
--     left changed is seen at once, whoever switched it;
--   * the watched parameter-block inputs are equal (EMA decay/tau; MuSGD
--     ns_bf16 when the optimizer segment is recorded);
-- then the clipping policy: the table is the recorded one (run reads
-- step.clip anyway) with the same max_norm, value, fn and capture; and the
-- policy objects (scaler, EMA, context) were not reassigned since the
-- last check (a flag the step object's __newindex clears; see
-- new_object). The input shapes are compared dim by dim before the
-- staging copies (RS:_stage, shapes_match).
--
-- Validation's model:eval() ... model:train() at each epoch boundary moves
-- none of it (the count goes up and back to zero); Model:train/eval, when
-- the model's mode changes, has each recording compare the class
-- forward/backward functions (RS:mode_switched: a replaced one retires the
-- recording through bump_version) and mark its next check, a cheap one,
-- as the "mode check" of stats().
--
-- A model whose parameters are enumerated its own way, or with an
-- instance override of forward/backward at record time, or whose
-- contract_version/mode_version are not Model's, never takes the cheap
-- path (guard slot 1 always says "moved"): every check is the slow one, a
-- full check for the first two.
--
-- The slow path (RS:_check_moved) compares each part by value and says
-- why: the clipping policy, the scaler (precision policy), the EMA, the
-- context (stream); refs:check (the watched inputs; the parameter set's
-- entries field by field when its version moved; the first module out of
-- its recorded mode, by name); the model's contract version (moved:
-- retire with the bump_version reason) and its mode (not the recorded one:
-- "model mode train -> eval"). Then what moved decides the rest:
--   full check   the set's version moved (entries compared), or a module
--                tree was edited (Module.edits moved), or the model
--                forces it: the module tree walked again (same C modules
--                in the same order, same instance overrides) and the
--                class forward/backward functions compared, allocating
--                nothing.
--   mode check   the contract epoch moved for nothing of this recording
--                (another model's bump_version or parameter set, say), or
--                a mode out of place (then retired): nothing more to do.

-- What the recording baked in, on the Lua side (the C side is self.refs).
function RS:_snapshot(b)
  local model = self.model
  local cmods, custom, classes, enum = collect(model)
  local clip = self.clip
  local cv, mv = model.contract_version, model.mode_version
  self.contract = {
    has_cv = cv ~= nil, has_mv = mv ~= nil,
    -- the model's versions move the contract epoch (Model's own methods)
    epoch = (cv == nil or cv == Model.contract_version) and (mv == nil or mv == Model.mode_version),
    model_version = cv and model:contract_version() or 0,
    mode_version = mv and model:mode_version() or 0, training = model.training,
    clip = clip, max_norm = clip.max_norm, value = clip.value, fn = clip.fn,
    capture = clip.capture_gradient_norm and true or false,
    scaler = self.scaler, ema = self.ema, ctx = self.ctx,
    custom = custom, classes = classes, cmods = cmods,
    edits = Module.edits.n,
    -- derived from the tree, not to be cached: the full check every time
    always_full = #custom > 0 or enum,
  }
  self.cmods = cmods
  self.buffers = b -- the eager step's buffers for n == batch stay alive with it
  self.seen = setmetatable({}, { __mode = "k" }) -- visit marks of the tree walk
  self.walks = 0
end

-- The tree walk of a full check: visits the modules as collect() does and
-- compares on the fly with the recorded lists (c.cmods, c.custom).
-- `seen` marks the visited modules with this walk's number `stamp` (one
-- table reused by every walk: nothing is allocated once warm). Returns the
-- counts of C modules and custom modules seen, or nil and the reason.
local function walk(m, c, seen, stamp, nc, nu)
  if seen[m] == stamp then return nc, nu end
  seen[m] = stamp
  local cm = m._c
  if cm then
    nc = nc + 1
    if c.cmods[nc] ~= cm then return nil, "the module tree changed" end
  end
  local f, bw = rawget(m, "forward"), rawget(m, "backward")
  if f ~= nil or bw ~= nil then
    nu = nu + 1
    local r = c.custom[nu]
    if not r or r.m ~= m or r.fwd ~= f or r.bwd ~= bw then return nil, "a module's custom forward was replaced" end
  end
  local mods = m._modules
  if mods then
    for _, e in ipairs(mods) do
      nc, nu = walk(e.module, c, seen, stamp, nc, nu)
      if not nc then return nil, nu end
    end
  end
  local hidden = m._hidden
  if hidden then
    for _, h in ipairs(hidden) do
      nc, nu = walk(h, c, seen, stamp, nc, nu)
      if not nc then return nil, nu end
    end
  end
  return nc, nu
end

-- The class forward/backward functions are those of the recording: nil or
-- the reason (a few dozen compares: the mode check).
function RS:_check_classes()
  local cl = self.contract.classes
  for i = 1, #cl do
    local k = cl[i]
    if k.cls.forward ~= k.fwd or k.cls.backward ~= k.bwd then
      return "forward/backward of class " .. tostring(k.cls.__name) .. " replaced"
    end
  end
  return nil
end

-- The Lua side of a full check: the module tree, the custom overrides and
-- the class functions are as recorded. nil or the reason.
function RS:_check_tree()
  local c = self.contract
  self.walks = self.walks + 1
  local nc, nu = walk(self.model, c, self.seen, self.walks, 0, 0)
  if not nc then return nu end
  if nc ~= #c.cmods then return "the module tree changed" end
  if nu ~= #c.custom then return "a module's custom forward was replaced" end
  c.edits = Module.edits.n
  return self:_check_classes()
end

-- Guard slot 1 of a contract that never takes the cheap path.
local function moved() return true end

-- The cheap path's recorded values (self.guard; read by RS:run and
-- RS:_check): [1] the refs' guard closure (nothing: unchanged; true:
-- something moved; or `moved`), [2] the clipping policy table, [3] true
-- while the policy objects were not reassigned, [4..7] its max_norm, value,
-- fn and capture; [8] true after a switch of the model's mode at the root
-- (RS:mode_switched): the next check is counted as a mode check.
function RS:_guard()
  local c = self.contract
  local g1 = (c.epoch and not c.always_full) and self.refs:guard() or moved
  self.guard = { g1, c.clip, true, c.max_norm, c.value, c.fn, c.capture, false }
end

-- true when the cheap path answers "unchanged" (RS:run has it inline:
-- keep the two conditions the same).
function RS:_cheap()
  local g, clip = self.guard, self.clip
  return not (g[1]() or clip ~= g[2] or not g[3] or clip.max_norm ~= g[4] or clip.value ~= g[5] or clip.fn ~= g[6]
    or (clip.capture_gradient_norm and true or false) ~= g[7])
end

-- nil when the recording may replay, else the reason. Second result: what
-- ran besides the cheap path: nil, "mode" or "full" (counted in
-- self.mode_checks / self.full_checks; "mode" also for the first check
-- after a switch of the model's mode, answered by the cheap path).
function RS:_check()
  local g = self.guard
  local why, kind
  if not RS._cheap(self) then why, kind = RS._check_moved(self) end
  if g[8] then
    g[8] = false
    if kind == nil then
      self.mode_checks = self.mode_checks + 1
      kind = "mode"
    end
  end
  return why, kind
end

--- Called by Model:train/eval when the model's mode changed (validation
-- around each epoch boundary): the class forward/backward functions are
-- compared (the modes need nothing: counted exactly); returns the reason
-- when one was replaced (the model then retires its recordings through
-- bump_version), else nil; the next check counts as a mode check.
function RS:mode_switched()
  local g = self.guard
  if not g then return nil end
  g[8] = true
  return self:_check_classes()
end

-- Count a check that did more than the cheap path; returns why, kind.
function RS:_counted(why, kind)
  if kind == "full" then
    self.full_checks = self.full_checks + 1
  elseif kind == "mode" then
    self.mode_checks = self.mode_checks + 1
  end
  return why, kind
end

-- The slow path (see above): something the cheap path watches moved, or
-- the contract never takes the cheap path.
function RS:_check_moved()
  local c, model, clip = self.contract, self.model, self.clip
  if clip ~= c.clip or clip.max_norm ~= c.max_norm or clip.value ~= c.value or clip.fn ~= c.fn
    or (clip.capture_gradient_norm and true or false) ~= c.capture then
    return "clipping policy changed"
  end
  if self.scaler ~= c.scaler then return "precision policy changed" end
  if self.ema ~= c.ema then return "EMA replaced" end
  if self.ctx ~= c.ctx then return "the context (stream) changed" end
  self.guard[3] = true -- the policy objects are the recorded ones
  local full = c.always_full
  local why, params, modes, epoch = self.refs:check(full)
  local mode_moved = c.has_mv and model:mode_version() ~= c.mode_version
  local kind = (full or params or Module.edits.n ~= c.edits) and "full"
    or ((mode_moved or modes or epoch) and "mode" or nil)
  if c.has_cv and model:contract_version() ~= c.model_version then
    return self:_counted(model._contract_reason or "model contract version moved", kind)
  end
  if mode_moved and model.training ~= c.training then
    return self:_counted("model mode " .. (c.training and "train -> eval" or "eval -> train"), kind)
  end
  if why then return self:_counted(why, kind) end
  if mode_moved then c.mode_version = model:mode_version() end
  if kind == "full" then return self:_counted(self:_check_tree(), "full") end
  if mode_moved then return self:_counted(self:_check_classes(), "mode") end
  -- nothing of this recording moved (the epoch moved for something else)
  return self:_counted(nil, kind)
end

-- ---------------------------------------------------------- lifecycle

-- Drop the graphs and references of the current recording (not a
-- retirement: release_recording / release / failure paths use it too).
function RS:_drop()
  self:_pipe_drop()
  for k, g in pairs(self.graphs) do
    pcall(g.free, g)
    self.graphs[k] = nil
  end
  self.fb_keeps = false
  if self.refs then pcall(self.refs.free, self.refs) end
  self.refs, self.contract, self.guard, self.cmods, self.buffers = nil, nil, nil, nil, nil
  if self.model._recordings then self.model._recordings[self] = nil end
end

--- step:retire(reason) — drop the recording. The first retirement of a
-- fit re-records after a new warm-up; the second keeps the eager route for
-- the rest of the fit.
function RS:retire(reason)
  reason = reason or "retired by the caller"
  self:_drop()
  self.retirements = self.retirements + 1
  self.last_retire_reason = reason
  self.calls, self.opt_warm = 0, 0
  if self.route ~= "eager" then
    self.policy = clip_policy(self.clip)
    self.capture_refused = nil
    self.route = self:_clip_route()
  end
  if self.retirements >= 2 and self.route ~= "eager" then
    self.route, self.eager_reason = "eager", "second contract drift: " .. reason
  end
  self.log(string.format("recorded step: retired (%s)%s", reason,
    self.route == "eager" and "; eager route for the rest of the fit" or "; will re-record"))
  self:_say()
end

--- Release the recording because its model was copied (Model:release_recordings).
function RS:release_recording(reason)
  self:_drop()
  self.last_release_reason = reason
  self.calls, self.opt_warm = 0, 0
end

-- A failure while warming up or recording: eager route, nothing recorded
-- kept, the original error re-raised unchanged.
function RS:_fail(err, phase)
  -- the open captures end first: the drop queues work (RS:join)
  self:_pipe_discard()
  pcall(function() lucid.graph.capture_discard(self.ctx) end)
  pcall(self._drop, self)
  self.route = "eager"
  self.eager_reason = phase .. " failed: " .. tostring(err)
  pcall(self._say, self)
  error(err, 0)
end

-- After the first recording of a model's step: what it baked in (the
-- snapshot, the C reference set, the cheap path's guard), and the model's
-- list of live recordings (Model:release_recordings). b: the eager step's
-- buffers for n == batch; phase: for the failure's message.
function RS:_contract(b, phase)
  local model = self.model
  local ok, err = pcall(function()
    self:_snapshot(b)
    local refs = self.recorder.refs(model.params, self.cmods)
    self.refs = refs
    refs:watch(self.ema.block, "ema") -- EMA decay/tau: compared in C
    self:_guard()
  end)
  if not ok then self:_fail(err, phase) end
  model._recordings = model._recordings or setmetatable({}, { __mode = "k" })
  model._recordings[self] = true
end

-- Record segment `name` (fn queues its work; precast, continue: see
-- R.record) on `lane` (default the step itself; the pipelined route's lane
-- B records on its own context into its own graphs) and run it once.
function RS:_record(name, fn, precast, lane, continue)
  lane = lane or self
  -- a clean parameter block: no upload (from host memory the host keeps
  -- rewriting) ends up inside a graph
  local ok, g = pcall(self.optimizer.upload, self.optimizer)
  if ok then ok, g = pcall(self.recorder.record, lane.ctx, fn, precast, continue) end
  if not ok then self:_fail(g, "recording " .. name .. (lane == self and "" or " (lane B)")) end
  lane.graphs[name] = g
  self.recorded = self.recorded + 1
  g:launch()
end

function RS:_launch(name)
  self.graphs[name]:launch()
end

pipeline.install(RS)

-- ------------------------------------------------------------------ run

--- step:run(batch, do_opt): one training step (see the file comment).
function RS:run(batch, do_opt)
  local e = self.eager
  local clip = self.clip
  e.clip = clip -- the eager calls (short batch, eager route) follow step.clip too
  if self.route == "eager" or batch.n ~= self.batch then
    -- eager route, or a short last batch (its own buffers and loss plan)
    if not self.pipe or self.route == "eager" then return e:run(batch, do_opt) end
    self:join() -- after lane B's last step, and lane B's next after it
    e:run(batch, do_opt)
    return self:handoff()
  end
  self.calls = self.calls + 1
  if self.calls <= self.warmup then
    return self:_run_warm(batch, do_opt)
  end
  local replay = self.graphs.fb ~= nil or self.graphs.b ~= nil
  if replay then
    local clock = self.recorder.clock
    local t0 = clock()
    -- the cheap path of RS:_check, inline (a call would cost more than the
    -- check: the check runs once per step, with cold caches, mostly
    -- interpreted; see "contract" above)
    local g = self.guard
    local why, kind
    if g[1]() or clip ~= g[2] or not g[3] or clip.max_norm ~= g[4] or clip.value ~= g[5] or clip.fn ~= g[6]
      or (clip.capture_gradient_norm and true or false) ~= g[7] then
      why, kind = RS._check_moved(self)
    end
    local dt = clock() - t0
    if g[8] then -- the first check after a switch of the model's mode (RS:mode_switched)
      g[8] = false
      if kind == nil then
        self.mode_checks = self.mode_checks + 1
        kind = "mode"
      end
    end
    -- the cheap path, the checks after a mode round trip (validation's
    -- eval/train at each epoch boundary: the cheap path too, normally) and
    -- the full checks are timed apart; stats() has their mean per replay too
    if kind == nil then
      self.check_s, self.checks = self.check_s + dt, self.checks + 1
    elseif kind == "mode" then
      self.mode_check_s = self.mode_check_s + dt -- counted above or by _check_moved
    else
      self.full_check_s = self.full_check_s + dt
    end
    if why then return self:_retire_run(why, batch, do_opt) end
  end
  if self.pipe then return self:_pipe_run(batch, do_opt, replay) end
  return self:_run_one(batch, do_opt, replay)
end

-- The one-lane recorded route's call after the contract check (RS:run).
function RS:_run_one(batch, do_opt, replay)
  local e = self.eager
  if not self:_stage(batch) then
    if replay then return self:_retire_run("input shapes changed", batch, do_opt) end
    self.calls = 1 -- not recorded yet: warm up again with the new shapes
    return self:_run_warm(batch, do_opt)
  end
  local model = self.model
  if replay and model.output ~= self.out_seen then
    -- an eager forward ran since the last replay (short batch, validation,
    -- a user's own call): give the modules their recorded buffers back
    self.restored = self.restored + self.refs:restore()
  end
  local b = e:_bufs(self.batch)
  self:_h2d(b)
  -- the FB graph reads the conv weight shadows as they are (RS:_prepare casts)
  self:_prepare(b, replay and self.fb_keeps)
  if replay then
    -- the host time of the FB launch (the driver's cudaGraphLaunch): a
    -- diagnostic for replays that start late after their input kernel
    local clock = self.recorder.clock
    local t0 = clock()
    self:_launch("fb")
    local dt = clock() - t0
    self.launch_s, self.launch_n = self.launch_s + dt, self.launch_n + 1
    if dt > self.launch_max_s then self.launch_max_s = dt end
    self.replays = self.replays + 1
  else
    local precast = not self.graph_wcast and function() model:cast_weights(b.x) end or nil
    self:_record("fb", function() self:_fb(b) end, precast)
    local fb = self.graphs.fb
    self.fb_keeps = precast ~= nil and fb.keeps_shadows ~= nil and fb:keeps_shadows() or false
    self:_contract(b, "recording fb")
  end
  -- the targets may be replaced now (a replay with fb_event recorded
  -- ev_fb itself, after its loss)
  if self.prefetch and not (replay and self.fb_event) then self.ev_fb:record() end
  -- Model:forward sets model.output to a new table on every call: the
  -- replay of a real graph does not, the fake recorder's does (it runs the
  -- segment again), hence read after the launch
  self.out_seen = model.output
  if do_opt then self:_opt(true) end
  self:_count(b, do_opt)
end

-- RS:run runs interpreted, always: LuaJIT would start traces at its C
-- calls (clock, the guard) and record them inside the timed check, where
-- the recording (tens to hundreds of microseconds, then an abort on the
-- calls that follow) would land on a handful of checks of every fit; its
-- callees compile as usual.
if jit then jit.off(RS.run) end

-- A retirement seen before a replay: retire, then run this call on the
-- route the retirement left (a new warm-up, or eager after a second drift).
function RS:_retire_run(why, batch, do_opt)
  self:retire(why)
  if why == "input shapes changed" then self:_reshape(batch) end
  if self.route == "eager" then return self:run(batch, do_opt) end
  self.calls = 1
  return self:_run_warm(batch, do_opt)
end

-- A warm-up call: the recorded route's segments, eagerly.
function RS:_run_warm(batch, do_opt)
  local b
  self:join()
  local ok, err = pcall(function()
    if not self:_stage(batch) then -- new input shapes before anything was recorded
      self:_reshape(batch)
      assert(self:_stage(batch), "recorded step: staging refused the batch after reshaping")
    end
    b = self.eager:_bufs(self.batch)
    self:_h2d(b)
    self:_prepare(b)
    self:_fb(b)
    if self.prefetch then self.ev_fb:record() end
    if do_opt then self:_opt(false) end
  end)
  if not ok then self:_fail(err, "warm-up") end
  self:handoff()
  self:_count(b, do_opt)
end

-- The optimizer segment. Route "recorded clip": recorded (graph "opt") once
-- it has been warmed up eagerly at least once, then replayed after an eager
-- upload of the parameter block. Route "eager clip": eager, the same calls
-- (see the file comment). Either way the engine calls are those of the
-- eager step's Step:_optimizer, in the same order.
function RS:_opt(replay)
  if not replay or self.opt_warm < 1 or self.route ~= "recorded clip" then
    -- eager: opt:step_fused uploads pending hyperparameter edits itself
    -- (through pageable memory outside a capture: no race with the host)
    self:_optimizer()
    self.opt_warm = self.opt_warm + 1
    return
  end
  local opt = self.optimizer
  opt:upload() -- staging -> device block, eagerly: the schedule moves freely
  if not self.ev_up then self.ev_up = self.recorder.event(self.ctx) end
  self.ev_up:record()
  if self.graphs.opt then
    self:_launch("opt")
    self.replays = self.replays + 1
  else
    self:_record("opt", function() self:_optimizer() end)
    -- what the recording baked in besides the FB contract: a MuSGD step
    -- keeps the Newton-Schulz GEMM precision (in.ns_bf16, read by the host
    -- when the step is enqueued) of its recording (compared in refs:check)
    if self.refs and opt.name == "MuSGD" then self.refs:watch(opt.block, "ns_bf16") end
  end
  -- the host may write the next step's hyperparameters into the staging
  -- copy once this step's upload has been read
  self.ev_up:synchronize()
end

-- ---------------------------------------------------- eager-step interface

function RS:reset_running()
  self:join()
  self.eager:reset_running()
end
function RS:running_losses()
  self:join()
  return self.eager:running_losses()
end
function RS:predict(vb)
  self:join()
  return self.eager:predict(vb)
end
function RS:val_loss(o, vb, n) return self.eager:val_loss(o, vb, n) end
function RS:val_losses() return self.eager:val_losses() end

--- Counters and timings (goes into the fit results as results.step).
-- contract_checks / contract_check_us: replays answered by the cheap path
-- and their mean host time; mode_checks / mode_check_us: the first check
-- after each switch of the model's mode (validation's round trip: the
-- cheap path, normally) and the slow checks that found only another
-- model's change or a mode out of place; full_checks / full_check_us: full
-- checks; contract_us_per_replay: the mean over all three (the per-step
-- host cost of the contract); fb_launch_us / fb_launch_us_max: the mean and
-- the largest host time of the FB graph launch call (RS:run), microseconds;
-- stage_wait_us: the mean host wait for a staging set's last upload (RS:_stage),
-- microseconds per call; fb_keeps_shadows / precasts: the FB graph kept the
-- conv weight shadows, and the casts called before its replays.
function RS:stats()
  local e = self.eager
  local nall = self.checks + self.mode_checks + self.full_checks
  -- the staging waits and the casts of both lanes of a pipelined step
  -- (lane B's: the lanes dropped so far and the current one)
  local p = self.pipe
  local L = p and p.lane_b
  local h = p and p.hist or { stage_wait_s = 0, stage_waits = 0, precasts = 0 }
  local sw_s = self.stage_wait_s + h.stage_wait_s + (L and L.stage_wait_s or 0)
  local sw_n = self.stage_waits + h.stage_waits + (L and L.stage_waits or 0)
  return {
    steps = e.steps, opt_steps = e.opt_steps, route = self.route, eager_reason = self.eager_reason,
    input_prefetch = self.prefetch, fb_event = self.fb_event,
    -- the pipelined route (step_pipeline.lua): on, why refused, lane B's replays
    pipelined = self.pipe ~= nil and self.route ~= "eager", pipeline_refused = self.pipeline_refused,
    lane_b_replays = self.pipe and self.pipe.replays_b or nil,
    -- the peaks of lane B's contexts (memory_stats; the largest over the
    -- lanes made so far: a dropped lane's context is collected first)
    lane_b_memory = p and self:_lane_b_memory() or nil,
    fb_keeps_shadows = (p and self.f_keeps) or self.fb_keeps,
    precasts = self.precasts + h.precasts + (L and L.precasts or 0),
    recorded = self.recorded, replays = self.replays, retirements = self.retirements,
    last_retire_reason = self.last_retire_reason, capture_refused = self.capture_refused,
    contract_checks = self.checks, mode_checks = self.mode_checks, full_checks = self.full_checks,
    buffers_restored = self.restored,
    contract_check_us = self.checks > 0 and 1e6 * self.check_s / self.checks or nil,
    mode_check_us = self.mode_checks > 0 and 1e6 * self.mode_check_s / self.mode_checks or nil,
    full_check_us = self.full_checks > 0 and 1e6 * self.full_check_s / self.full_checks or nil,
    contract_us_per_replay = nall > 0 and 1e6 * (self.check_s + self.mode_check_s + self.full_check_s) / nall or nil,
    fb_launch_us = self.launch_n > 0 and 1e6 * self.launch_s / self.launch_n or nil,
    fb_launch_us_max = self.launch_n > 0 and 1e6 * self.launch_max_s or nil,
    -- mean host wait for the upload that last read a staging set (the device
    -- pacing the host: near 0 when the host is the slower side)
    stage_wait_us = sw_n > 0 and 1e6 * sw_s / sw_n or nil,
  }
end

--- Release everything: graphs, references, staging, events, the eager
-- step's buffers. Safe to call twice.
function RS:release()
  self:_drop()
  for _, k in ipairs({ "ev_up", "ev_prep", "ev_fb", "evF", "evB" }) do
    if self[k] then pcall(self[k].free, self[k]); self[k] = nil end
  end
  if self.stage then self:_free_stages() end
  if not self.released then
    self.released = true
    self.eager:release()
  end
end

return M
