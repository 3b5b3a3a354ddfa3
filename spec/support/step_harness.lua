-- step_harness.lua — builds matched (model, optimizer, EMA, scaler, step)
-- stacks for the recorded-step specs (spec/step_spec.lua on the CPU with a
-- fake recorder, spec/step_gpu_spec.lua on CUDA), synthetic batches, and
-- byte-exact comparisons of every tensor of a stack.
local lucid = require "lucid"
local step_mod = require "lucid.step"
local RS = require "lucid.recorded_step"

local H = {}

H.G, H.K = 8, 17
H.force_act = nil -- an activation dtype for every stack (dry runs of the GPU spec on the CPU)

--- A synthetic loader batch of b images (n of them real), deterministic in
-- `seed`: u8 images, boxes/keypoints in pixels, 1..3 instances per image,
-- max_gt G (default H.G).
function H.batch(b, S, seed, n, G)
  n = n or b
  local K = H.K
  G = G or H.G
  local images = lucid.zeros({ b, 3, S, S }, { device = "cpu", dtype = "u8" })
  local cls = lucid.zeros({ b, G }, { device = "cpu" })
  local boxes = lucid.zeros({ b, G, 4 }, { device = "cpu" })
  local kpts = lucid.zeros({ b, G, K, 3 }, { device = "cpu" })
  local mask = lucid.zeros({ b, G }, { device = "cpu", dtype = "u8" })
  -- a cheap LCG so the bytes depend on seed only
  local state = seed * 2654435761 % 4294967296
  local function rnd()
    state = (1103515245 * state + 12345) % 2147483648
    return state / 2147483648
  end
  local img = {}
  for i = 1, b * 3 * S * S do img[i] = math.floor(rnd() * 256) end
  images:copy_(lucid.tensor(img, { dtype = "f32" }):view({ b, 3, S, S }))
  local bx, kp, mk = {}, {}, {}
  for i = 1, b do
    local m = (i <= n) and (1 + math.floor(rnd() * 3)) or 0
    for g = 1, G do
      local on = g <= m
      mk[#mk + 1] = on and 1 or 0
      local w, h = 8 + rnd() * S / 3, 8 + rnd() * S / 3
      local x1, y1 = rnd() * (S - w), rnd() * (S - h)
      for _, v in ipairs({ x1, y1, x1 + w, y1 + h }) do bx[#bx + 1] = on and v or 0 end
      for _ = 1, K do
        kp[#kp + 1] = on and (x1 + rnd() * w) or 0
        kp[#kp + 1] = on and (y1 + rnd() * h) or 0
        kp[#kp + 1] = on and ((rnd() < 0.7) and 2 or 0) or 0
      end
    end
  end
  boxes:copy_(lucid.tensor(bx):view({ b, G, 4 }))
  kpts:copy_(lucid.tensor(kp):view({ b, G, K, 3 }))
  mask:copy_(lucid.tensor(mk, { dtype = "f32" }):view({ b, G }))
  return { n = n, images = images, cls = cls, boxes = boxes, kpts = kpts, mask = mask, overflow = 0, max_count = 3 }
end

--- A YOLO11n-pose (nc 1, H.K keypoints) on ctx; its trainable flags are
-- remembered for H.reset.
function H.model(ctx)
  local model = require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { H.K, 3 }, ctx = ctx,
    device = ctx:device() }
  local tr = {}
  for i, p in ipairs(model.params:list()) do tr[i] = p.trainable end
  model._h_trainable, model._h_ctx = tr, ctx
  return model
end

--- Put a model back to a saved state: the parameters and buffers of
-- `init` (a model:save file), train mode everywhere, the trainable flags it
-- was built with, zero gradients. (Not for a model whose parameter tensors
-- were replaced: build a new one.)
function H.reset(model, init)
  if init then model:load(init) end
  model:train()
  local tr = model._h_trainable
  for i, p in ipairs(model.params:list()) do
    if p.kind == "param" and tr and p.trainable ~= tr[i] then p.trainable = tr[i] end
  end
  model:zero_grad()
  return model
end

--- A stack (model, optimizer, EMA, scaler, step) on o.ctx, or on a fresh
-- context of `o.device` ("cpu" | "cuda", seed 7). o.model: reuse this
-- model (H.reset with o.init first); o.init: a model:save file loaded into
-- the model (the way stacks sharing one context start from the same
-- weights). o.recorded (use the recorded step), o.recorder (fake recorder),
-- o.precision ("fp32" | "bf16" | "fp16"), o.clip, o.B, o.S, o.G (max_gt),
-- o.warmup, o.input_stages, o.fb_event, o.graph_wcast, o.pipeline, o.trainer (non-nil: Trainer-driven).
function H.stack(o)
  local ctx = o.ctx or (o.model and o.model._h_ctx) or lucid.Context{ device = o.device or "cpu", seed = 7 }
  local model = o.model
  if model then
    H.reset(model, o.init)
  else
    model = H.model(ctx)
    if o.init then model:load(o.init) end
  end
  local opt = lucid.optim.build{ model = model, name = o.optimizer or "SGD", lr0 = 0.01, momentum = 0.9,
    decay = 5e-4, iterations = 100, nc = 1 }
  local ema = lucid.EMA{ model = model, decay = 0.9999, tau = 2000, block = opt }
  local scaler
  if o.precision == "fp16" then scaler = lucid.amp.GradScaler{ optimizer = opt } end
  local act = H.force_act or ({ fp32 = "f32", bf16 = "bf16", fp16 = "f16" })[o.precision or "fp32"]
  local so = { model = model, optimizer = opt, ema = ema, scaler = scaler, ctx = ctx, batch = o.B or 2,
    imgsz = o.S or 64, max_gt = o.G or H.G, nc = 1, nkpt = H.K, act_dtype = act, clip = o.clip or { max_norm = 10.0 },
    accumulate = 1, trainer = o.trainer, record_losses = true, record = true }
  local step
  if o.recorded then
    so.record = nil
    so.warmup = o.warmup or 2
    so.input_stages = o.input_stages
    so.fb_event = o.fb_event
    so.graph_wcast = o.graph_wcast
    so.pipeline = o.pipeline
    so.recorder = o.recorder
    so.log = o.log or function() end
    step = RS.new(so)
  else
    so.record_losses = nil
    step = step_mod.new(so)
  end
  model:train()
  return { ctx = ctx, model = model, opt = opt, ema = ema, scaler = scaler, step = step }
end

--- An eager stack and a recorded one from the same options o (the
-- recorded one also takes the fields of `rec`; its log lines are collected
-- in r.logs). Returns e, r.
function H.pair(o, rec)
  local a = {}
  for k, v in pairs(o or {}) do a[k] = v end
  local e = H.stack(a)
  for k, v in pairs(rec or {}) do a[k] = v end
  a.recorded = true
  local logs = {}
  a.log = a.log or function(l) logs[#logs + 1] = l end
  local r = H.stack(a)
  r.logs = logs
  return e, r
end

--- The same batch through both stacks of a pair.
function H.both(e, r, bt, do_opt)
  e.step:run(bt, do_opt)
  r.step:run(bt, do_opt)
end

--- A plain eager stack follows new input shapes the way the recorded step
-- does after an "input shapes changed" retirement.
function H.reshape(st, S, G)
  RS.reshape_eager(st.step.eager or st.step, S, G)
end

-- A host f64 copy of a tensor (for the difference shown on a mismatch).
local function host(t) return t:to("cpu"):to("f64"):contiguous() end
H.host = host

--- Every tensor of a stack that must match: parameters, gradients,
-- buffers, optimizer state, EMA (params and buffers), and every loss.
function H.state(st)
  local out = {}
  local set = st.model.params
  out.params = set:flat_params()
  out.grads = set:flat_grads()
  for i = 1, set:count() do
    local p = set:get(i)
    if p.kind == "buffer" then out["buf." .. p.name] = p:data() end
  end
  for k, t in pairs(st.opt:state_tensors()) do out["opt." .. k] = t end
  out.ema = st.ema:flat()
  local eb = st.ema:flat("buffers")
  if eb then out.ema_buffers = eb end
  for i, t in ipairs(st.step.recorded_losses or {}) do out["loss" .. i] = t end
  return out
end

--- nil when two tensors hold the same value bytes (lucid.hash_tensor: NaN
-- payloads, signed zeros and dtypes included), else a description.
function H.differs(a, b)
  if a:dtype() ~= b:dtype() then return "dtype " .. a:dtype() .. " vs " .. b:dtype() end
  if a:numel() ~= b:numel() then return string.format("numel %d vs %d", a:numel(), b:numel()) end
  if lucid.hash_tensor(a) == lucid.hash_tensor(b) then return nil end
  local d = (host(a) - host(b)):abs():max():item()
  return string.format("value bytes differ (max |diff| %g)", d)
end

--- Assert two tables of tensors (name -> tensor) hold the same bytes.
function H.same_tensors(sa, sb, what, level)
  local n = 0
  for k, v in pairs(sa) do
    local w = sb[k]
    if not w then error(string.format("%s: %s missing on one route", what or "state", k), level or 2) end
    local why = H.differs(v, w)
    if why then error(string.format("%s: %s differs between the routes: %s", what or "state", k, why), level or 2) end
    n = n + 1
  end
  for k in pairs(sb) do
    if not sa[k] then error(string.format("%s: %s missing on one route", what or "state", k), level or 2) end
  end
  return n
end

--- Assert two stacks hold the same bytes everywhere.
function H.same(a, b, what)
  return H.same_tensors(H.state(a), H.state(b), what, 3)
end

return H
