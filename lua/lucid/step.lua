--[[
lucid.step — one training step of a pose model, in segments: input copy
(u8 images -> a device u8 buffer, then lucid.input_prepare: HSV with the
batch's gains when device_hsv, /255, in the activation dtype; targets ->
device), network forward + loss + backward, gradient clipping, optimizer
update, EMA update.

  local step = require("lucid.step").new{model=, optimizer=, ema=, scaler=,
      ctx=, batch=B, imgsz=S, max_gt=G, nc=1, nkpt=17, act_dtype="bf16",
      gains={box=7.5, ...}, clip={max_norm=10}, accumulate=16,
      device_hsv=false}   -- true: the loader left HSV to the device
                          -- (hsv_on_cpu = false): batch.hsv is applied here
  step:run(batch, do_optimizer_step)
  local losses = step:running_losses()  -- means since reset_running (syncs)

This is the eager route. Every buffer it touches (inputs, targets, loss
outputs and gradients, module outputs) is allocated once per batch shape
and reused, which is what a recorded route needs (see docs/DECISIONS.md).
The short last batch of an epoch (n < B images) runs with its own buffers
and loss plan, exactly like the reference trains on it (BatchNorm
statistics over the n images).
]]
local lucid = require "lucid"

local Step = {}
Step.__index = Step
local M = {}

--- M.lane_backward(ctx, model, x, grads): model:backward(x, grads) with the
-- parameter-gradient lane of ctx on (ctx:grad_lane, lucid_ctx_set_grad_lane
-- in engine/lucid.h): on a CUDA device the Conv2d weight and bias gradients
-- run on a second stream and overlap the input-gradient chain; the lane is
-- joined (turned off) before this returns, also when the backward raises
-- (the error is raised again). Bitwise the same gradients as without it.
function M.lane_backward(ctx, model, x, grads)
  ctx:grad_lane(true)
  local ok, err = pcall(model.backward, model, x, grads)
  ctx:grad_lane(false)
  if not ok then error(err, 0) end
end
local lane_backward = M.lane_backward

