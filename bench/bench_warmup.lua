--[[
bench/bench_warmup.lua — where the first epoch's extra time goes: the first
calls of each batch shape of the default fit (recipes/pose_nano.lua: train at
batch 4, the short batch of 1, validation at batch 8 in eval mode), timed
one by one on a fresh context, against the same calls made a second time.

  luajit bench/bench_warmup.lua [device=auto] [imgsz=640] [dtype=auto]
  LUCID_PROFILE=1 luajit bench/bench_warmup.lua     # + cuDNN plan columns

Phases, in this order (each one fenced with ctx:synchronize() on both sides,
host clock lucid.wall_time()):
  context          lucid.Context (CUDA context, streams, cuBLAS/cuDNN handles)
  model build      YOLO11n-pose (nc 1, 17x3), parameters on the device
  b4 fwd+bwd #1..3 batch 4 train mode: forward, then backward of random
                   output gradients (bench/bench_model.lua's iteration); the
                   forward and backward seconds are also shown apart
  b8 eval fwd #1,2 batch 8 eval mode, forward only (validation)
  b1 fwd+bwd #1,2  batch 1 train mode (the short last batch)
The "#1" rows pay the first-call costs (cuDNN plans, lazy kernel loading,
arena and allocator growth); "#2" rows are the warm cost of the same shapes.

With LUCID_PROFILE=1 the table adds, per phase, the cuDNN plans made per
pass (fwd / bwd_data / bwd_filter), their host seconds, the host seconds of
each plan pass's first cuDNN call ("1st run": lazy module loading shows up
there) and the nn-arena growths (count, seconds); the counters are read
through the LuaJIT FFI (lucid_cuda_nn_profile_read in lucid.so). The engine
also prints its one-line summary to stderr when the context is freed at the
end.

Last lines: value hashes (FNV-1a, lucid.hash_tensor) of every phase's
outputs and of the parameters, buffers and gradients after the last phase,
to compare two builds bitwise (same GPU, same build flags): the nn plan
changes must not move them.

Runs in seconds on the H200 (a few calls of the nano network); on a machine
without CUDA it skips (device=cpu runs it on the CPU, slowly, 128 px
recommended: imgsz=128).
]]
local lucid = require "lucid"
local recipe = require "lucid.recipe"
local cfg = recipe.resolve({ device = "auto", imgsz = 640, dtype = "auto", seed = 0 }, arg)

local t_ctx0 = lucid.wall_time()
local ctx = lucid.Context{ device = cfg.device }
ctx:synchronize()
local t_ctx = lucid.wall_time() - t_ctx0
local dev = ctx:device()
local gpu = dev:sub(1, 4) == "cuda"
if not gpu and cfg.device == "auto" then
  print("skip bench_warmup: no CUDA device (run with device=cpu imgsz=128 for the CPU)")
  return
end
local dt = cfg.dtype == "auto" and (gpu and "bf16" or "f32") or cfg.dtype
local S = cfg.imgsz
if ctx.manual_seed then ctx:manual_seed(cfg.seed) end

-- LUCID_PROFILE counters through the FFI (optional: nil when unavailable)
local prof_read
do
  local e = os.getenv("LUCID_PROFILE")
  if gpu and e and e ~= "" and e ~= "0" then
    local okf, ffi = pcall(require, "ffi")
    if okf then
      pcall(ffi.cdef, "int lucid_cuda_nn_profile_read(void *ctx, double out[16]);")
      local lib
      local okc = pcall(function() return ffi.C.lucid_cuda_nn_profile_read end)
      if okc then
        lib = ffi.C
      else
        local path = package.searchpath and package.searchpath("lucid", package.cpath)
        local okl, l = pcall(ffi.load, path or "lucid")
        if okl and pcall(function() return l.lucid_cuda_nn_profile_read end) then lib = l end
      end
      if lib then
        local buf = ffi.new("double[16]")
        prof_read = function()
          -- the Context userdata's payload is its lucid_ctx * (lua_context.c)
          local p = ffi.cast("void **", ctx)[0]
          if lib.lucid_cuda_nn_profile_read(p, buf) == 0 then return nil end
          local r = {}
          for i = 0, 15 do r[i] = buf[i] end
          return r
        end
      end
    end
  end
end

