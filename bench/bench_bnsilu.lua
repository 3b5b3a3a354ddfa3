--[[
bench/bench_bnsilu.lua — the BatchNorm2d + SiLU of every Conv block of
YOLO11n-pose (batch 4, 640x640; bf16 on a GPU, f32 on the CPU), training
mode, one step's worth: forward then backward of all bn -> act pairs in
network order, separate calls (batchnorm2d, silu; silu backward, batchnorm2d
backward) against the fused calls (lucid.nn.prim bn_silu_forward/backward).
The inputs are each block's own conv output from one forward of the model;
the device is synchronised around each pass only (launches overlap as in a
step). Median over timed iterations after warm-up. Run by `make bench`.
  luajit bench/bench_bnsilu.lua [device=auto] [batch=4] [imgsz=640] [iters=30]
]]
local lucid = require "lucid"
local recipe = require "lucid.recipe"
local P = require "lucid.nn.prim"
local cfg = recipe.resolve({ device = "auto", batch = 4, imgsz = 640, iters = 30, warmup = 5, dtype = "auto" }, arg)
local ctx = lucid.Context{ device = cfg.device }
local dev = ctx:device()
local gpu = dev:sub(1, 4) == "cuda"
if not gpu and cfg.device == "auto" then
  print("skip bench_bnsilu: no CUDA device (run with device=cpu imgsz=128 for the CPU)")
  return
end
local dt = cfg.dtype == "auto" and (gpu and "bf16" or "f32") or cfg.dtype
local model = require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { 17, 3 }, ctx = ctx, device = dev }
model:train()
local B, S = cfg.batch, cfg.imgsz

-- every Conv block whose bn -> act pair can be fused, with a copy of its
-- conv output (the pair's input) and a random output gradient
P.fuse_bn_silu = false
model:forward(lucid.rand({ B, 3, S, S }, { ctx = ctx, dtype = dt }))
P.fuse_bn_silu = true
local pairs_ = {}
model:apply(function(m)
  if m.bn and m.act and m._a and P.bn_silu_fusable(m.bn, m.act) then
    pairs_[#pairs_ + 1] = { bn = m.bn, act = m.act, x = m._a:clone(),
      gy = lucid.rand(m._a:shape(), { ctx = ctx, dtype = dt }):sub(0.5) }
  end
end)

local function separate()
  for _, p in ipairs(pairs_) do
    local z = p.bn:forward(p.x)
    p.act:forward(z)
    p.z = z
  end
  for i = #pairs_, 1, -1 do
    local p = pairs_[i]
    p.bn:backward(p.x, p.act:backward(p.z, p.gy))
  end
end

local function fused()
  for _, p in ipairs(pairs_) do P.bn_silu_forward(p.bn, p.act, p.x) end
  for i = #pairs_, 1, -1 do
    local p = pairs_[i]
    P.bn_silu_backward(p.bn, p.act, p.x, p.gy)
  end
end

local function measure(fn)
  for _ = 1, cfg.warmup do fn() end
  ctx:synchronize()
  local t = {}
  for i = 1, cfg.iters do
    local t0 = lucid.wall_time()
    fn()
    ctx:synchronize()
    t[i] = (lucid.wall_time() - t0) * 1000
  end
  table.sort(t)
  return t[math.floor((#t + 1) / 2)], t[1], t[#t]
end

local ms, s_lo, s_hi = measure(separate)
local mf, f_lo, f_hi = measure(fused)
local tag = string.format("[%s, %s, batch %d, %dpx, %d pairs]", dev, dt, B, S, #pairs_)
print(string.format("lucid %-30s %9.3f ms  (min %.3f, max %.3f)  %s", "bn+silu fwd+bwd, separate", ms, s_lo, s_hi, tag))
print(string.format("lucid %-30s %9.3f ms  (min %.3f, max %.3f)  %s", "bn+silu fwd+bwd, fused", mf, f_lo, f_hi, tag))
print(string.format("lucid %-30s %9.2fx", "fused speed-up", ms / mf))
