--[[
bench/bench_bnsilu.lua — the BatchNorm2d + SiLU of every Conv block of
YOLO11n-pose (batch 4, 640x640; bf16 on a GPU, f32 on the CPU), training
mode, one step's worth: forward then backward of all bn -> act pairs in
network order, separate calls (batchnorm2d, silu; silu backward, batchnorm2d
backward) against the fused calls (lucid.nn.prim bn_silu_forward/backward).
The inputs are each block's own conv output from one forward of the model;
the device is synchronised around each pass only (launches overlap as in a
step). Median over timed iterations after warm-up. Run by `make bench`.
A third line times the fused calls of the pairs whose channels have
several parts (N*H*W > 8192: at batch 4, 640 px, the 80x80, 160x160 and
320x320 layers), the calls the cluster route (LUCID_BN_CLUSTER, read once
per process: A/B in two processes, e.g. `LUCID_BN_CLUSTER=0 luajit
bench/bench_bnsilu.lua`), the cooperative route (LUCID_BN_COOP) and the
two-launch route share; the tag names those switches as set.
  luajit bench/bench_bnsilu.lua [device=auto] [batch=4] [imgsz=640] [iters=30]
]]
local lucid = require "lucid"
local P = require "lucid.nn.prim"
local util = require "bench.util"
local cfg, ctx, dev, dt, model = util.setup("bench_bnsilu", arg, "run with device=cpu imgsz=128 for the CPU")
if not cfg then return end
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

local function fused_of(list)
  return function()
    for _, p in ipairs(list) do P.bn_silu_forward(p.bn, p.act, p.x) end
    for i = #list, 1, -1 do
      local p = list[i]
      P.bn_silu_backward(p.bn, p.act, p.x, p.gy)
    end
  end
end
local fused = fused_of(pairs_)

-- the pairs whose channels have several parts (cuda/nn_norm.cuh: N*H*W > 8192)
local multi, shapes = {}, {}
for _, p in ipairs(pairs_) do
  local s = p.x:shape()
  if s[1] * s[3] * s[4] > 8192 then
    multi[#multi + 1] = p
    shapes[#shapes + 1] = string.format("%dx%dx%dx%d", s[1], s[2], s[3], s[4])
  end
end

local ms, s_lo, s_hi = util.measure(ctx, separate, cfg.warmup, cfg.iters)
local mf, f_lo, f_hi = util.measure(ctx, fused, cfg.warmup, cfg.iters)
local function env(k) return os.getenv(k) or "unset" end
local tag = string.format("[%s, %s, batch %d, %dpx, %d pairs; LUCID_BN_CLUSTER=%s LUCID_BN_COOP=%s]",
  dev, dt, B, S, #pairs_, env("LUCID_BN_CLUSTER"), env("LUCID_BN_COOP"))
print(string.format("lucid %-30s %9.3f ms  (min %.3f, max %.3f)  %s", "bn+silu fwd+bwd, separate", ms, s_lo, s_hi, tag))
print(string.format("lucid %-30s %9.3f ms  (min %.3f, max %.3f)  %s", "bn+silu fwd+bwd, fused", mf, f_lo, f_hi, tag))
print(string.format("lucid %-30s %9.2fx", "fused speed-up", ms / mf))
if #multi > 0 then
  local mm, m_lo, m_hi = util.measure(ctx, fused_of(multi), cfg.warmup, cfg.iters)
  print(string.format("lucid %-30s %9.3f ms  (min %.3f, max %.3f)  [%d pairs: %s]", "bn+silu multi-part, fused",
    mm, m_lo, m_hi, #multi, table.concat(shapes, " ")))
end