local rows = {}
local hashes = {}
local function phase(name, fn)
  ctx:synchronize()
  local p0 = prof_read and prof_read()
  local t0 = lucid.wall_time()
  local extra = fn()
  ctx:synchronize()
  local row = { name = name, s = lucid.wall_time() - t0, extra = extra }
  local p1 = prof_read and prof_read()
  if p1 then
    p0 = p0 or setmetatable({}, { __index = function() return 0 end })
    row.prof = {}
    for i = 0, 15 do row.prof[i] = p1[i] - p0[i] end
    row.prof.keys = p1[15]
    row.prof.arena = p1[14]
  end
  rows[#rows + 1] = row
  return row
end

local build = require("lucid.models.yolo11_pose")
local model
phase("model build", function()
  model = build{ scale = "n", nc = 1, kpt_shape = { 17, 3 }, ctx = ctx, device = dev }
  model:train()
end)

-- inputs and output gradients are made outside the timed regions (one small
-- rand first, so the random kernels' first use is not in a phase either)
lucid.rand({ 8 }, { ctx = ctx, dtype = dt })
local function inputs(B) return lucid.rand({ B, 3, S, S }, { ctx = ctx, dtype = dt }) end
local function grads_like(out)
  return {
    boxes = lucid.rand(out.boxes:shape(), { ctx = ctx, dtype = dt }),
    scores = lucid.rand(out.scores:shape(), { ctx = ctx, dtype = dt }),
    kpts = lucid.rand(out.kpts:shape(), { ctx = ctx, dtype = dt }),
  }
end
local function hash_out(tag, o)
  local h
  for _, k in ipairs({ "boxes", "scores", "kpts" }) do h = lucid.hash_tensor(o[k], h) end
  hashes[#hashes + 1] = { tag, h }
end

-- forward and backward timed apart (both fenced), summed into the phase
local gcache = {}
local function fwd_bwd(B, x, tag)
  local t0 = lucid.wall_time()
  local o = model:forward(x)
  ctx:synchronize()
  local tf = lucid.wall_time() - t0
  local pause0 = lucid.wall_time()
  gcache[B] = gcache[B] or grads_like(o) -- same gradients for every call of B
  ctx:synchronize()
  local pause = lucid.wall_time() - pause0
  local t1 = lucid.wall_time()
  model:backward(x, gcache[B])
  ctx:synchronize()
  local tb = lucid.wall_time() - t1
  return { fwd = tf, bwd = tb, pause = pause, out = o, tag = tag }
end

local x4, x8, x1 = inputs(4), inputs(8), inputs(1)
ctx:synchronize()
local function train_phase(name, B, x)
  local r = phase(name, function() return fwd_bwd(B, x) end)
  r.s = r.s - r.extra.pause -- the gradient tensors' creation is not counted
  hash_out(name, r.extra.out)
  r.extra.out = nil
end
train_phase("b4 fwd+bwd #1", 4, x4)
train_phase("b4 fwd+bwd #2", 4, x4)
train_phase("b4 fwd+bwd #3", 4, x4)
for i = 1, 2 do
  model:eval()
  local o
  local r = phase("b8 eval fwd #" .. i, function()
    o = model:forward(x8)
    return { fwd = nil }
  end)
  model:train()
  hash_out(r.name, o)
end
train_phase("b1 fwd+bwd #1", 1, x1)
train_phase("b1 fwd+bwd #2", 1, x1)

-- table
print(string.format("bench_warmup: %s, %s, %dpx; context %.3f s%s", dev, dt, S, t_ctx,
  prof_read and "" or (gpu and " (LUCID_PROFILE=1 adds the cuDNN plan columns)" or "")))
local hdr = string.format("%-16s %9s %9s %9s", "phase", "total ms", "fwd ms", "bwd ms")
if prof_read then
  hdr = hdr .. string.format(" | %-13s %8s %9s | %-13s %8s | %6s %8s", "plans f/d/w", "plan ms",
    "ms/plan", "1st runs f/d/w", "1st ms", "grows", "grow ms")
end
print(hdr)
local function ms(v) return v and string.format("%9.2f", v * 1000) or string.format("%9s", "-") end
for _, r in ipairs(rows) do
  local e = r.extra or {}
  local line = string.format("%-16s %s %s %s", r.name, ms(r.s), ms(e.fwd), ms(e.bwd))
  local p = r.prof
  if p then
    local np = p[0] + p[1] + p[2]
    local sp = p[3] + p[4] + p[5]
    line = line .. string.format(" | %-13s %8.1f %9s | %-13s %8.1f | %6d %8.2f",
      string.format("%d/%d/%d", p[0], p[1], p[2]), sp * 1000,
      np > 0 and string.format("%.3f", sp * 1000 / np) or "-",
      string.format("%d/%d/%d", p[6], p[7], p[8]), (p[9] + p[10] + p[11]) * 1000, p[12], p[13] * 1000)
  end
  print(line)
end
if prof_read then
  local last = rows[#rows].prof
  if last then
    print(string.format("conv plan keys %d, nn arena %.1f MiB", last.keys, last.arena / 2 ^ 20))
  end
end

-- hashes (bitwise comparison between builds)
for _, h in ipairs(hashes) do print(string.format("hash %-16s %s", h[1], h[2])) end
local hp, hg
for _, p in ipairs(model.params:list()) do
  hp = lucid.hash_tensor(p:data(), hp)
  local okg, g = pcall(function() return p:grad() end)
  if okg and g then hg = lucid.hash_tensor(g, hg) end
end
print(string.format("hash %-16s %s", "params+buffers", tostring(hp)))
print(string.format("hash %-16s %s", "grads", tostring(hg)))

-- free everything so the engine's LUCID_PROFILE summary line is printed now
model, x4, x8, x1, gcache = nil, nil, nil, nil, nil
collectgarbage()
collectgarbage()
ctx:free()
