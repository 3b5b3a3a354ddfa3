--[[
bench/conv_lab/shapes.lua — the distinct Conv2d shapes of YOLO11n-pose (nc 1,
17x3 keypoints) at batch B, S x S, each with its multiplicity, for the conv
kernel lab (bench/conv_lab/conv_lab.cu reads the output).

  luajit bench/conv_lab/shapes.lua [batch=4] [imgsz=640] [out=bench/conv_lab/shapes.txt]

Runs one real forward on the CPU (f32) with Conv2d.forward wrapped to record
each call's input shape, so every conv the network executes is seen with the
spatial size it really gets (the layer table's infer_shapes only lists layer
outputs, not the convs inside blocks). Layer 0 computes no input gradient
(model input_grad = false): its backward-data count is 0.
]]
local lucid = require "lucid"
local recipe = require "lucid.recipe"
local P = require "lucid.nn.prim"
local cfg = recipe.resolve({ batch = 4, imgsz = 640, out = "bench/conv_lab/shapes.txt" }, arg)

local ctx = lucid.Context{ device = "cpu" }
local model = require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { 17, 3 }, ctx = ctx,
  device = "cpu" }
model:train()

-- module object -> dotted reference name
local names = {}
for _, e in ipairs(model:named_modules()) do names[e.module] = e.name end
local first_conv = model.layers[1].module.conv

local calls = {}
local orig = P.Conv2d.forward
P.Conv2d.forward = function(self, x)
  local s = x:shape()
  calls[#calls + 1] = { m = self, N = s[1], Cin = s[2], H = s[3], W = s[4] }
  return orig(self, x)
end

local B, S = cfg.batch, cfg.imgsz
local x = lucid.rand({ B, 3, S, S }, { ctx = ctx, dtype = "f32" })
local t0 = lucid.wall_time()
model:forward(x)
local elapsed = lucid.wall_time() - t0
P.Conv2d.forward = orig

local function outsz(n, k, s, p, d) return math.floor((n + 2 * p - d * (k - 1) - 1) / s) + 1 end

local rows, byKey = {}, {}
local total = { fwd = 0, dgrad = 0, wgrad = 0 }
for _, c in ipairs(calls) do
  local m = c.m
  assert(m.c1 == c.Cin, "conv input channels differ from the module's c1")
  assert(m.d == 1, "conv_lab handles dilation 1 only")
  local Ho, Wo = outsz(c.H, m.k, m.s, m.p, m.d), outsz(c.W, m.k, m.s, m.p, m.d)
  local key = table.concat({ c.N, c.Cin, c.H, c.W, m.c2, m.k, m.s, m.p, m.g }, " ")
  local r = byKey[key]
  if not r then
    r = { N = c.N, Cin = c.Cin, H = c.H, W = c.W, Cout = m.c2, k = m.k, s = m.s, p = m.p, g = m.g, Ho = Ho, Wo = Wo,
      count = 0, dgrad = 0, names = {} }
    r.flops = 2 * c.N * Ho * Wo * m.c2 * (c.Cin / m.g) * m.k * m.k
    byKey[key] = r
    rows[#rows + 1] = r
  end
  r.count = r.count + 1
  if m ~= first_conv then r.dgrad = r.dgrad + 1 end
  r.names[#r.names + 1] = names[m] or "?"
  total.fwd = total.fwd + r.flops
  total.wgrad = total.wgrad + r.flops
  if m ~= first_conv then total.dgrad = total.dgrad + r.flops end
end

local f = assert(io.open(cfg.out, "w"))
local function w(...) f:write(string.format(...)) end
w("# Distinct Conv2d shapes of YOLO11n-pose (nc=1, kpt 17x3), batch %d, %dx%d, training forward.\n", B, S, S)
w("# Generated (do not edit) from the repository root by:\n")
w("#   luajit bench/conv_lab/shapes.lua batch=%d imgsz=%d out=%s\n", B, S, cfg.out)
w("# %d conv calls per forward, %d distinct shapes. GFLOP per step (2*MACs): forward %.2f,\n", #calls, #rows,
  total.fwd / 1e9)
w("# backward-data %.2f, backward-filter %.2f, sum %.2f.\n", total.dgrad / 1e9, total.wgrad / 1e9,
  (total.fwd + total.dgrad + total.wgrad) / 1e9)
w("# Columns: N Cin H W Cout k stride pad groups Ho Wo count dgrad_count gflop_per_call first_name\n")
w("# count = calls per forward (= backward-filter calls); dgrad_count = backward-data calls (layer 0 has none).\n")
for _, r in ipairs(rows) do
  w("%d %d %d %d %d %d %d %d %d %d %d %d %d %.4f %s\n", r.N, r.Cin, r.H, r.W, r.Cout, r.k, r.s, r.p, r.g, r.Ho, r.Wo,
    r.count, r.dgrad, r.flops / 1e9, r.names[1])
end
f:close()
io.stderr:write(string.format("shapes.lua: %d conv calls, %d distinct shapes -> %s (forward %.1f s)\n", #calls, #rows,
  cfg.out, elapsed))
