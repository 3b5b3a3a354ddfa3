--- bench/count_sums.lua — how many channel-copy and add launches one
-- training step of a model issues on the GPU, counted on the CPU from the
-- calls that issue them (no GPU needed: the Lua calls are the same on the
-- CPU and the GPU; the GPU only runs the head's branches on lanes, which
-- changes no call).
--
--   luajit bench/count_sums.lua [model=yolo11|yolov8] [scale=n] [batch=4]
--     [size=64] [dtype=f32] [fuse=1|0|both]
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
-- The image size does not change the counts (no tensor here reaches the
-- 2^30-element chunking of the add kernels). fuse=both prints the counts
-- with LUCID_FUSE_SUMS off and on (the blocks' switch,
-- require("lucid.nn.containers").fuse_sums).
package.path = "./lua/?.lua;./lua/?/init.lua;" .. package.path
package.cpath = "./?.so;" .. package.cpath
local lucid = require("lucid")

local opt = { model = "yolo11", scale = "n", batch = 4, size = 64, dtype = "f32", fuse = "both" }
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
for name, key in pairs({ chan_sum = "chan_copy", add_n = "add_n" }) do
  local f = rawget(C, name)
  if f then C[name] = function(...) bump(key) return f(...) end end
end

local build = require("lucid.models." .. (opt.model == "yolov8" and "yolov8_pose" or "yolo11_pose"))
local containers = require("lucid.nn.containers")

local function run(on)
  containers.fuse_sums = on
  lucid.manual_seed(0)
  local m = build({ scale = opt.scale, nc = 1, kpt_shape = { 17, 3 } })
  wrap_cmodules(m)
  local x = lucid.rand({ opt.batch, 3, opt.size, opt.size }):to(opt.dtype)
  local res
  for pass = 1, 2 do
    counts = pass == 2 and {} or nil
    local out = m:forward(x)
    local gy = {}
    for _, k in ipairs({ "boxes", "scores", "kpts" }) do gy[k] = lucid.ones(out[k]:shape()):to(opt.dtype) end
    local fw = counts and {} or nil
    if fw then for k, v in pairs(counts) do fw[k] = v end end
    if counts then counts.fwd = fw end
    m:backward(x, gy)
    res = counts
  end
  counts = nil
  return res
end

local function show(label, c)
  local f = c.fwd
  local function n(t, k) return t[k] or 0 end
  print(string.format("%-8s forward: chan_copy %d, add_fwd %d, add %d, add_n %d | backward: chan_copy %d, "
    .. "add %d, add_n %d, add_bwd %d | step: chan_copy %d, adds %d",
    label, n(f, "chan_copy"), n(f, "add_fwd"), n(f, "add"), n(f, "add_n"),
    n(c, "chan_copy") - n(f, "chan_copy"), n(c, "add") - n(f, "add"), n(c, "add_n") - n(f, "add_n"),
    n(c, "add_bwd"), n(c, "chan_copy"), n(c, "add_fwd") + n(c, "add") + n(c, "add_n")))
end

print(string.format("%s-%s batch %d, %dx%d, %s", opt.model, opt.scale, opt.batch, opt.size, opt.size, opt.dtype))
if opt.fuse == "both" or opt.fuse == 0 then show("fuse=0", run(false)) end
if opt.fuse == "both" or opt.fuse == 1 then show("fuse=1", run(true)) end
