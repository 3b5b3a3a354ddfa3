--[[
lucid.step — one training step of a pose model, in segments: input copy
(u8 images -> activations on the device, /255; targets -> device), network
forward + loss + backward, gradient clipping, optimizer update, EMA update.

  local step = require("lucid.step").new{model=, optimizer=, ema=, scaler=,
      ctx=, batch=B, imgsz=S, max_gt=G, nc=1, nkpt=17, act_dtype="bf16",
      gains={box=7.5, ...}, clip={max_norm=10}, accumulate=16}
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
  self.optimizer:zero_grad()
  return self
end

-- Buffers for batches of n images (created on first use).
function Step:_bufs(n)
  local b = self.bufs[n]
  if b then return b end
  local ctx, S, G, K = self.ctx, self.imgsz, self.max_gt, self.nkpt
  local on = { ctx = ctx }
  b = {
    x = lucid.empty({ n, 3, S, S }, { ctx = ctx, dtype = self.act_dtype }),
    tg = {
      cls = lucid.empty({ n, G }, on), boxes = lucid.empty({ n, G, 4 }, on),
      kpts = lucid.empty({ n, G, K, 3 }, on), mask = lucid.empty({ n, G }, { ctx = ctx, dtype = "u8" }),
    },
  }
  local gains = self.gains or {}
  b.crit = lucid.PoseLoss{ batch = n, imgsz = S, max_gt = G, nc = self.nc, kpt_shape = { K, 3 }, ctx = ctx,
    box = gains.box, cls = gains.cls, dfl = gains.dfl, pose = gains.pose, kobj = gains.kobj }
  if self.scaler then b.scale = lucid.ones({ 1 }, on) end
  self.bufs[n] = b
  return b
end

-- Copy a loader batch (CPU, pinned) into the device buffers of n images.
function Step:_inputs(batch, n)
  local b = self:_bufs(n)
  local B = batch.images:size(1)
  local function part(t) return n == B and t or t:narrow(1, 1, n) end
  b.x:copy_(part(batch.images))
  b.x:mul_(1 / 255)
  b.tg.cls:copy_(part(batch.cls))
  b.tg.boxes:copy_(part(batch.boxes))
  b.tg.kpts:copy_(part(batch.kpts))
  b.tg.mask:copy_(part(batch.mask))
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
  model:backward(b.x, { boxes = gb, scores = gc, kpts = gk })
  self.running:add_(items)
  self.nrun = self.nrun + 1
  if self.recorded_losses then self.recorded_losses[#self.recorded_losses + 1] = items:clone() end
  self.steps = self.steps + 1
  if do_opt then self:optimizer_step() end
end

--- The optimizer segment: unscale (fp16), clip, update, zero_grad, EMA.
function Step:optimizer_step()
  local opt, scaler = self.optimizer, self.scaler
  if scaler then scaler:unscale_(opt) end
  local clip = self.clip or {}
  if clip.max_norm then lucid.optim.clip_grad_norm(opt, clip.max_norm) end
  if clip.value then lucid.optim.clip_grad_value(opt, clip.value) end
  if scaler then
    scaler:step(opt)
    scaler:update()
  else
    opt:step()
  end
  opt:zero_grad()
  self.ema:update()
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
  end
  x:copy_(vb.images)
  x:mul_(1 / 255)
  return self.model:forward(x)
end

function Step:stats()
  return { steps = self.steps, opt_steps = self.opt_steps, route = "eager" }
end

--- Drop every buffer (the end of a fit).
function Step:release()
  for _, b in pairs(self.bufs) do
    if type(b) == "table" then
      b.x:free()
      for _, t in pairs(b.tg) do t:free() end
      b.crit:free()
      if b.scale then b.scale:free() end
    else
      b:free()
    end
  end
  self.bufs = {}
  self.running:free()
end

return M
