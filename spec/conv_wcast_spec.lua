-- conv_wcast_spec.lua — lucid.nn.conv_cast_weights and the weight-cast
-- prologue of Model:forward (the 1x1 conv weight shadows of
-- engine/nn/nn.h, lucid_conv_wshadow).
--
-- CPU part (make test): the binding's argument errors, a call on CPU
-- modules does nothing, and a CPU model's forward is unchanged by the
-- prologue (the same bytes as calling the layers without it is not
-- observable; the check is that the forward runs and its outputs equal a
-- second model's with the same parameters).
-- GPU part (#gpu, make test-gpu): a YOLO11n-pose forward + backward in
-- bf16 and f16 launches TWO weight casts (the group cast of the prologue:
-- the plain casts on the compute stream, the backward-data's flipped and
-- transposed copies on the cast lane, cuda/nn_conv.cu) and none in the
-- backward, and its outputs and gradients equal, byte for byte
-- (lucid.hash_tensor), those of the per-call casts
-- (lucid_cuda_nn_set_wcast(ctx, 1) through the LuaJIT FFI:
-- LUCID_WCAST_ONCE=0 for this context); after an optimizer-like in-place
-- write of the parameters the next forward re-casts and still equals the
-- per-call route.  With lucid_cuda_nn_set_wcast_side(ctx, 1)
-- (LUCID_WCAST_SIDE=0 for this context) the group cast is ONE launch and
-- the results are the same bytes, on the original and the written
-- parameters.  LUCID_WCAST_SIDE itself (read once per process) in child
-- processes: a 3x3 conv's group cast is 2 launches without it, 1 with
-- LUCID_WCAST_SIDE=0.
local lucid = require "lucid"
local nn = require "lucid.nn"
local yolo11 = require "lucid.models.yolo11_pose"
local err_of = require("support.errors").err_of

local function conv_modules(m, pred)
  local list = {}
  m:apply(function(x)
    if getmetatable(x).__name == "Conv2d" and x._c and (not pred or pred(x)) then list[#list + 1] = x._c end
  end)
  return list
end

describe("lucid.nn.conv_cast_weights", function()
  it("checks its arguments", function()
    local m = nn.Conv(8, 16, 1)
    nn.materialize(m)
    local C = lucid.nn
    local e = err_of(C.conv_cast_weights, "x", "bf16")
    assert.is_truthy(e:find("bad argument #1", 1, true), e)
    e = err_of(C.conv_cast_weights, { m.conv._c }, "f64")
    assert.is_truthy(e:find('bad argument #2 (dtype): expected "bf16", "f16" or "f32", got \'f64\'', 1, true), e)
    e = err_of(C.conv_cast_weights, { m.conv._c, 3 }, "bf16")
    assert.is_truthy(e:find("bad argument #1 (modules[2]): expected lucid.CModule, got number", 1, true), e)
    e = err_of(C.conv_cast_weights, { m.conv._c, m.bn._c }, "bf16")
    assert.is_truthy(e:find("is a BatchNorm2d, not a Conv2d", 1, true), e)
  end)

  it("does nothing on CPU modules, for an empty list and for f32", function()
    local m = nn.Conv(8, 16, 1)
    nn.materialize(m)
    local before = lucid.hash_tensor(m.conv._c:parameters()[1]:data())
    assert.is_nil(lucid.nn.conv_cast_weights({ m.conv._c }, "bf16"))
    assert.is_nil(lucid.nn.conv_cast_weights({}, "bf16"))
    assert.is_nil(lucid.nn.conv_cast_weights({ m.conv._c }, "f32"))
    assert.equal(before, lucid.hash_tensor(m.conv._c:parameters()[1]:data()))
  end)

  it("a CPU model's forward runs the prologue and gives the same outputs as a copy", function()
    lucid.manual_seed(3)
    local a = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 } })
    local b = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 } })
    b.params:flat_params():copy_(a.params:flat_params())
    local x = lucid.rand({ 1, 3, 64, 64 })
    local ya, yb = a:forward(x), b:forward(x)
    for _, k in ipairs({ "boxes", "scores", "kpts" }) do
      assert.equal(lucid.hash_tensor(yb[k]), lucid.hash_tensor(ya[k]), k)
    end
    -- the 1x1 convs the prologue would cast on the GPU: some, not all
    local n1, all = #conv_modules(a, function(c) return c.k == 1 and c.s == 1 and c.p == 0 and c.g == 1 end),
      #conv_modules(a)
    assert.is_true(n1 > 0 and n1 < all, ("%d of %d"):format(n1, all))
  end)
