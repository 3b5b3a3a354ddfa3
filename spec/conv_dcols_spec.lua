-- conv_dcols_spec.lua — the Conv block's backward with the BatchNorm
-- backward writing the conv's backward-data im2col columns (lucid.nn.prim
-- conv_dcols_reserve / bn_backward_dcols / bn_silu_backward_dcols; the
-- engine side: engine/nn/nn.h lucid_conv_dcols, cuda/nn_norm_bwd.cu
-- bn_grad_dx1_cols; LUCID_BN_EMIT_COLS=0 turns it off, read per call).
--
-- CPU part (make test): the binding's argument errors; on the CPU nothing
-- is reserved (lucid.nn.conv2d_dcols_reserve is false, the CPU kernel table
-- has no columns) and Conv:backward gives the bytes of the plain calls
-- (the pre-existing backward, written out here) on the fused and the
-- separate route; the gate refuses a conv or bn whose backward is
-- overridden.
-- GPU part (#gpu, make test-gpu): Conv(c, c, 3) blocks in bf16 and f16 at
-- N 4 on 40x40 and 20x20 maps, fused SiLU, separate SiLU and act=false,
-- forward + backward with the switch on and LUCID_BN_EMIT_COLS=0 (setenv
-- through the LuaJIT FFI): grad_input, every parameter gradient and buffer
-- bitwise equal (lucid.hash_tensor), the reservation made on, declined off,
-- and one im2col launch fewer per backward on (the cuda test hook
-- lucid_cuda_conv_col_launch_count through the FFI); a YOLO11n-pose forward
-- + backward at 4x3x320x320 bitwise equal on and off, with fewer im2col
-- launches on.
local lucid = require "lucid"
-- the process's own LUCID_BN_EMIT_COLS, restored after each case
local ENV0 = os.getenv("LUCID_BN_EMIT_COLS")
local nn = require "lucid.nn"
local P = require "lucid.nn.prim"
local err_of = require("support.errors").err_of

local function same_bytes(a, b) return lucid.hash_tensor(a) == lucid.hash_tensor(b) end

-- A Conv(c1, c2, k, s, act) materialised on ctx with non-trivial BN
-- weight/bias (a fresh context with the same seed gives the same block).
local function block(ctx, o, c1, c2, k, s, act)
  local m = nn.Conv(c1, c2, k, s, nil, nil, nil, act)
  nn.materialize(m, { ctx = ctx, device = o.device })
  local w, b = m.bn:parameters()[1]:data(), m.bn:parameters()[2]:data()
  w:copy_(lucid.rand(w:shape(), { ctx = ctx, dtype = w:dtype(), device = w:device() }):add(0.5))
  b:copy_(lucid.rand(b:shape(), { ctx = ctx, dtype = b:dtype(), device = b:device() }):sub(0.5))
  return m
end

-- Forward + backward of m; every result as a host copy.
local function pass(m, x, gy)
  for _, p in ipairs(m:parameters()) do p:grad():zero_() end
  local r = { y = m:forward(x):to("cpu") }
  r.gx = m:backward(x, gy):to("cpu")
  for i, p in ipairs(m:parameters()) do r["g" .. i] = p:grad():to("cpu") end
  for i, b in ipairs(m:buffers()) do r["b" .. i] = b:data():to("cpu") end
  return r
end

local function assert_same(a, b, what)
  for k, v in pairs(a) do
    assert.is_truthy(b[k], what .. ": " .. k .. " missing")
    assert.is_true(same_bytes(v, b[k]), what .. ": " .. k .. " differs")
  end
end

-- Conv:backward as it was before the columns (the plain calls).
local function plain_backward(self, x, gy)
  local g
  if self._fused then
    g = P.bn_silu_backward(self.bn, self.act, self._a, gy)
  else
    g = self.act:backward(self._b, gy)
    g = self.bn:backward(self._a, g)
  end
  self.grad_input = self.conv:backward(x, g)
  return self.grad_input
end

describe("Conv backward with the BatchNorm writing the conv's columns (CPU)", function()
  it("checks the binding's arguments", function()
    local m = nn.Conv(4, 8, 3)
    nn.materialize(m)
    local C = lucid.nn
    local x = lucid.randn({ 1, 4, 8, 8 })
    local e = err_of(C.conv2d_dcols_reserve, m.bn._c, x)
    assert.is_truthy(e:find("expected a Conv2d module, got BatchNorm2d", 1, true), e)
    e = err_of(C.conv2d_dcols_reserve, m.conv._c, 3)
    assert.is_truthy(e:find("bad argument #2", 1, true), e)
    m:forward(x)
    local gy = lucid.randn({ 1, 8, 8, 8 })
    e = err_of(C.batchnorm2d_backward_dcols, m.bn._c, m.act._c, m._a, gy, m.bn._c)
    assert.is_truthy(e:find("expected a Conv2d module, got BatchNorm2d", 1, true), e)
    e = err_of(C.batchnorm2d_backward_dcols, m.conv._c, nil, m._a, gy, m.conv._c)
    assert.is_truthy(e:find("expected a BatchNorm2d module, got Conv2d", 1, true), e)
  end)

  it("reserves nothing on the CPU", function()
    local m = nn.Conv(8, 8, 3)
    nn.materialize(m)
    local x = lucid.randn({ 2, 8, 8, 8 })
    assert.is_false(lucid.nn.conv2d_dcols_reserve(m.conv._c, x))
    assert.is_false(P.conv_dcols_reserve(m.conv, nil, x))
    assert.is_false(P.conv_dcols_reserve(m.conv, m.bn, x))
  end)

  for _, route in ipairs({ "fused", "separate", "act=false" }) do
    it("gives the plain calls' bytes on the CPU (" .. route .. ")", function()
      local outs = {}
      for i = 1, 2 do
        P.fuse_bn_silu = route == "fused"
        local ok, err = pcall(function()
          local ctx = lucid.Context{ device = "cpu", seed = 5 }
          local m = block(ctx, { device = "cpu" }, 6, 8, 3, 1, route ~= "act=false")
          if i == 2 then m.backward = plain_backward end
          local x = lucid.randn({ 2, 6, 10, 12 }, { ctx = ctx })
          local gy = lucid.randn({ 2, 8, 10, 12 }, { ctx = ctx })
          outs[i] = pass(m, x, gy)
          assert.are.equal(route == "fused", m._fused)
        end)
        P.fuse_bn_silu = true
        assert(ok, err)
      end
      assert_same(outs[1], outs[2], route)
    end)
  end

  it("the gate: plain 3x3 stride-1 modules only, no overridden backward", function()
    local m = nn.Conv(8, 8, 3)
    nn.materialize(m)
    assert.is_true(P.conv_dcols_allowed(m.conv, nil))
    assert.is_true(P.conv_dcols_allowed(m.conv, m.bn))
    m.conv.backward = function(self, xx, gy) return P.Leaf.backward(self, xx, gy) end
    assert.is_false(P.conv_dcols_allowed(m.conv, nil))
    m.conv.backward = nil
    assert.is_true(P.conv_dcols_allowed(m.conv, nil))
    m.bn.backward = function(self, xx, gy) return P.Leaf.backward(self, xx, gy) end
    assert.is_false(P.conv_dcols_allowed(m.conv, m.bn))
    assert.is_true(P.conv_dcols_allowed(m.conv, nil)) -- the fused pair does not call bn.backward
    for _, args in ipairs({ { 8, 8, 1 }, { 8, 8, 3, 2 }, { 8, 12, 3 }, { 8, 8, 5 } }) do
      local b = nn.Conv((table.unpack or unpack)(args))
      nn.materialize(b)
      assert.is_false(P.conv_dcols_allowed(b.conv, nil), table.concat(args, ","))
    end
    local d = nn.DWConv(8, 8, 3)
    nn.materialize(d)
    assert.is_false(P.conv_dcols_allowed(d.conv, nil))
    local u = nn.Conv(8, 8, 3)
    assert.is_false(P.conv_dcols_allowed(u.conv, nil)) -- not materialised
  end)
end)

-- setenv / unsetenv and the im2col launch counter, through the FFI
local function hooks()
  local lib, ffi = require("support.ffi_lib").lib_with("lucid_cuda_conv_col_launch_count", {
    "int setenv(const char *name, const char *value, int overwrite);",
    "int unsetenv(const char *name);",
    "unsigned long lucid_cuda_conv_col_launch_count(void);",
  })
  if not lib then return nil end
  return {
    switch = function(on)
      if on then ffi.C.setenv("LUCID_BN_EMIT_COLS", "1", 1) else ffi.C.setenv("LUCID_BN_EMIT_COLS", "0", 1) end
    end,
    -- back to the process's own setting (the fusion is off unless it says "1")
    restore = function()
      if ENV0 then ffi.C.setenv("LUCID_BN_EMIT_COLS", ENV0, 1) else ffi.C.unsetenv("LUCID_BN_EMIT_COLS") end
    end,
    count = function() return tonumber(lib.lucid_cuda_conv_col_launch_count()) end,
  }
end

-- without a GPU the block is listed as pending (skipped visibly), as the
-- other #gpu specs do
local describe_gpu = lucid.cuda_available() and describe or pending
describe_gpu("Conv backward with the BatchNorm writing the conv's columns #gpu", function()
  local H
  local env0 = os.getenv("LUCID_BN_EMIT_COLS")
  setup(function() H = assert(hooks(), "the cuda test hooks are not reachable through the FFI") end)
  teardown(function()
    if H then
      if env0 then require("ffi").C.setenv("LUCID_BN_EMIT_COLS", env0, 1)
      else require("ffi").C.unsetenv("LUCID_BN_EMIT_COLS") end
    end
  end)

  -- results, reservations made, im2col launches of the backward
  local function run(on, dt, c, hw, route)
    local r, reserved, launches
    local spy = P.conv_dcols_reserve
    P.fuse_bn_silu = route == "fused"
    H.switch(on)
    local ok, err = pcall(function()
      local ctx = lucid.Context{ device = "cuda", seed = 7 }
      local o = { device = "cuda", dtype = dt, ctx = ctx }
      local m = block(ctx, o, c, c, 3, 1, route ~= "act=false")
      local x = lucid.randn({ 4, c, hw, hw }, { ctx = ctx }):to(o)
      local gy = lucid.randn({ 4, c, hw, hw }, { ctx = ctx }):to(o)
      m:forward(x) -- warm-up: plans, arena
      reserved = 0
      P.conv_dcols_reserve = function(...)
        local v = spy(...)
        if v then reserved = reserved + 1 end
        return v
      end
      for _, p in ipairs(m:parameters()) do p:grad():zero_() end
      r = { y = m:forward(x):to("cpu") }
      local c0 = H.count()
      r.gx = m:backward(x, gy):to("cpu")
      launches = H.count() - c0
      for i, p in ipairs(m:parameters()) do r["g" .. i] = p:grad():to("cpu") end
      for i, b in ipairs(m:buffers()) do r["b" .. i] = b:data():to("cpu") end
    end)
    P.conv_dcols_reserve = spy
    P.fuse_bn_silu = true
    H.restore()
    assert(ok, err)
    return r, reserved, launches
  end

  for _, dt in ipairs({ "bf16", "f16" }) do
    for _, route in ipairs({ "fused", "separate", "act=false" }) do
      for _, c in ipairs({ 32, 64 }) do
        for _, hw in ipairs({ 40, 20 }) do
          local what = ("%s %s Conv(%d, %d, 3) at 4x%dx%dx%d"):format(dt, route, c, c, c, hw, hw)
          it(what .. ": bitwise the same with LUCID_BN_EMIT_COLS=0, one im2col fewer", function()
            local a, na, la = run(true, dt, c, hw, route)
            local b, nb, lb = run(false, dt, c, hw, route)
            assert.are.equal(1, na, "reserved with the switch on")
            assert.are.equal(0, nb, "reserved with the switch off")
            assert.are.equal(lb - 1, la, "im2col launches on / off")
            assert_same(a, b, what)
          end)
        end
      end
    end
  end

  it("YOLO11n-pose bf16 4x3x320x320: forward + backward bitwise the same on and off, fewer im2col launches on", function()
    local yolo11 = require "lucid.models.yolo11_pose"
    local res = {}
    for i, on in ipairs({ true, false }) do
      H.switch(on)
      local ok, err = pcall(function()
        local ctx = lucid.Context{ device = "cuda", seed = 9 }
        local m = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 }, device = "cuda", ctx = ctx })
        local o = { device = "cuda", dtype = "bf16", ctx = ctx }
        local x = lucid.rand({ 4, 3, 320, 320 }, { ctx = ctx }):to(o)
        m:train()
        local function step()
          m:zero_grad()
          local y = m:forward(x)
          local g = {}
          for _, k in ipairs({ "boxes", "scores", "kpts" }) do g[k] = lucid.ones(y[k]:shape(), o) * 0.01 end
          m:backward(x, g)
        end
        step() -- warm-up
        local c0 = H.count()
        step()
        res[i] = { launches = H.count() - c0, grads = m.params:flat_grads():to("cpu") }
      end)
      H.restore()
      assert(ok, err)
    end
    assert.is_true(same_bytes(res[1].grads, res[2].grads), "parameter gradients differ")
    assert.is_true(res[1].launches < res[2].launches,
      ("im2col launches %d on, %d off"):format(res[1].launches, res[2].launches))
  end)
end)
