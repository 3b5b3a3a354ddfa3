--- bench/count_sums.lua — how many channel-copy and add launches one
-- training step of a model issues on the GPU, counted on the CPU from the
-- calls that issue them (no GPU needed: the Lua calls are the same on the
-- CPU and the GPU; the GPU only runs the head's branches on lanes, which
-- changes no call).
--
--   luajit bench/count_sums.lua [model=yolo11|yolov8] [scale=n] [batch=4]
--     [size=64] [dtype=f32] [fuse=1|0|both] [nominal=640]
--
-- One forward and one backward (the gradient of every head output: ones)
-- are run twice; the second pass is counted (the first allocates). Counted:
--   chan_copy  a Concat or Split C module forward or backward (one
--              chan_copy_multi launch: every one here has <= 16 pieces of one
--              dtype) and a lucid.nn.chan_sum call (one chan_copy_multi or
--              chan_sum_multi launch likewise)
--   add_fwd    an Add C module forward (one add_fwd launch)
--   add        a Tensor:add (one map_contig_kernel launch: every sum here is
--              contiguous and of one dtype)
--   add_n      one lucid.nn.add_n call (one launch)
--   bn_terms   a BatchNorm backward that read its gradient as a sum of
--              terms (lucid.nn.batchnorm2d_backward_terms taken: one
--              bn_grad_dx1_terms launch instead of bn_grad_dx1, and no
--              copy / sum launch before it)
-- The image size does not change the counts of fuse=0 and fuse=1 terms=0
-- (no tensor here reaches the 2^30-element chunking of the add kernels).
-- fuse=both prints the counts with LUCID_FUSE_SUMS off and on (the blocks'
-- switch, require("lucid.nn.containers").fuse_sums), the latter with
-- LUCID_BN_DY_TERMS off (containers.dy_terms: DECISIONS 33's launches) and
-- on. The CPU engine never takes a gradient description, so with
-- terms=1 the GPU's choice is SIMULATED (spec/support/dy_terms_sim.lua):
-- a description is taken when the GPU's one-pass BatchNorm would take it
-- for the image size `nominal` (its shape rule: N*H*W of one part,
-- H and W scaled by nominal/size), and its materialisation is not counted;
-- the GPU spec spec/bn_dy_terms_spec.lua (#gpu) counts the real launches.
package.path = "./lua/?.lua;./lua/?/init.lua;./spec/support/?.lua;" .. package.path
package.cpath = "./?.so;" .. package.cpath
local lucid = require("lucid")

local opt = { model = "yolo11", scale = "n", batch = 4, size = 64, dtype = "f32", fuse = "both",
  nominal = 640 }
for _, a in ipairs(arg) do
  local k, v = a:match("^(%w+)=(.*)$")
  if not k or opt[k] == nil then error("count_sums: unknown argument " .. a) end
  opt[k] = tonumber(v) or v
end

local counts
local function bump(k) if counts then counts[k] = (counts[k] or 0) + 1 end end

-- Tensor:add
local T = lucid.Tensor
local add0 = T.add
T.add = function(...) bump("add") return add0(...) end

-- the C modules, by kind
local cm_mt
local function wrap_cmodules(model)
  model:apply(function(m)
    if m._c and not cm_mt then
      -- the method table: the upvalue of the CModule's __index closure
      local _, t = debug.getupvalue(getmetatable(m._c).__index, 1)
      cm_mt = t
    end
  end)
  if cm_mt.counted then return end
  cm_mt.counted = true
  local fwd, bwd = cm_mt.forward, cm_mt.backward
  local kind = cm_mt.kind
  local COPY = { Concat = true, Split = true }
  cm_mt.forward = function(c, ...)
    local k = kind(c)
    if COPY[k] then bump("chan_copy") elseif k == "Add" then bump("add_fwd") end
    return fwd(c, ...)
  end
  cm_mt.backward = function(c, ...)
    local k = kind(c)
    if COPY[k] then bump("chan_copy") elseif k == "Add" then bump("add_bwd") end
    return bwd(c, ...)
  end
end

-- the fused primitives (absent before them)
local C = lucid.nn
local uncounted_chan_sum = rawget(C, "chan_sum")
for name, key in pairs({ chan_sum = "chan_copy", add_n = "add_n" }) do
  local f = rawget(C, name)
  if f then C[name] = function(...) bump(key) return f(...) end end
end

local build = require("lucid.models." .. (opt.model == "yolov8" and "yolov8_pose" or "yolo11_pose"))
local containers = require("lucid.nn.containers")
local sim = require("dy_terms_sim")

local function run(on, terms)
  containers.fuse_sums = on
  containers.dy_terms = terms and true or false
  local remove, stats
  if terms then
    remove, stats = sim.install({ scale = (opt.nominal / opt.size) ^ 2, chan_sum = uncounted_chan_sum })
  end
  local ok, res = pcall(function()
    lucid.manual_seed(0)
    local m = build({ scale = opt.scale, nc = 1, kpt_shape = { 17, 3 } })
    wrap_cmodules(m)
    local x = lucid.rand({ opt.batch, 3, opt.size, opt.size }):to(opt.dtype)
    local r
    for pass = 1, 2 do
      counts = pass == 2 and {} or nil
      local taken0 = stats and stats.taken or 0
      local out = m:forward(x)
      local gy = {}
      for _, k in ipairs({ "boxes", "scores", "kpts" }) do gy[k] = lucid.ones(out[k]:shape()):to(opt.dtype) end
      local fw = counts and {} or nil
      if fw then for k, v in pairs(counts) do fw[k] = v end end
      if counts then counts.fwd = fw end
      m:backward(x, gy)
      if counts then counts.bn_terms = (stats and stats.taken or 0) - taken0 end
      r = counts
    end
    counts = nil
    return r
  end)
  counts = nil
  if remove then remove() end
  containers.dy_terms = true
  if not ok then error(res, 0) end
  return res
end

local function show(label, c)
  local f = c.fwd
  local function n(t, k) return t[k] or 0 end
  print(string.format("%-16s forward: chan_copy %d, add_fwd %d, add %d, add_n %d | backward: chan_copy %d, "
    .. "add %d, add_n %d, add_bwd %d, bn_terms %d | step: chan_copy %d, adds %d",
    label, n(f, "chan_copy"), n(f, "add_fwd"), n(f, "add"), n(f, "add_n"),
    n(c, "chan_copy") - n(f, "chan_copy"), n(c, "add") - n(f, "add"), n(c, "add_n") - n(f, "add_n"),
    n(c, "add_bwd"), n(c, "bn_terms"), n(c, "chan_copy"), n(c, "add_fwd") + n(c, "add") + n(c, "add_n")))
end

print(string.format("%s-%s batch %d, %dx%d, %s (terms=1: the GPU's choice simulated for %dx%d)", opt.model,
  opt.scale, opt.batch, opt.size, opt.size, opt.dtype, opt.nominal, opt.nominal))
if opt.fuse == "both" or opt.fuse == 0 then show("fuse=0", run(false, false)) end
if opt.fuse == "both" or opt.fuse == 1 then
  show("fuse=1 terms=0", run(true, false))
  show("fuse=1 terms=1", run(true, true))
end