end)

-- the per-context switch and the launch counter, through the FFI
local function hooks()
  local lib, ffi = require("support.ffi_lib").lib_with("lucid_cuda_nn_set_wcast", {
    "int lucid_cuda_nn_set_wcast(void *ctx, int mode); unsigned long lucid_cuda_wcast_launch_count(void);",
    "int lucid_cuda_nn_set_wcast_side(void *ctx, int mode);",
  })
  if not lib then return nil end
  return {
    set = function(ctx, mode) return lib.lucid_cuda_nn_set_wcast(ffi.cast("void **", ctx)[0], mode) end,
    side = function(ctx, mode) return lib.lucid_cuda_nn_set_wcast_side(ffi.cast("void **", ctx)[0], mode) end,
    count = function() return tonumber(lib.lucid_cuda_wcast_launch_count()) end,
  }
end

-- without a GPU the block is listed as pending (skipped visibly), as the
-- other #gpu specs do
local describe_gpu = lucid.cuda_available() and describe or pending
describe_gpu("1x1 conv weights cast once per forward #gpu", function()
  local H, ctx
  setup(function()
    H = assert(hooks(), "the cuda test hooks are not reachable through the FFI")
    ctx = lucid.Context({ device = "cuda", seed = 11 })
  end)

  for _, dt in ipairs({ "bf16", "f16" }) do
    it(dt .. ": two cast launches per forward (one on the cast lane), none in the backward, "
      .. "bitwise the per-call casts and the single launch", function()
      local m = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 }, device = "cuda", ctx = ctx })
      local o = { device = "cuda", dtype = dt, ctx = ctx }
      local x = lucid.rand({ 2, 3, 64, 64 }):to(o)
      local function pass()
        m:zero_grad()
        local c0 = H.count()
        local y = m:forward(x)
        local c1 = H.count()
        local gy = {}
        for _, k in ipairs({ "boxes", "scores", "kpts" }) do gy[k] = lucid.ones(y[k]:shape(), o) * 0.01 end
        m:backward(x, gy)
        ctx:synchronize()
        local h = {}
        for _, k in ipairs({ "boxes", "scores", "kpts" }) do h[k] = lucid.hash_tensor(y[k]) end
        h.grads = lucid.hash_tensor(m.params:flat_grads())
        return h, c1 - c0, H.count() - c1
      end
      H.set(ctx, 1)
      local ref, f0, b0 = pass()
      assert.is_true(f0 > 1 and b0 > 1, ("per-call route: %d + %d casts"):format(f0, b0))
      H.set(ctx, 2)
      H.side(ctx, 2) -- the copies on the cast lane (the default; set for the counts)
      -- the first backward on the shadows asks each strided conv's shadow for
      -- its transposed copy (igemm_dgrad_ph, cast per call that once); the
      -- group casts of the passes after it write that copy too
      pass()
      local got, f1, b1 = pass()
      assert.equal(2, f1, "forward: the prologue's group cast, its copies on the cast lane")
      assert.equal(0, b1, "backward: no cast")
      assert.same(ref, got)
      -- unchanged weights: the prologue finds every shadow fresh
      local _, f2, b2 = pass()
      assert.equal(0, f2 + b2)
      -- an optimizer-like in-place write of every parameter
      local p = m.params:flat_params()
      local p0 = p:clone()
      p:mul_(0.5)
      local got2, f3, b3 = pass()
      assert.equal(2, f3)
      assert.equal(0, b3)
      -- the single launch (LUCID_WCAST_SIDE=0 for this context): the same
      -- bytes on the original parameters and on the written ones
      H.side(ctx, 1)
      p:copy_(p0)
      local one, f4, b4 = pass()
      assert.equal(1, f4, "forward: one group-cast launch with the copies")
      assert.equal(0, b4)
      assert.same(ref, one)
      p:mul_(0.5)
      local one2, f5, b5 = pass()
      assert.equal(1, f5)
      assert.equal(0, b5)
      assert.same(got2, one2)
      H.side(ctx, 0)
      H.set(ctx, 1)
      local ref2 = pass()
      H.set(ctx, 0)
      assert.same(ref2, got2)
      assert.are_not.same(ref, ref2)
    end)
  end

  -- the process switch, read once: in child processes
  it("LUCID_WCAST_SIDE=0 puts the copies back into the one launch", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write([[
package.cpath = "./?.so;" .. package.cpath
local lucid = require "lucid"
local nn = require "lucid.nn"
local ffi = require "ffi"
ffi.cdef("unsigned long lucid_cuda_wcast_launch_count(void);")
local lib = ffi.C
if not pcall(function() return lib.lucid_cuda_wcast_launch_count end) then
  lib = ffi.load(package.searchpath("lucid", package.cpath))
end
local ctx = lucid.Context({ device = "cuda", seed = 5 })
local m = nn.Conv(16, 32, 3)
nn.materialize(m, { device = "cuda", ctx = ctx })
local c0 = tonumber(lib.lucid_cuda_wcast_launch_count())
lucid.nn.conv_cast_weights({ m.conv._c }, "bf16")
ctx:synchronize()
io.write("launches=", tonumber(lib.lucid_cuda_wcast_launch_count()) - c0, "\n")
]])
    f:close()
    local function launches(env)
      -- the im2col backward-data on (its flipped weight is the copy)
      local p = io.popen(env .. " LUCID_CONV_COL=1 LUCID_WCAST_ONCE=1 luajit " .. script .. " 2>&1")
      local out = p:read("*a")
      p:close()
      return tonumber(out:match("launches=(%d+)")), out
    end
    local on, out_on = launches("env -u LUCID_WCAST_SIDE")
    local off, out_off = launches("env LUCID_WCAST_SIDE=0")
    os.remove(script)
    assert.equal(2, on, out_on)
    assert.equal(1, off, out_off)
  end)

  -- the plain casts on the cast lane (default): the forward's GEMMs wait for
  -- the mark after them. Same bytes as with the plain casts ahead on the
  -- compute stream (LUCID_WCAST_PLAIN_SIDE=0) and as one launch
  -- (LUCID_WCAST_SIDE=0), eager and replayed from a recorded graph
  it("LUCID_WCAST_PLAIN_SIDE: same forward and gradients, eager and recorded", function()
    local child = require("support.replay_child")
    local src = child.source({ shape = { 2, 3, 64, 64 } })
    local e1, r1, _, o1 = child.digests(src, "env -u LUCID_WCAST_PLAIN_SIDE -u LUCID_WCAST_SIDE")
    local e2, r2, _, o2 = child.digests(src, "env LUCID_WCAST_PLAIN_SIDE=0")
    local e3, r3, _, o3 = child.digests(src, "env LUCID_WCAST_SIDE=0")
    assert.is_truthy(e1 and r1, o1)
    assert.is_truthy(e2 and r2, o2)
    assert.is_truthy(e3 and r3, o3)
    assert.are_not.equal(e1, r1) -- the halved weights changed the replay's result
    assert.equal(e1, e2, o2)
    assert.equal(r1, r2, o2)
    assert.equal(e1, e3, o3)
    assert.equal(r1, r3, o3)
  end)
end)
