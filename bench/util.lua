--[[
bench/util.lua — the setup and the timing shared by the model-level
benchmarks on YOLO11n-pose (bench/bench_model.lua, bench/bench_bnsilu.lua).
Run from the repository root (as bench/run.sh does): require "bench.util".
]]
local lucid = require "lucid"
local recipe = require "lucid.recipe"

local M = {}

--- The settings of these benchmarks, each overridable as key=value.
M.defaults = { device = "auto", batch = 4, imgsz = 640, iters = 30, warmup = 5, dtype = "auto" }

--- M.setup(name, argv, hint) -> cfg, ctx, dev, dt, model; nil after
-- printing "skip <name>: no CUDA device (<hint>)" when device=auto finds no
-- GPU. cfg: M.defaults resolved over the command line argv; dt: cfg.dtype,
-- where "auto" is bf16 on a GPU and f32 on the CPU; model: YOLO11n-pose
-- (nc 1, 17x3 keypoints) on ctx's device, in training mode.
function M.setup(name, argv, hint)
  local cfg = recipe.resolve(M.defaults, argv)
  local ctx = lucid.Context{ device = cfg.device }
  local dev = ctx:device()
  local gpu = dev:sub(1, 4) == "cuda"
  if not gpu and cfg.device == "auto" then
    print(string.format("skip %s: no CUDA device (%s)", name, hint))
    return nil
  end
  local dt = cfg.dtype == "auto" and (gpu and "bf16" or "f32") or cfg.dtype
  local model = require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { 17, 3 }, ctx = ctx, device = dev }
  model:train()
  return cfg, ctx, dev, dt, model
end

--- M.measure(ctx, fn, warmup, iters) -> median, min, max of the wall time
-- in ms of fn(): warmup untimed calls, then iters timed ones, ctx
-- synchronised before each timed call ends.
function M.measure(ctx, fn, warmup, iters)
  for _ = 1, warmup do fn() end
  ctx:synchronize()
  local t = {}
  for i = 1, iters do
    local t0 = lucid.wall_time()
    fn()
    ctx:synchronize()
    t[i] = (lucid.wall_time() - t0) * 1000
  end
  table.sort(t)
  return t[math.floor((#t + 1) / 2)], t[1], t[#t]
end

return M
