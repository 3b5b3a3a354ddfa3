--[[
bench/bench_model.lua — forward+backward time of lucid's YOLO11n-pose
network at batch 4, 640x640 (bf16 activations on a GPU, f32 on the CPU),
eager route: median over timed iterations after warm-up, the device
synchronised around each iteration. Run by `make bench`; read it against
bench/bench_model_torch.py from the same run.
  luajit bench/bench_model.lua [device=auto] [batch=4] [imgsz=640] [iters=30]
]]
local lucid = require "lucid"
local recipe = require "lucid.recipe"
local cfg = recipe.resolve({ device = "auto", batch = 4, imgsz = 640, iters = 30, warmup = 5, dtype = "auto" }, arg)
local ctx = lucid.Context{ device = cfg.device }
local dev = ctx:device()
local gpu = dev:sub(1, 4) == "cuda"
if not gpu and cfg.device == "auto" then
  print("skip bench_model: no CUDA device (run with device=cpu for the CPU)")
  return
end
local dt = cfg.dtype == "auto" and (gpu and "bf16" or "f32") or cfg.dtype
local model = require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { 17, 3 }, ctx = ctx, device = dev }
model:train()
local B, S = cfg.batch, cfg.imgsz
local x = lucid.rand({ B, 3, S, S }, { ctx = ctx, dtype = dt })
local out = model:forward(x)
local gb = lucid.rand(out.boxes:shape(), { ctx = ctx, dtype = dt })
local gs = lucid.rand(out.scores:shape(), { ctx = ctx, dtype = dt })
local gk = lucid.rand(out.kpts:shape(), { ctx = ctx, dtype = dt })
local function iter()
  local o = model:forward(x)
  model:backward(x, { boxes = gb, scores = gs, kpts = gk })
  return o
end
for _ = 1, cfg.warmup do iter() end
ctx:synchronize()
local t = {}
for i = 1, cfg.iters do
  local t0 = lucid.wall_time()
  iter()
  ctx:synchronize()
  t[i] = (lucid.wall_time() - t0) * 1000
end
table.sort(t)
local med = t[math.floor((#t + 1) / 2)]
print(string.format("lucid %-24s %9.3f ms  (min %.3f, max %.3f)  [%s, %s, batch %d, %dpx]", "eager fwd+bwd", med, t[1],
  t[#t], dev, dt, B, S))