--- Build a step (see the file comment for the fields of o).
function M.new(o)
  local self = setmetatable({}, Step)
  for k, v in pairs(o) do self[k] = v end
  self.device = o.ctx:device()
  self.bufs = {}   -- per batch size n: {x, tg, crit, scale}
  self.running = lucid.zeros({ 5 }, { ctx = o.ctx, dtype = "f32" })
  self.nrun = 0
  self.steps, self.opt_steps = 0, 0
  self.recorded_losses = o.record and {} or nil
  -- keep_grads: a second step object over the same gradients (the
  -- pipelined route's lane on a twin model) must not clear them
  if not o.keep_grads then self.optimizer:zero_grad() end
  return self
end

-- Device target buffers and a loss plan for n images with G instance slots.
function Step:_targets_and_crit(n, G)
  local ctx, K = self.ctx, self.nkpt
  local on = { ctx = ctx }
  local tg = {
    cls = lucid.empty({ n, G }, on), boxes = lucid.empty({ n, G, 4 }, on),
    kpts = lucid.empty({ n, G, K, 3 }, on), mask = lucid.empty({ n, G }, { ctx = ctx, dtype = "u8" }),
  }
  local gains = self.gains or {}
  local crit = lucid.PoseLoss{ batch = n, imgsz = self.imgsz, max_gt = G, nc = self.nc, kpt_shape = { K, 3 },
    ctx = ctx, box = gains.box, cls = gains.cls, dfl = gains.dfl, pose = gains.pose, kobj = gains.kobj }
  return tg, crit
end

-- Buffers for batches of n images (created on first use).
function Step:_bufs(n)
  local b = self.bufs[n]
  if b then return b end
  local ctx, S = self.ctx, self.imgsz
  b = { x = lucid.empty({ n, 3, S, S }, { ctx = ctx, dtype = self.act_dtype }) }
  b.tg, b.crit = self:_targets_and_crit(n, self.max_gt)
  if self.scaler then b.scale = lucid.ones({ 1 }, { ctx = ctx }) end
  self.bufs[n] = b
  return b
end

-- Copy a loader batch (CPU, pinned) into the device buffers of n images.
function Step:_inputs(batch, n)
  local b = self:_bufs(n)
  local B = batch.images:size(1)
  local function part(t) return n == B and t or t:narrow(1, 1, n) end
  local images, hsv = part(batch.images), self.device_hsv and part(batch.hsv) or nil
  if self.device ~= "cpu" then
    -- u8 images (and HSV gains) to persistent device buffers, then one kernel
    if not b.img then
      b.img = lucid.empty(images:shape(), { ctx = self.ctx, dtype = "u8" })
      if self.device_hsv then b.hsv = lucid.empty({ n, 3 }, { ctx = self.ctx }) end
    end
    b.img:copy_(images)
    images = b.img
    if hsv then
      b.hsv:copy_(hsv)
      hsv = b.hsv
    end
  end
  lucid.input_prepare(b.x, images, hsv)
  b.tg.cls:copy_(part(batch.cls))
  b.tg.boxes:copy_(part(batch.boxes))
  b.tg.kpts:copy_(part(batch.kpts))
  b.tg.mask:copy_(part(batch.mask))
  if self.device ~= "cpu" and lucid.graph and lucid.graph.Event then
    -- the copies read the loader's pinned slot when the stream reaches
    -- them; run() waits on this event before it returns, so the loader can
    -- refill that slot only once the copies are done
    self.ev_in = self.ev_in or lucid.graph.Event(self.ctx)
    self.ev_in:record()
  end
  return b
end

--- step:run(batch, do_opt): forward, loss, backward; when do_opt, also
-- unscale (fp16), clip, optimizer step, zero_grad and EMA update.
function Step:run(batch, do_opt)
  local n = batch.n
  local b = self:_inputs(batch, n)
  local model = self.model
  local out = model:forward(b.x)
  local _, items = b.crit:forward(out.boxes, out.scores, out.kpts, b.tg)
  local gs
  if self.scaler then
    b.scale:fill_(1)
    self.scaler:scale(b.scale)
    gs = b.scale
  end
  local gb, gc, gk = b.crit:backward(gs)
  lane_backward(self.ctx, model, b.x, { boxes = gb, scores = gc, kpts = gk })
  self.running:add_(items)
  self.nrun = self.nrun + 1
  if self.recorded_losses then self.recorded_losses[#self.recorded_losses + 1] = items:clone() end
  self.steps = self.steps + 1
  if do_opt then self:optimizer_step() end
  if self.ev_in then self.ev_in:synchronize() end
end

--- The optimizer calls of one step, without the step counter (the
-- recorded step, lua/lucid/recorded_step.lua, issues exactly these calls,
-- eagerly or inside its OPT graph, so both routes run the same kernels in
-- the same order): one fused engine call, opt:step_fused (lua/lua_optim.c ->
-- lucid_optim_step_fused), for
--   unscale (fp16 GradScaler) -> clip_grad_norm(clip.max_norm) ->
--   clip_grad_value(clip.value) -> update (skipped on the device on
--   found_inf) -> scaler update -> EMA of the parameters and of the f32 BN
--   buffers (one d) -> zero_grad,
-- bitwise equal to those separate calls (engine/train/optim.h). A user's
-- clip.fn must see the unscaled gradients between the unscale and the
-- clips: then the unscale runs first as its own call (scaler:unscale_),
-- clip.fn(opt) after it, and the fused call does the rest (it does not
-- unscale twice). The pre-clip norm, non-finite norms and skipped fp16
-- steps stay in the block (opt:last_norm(), opt.block:state()).
-- clip: the clipping policy {max_norm=, value=, fn=} (default self.clip).
function Step:_optimizer(clip)
  local opt, scaler = self.optimizer, self.scaler
  clip = clip or self.clip or {}
  if clip.fn then
    if scaler then scaler:unscale_(opt) end
    clip.fn(opt)
  end
  opt:step_fused{ scaler = scaler, max_norm = clip.max_norm, clip_value = clip.value, ema = self.ema,
    zero_grad = true }
end

--- The optimizer segment: unscale (fp16), clip, update, scaler update,
-- EMA, zero_grad (Step:_optimizer), counted in opt_steps.
function Step:optimizer_step()
  self:_optimizer()
  self.opt_steps = self.opt_steps + 1
end

function Step:reset_running()
  self.running:zero_()
  self.nrun = 0
end

--- Mean losses since reset_running, as {box, pose, kobj, cls, dfl}
-- (reads the device: synchronises).
function Step:running_losses()
  local t = self.running:to("cpu"):totable()
  local n = math.max(self.nrun, 1)
  return { t[1] / n, t[2] / n, t[3] / n, t[4] / n, t[5] / n }
end

--- Forward a validation batch (the model is in eval mode with the EMA
-- weights); returns the head outputs {boxes, scores, kpts} on the device.
function Step:predict(vb)
  local n = vb.images:size(1)
  local key = "val" .. n
  local x = self.bufs[key]
  if not x then
    x = lucid.empty({ n, 3, self.imgsz, self.imgsz }, { ctx = self.ctx, dtype = self.act_dtype })
    self.bufs[key] = x
    if self.device ~= "cpu" then
      self.bufs[key .. "u8"] = lucid.empty({ n, 3, self.imgsz, self.imgsz }, { ctx = self.ctx, dtype = "u8" })
    end
  end
  local images = vb.images -- validation: no HSV
  local img = self.bufs[key .. "u8"]
  if img then
    img:copy_(images)
    images = img
  end
  lucid.input_prepare(x, images)
  return self.model:forward(x)
end

--- Validation loss of one batch (eval-mode outputs o of step:predict on the
-- n real images of vb), accumulated on the device until val_losses().
function Step:val_loss(o, vb, n)
  local B = vb.images:size(1)
  local key = "valloss" .. n
  local b = self.bufs[key]
  if not b then
    b = {}
    b.tg, b.crit = self:_targets_and_crit(n, vb.cls:size(2))
    self.bufs[key] = b
  end
  local function part(t) return n == B and t or t:narrow(1, 1, n) end
  for _, k in ipairs({ "cls", "boxes", "kpts", "mask" }) do b.tg[k]:copy_(part(vb[k])) end
  local _, items = b.crit:forward(part(o.boxes), part(o.scores), part(o.kpts), b.tg)
  if not self.val_running then self.val_running = lucid.zeros({ 5 }, { ctx = self.ctx, dtype = "f32" }) end
  self.val_running:add_(items)
  self.val_n = (self.val_n or 0) + 1
end

--- Mean validation losses since the last call (syncs), or nil.
function Step:val_losses()
  if not self.val_running or (self.val_n or 0) == 0 then return nil end
  local t = self.val_running:to("cpu"):totable()
  local n = self.val_n
  self.val_running:zero_()
  self.val_n = 0
  return { t[1] / n, t[2] / n, t[3] / n, t[4] / n, t[5] / n }
end

--- join() / handoff(): no-ops on the eager route (the recorded step's
-- pipelined route orders its two contexts with them; step_pipeline.lua).
function Step:join() end
function Step:handoff() end

function Step:stats()
  return { steps = self.steps, opt_steps = self.opt_steps, route = "eager" }
end

--- Drop every buffer (the end of a fit).
function Step:release()
  for _, b in pairs(self.bufs) do
    if type(b) == "table" then
      if b.x then b.x:free() end
      if b.img then b.img:free() end
      if b.hsv then b.hsv:free() end
      for _, t in pairs(b.tg) do t:free() end
      b.crit:free()
      if b.scale then b.scale:free() end
    else
      b:free()
    end
  end
  self.bufs = {}
  if self.ev_in then self.ev_in:free(); self.ev_in = nil end
  self.running:free()
  if self.val_running then self.val_running:free() end
end

return M
