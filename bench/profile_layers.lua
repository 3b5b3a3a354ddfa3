--[[
bench/profile_layers.lua — where the time of the eager training step of the
nano pose model goes: YOLO11n-pose as recipes/pose_nano.lua builds it (nc 1,
17x3 keypoints), forward + PoseLoss + backward, per top-level layer of the
layer table (model.0 ... model.23) and per primitive kind.

  luajit bench/profile_layers.lua                     # cuda: batch 4, 640 px, bf16
  luajit bench/profile_layers.lua device=cpu imgsz=64 batch=2 iters=2
  options: device=auto|cpu|cuda  batch=4  imgsz=auto (640 on a GPU, 128 on
           the CPU; a multiple of 32)  precision=auto|bf16|fp16|fp32 (auto:
           bf16 on a GPU, fp32 on the CPU)  iters=10  warmup=3  seed=0
           loss=true (false: backward of fixed random output gradients, as
           bench/bench_model.lua)  max_gt=16 (instance slots per image)
           fuse=true (false: the separate BatchNorm2d and SiLU calls)

Three passes over the same step, each `iters` iterations after `warmup`
untimed ones (host clock lucid.wall_time(), medians over the iterations):
  whole   no synchronisation inside the step, ctx:synchronize() at its end
          only (bench/bench_model.lua's measure; also shown without the loss)
  layer   ctx:synchronize() before and after the forward and the backward of
          every top-level layer and around the loss forward / backward
  kind    ctx:synchronize() before and after every primitive call (the leaf
          modules of lucid.nn.prim/head: Conv2d, BatchNorm2d, SiLU, ...; a
          Conv's bn+act pair on the fused route is one call, kind "bn+silu",
          timed through lucid.nn.prim's bn_silu_forward/backward) and every
          gradient sum of the Lua blocks (Tensor add/add_/copy_, the work of
          containers.accumulate). fuse=false (LUCID_FUSE_BN_SILU=0 does the
          same) runs every pass on the separate BatchNorm2d and SiLU calls.
The step itself is the library's: model:forward / model:backward of
lua/lucid/model.lua run unchanged; the timing goes in as instance overrides
of forward/backward on the modules (the mechanism of Model:replace_forward),
removed after each pass. Each sync costs a host round trip and serialises the
GPU, so a pass's sum exceeds the unsynchronised step; the summary prints both.
"between layers" is what the layer pass does not time inside a layer: the
DAG's gradient sums (model.lua backward_pass) and the Lua loop. The loss is
the C PoseLoss (assignment, box/DFL/keypoint terms and their gradients); the
head's DFL module is not called in training (decoding is for prediction).
Synthetic targets: 3 people per image with random boxes and 17 visible
keypoints (seeded).
]]
local lucid = require "lucid"
local recipe = require "lucid.recipe"

local cfg = recipe.resolve({
  device = "auto", batch = 4, imgsz = "auto", precision = "auto", iters = 10, warmup = 3, seed = 0,
  loss = true, max_gt = 16, fuse = true,
}, arg)
local prim = require "lucid.nn.prim"
if cfg.fuse == false or cfg.fuse == "false" then prim.fuse_bn_silu = false end

local ctx = lucid.Context{ device = cfg.device, seed = cfg.seed }
local dev = ctx:device()
local gpu = dev:sub(1, 4) == "cuda"
local prec = cfg.precision == "auto" and (gpu and "bf16" or "fp32") or cfg.precision
local dt = ({ bf16 = "bf16", fp16 = "f16", fp32 = "f32" })[prec]
if not dt then error("profile_layers: precision must be auto, bf16, fp16 or fp32, got '" .. tostring(prec) .. "'", 0) end
if not gpu and dt ~= "f32" then error("profile_layers: precision " .. prec .. " needs a GPU; the CPU runs fp32", 0) end
local B = cfg.batch
local S = cfg.imgsz == "auto" and (gpu and 640 or 128) or tonumber(cfg.imgsz)
if not S or S % 32 ~= 0 then error("profile_layers: imgsz must be a multiple of 32, got " .. tostring(cfg.imgsz), 0) end
local ITERS, WARM = math.max(1, cfg.iters), math.max(0, cfg.warmup)

local wall = lucid.wall_time
local function sync() ctx:synchronize() end

---------------------------------------------------------------- the step
local model = require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { 17, 3 }, ctx = ctx, device = dev }
model:train()
local x = lucid.rand({ B, 3, S, S }, { ctx = ctx, dtype = dt })

-- synthetic targets on the device (normalised xywh boxes, keypoints x, y, v)
local G, K = cfg.max_gt, 17
local crit, tg
if cfg.loss then
  math.randomseed(cfg.seed + 1)
  local cls, boxes, kpts, mask = {}, {}, {}, {}
  for b = 1, B do
    cls[b], boxes[b], kpts[b], mask[b] = {}, {}, {}, {}
    for g = 1, G do
      local on = g <= math.min(3, G)
      local w, h = 0.1 + 0.3 * math.random(), 0.2 + 0.4 * math.random()
      local cx, cy = w / 2 + (1 - w) * math.random(), h / 2 + (1 - h) * math.random()
      cls[b][g] = 0
      boxes[b][g] = on and { cx, cy, w, h } or { 0, 0, 0, 0 }
      mask[b][g] = on and 1 or 0
      local kp = {}
      for k = 1, K do
        kp[k] = on and { cx + (math.random() - 0.5) * w, cy + (math.random() - 0.5) * h, 2 } or { 0, 0, 0 }
      end
      kpts[b][g] = kp
    end
  end
  -- host tensors of the final dtype, copied into device buffers (as lucid.step)
  local function dev_tensor(data, dtype)
    local h = lucid.tensor(data, { ctx = ctx, device = "cpu", dtype = dtype })
    if not gpu then return h end
    local d = lucid.empty(h:shape(), { ctx = ctx, dtype = dtype })
    d:copy_(h)
    return d
  end
  tg = { cls = dev_tensor(cls, "f32"), boxes = dev_tensor(boxes, "f32"), kpts = dev_tensor(kpts, "f32"),
    mask = dev_tensor(mask, "u8") }
  crit = lucid.PoseLoss{ batch = B, imgsz = S, max_gt = G, nc = 1, kpt_shape = { K, 3 }, ctx = ctx }
end

-- fixed output gradients for loss=false and for the model-only measure
local gfix
do
  local o = model:forward(x)
  gfix = { boxes = lucid.rand(o.boxes:shape(), { ctx = ctx, dtype = dt }),
    scores = lucid.rand(o.scores:shape(), { ctx = ctx, dtype = dt }),
    kpts = lucid.rand(o.kpts:shape(), { ctx = ctx, dtype = dt }) }
end

-- loss calls go through `loss_call` so that the layer and kind passes can
-- time them
local function plain(_, f) return f() end
local loss_call = plain

local grad_sum_dir = "b" -- which half of the step runs (keys of the kind pass)

local function step()
  grad_sum_dir = "f"
  local o = model:forward(x)
  grad_sum_dir = "b"
  if crit then
    loss_call("loss|dag|f", function() return crit:forward(o.boxes, o.scores, o.kpts, tg) end)
    local gb, gc, gk = loss_call("loss|dag|b", function() return crit:backward() end)
    model:backward(x, { boxes = gb, scores = gc, kpts = gk })
  else
    model:backward(x, gfix)
  end
end

local function step_model_only()
  model:forward(x)
  model:backward(x, gfix)
end

------------------------------------------------------------ instrumentation
local rec = nil        -- the current iteration's record {key = seconds}, or nil
local counts = nil     -- calls per key in the current iteration, or nil

-- f() fenced by synchronisations; its seconds go to rec[key].
local function timed(key, f, a, b, c, d)
  sync()
  local t0 = wall()
  local r1, r2, r3 = f(a, b, c, d)
  sync()
  local d = wall() - t0
  if rec then
    rec[key] = (rec[key] or 0) + d
    counts[key] = (counts[key] or 0) + 1
  end
  return r1, r2, r3
end

-- Instance overrides, undone in reverse order by unpatch_all.
local patches = {}
local function patch(obj, field, fn)
  patches[#patches + 1] = { obj, field, rawget(obj, field) }
  rawset(obj, field, fn)
end
local function unpatch_all()
  for i = #patches, 1, -1 do
    local p = patches[i]
    rawset(p[1], p[2], p[3])
    patches[i] = nil
  end
end

-- Primitive kind of a leaf module (lucid.nn.prim / head classes).
local KIND = { BatchNorm2d = "batchnorm", SiLU = "silu", Concat = "concat", Split = "split", Upsample = "upsample",
  MaxPool2d = "maxpool", Add = "add", MatMul = "matmul", Softmax = "softmax", DFL = "dfl" }
local function kind_of(m)
  local name = getmetatable(m).__name
  if name == "Conv2d" then
    if m.g > 1 then return string.format("dwconv%dx%d", m.k, m.k) end
    return string.format("conv%dx%d%s", m.k, m.k, m.s > 1 and ("/s" .. m.s) or "")
  end
  return KIND[name] or name:lower()
end

-- Leaf modules (those with a C module) of a tree, helpers included.
local function leaves(m, out, seen)
  if seen[m] then return out end
  seen[m] = true
  if m._c then out[#out + 1] = m end
  for _, e in ipairs(m._modules) do leaves(e.module, out, seen) end
  for _, h in ipairs(m._hidden) do leaves(h, out, seen) end
  return out
end

local layers = model.layers
local cur_layer = "dag"   -- layer index being run (kind pass), "dag" outside layers

-- Layer pass: each layer's forward and backward timed.
local function install_layer_pass()
  for _, L in ipairs(layers) do
    local m = L.module
    local f, b = m.forward, m.backward
    local kf, kb = "L" .. L.i .. "|f", "L" .. L.i .. "|b"
    patch(m, "forward", function(self, inp) return timed(kf, f, self, inp) end)
    patch(m, "backward", function(self, inp, gy) return timed(kb, b, self, inp, gy) end)
  end
  loss_call = timed
end

-- Kind pass: every primitive call and every Lua-level gradient sum timed,
-- keyed "kind|layer|f/b"; the layers only set cur_layer.
local function install_kind_pass()
  -- the bn and act of a fusable pair stay unpatched (an override would make
  -- the pair take the separate calls); the fused call is timed instead
  local fused = {}
  for _, L in ipairs(layers) do
    L.module:apply(function(m)
      if m.bn and m.act and prim.bn_silu_fusable(m.bn, m.act) then
        fused[m.bn], fused[m.act] = true, true
      end
    end)
  end
  for _, L in ipairs(layers) do
    for _, m in ipairs(leaves(L.module, {}, {})) do
      if not fused[m] then
        local k = kind_of(m)
        local f, b = m.forward, m.backward
        patch(m, "forward", function(self, inp) return timed(k .. "|" .. cur_layer .. "|f", f, self, inp) end)
        patch(m, "backward", function(self, inp, gy) return timed(k .. "|" .. cur_layer .. "|b", b, self, inp, gy) end)
      end
    end
  end
  local pf, pb = prim.bn_silu_forward, prim.bn_silu_backward
  patch(prim, "bn_silu_forward", function(bn, act, x) return timed("bn+silu|" .. cur_layer .. "|f", pf, bn, act, x) end)
  patch(prim, "bn_silu_backward", function(bn, act, x, gy)
    return timed("bn+silu|" .. cur_layer .. "|b", pb, bn, act, x, gy)
  end)
  for _, L in ipairs(layers) do -- after the leaves: a layer that is a leaf (Concat, Upsample) wraps its leaf wrapper
    local m, i = L.module, L.i
    local f, b = m.forward, m.backward
    patch(m, "forward", function(self, inp)
      cur_layer = i
      local r = f(self, inp)
      cur_layer = "dag"
      return r
    end)
    patch(m, "backward", function(self, inp, gy)
      cur_layer = i
      local r = b(self, inp, gy)
      cur_layer = "dag"
      return r
    end)
  end
  local T = lucid.Tensor
  for _, name in ipairs({ "add", "add_", "copy_" }) do
    local f = T[name]
    patch(T, name, function(a, b2, c) return timed("grad sum|" .. cur_layer .. "|" .. grad_sum_dir, f, a, b2, c) end)
  end
  loss_call = timed
end

local function uninstall()
  unpatch_all()
  loss_call = plain
  cur_layer = "dag"
end

-- Run `fn` iters times; returns the per-iteration records, call counts of the
-- first one and the iteration wall times (ms).
local function run_pass(fn)
  local recs, walls, first_counts = {}, {}, nil
  sync()
  for it = 1, ITERS do
    rec, counts = {}, {}
    local t0 = wall()
    fn()
    sync()
    walls[it] = (wall() - t0) * 1000
    recs[it] = rec
    first_counts = first_counts or counts
  end
  rec, counts = nil, nil
  return recs, first_counts, walls
end

local function median(t)
  local s = {}
  for i = 1, #t do s[i] = t[i] end
  table.sort(s)
  local n = #s
  if n == 0 then return 0 end
  if n % 2 == 1 then return s[(n + 1) / 2] end
  return (s[n / 2] + s[n / 2 + 1]) / 2
end

-- Median over iterations (ms) of the wall time of an iteration less the
-- time of its fenced calls.
local function med_untimed(recs, walls)
  local per = {}
  for it, r in ipairs(recs) do
    local s = 0
    for _, v in pairs(r) do s = s + v end
    per[it] = math.max(0, walls[it] - s * 1000)
  end
  return median(per)
end

-- Number of fenced calls in one iteration.
local function ncalls(c)
  local n = 0
  for _, v in pairs(c) do n = n + v end
  return n
end

-- Median over iterations (ms) of the sum of the keys for which sel(key)
-- returns true.
local function med_of(recs, sel)
  local per = {}
  for it, r in ipairs(recs) do
    local s = 0
    for k, v in pairs(r) do if sel(k) then s = s + v end end
    per[it] = s * 1000
  end
  return median(per)
end

---------------------------------------------------------------- measure
for _ = 1, WARM do step() end
sync()

local _, _, w_whole = run_pass(step)
local _, _, w_model = run_pass(step_model_only)

install_layer_pass()
local lrecs, lcounts, w_layer = run_pass(step)
uninstall()

install_kind_pass()
local krecs, kcounts, w_kind = run_pass(step)
uninstall()

---------------------------------------------------------------- report
local function split3(k)
  local a, b, c = k:match("^(.-)|(.-)|(.-)$")
  return a, b, c
end
local function pct(v, tot) return tot > 0 and 100 * v / tot or 0 end

local whole, whole_model = median(w_whole), median(w_model)
print(string.format("profile_layers: YOLO11n-pose eager train step (forward%s + backward), %s %s, batch %d, %d px, "
  .. "BatchNorm2d+SiLU %s; %d warm-up + %d timed iterations per pass, medians in ms", crit and " + PoseLoss" or "", dev,
  dt, B, S, prim.fuse_bn_silu and "fused" or "separate", WARM, ITERS))

-- per layer (layer pass), with the top primitive kinds of the layer (kind pass)
local shapes = model:infer_shapes(B, S, S)
local lsum_f, lsum_b = 0, 0
local rows = {}
for idx, L in ipairs(layers) do
  local f = med_of(lrecs, function(k) return k == "L" .. L.i .. "|f" end)
  local b = med_of(lrecs, function(k) return k == "L" .. L.i .. "|b" end)
  lsum_f, lsum_b = lsum_f + f, lsum_b + b
  local sh = shapes[idx]
  local shs = sh.boxes and string.format("A=%d anchors", sh.boxes[3]) or string.format("%dx%dx%d", sh[2], sh[3], sh[4])
  -- kinds inside this layer (kind pass)
  local by = {}
  local tot = 0
  for _, r in ipairs(krecs) do
    for k, v in pairs(r) do
      local kind, li = split3(k)
      if li == tostring(L.i) then
        by[kind] = (by[kind] or 0) + v
        tot = tot + v
      end
    end
  end
  local ks = {}
  for kind, v in pairs(by) do ks[#ks + 1] = { kind, v } end
  table.sort(ks, function(p, q) return p[2] > q[2] end)
  local top = {}
  for j = 1, math.min(3, #ks) do top[j] = string.format("%s %.0f%%", ks[j][1], pct(ks[j][2], tot)) end
  rows[#rows + 1] = { tostring(L.i), L.type, shs, f, b, table.concat(top, " ") }
end
local loss_f = med_of(lrecs, function(k) return k == "loss|dag|f" end)
local loss_b = med_of(lrecs, function(k) return k == "loss|dag|b" end)
local lwall = median(w_layer)
local timed_sum = lsum_f + lsum_b + loss_f + loss_b
local between = med_untimed(lrecs, w_layer)
local ltotal = timed_sum + between

print("")
print("per top-level layer (layer pass: fwd / bwd fenced by syncs; % of the sum row)")
print(string.format("%-5s %-8s %-18s %8s %8s %8s %6s  %s", "layer", "type", "output", "fwd", "bwd", "total", "%",
  "top primitives in the layer (kind pass)"))
for _, r in ipairs(rows) do
  print(string.format("%-5s %-8s %-18s %8.3f %8.3f %8.3f %5.1f%%  %s", r[1], r[2], r[3], r[4], r[5], r[4] + r[5],
    pct(r[4] + r[5], ltotal), r[6]))
end
if crit then
  print(string.format("%-5s %-8s %-18s %8.3f %8.3f %8.3f %5.1f%%", "loss", "PoseLoss", "", loss_f, loss_b, loss_f + loss_b,
    pct(loss_f + loss_b, ltotal)))
end
print(string.format("%-5s %-27s %8s %8s %8.3f %5.1f%%  %s", "-", "between layers", "", "", between, pct(between, ltotal),
  "DAG grad sums (model.lua), Lua loop"))
print(string.format("%-5s %-27s %8.3f %8.3f %8.3f %5.1f%%", "sum", "of medians", lsum_f + loss_f, lsum_b + loss_b,
  ltotal, 100))

-- per kind (kind pass)
local kinds, kind_order = {}, {}
local function kind_row(kind)
  if not kinds[kind] then
    kinds[kind] = { kind = kind, calls = 0 }
    kind_order[#kind_order + 1] = kind
  end
  return kinds[kind]
end
for k, n in pairs(kcounts) do
  local kind = split3(k)
  local r = kind_row(kind)
  r.calls = r.calls + n
end
local present = {}
for _, L in ipairs(layers) do
  for _, m in ipairs(leaves(L.module, {}, {})) do present[kind_of(m)] = true end
end
for kind in pairs(present) do kind_row(kind) end
for _, r in pairs(kinds) do
  local kind = r.kind
  r.f = med_of(krecs, function(k) local a, _, c = split3(k) return a == kind and c == "f" end)
  r.b = med_of(krecs, function(k) local a, _, c = split3(k) return a == kind and c == "b" end)
end
local kwall = median(w_kind)
local kuntimed = med_untimed(krecs, w_kind)
local ktotal = 0
for _, r in pairs(kinds) do ktotal = ktotal + r.f + r.b end
ktotal = ktotal + kuntimed
local conv = { kind = "conv (all)", calls = 0, f = 0, b = 0 }
for _, r in pairs(kinds) do
  if r.kind:find("conv", 1, true) then
    conv.calls, conv.f, conv.b = conv.calls + r.calls, conv.f + r.f, conv.b + r.b
  end
end
table.sort(kind_order, function(a, b2)
  local ca, cb = a:find("conv", 1, true) and 1 or 0, b2:find("conv", 1, true) and 1 or 0
  if ca ~= cb then return ca > cb end
  return kinds[a].f + kinds[a].b > kinds[b2].f + kinds[b2].b
end)
print("")
print("per primitive kind (kind pass: every primitive call fenced by syncs; calls per step, fwd + bwd)")
print(string.format("%-14s %6s %8s %8s %8s %6s", "kind", "calls", "fwd", "bwd", "total", "%"))
local function kprint(r, indent)
  local note = ""
  if r.calls == 0 and r.kind == "dfl" then note = "  not called in training (the loss decodes the DFL bins itself)" end
  if r.calls == 0 and r.kind == "silu" then note = "  every SiLU runs inside bn+silu (fuse=false: separate)" end
  if r.kind == "bn+silu" then note = "  the fused BatchNorm2d+SiLU of the Conv blocks" end
  if r.kind == "grad sum" then note = "  Tensor add/add_/copy_ of the Lua blocks and the DAG" end
  if r.kind == "loss" then note = "  PoseLoss forward / backward" end
  print(string.format("%-14s %6d %8.3f %8.3f %8.3f %5.1f%%%s", (indent and "  " or "") .. r.kind, r.calls, r.f, r.b,
    r.f + r.b, pct(r.f + r.b, ktotal), note))
end
kprint(conv, false)
for _, kind in ipairs(kind_order) do kprint(kinds[kind], kind:find("conv", 1, true) ~= nil) end
print(string.format("%-14s %6s %8s %8s %8.3f %5.1f%%  Lua, views, launch gaps", "untimed", "", "", "", kuntimed,
  pct(kuntimed, ktotal)))
print(string.format("%-14s %6s %8s %8s %8.3f %5.1f%%", "sum", "", "", "", ktotal, 100))

-- the unsynchronised step against the synchronised passes
print("")
print(string.format("%-31s %8.3f ms  (model fwd+bwd only, fixed output grads: %.3f ms)", "whole step, no sync inside", whole,
  whole_model))
print(string.format("layer pass, %4d fenced calls %8.3f ms  (sum of the row medians %.3f ms): %+.3f ms (%+.0f%%) over the whole step",
  ncalls(lcounts), lwall, ltotal, lwall - whole, pct(lwall - whole, whole)))
print(string.format("kind pass,  %4d fenced calls %8.3f ms  (sum of the row medians %.3f ms): %+.3f ms (%+.0f%%) over the whole step",
  ncalls(kcounts), kwall, ktotal, kwall - whole, pct(kwall - whole, whole)))
