-- bn_dy_terms_spec.lua — gradient descriptions: the Conv block's BatchNorm
-- backward reading its incoming gradient as a sum of terms / channel slices
-- (lucid.nn.containers desc / materialize / sum_desc / residual /
-- takes_desc; lucid.nn.prim bn_silu_backward_terms / bn_backward_terms;
-- the binding lucid.nn.batchnorm2d_backward_terms / batchnorm2d_terms_fit;
-- engine/nn/nn.h lucid_nn_batchnorm2d_backward_terms; switch
-- LUCID_BN_DY_TERMS, containers.dy_terms).
--
-- CPU part (make test):
--   - a description's value (containers.materialize) is bitwise the sum the
--     producer would have written (containers.sum / piece, i.e. chained
--     Tensor:add), f32 / bf16 / f16 / f64, whole tensors, slices, several
--     pieces, more than four terms; the binding's pieces; residual;
--   - the binding's argument errors and the engine's checks; the CPU never
--     takes a description (taken false, nothing written);
--   - every block that produces or takes descriptions, and both pose
--     models, give bitwise the same outputs, input gradients, parameter
--     gradients, parameters and buffers, two passes each, f32 and bf16, on
--     four routes: LUCID_FUSE_SUMS off; on with LUCID_BN_DY_TERMS off (the
--     launches of DECISIONS 33); on with descriptions (the CPU engine
--     declines, every description is materialised where it is read); and on
--     with the GPU's choice simulated (spec/support/dy_terms_sim.lua: calls
--     of one-part channels taken, the BatchNorm then reading the
--     description's value computed by the engine's definition), for small
--     and scaled-up plane sizes (some calls taken, some declined);
--   - a module whose backward is replaced (instance override) never
--     receives a description, nor does a block's child whose backward is
--     replaced;
--   - the launches of one YOLO11n-pose step (batch 4) with the GPU's choice
--     simulated for 640 px: backward channel copies 30 -> 19, adds 14 -> 6,
--     n-ary adds 3 -> 1 (24 BatchNorm backwards read descriptions); steady
--     passes allocate nothing;
--   - LUCID_BN_DY_TERMS=0 in the environment turns containers.dy_terms off.
-- GPU part (#gpu, make test-gpu):
--   - the blocks on cuda, bf16 and f32: the routes above with the real
--     engine bitwise equal;
--   - YOLO11n-pose bf16, batch 4, 640 px, forward + backward: bitwise equal
--     with descriptions on and off; the GPU's own channel-copy counter
--     (lucid_cuda_chan_copy_op_count: chan_copy_multi / chan_sum_multi,
--     which add_n launches too) 13 launches lower (11 copies / sums and 2
--     n-ary adds), Tensor:add (map_contig_kernel) 8 lower, and 24
--     bn_grad_dx1_terms launches (lucid_cuda_bn_terms_count), as the CPU
--     simulation counts (expected numbers from it, not yet seen on a GPU);
--   - recorded: a child process per LUCID_BN_DY_TERMS setting records the
--     model's forward + backward in a CUDA graph and replays it: eager and
--     replayed digests equal across the settings, and the replay ran the
--     terms kernels it recorded.
package.path = "spec/support/?.lua;" .. package.path
local lucid = require("lucid")
local err_of = require("support.errors").err_of
local nn = require("lucid.nn")
local P = require("lucid.nn.prim")
local containers = require("lucid.nn.containers")
local yolo11 = require("lucid.models.yolo11_pose")
local yolov8 = require("lucid.models.yolov8_pose")
local sim = require("dy_terms_sim")

local PO = require("support.pose_out")
local KEYS, hash, grad_like = PO.KEYS, PO.hash, PO.grad_like
local unpack = table.unpack or unpack

local function input(shape, o, seed)
  lucid.manual_seed(seed or 5)
  return lucid.randn(shape):to(o)
end

-- The routes: {fuse_sums, dy_terms, simulated engine scale (nil: the real
-- engine)}.
local ROUTES = {
  { "unfused", false, false },
  { "fused, LUCID_BN_DY_TERMS=0", true, false },
  { "descriptions (the engine's own choice)", true, true },
  { "descriptions, GPU choice simulated (planes as they are)", true, true, 1 },
  { "descriptions, GPU choice simulated (planes x1000)", true, true, 1000 },
}

-- Run pass(route) under each route (switches restored after each); the
-- list of what each returned.
-- Also returns, per route, the simulated engine's {taken =, declined =}
-- (nil on the other routes).
local function under_routes(routes, pass)
  local res, stats = {}, {}
  for r, rt in ipairs(routes) do
    local f0, t0 = containers.fuse_sums, containers.dy_terms
    containers.fuse_sums, containers.dy_terms = rt[2], rt[3]
    local remove
    if rt[4] then remove, stats[r] = sim.install({ scale = rt[4] }) end
    local ok, err = pcall(function() res[r] = pass(rt) end)
    if remove then remove() end
    containers.fuse_sums, containers.dy_terms = f0, t0
    if not ok then error(rt[1] .. ": " .. tostring(err), 0) end
  end
  return res, stats
end

-- m materialised once; each route starts from the same parameters and
-- buffers and runs two passes: hashes of outputs, input gradients,
-- parameter gradients, and of every parameter and buffer at the end.
local function routes_of(m, x, o, routes)
  local set = nn.materialize(m, { device = o.device, ctx = o.ctx })
  local restore, gys = PO.snapshot(set), {}
  local function no_desc(gx) assert(not containers.is_desc(gx), "a description escaped as an input gradient") end
  return under_routes(routes or ROUTES, function()
    restore()
    return PO.passes(m, x, o, set, gys, 100, no_desc)
  end)
end

-- The blocks, each with its input and how many BatchNorm backwards of one
-- pass read a description when the GPU takes every one (the simulated
-- route with planes as they are; 0: the block receives a tensor and makes
-- none).
local function cases(o, N)
  N = N or 2
  local function x(c, h) return function() return input({ N, c, h, h }, o) end end
  return {
    { "Conv", function() return nn.Conv(8, 16, 3) end, x(8, 6), 0 },
    { "Bottleneck (residual)", function() return nn.Bottleneck(8, 8, true) end, x(8, 6), 0 },
    { "C2f n=1 shortcut", function() return nn.C2f(8, 16, 1, true) end, x(8, 6), 2 },
    { "C2f n=2 shortcut", function() return nn.C2f(8, 16, 2, true) end, x(8, 6), 2 },
    { "C2f n=1 no shortcut", function() return nn.C2f(8, 16, 1, false) end, x(8, 6), 2 },
    { "C3k2 c3k=false n=2", function() return nn.C3k2(16, 32, 2, false, 0.5) end, x(16, 6), 2 },
    { "C3k2 c3k=true", function() return nn.C3k2(16, 32, 1, true) end, x(16, 6), 4 },
    { "C3k2 c3k=true n=2", function() return nn.C3k2(16, 16, 2, true) end, x(16, 6), 7 },
    { "C3k2 attn", function() return nn.C3k2(128, 128, 1, false, 0.5, true) end, x(128, 4), 2 },
    { "C3 n=2", function() return nn.C3(16, 16, 2) end, x(16, 6), 2 },
    { "C3k n=2", function() return nn.C3k(16, 16, 2) end, x(16, 6), 2 },
    { "SPPF", function() return nn.SPPF(16, 16) end, x(16, 6), 1 },
    { "SPPF shortcut", function() return nn.SPPF(16, 16, 5, 3, true) end, x(16, 6), 1 },
    { "PSABlock", function() return nn.PSABlock(64, 0.5, 1) end, x(64, 4), 0 },
    { "C2PSA n=1", function() return nn.C2PSA(128, 128, 1) end, x(128, 4), 2 },
    { "C2PSA n=2", function() return nn.C2PSA(128, 128, 2) end, x(128, 4), 2 },
    { "Pose head", function() return nn.Pose(1, { 17, 3 }, 16, { 16, 32, 64 }) end, function()
      return { input({ N, 16, 8, 8 }, o, 1), input({ N, 32, 4, 4 }, o, 2), input({ N, 64, 2, 2 }, o, 3) }
    end, 0 },
  }
end

local function models_routes(mk, o, size, routes)
  local m = mk({ scale = "n", nc = 1, kpt_shape = { 17, 3 }, materialize = false, input_grad = true })
  m:materialize({ device = o.device, ctx = o.ctx })
  local x = input({ 2, 3, size, size }, o)
  local restore, gys = PO.snapshot(m.params), {}
  return under_routes(routes or ROUTES, function()
    restore()
    return PO.passes(m, x, o, m.params, gys, 200)
  end)
end

-- The simulated routes took (scale 1: every call, `want` per pass, two
-- passes) and declined what they should.
local function check_sim(routes, stats, want)
  for r, rt in ipairs(routes) do
    local st = stats[r]
    if st and rt[4] == 1 and want then
      assert.same({ taken = 2 * want, declined = 0 }, st, rt[1])
    elseif st and rt[4] == 1000 and want then
      assert.equal(0, st.taken, rt[1]) -- planes x1000: multi-part everywhere
    end
  end
end

local function check_blocks(o, routes)
  routes = routes or ROUTES
  for _, c in ipairs(cases(o)) do
    it(c[1] .. ": every route bitwise equal", function()
      local res, stats = routes_of(c[2](), c[3](), o, routes)
      for r = 2, #res do assert.same(res[1], res[r], routes[r][1]) end
      check_sim(routes, stats, c[4])
    end)
  end
  for _, mk in ipairs({ { "YOLO11n-pose", yolo11 }, { "YOLOv8n-pose", yolov8 } }) do
    it(mk[1] .. " (input gradient too): every route bitwise equal", function()
      local res, stats = models_routes(mk[2], o, 32, routes)
      for r = 2, #res do assert.same(res[1], res[r], routes[r][1]) end
      for r, rt in ipairs(routes) do
        if stats[r] then
          assert.is_true(stats[r].taken > 0, rt[1] .. ": nothing taken")
          if rt[4] == 1000 then assert.is_true(stats[r].declined > 0, rt[1] .. ": nothing declined") end
        end
      end
    end)
  end
end

describe("gradient descriptions: the value is the producer's sum, bitwise (cpu)", function()
  it("materialize = containers.sum / piece = chained Tensor:add (f32, bf16, f16, f64)", function()
    local C = nn.binding()
    for _, dt in ipairs({ "f32", "bf16", "f16", "f64" }) do
      lucid.manual_seed(9)
      local a = (lucid.randn({ 2, 5, 3, 3 }) * 100):to(dt)
      local b = lucid.randn({ 2, 5, 3, 3 }):to(dt)
      local c = (lucid.randn({ 2, 5, 3, 3 }) * 0.01):to(dt)
      local d = lucid.randn({ 2, 5, 3, 3 }):to(dt)
      local e = lucid.randn({ 2, 5, 3, 3 }):to(dt)
      local wide = lucid.randn({ 2, 9, 3, 3 }):to(dt)
      local D = containers.desc
      -- one whole tensor is no description
      assert.is_true(rawequal(a, D({ { 0, 5, a } })))
      assert.equal(hash(a:add(b)), hash(containers.materialize(D({ { 0, 5, a, b } }))), dt)
      assert.equal(hash(a:add(b):add(c)), hash(containers.materialize(D({ { 0, 5, a, b, c } }))), dt)
      assert.equal(hash(a:add(b):add(c):add(d):add(e)),
        hash(containers.materialize(D({ { 0, 5, a, b, c, d, e } }))), dt)
      -- a slice (a copy) and slices in a sum
      local s1 = containers.slice(wide, 4, 5)
      local ref = wide:narrow(2, 5, 5):contiguous()
      assert.equal(hash(ref), hash(containers.materialize(D({ { 0, 5, s1 } }))), dt)
      assert.equal(hash(a:add(ref)), hash(containers.materialize(D({ { 0, 5, a, s1 } }))), dt)
      assert.equal(hash(ref:add(a):add(b)), hash(containers.materialize(D({ { 0, 5, s1, a, b } }))), dt)
      -- several pieces into the producer's buffer
      local buf = lucid.zeros({ 2, 8, 3, 3 }):to(dt)
      local dd = D({ { 0, 3, containers.slice(wide, 0, 3) }, { 3, 5, a, containers.slice(wide, 2, 5), c } },
        function() return buf end)
      assert.is_true(containers.is_desc(dd))
      local v = containers.materialize(dd)
      assert.is_true(rawequal(v, buf))
      assert.is_true(rawequal(v, containers.materialize(dd))) -- written once
      local want = lucid.zeros({ 2, 8, 3, 3 }):to(dt)
      C.chan_sum({ { want, 0, 3, wide, 0 }, containers.piece(want, 3, 5, { a, containers.slice(wide, 2, 5), c }) })
      assert.equal(hash(want), hash(v), dt)
      -- the binding's pieces: {c0, nch, src, src_c0, ...}
      local ep = containers.engine_pieces(D({ { 0, 3, containers.slice(wide, 1, 3) }, { 3, 2, b, c } }))
      assert.equal(2, #ep)
      assert.equal(0, ep[1][1]); assert.equal(3, ep[1][2]); assert.is_true(rawequal(wide, ep[1][3])); assert.equal(1, ep[1][4])
      assert.equal(3, ep[2][1]); assert.equal(2, ep[2][2]); assert.is_true(rawequal(b, ep[2][3])); assert.equal(0, ep[2][4])
      assert.is_true(rawequal(c, ep[2][5])); assert.equal(0, ep[2][6])
      -- more than four terms: the first ones summed first, shared with the value
      local d5 = D({ { 0, 5, a, b, c, d, e } })
      local ep5 = containers.engine_pieces(d5)
      assert.equal(2 + 2 * 4, #ep5[1])
      assert.equal(hash(a:add(b)), hash(ep5[1][3]), dt)
      assert.equal(hash(a:add(b):add(c):add(d):add(e)), hash(containers.materialize(d5)), dt)
    end
  end)

  it("sum_desc follows the switch; residual keeps a single slice, materialises sums", function()
    local a, b = lucid.randn({ 2, 4, 3, 3 }), lucid.randn({ 2, 4, 3, 3 })
    local wide = lucid.randn({ 2, 8, 3, 3 })
    local prev = containers.dy_terms
    containers.dy_terms = true
    local d = containers.sum_desc({ a, b })
    assert.is_true(containers.is_desc(d))
    assert.is_true(rawequal(a, containers.sum_desc({ a })))
    local s = containers.desc({ { 0, 4, containers.slice(wide, 4, 4) } })
    local g, t = containers.residual(s)
    assert.is_true(rawequal(g, s))
    assert.is_true(containers.is_slice(t))
    local g2, t2 = containers.residual(d)
    assert.is_true(lucid.is_tensor(g2) and rawequal(g2, t2))
    assert.equal(hash(a:add(b)), hash(g2))
    containers.dy_terms = false
    assert.is_false(containers.is_desc(containers.sum_desc({ a, b })))
    containers.dy_terms = prev
  end)

  it("takes_desc: the declaring class's backward only", function()
    local m = nn.Conv(4, 4, 1)
    assert.is_true(containers.takes_desc(m))
    assert.is_true(containers.takes_desc(nn.DWConv(4, 4, 3)))
    assert.is_true(containers.takes_desc(nn.C3k2(8, 8, 1)))
    assert.is_true(containers.takes_desc(nn.C3k(8, 8, 1)))
    m.backward = function(self, x, gy) return nn.Conv.backward(self, x, gy) end
    assert.is_false(containers.takes_desc(m))
    assert.is_false(containers.takes_desc(nn.Upsample(2)))
    assert.is_false(containers.takes_desc(nn.Concat(2)))
    assert.is_false(containers.takes_desc(nn.Attention(64, 1)))
  end)
end)

describe("gradient descriptions: the binding (cpu)", function()
  local C = lucid.nn
  local function fused_block()
    local m = nn.Conv(4, 8, 1)
    local set = nn.materialize(m)
    local x = lucid.randn({ 2, 4, 5, 5 })
    m:forward(x)
    return m, x, set
  end

  it("the CPU never takes a description: taken false, nothing written", function()
    local m, x, set = fused_block()
    assert.is_true(m._fused)
    local g = lucid.randn({ 2, 8, 5, 5 })
    local before = hash(set:flat_grads())
    local taken, gx = C.batchnorm2d_backward_terms(m.bn._c, m.act._c, m._a, { { 0, 8, g, 0 } })
    assert.is_false(taken)
    assert.is_nil(gx)
    assert.equal(before, hash(set:flat_grads()))
    assert.is_false(C.batchnorm2d_terms_fit(m.bn._c, m._a))
    assert.is_false(P.bn_terms_fit(m.bn, m._a))
    -- Conv:backward then materialises: the plain call's bits
    local d = containers.desc({ { 0, 3, containers.slice(g, 0, 3) }, { 3, 5, containers.slice(g, 3, 5), g:narrow(2, 4, 5):contiguous() } })
    set:zero_grad()
    local gx1 = m:backward(x, d):clone()
    local pg1 = set:flat_grads():clone()
    set:zero_grad()
    local gx2 = m:backward(x, containers.materialize(d))
    assert.equal(hash(gx1), hash(gx2))
    assert.equal(hash(pg1), hash(set:flat_grads()))
  end)

  it("checks its arguments and the pieces", function()
    local m, x = fused_block()
    local a = m._a
    local g = lucid.randn({ 2, 8, 5, 5 })
    local function e(...) return err_of(C.batchnorm2d_backward_terms, ...) end
    assert.truthy(e(m.bn._c, m.act._c, a, 5):find("bad argument #4", 1, true))
    assert.truthy(e(m.bn._c, m.act._c, a, {}):find("expected 1 or more pieces", 1, true))
    assert.truthy(e(m.bn._c, m.act._c, a, { { 0, 8 } }):find("(pieces[1]): expected {c0, nch, src", 1, true))
    assert.truthy(e(m.bn._c, m.act._c, a, { { 0, 8, 3, 0 } }):find("expected lucid.Tensor, got number", 1, true))
    assert.truthy(e(m.bn._c, m.act._c, a, { { 0, 8, g, 0, g, 0, g, 0, g, 0, g, 0 } }):find("1 to 4 sources", 1, true))
    local msg = e(m.bn._c, m.act._c, a, { { 0, 5, g, 0 } })
    assert.truthy(msg:find("cover channels [0, 5) of dy; expected [0, 8)", 1, true), msg)
    msg = e(m.bn._c, m.act._c, a, { { 0, 4, g, 0 }, { 5, 3, g, 5 } })
    assert.truthy(msg:find("piece 1 covers channels [5, 8) of dy; expected pieces tiling [0, 8) in order", 1, true), msg)
    msg = e(m.bn._c, m.act._c, a, { { 0, 8, g, 1 } })
    assert.truthy(msg:find("piece 0 source 0: channels [1, 9) out of range (8)", 1, true), msg)
    msg = e(m.bn._c, m.act._c, a, { { 0, 8, lucid.randn({ 2, 8, 4, 5 }), 0 } })
    assert.truthy(msg:find("piece 0 source 0 has shape [2,8,4,5]; expected [2,*,5,5]", 1, true), msg)
    msg = e(m.bn._c, m.act._c, a, { { 0, 8, g:to("bf16"), 0 } })
    assert.truthy(msg:find("piece 0 source 0 has dtype bf16 but the input has f32", 1, true), msg)
    -- bn's own grad input overlapping a source (after one backward it exists)
    m:backward(x, g)
    msg = e(m.bn._c, m.act._c, a, { { 0, 8, m.bn.grad_input, 0 } })
    assert.truthy(msg:find("grad_input may overlap piece 0 source 0", 1, true), msg)
    msg = e(m.conv._c, m.act._c, a, { { 0, 8, g, 0 } })
    assert.truthy(msg:find("expected a BatchNorm2d and a SiLU module, got Conv2d", 1, true), msg)
    msg = e(m.conv._c, nil, a, { { 0, 8, g, 0 } })
    assert.truthy(msg:find("expected a BatchNorm2d module, got Conv2d", 1, true), msg)
    -- more pieces than the engine reads: declined, not an error
    local many = {}
    for i = 0, 7 do many[#many + 1] = { i, 1, g, i } end
    many[#many + 1] = { 8, 0, g, 0 }
    assert.is_false((C.batchnorm2d_backward_terms(m.bn._c, m.act._c, a, many)))
  end)

  it("LUCID_BN_DY_TERMS=0 in the environment turns the descriptions off", function()
    local run = require("support.errors").run
    local code = [[package.path = './lua/?.lua;./lua/?/init.lua;' .. package.path; ]]
      .. [[package.cpath = './?.so;' .. package.cpath; ]]
      .. [[local c = require('lucid.nn.containers'); io.write('dy_terms=', tostring(c.dy_terms), ]]
      .. [[' describing=', tostring(c.describing()), '\n')]]
    local off = run("LUCID_BN_DY_TERMS=0 luajit -e \"" .. code .. "\"")
    local on = run("env -u LUCID_BN_DY_TERMS luajit -e \"" .. code .. "\"")
    assert.truthy(off:find("dy_terms=false describing=false", 1, true), off)
    assert.truthy(on:find("dy_terms=true describing=true", 1, true), on)
  end)
end)

describe("gradient descriptions: every block and model bitwise equal on every route (cpu)", function()
  for _, dt in ipairs({ "f32", "bf16" }) do
    describe(dt, function() check_blocks({ dtype = dt }) end)
  end
end)

describe("gradient descriptions: who receives them (cpu)", function()
  -- the types of gy each module's backward received
  local function spy(m, seen, tag)
    local f0 = m.backward
    m.backward = function(self, x, gy)
      seen[#seen + 1] = tag .. ":" .. (containers.is_desc(gy) and "desc" or "tensor")
      return f0(self, x, gy)
    end
  end

  it("a replaced backward receives a tensor; the class's own a description", function()
    local remove = sim.install({ scale = 1 })
    local ok, err = pcall(function()
      -- the C2f's inner Bottleneck replaced: its gradient is materialised
      local m = nn.C2f(8, 16, 1, true)
      nn.materialize(m)
      local seen = {}
      spy(m.m:get(1), seen, "inner")
      local x = input({ 2, 8, 6, 6 }, {})
      local y = m:forward(x)
      m:backward(x, grad_like(y, {}, 1))
      assert.same({ "inner:tensor" }, seen)
      -- its cv1 replaced (the split gradient's consumer): a tensor
      local m2 = nn.C2f(8, 16, 1, true)
      nn.materialize(m2)
      local seen2 = {}
      spy(m2.cv1, seen2, "cv1")
      local y2 = m2:forward(x)
      m2:backward(x, grad_like(y2, {}, 1))
      assert.same({ "cv1:tensor" }, seen2)
      -- a model layer replaced through Model:replace_forward receives the
      -- sum (a tensor), and so its Conv does; an intact layer's Conv reads
      -- its description (the simulated engine is asked for its BatchNorm)
      local mdl = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 } })
      local L16, L22 = mdl.layers[17], mdl.layers[23]
      local seen3 = {}
      local own = L16.module.backward
      mdl:replace_forward(L16.module, L16.module.forward, function(self, xx, gy)
        seen3[#seen3 + 1] = containers.is_desc(gy) and "desc" or "tensor"
        return own(self, xx, gy)
      end)
      local asked = {}
      local stub = rawget(lucid.nn, "batchnorm2d_backward_terms")
      rawset(lucid.nn, "batchnorm2d_backward_terms", function(bn_c, ...)
        asked[bn_c] = true
        return stub(bn_c, ...)
      end)
      local ok2, err2 = pcall(function()
        local xx = input({ 2, 3, 32, 32 }, {})
        local yy = mdl:forward(xx)
        mdl:backward(xx, grad_like(yy, {}, 3))
      end)
      rawset(lucid.nn, "batchnorm2d_backward_terms", stub)
      assert(ok2, err2)
      assert.same({ "tensor" }, seen3)
      assert.is_nil(asked[L16.module.cv2.bn._c])
      assert.is_true(asked[L22.module.cv2.bn._c])
    end)
    remove()
    assert(ok, err)
  end)
end)

-- Call counters of the launches a step issues (spec/support/launch_counters.lua):
-- counts, reset, remove, and the binding's uncounted chan_sum / add_n.
local counters = require("support.launch_counters").install

describe("gradient descriptions: launches of one YOLO11n-pose step, the GPU's choice simulated (cpu)", function()
  it("640 px, batch 4: backward chan_copy 30 -> 19, adds 14 -> 6, add_n 3 -> 1; steady passes allocate nothing",
    function()
      local counts, reset, remove, raw = counters()
      local f0, t0 = containers.fuse_sums, containers.dy_terms
      local got = {}
      local ok, err = pcall(function()
        for _, terms in ipairs({ false, true }) do
          containers.fuse_sums, containers.dy_terms = true, terms
          local rm, stats = sim.install({ scale = (640 / 64) ^ 2, chan_sum = raw.chan_sum, empty_like = raw.empty_like })
          local ok2, err2 = pcall(function()
            lucid.manual_seed(0)
            local m = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 } })
            local x = lucid.rand({ 4, 3, 64, 64 })
            local per = {}
            for pass = 1, 3 do
              m:forward(x)
              local gy = {}
              local y = m.output
              for _, k in ipairs(KEYS) do gy[k] = lucid.ones(y[k]:shape()) end
              reset()
              local t1 = stats.taken
              m:backward(x, gy)
              per[pass] = { chan = counts.chan_copy or 0, add = counts.add or 0, add_n = counts.add_n or 0,
                alloc = counts.alloc or 0, taken = stats.taken - t1 }
            end
            got[terms] = per
          end)
          rm()
          assert(ok2, err2)
        end
      end)
      containers.fuse_sums, containers.dy_terms = f0, t0
      remove()
      if not ok then error(err, 0) end
      local off, on = got[false][3], got[true][3]
      assert.same({ chan = 30, add = 14, add_n = 3, alloc = 0, taken = 0 }, off)
      assert.same({ chan = 19, add = 6, add_n = 1, alloc = 0, taken = 24 }, on)
      assert.equal(0, got[true][2].alloc)
    end)
end)

---------------------------------------------------------------------- GPU

local function ffi_hooks()
  local lib = require("support.ffi_lib").lib_with("lucid_cuda_bn_terms_count", {
    "unsigned long lucid_cuda_chan_copy_op_count(void);",
    "unsigned long lucid_cuda_bn_terms_count(void);",
  })
  if not lib then return nil end
  return {
    chan = function() return tonumber(lib.lucid_cuda_chan_copy_op_count()) end,
    terms = function() return tonumber(lib.lucid_cuda_bn_terms_count()) end,
  }
end

local describe_gpu = lucid.cuda_available() and describe or pending
describe_gpu("gradient descriptions on cuda #gpu", function()
  local ctx
  local os_ = { { dtype = "bf16", device = "cuda" }, { dtype = "f32", device = "cuda" } }
  -- the real engine's routes (no simulation on the GPU)
  local GPU_ROUTES = { ROUTES[1], ROUTES[2], ROUTES[3] }
  setup(function()
    ctx = lucid.Context({ device = "cuda", seed = 3 })
    for _, o in ipairs(os_) do o.ctx = ctx end
  end)
  for _, o in ipairs(os_) do
    describe(o.dtype, function() check_blocks(o, GPU_ROUTES) end)
  end

  it("YOLO11n-pose bf16 4x3x640x640: bitwise equal on and off; 13 copy/sum kernels, 8 adds fewer, 24 terms kernels",
    function()
      local H = assert(ffi_hooks(), "the cuda test hooks are not reachable through the FFI")
      local counts, reset, remove = counters()
      local f0, t0 = containers.fuse_sums, containers.dy_terms
      local got = {}
      local o = { dtype = "bf16", device = "cuda", ctx = ctx }
      local ok, err = pcall(function()
        -- one model and one input for both arms (a second model would draw
        -- other weights from the context's generator); the training
        -- forward's running-statistics updates do not enter the gradients
        local m = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 }, device = "cuda", ctx = ctx })
        local x = lucid.rand({ 4, 3, 640, 640 }):to(o)
        for _, terms in ipairs({ false, true }) do
          containers.fuse_sums, containers.dy_terms = true, terms
          local r
          for _ = 1, 2 do
            m:zero_grad()
            local y = m:forward(x)
            local gy = {}
            for _, k in ipairs(KEYS) do gy[k] = lucid.ones(y[k]:shape(), o) * 0.01 end
            ctx:synchronize()
            reset()
            local c0, k0 = H.chan(), H.terms()
            m:backward(x, gy)
            ctx:synchronize()
            r = { chan = H.chan() - c0, add = counts.add or 0, add_n = counts.add_n or 0, terms = H.terms() - k0,
              grads = hash(m.params:flat_grads()) }
          end
          got[terms] = r
        end
      end)
      containers.fuse_sums, containers.dy_terms = f0, t0
      remove()
      if not ok then error(err, 0) end
      local off, on = got[false], got[true]
      assert.equal(off.grads, on.grads, "parameter gradients differ")
      assert.equal(0, off.terms)
      assert.equal(24, on.terms)
      assert.equal(off.chan - 13, on.chan) -- 11 copies / sums and 2 add_n (chan_sum_multi launches)
      assert.equal(off.add - 8, on.add)
      assert.equal(off.add_n - 2, on.add_n)
    end)

  it("recorded: eager and replayed forward + backward equal with LUCID_BN_DY_TERMS=0 and on", function()
    local child = require("support.replay_child")
    local src = child.source({
      shape = { 4, 3, 320, 320 },
      setup = [[
local ffi = require "ffi"
ffi.cdef("unsigned long lucid_cuda_bn_terms_count(void);")
local lib = pcall(function() return ffi.C.lucid_cuda_bn_terms_count end) and ffi.C
  or ffi.load(package.searchpath("lucid", package.cpath))
]],
      before_capture = "local k0 = tonumber(lib.lucid_cuda_bn_terms_count())\n",
      after_capture = 'io.write("recorded_terms=", tonumber(lib.lucid_cuda_bn_terms_count()) - k0, "\\n")\n',
    })
    local e1, r1, k1, o1 = child.digests(src, "env -u LUCID_BN_DY_TERMS", "recorded_terms")
    local e0, r0, k0, o0 = child.digests(src, "env LUCID_BN_DY_TERMS=0", "recorded_terms")
    assert.is_truthy(e1 and r1, o1)
    assert.is_truthy(e0 and r0, o0)
    assert.are_not.equal(e1, r1) -- the halved weights changed the replay's result
    assert.equal(e0, e1, o1)
    assert.equal(r0, r1, o1)
    assert.equal(0, k0, o0)
    assert.is_true(k1 > 0, o1)
  end)
end)
