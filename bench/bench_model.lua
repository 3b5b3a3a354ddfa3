--[[
bench/bench_model.lua — forward+backward time of lucid's YOLO11n-pose
network at batch 4, 640x640 (bf16 activations on a GPU, f32 on the CPU),
eager route: median over timed iterations after warm-up, the device
synchronised around each iteration. Run by `make bench`; read it against
bench/bench_model_torch.py from the same run.
  luajit bench/bench_model.lua [device=auto] [batch=4] [imgsz=640] [iters=30]
The backward runs with the parameter-gradient lane as in training
(LUCID_GRAD_LANE=0: without). The engine's environment switches apply; the line names the 1x1 conv route
(LUCID_CONV1X1, cuda/nn_conv_gemm.cuh; default gemm), so an A/B of it is
  luajit bench/bench_model.lua; LUCID_CONV1X1=igemm luajit bench/bench_model.lua
]]
local lucid = require "lucid"
local util = require "bench.util"
local cfg, ctx, dev, dt, model = util.setup("bench_model", arg, "run with device=cpu for the CPU")
if not cfg then return end
local B, S = cfg.batch, cfg.imgsz
local x = lucid.rand({ B, 3, S, S }, { ctx = ctx, dtype = dt })
local out = model:forward(x)
local gb = lucid.rand(out.boxes:shape(), { ctx = ctx, dtype = dt })
local gs = lucid.rand(out.scores:shape(), { ctx = ctx, dtype = dt })
local gk = lucid.rand(out.kpts:shape(), { ctx = ctx, dtype = dt })
-- the backward as the training step runs it: with the parameter-gradient
-- lane (lucid.step's lane_backward; LUCID_GRAD_LANE=0 turns the lane off)
local lane_backward = require("lucid.step").lane_backward
local function iter()
  local o = model:forward(x)
  lane_backward(ctx, model, x, { boxes = gb, scores = gs, kpts = gk })
  return o
end
local med, lo, hi = util.measure(ctx, iter, cfg.warmup, cfg.iters)
local c1 = os.getenv("LUCID_CONV1X1")
print(string.format("lucid %-24s %9.3f ms  (min %.3f, max %.3f)  [%s, %s, batch %d, %dpx%s]", "eager fwd+bwd", med, lo,
  hi, dev, dt, B, S, (dev ~= "cpu" and c1 and c1 ~= "") and (", conv1x1 " .. c1) or ""))
