-- fuse_sums_spec.lua — the blocks' fused sums (lucid.nn.containers:
-- fuse_sums / LUCID_FUSE_SUMS, sum, piece, forward_terms, backward_terms;
-- lucid.nn.chan_sum / add_n / empty_like; CModule:ensure_buffer).
--
-- Every block that fuses (Bottleneck as an inner block, C2f, C3k2 with and
-- without c3k and with attn, C3, C3k, C2PSA, PSABlock, Attention, the
-- heads) and the two pose models give bitwise the same forward outputs,
-- input gradients, parameter gradients and BatchNorm state with the switch
-- on and off, two passes each, on the CPU in f32 and bf16 (and, tagged gpu,
-- on cuda in bf16 and f32). The switch off is the unfused composition (the
-- code of before the fusion); on, the sums are the same chains rounded the
-- same way, so nothing may move. Also: the launches one training step of
-- YOLO11n-pose issues (counted from the calls that issue them: 114 -> 82),
-- steady-state passes allocate no sum buffer, a standalone head's gradient
-- outside Model:backward is a new tensor per call, and the building blocks
-- (chan_sum, add_n, piece, sum) against Tensor:add.
local lucid = require("lucid")
local err_of = require("support.errors").err_of
local nn = require("lucid.nn")
local containers = require("lucid.nn.containers")
local yolo11 = require("lucid.models.yolo11_pose")
local yolov8 = require("lucid.models.yolov8_pose")

-- hash(v, h) of a tensor, a list or a head output table; grad_like(y, o,
-- seed): a seeded gradient shaped like y (spec/support/pose_out.lua)
local PO = require("support.pose_out")
local KEYS, hash, grad_like = PO.KEYS, PO.hash, PO.grad_like

-- Materialise m (f32 parameters) and run it twice with the switch off and
-- twice with it on, from the same parameters and buffers: per route, the
-- hashes of every pass's output, input gradient and parameter gradients,
-- and of every parameter and buffer at the end.
local function both_routes(m, x, o)
  local set = nn.materialize(m, { device = o.device, ctx = o.ctx })
  local restore, gys = PO.snapshot(set), {}
  local res = {}
  local prev = containers.fuse_sums
  local ok, err = pcall(function()
    for r, fuse in ipairs({ false, true }) do
      containers.fuse_sums = fuse
      restore()
      res[r] = PO.passes(m, x, o, set, gys, 100)
    end
  end)
  containers.fuse_sums = prev
  if not ok then error(err, 0) end
  return res[1], res[2]
end

local function input(shape, o, seed)
  lucid.manual_seed(seed or 5)
  return lucid.randn(shape):to(o)
end

-- The blocks, each with its input (a tensor, or the head's list).
local function cases(o, N)
  N = N or 2
  local function x(c, h) return function() return input({ N, c, h, h }, o) end end
  return {
    { "Bottleneck (residual, standalone)", function() return nn.Bottleneck(8, 8, true) end, x(8, 6) },
    { "Bottleneck (no residual)", function() return nn.Bottleneck(8, 8, false) end, x(8, 6) },
    { "C2f n=1 shortcut", function() return nn.C2f(8, 16, 1, true) end, x(8, 6) },
    { "C2f n=2 shortcut", function() return nn.C2f(8, 16, 2, true) end, x(8, 6) },
    { "C2f n=1 no shortcut", function() return nn.C2f(8, 16, 1, false) end, x(8, 6) },
    { "C3k2 c3k=false", function() return nn.C3k2(16, 16, 1, false, 0.5) end, x(16, 6) },
    { "C3k2 c3k=false n=2", function() return nn.C3k2(16, 32, 2, false, 0.5) end, x(16, 6) },
    { "C3k2 c3k=true", function() return nn.C3k2(16, 32, 1, true) end, x(16, 6) },
    { "C3k2 c3k=true n=2", function() return nn.C3k2(16, 16, 2, true) end, x(16, 6) },
    { "C3k2 attn", function() return nn.C3k2(128, 128, 1, false, 0.5, true) end, x(128, 4) },
    { "C3 n=2", function() return nn.C3(16, 16, 2) end, x(16, 6) },
    { "C3k n=2", function() return nn.C3k(16, 16, 2) end, x(16, 6) },
    { "SPPF", function() return nn.SPPF(16, 16) end, x(16, 6) },
    { "Attention", function() return nn.Attention(64, 1) end, x(64, 4) },
    { "PSABlock", function() return nn.PSABlock(64, 0.5, 1) end, x(64, 4) },
    { "C2PSA n=1", function() return nn.C2PSA(128, 128, 1) end, x(128, 4) },
    { "C2PSA n=2", function() return nn.C2PSA(128, 128, 2) end, x(128, 4) },
    { "Pose head", function() return nn.Pose(1, { 17, 3 }, 16, { 16, 32, 64 }) end, function()
      return { input({ N, 16, 8, 8 }, o, 1), input({ N, 32, 4, 4 }, o, 2), input({ N, 64, 2, 2 }, o, 3) }
    end },
    { "Detect head (two branches)", function() return nn.Detect(1, 16, { 16, 32 }) end, function()
      return { input({ N, 16, 8, 8 }, o, 1), input({ N, 32, 4, 4 }, o, 2) }
    end },
  }
end

local function check_blocks(o)
  for _, c in ipairs(cases(o)) do
    it(c[1] .. ": switch on = off, bitwise", function()
      local off, on = both_routes(c[2](), c[3](), o)
      assert.same(off, on)
    end)
  end
  for _, mk in ipairs({ { "YOLO11n-pose", yolo11 }, { "YOLOv8n-pose", yolov8 } }) do
    it(mk[1] .. " (input gradient too): switch on = off, bitwise", function()
      local m = mk[2]({ scale = "n", nc = 1, kpt_shape = { 17, 3 }, materialize = false, input_grad = true })
      -- Model:materialize sets the first layer's input gradient
      local x = input({ 2, 3, 32, 32 }, o)
      local prev = containers.fuse_sums
      local res = {}
      local ok, err = pcall(function()
        m:materialize({ device = o.device, ctx = o.ctx })
        local restore, gys = PO.snapshot(m.params), {}
        for r, fuse in ipairs({ false, true }) do
          containers.fuse_sums = fuse
          restore()
          res[r] = PO.passes(m, x, o, m.params, gys, 200)
        end
      end)
      containers.fuse_sums = prev
      if not ok then error(err, 0) end
      assert.same(res[1], res[2])
    end)
  end
end

describe("fused sums: every block bitwise equal with LUCID_FUSE_SUMS on and off (cpu)", function()
  for _, dt in ipairs({ "f32", "bf16" }) do
    describe(dt, function() check_blocks({ dtype = dt }) end)
  end
end)

-- Call counters of the launches a step issues (spec/support/launch_counters.lua):
-- counts, reset, remove, and the binding's uncounted chan_sum / add_n.
local counters = require("support.launch_counters").install

describe("fused sums: launches of one YOLO11n-pose training step (batch 4)", function()
  -- the sums of DECISIONS 33 as such: LUCID_BN_DY_TERMS off (the gradient
  -- descriptions move some of them into the BatchNorm: spec/bn_dy_terms_spec.lua)
  it("114 channel-copy and add launches unfused, 82 fused; steady passes allocate nothing", function()
    local counts, reset, remove = counters()
    local prev = containers.fuse_sums
    local prev_terms = containers.dy_terms
    containers.dy_terms = false
    local got = {}
    local ok, err = pcall(function()
      for _, fuse in ipairs({ false, true }) do
        containers.fuse_sums = fuse
        lucid.manual_seed(0)
        local m = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 } })
        local x = lucid.rand({ 4, 3, 32, 32 })
        local per = {}
        for pass = 1, 3 do
          reset()
          local y = m:forward(x)
          local fwd = {}
          for k, v in pairs(counts) do fwd[k] = v end
          local gy = {}
          for _, k in ipairs(KEYS) do gy[k] = lucid.ones(y[k]:shape()) end
          reset()
          m:backward(x, gy)
          per[pass] = { fwd = fwd, bwd = {} }
          for k, v in pairs(counts) do per[pass].bwd[k] = v end
        end
        got[fuse] = per
      end
    end)
    containers.fuse_sums = prev
    containers.dy_terms = prev_terms
    remove()
    if not ok then error(err, 0) end
    local function n(t, k) return t[k] or 0 end
    for _, fuse in ipairs({ false, true }) do
      local p = got[fuse][3] -- a steady-state pass
      local f, b = p.fwd, p.bwd
      local want = fuse
        and { fc = 30, fa = 5, bc = 30, ba = 14, bn = 3 }
        or { fc = 30, fa = 14, bc = 30, ba = 40, bn = 0 }
      assert.same(want, { fc = n(f, "chan_copy"), fa = n(f, "add_fwd") + n(f, "add"), bc = n(b, "chan_copy"),
        ba = n(b, "add"), bn = n(b, "add_n") }, "fuse " .. tostring(fuse))
      local total = n(f, "chan_copy") + n(f, "add_fwd") + n(f, "add") + n(b, "chan_copy") + n(b, "add")
        + n(b, "add_n")
      assert.equal(fuse and 82 or 114, total)
      -- the sum buffers are persistent: only the first backward allocates
      assert.equal(0, n(got[fuse][2].bwd, "alloc") + n(got[fuse][3].bwd, "alloc") + n(f, "alloc"))
    end
    assert.is_true((got[true][1].bwd.alloc or 0) > 0, "the first fused backward allocates its sum buffers")
  end)
end)

describe("fused sums: standalone use", function()
  it("a standalone head's fused level sum outside Model:backward is a new tensor per call", function()
    local prev = containers.fuse_sums
    containers.fuse_sums = true
    local ok, err = pcall(function()
      local head = nn.Pose(1, { 17, 3 }, 16, { 16, 32, 64 })
      nn.materialize(head)
      local x = { input({ 2, 16, 8, 8 }, {}, 1), input({ 2, 32, 4, 4 }, {}, 2), input({ 2, 64, 2, 2 }, {}, 3) }
      local y = head:forward(x)
      local g1 = head:backward(x, grad_like(y, {}, 1))
      local h1 = hash(g1)
      local g2 = head:backward(x, grad_like(y, {}, 2))
      assert.equal(h1, hash(g1), "the first call's gradients were overwritten")
      assert.are_not.equal(h1, hash(g2))
    end)
    containers.fuse_sums = prev
    if not ok then error(err, 0) end
  end)

  it("a fused C2f leaves its inner block's output and gradient unmaterialised, its own set", function()
    local prev = containers.fuse_sums
    containers.fuse_sums = true
    local ok, err = pcall(function()
      local m = nn.C2f(8, 16, 1, true)
      nn.materialize(m)
      local x = input({ 2, 8, 6, 6 }, {})
      local y = m:forward(x)
      assert.is_nil(m.m:get(1).output)
      local gx = m:backward(x, grad_like(y, {}, 1))
      assert.is_nil(m.m:get(1).grad_input)
      assert.is_true(lucid.is_tensor(m.output) and lucid.is_tensor(m.grad_input) and rawequal(gx, m.grad_input))
      -- the inner Bottleneck used on its own materialises both
      local b = m.m:get(1)
      local yb = b:forward(m._outs[2])
      assert.is_true(lucid.is_tensor(yb) and rawequal(yb, b.output))
      local gb = b:backward(m._outs[2], yb)
      assert.is_true(lucid.is_tensor(gb) and rawequal(gb, b.grad_input))
    end)
    containers.fuse_sums = prev
    if not ok then error(err, 0) end
  end)

  it("an instance override of the inner block's forward is called (no terms for it)", function()
    local prev = containers.fuse_sums
    containers.fuse_sums = true
    local ok, err = pcall(function()
      local m = nn.C2f(8, 16, 1, true)
      nn.materialize(m)
      local b = m.m:get(1)
      local calls = 0
      local f0 = b.forward
      b.forward = function(self, x) calls = calls + 1 return f0(self, x) end
      m:forward(input({ 2, 8, 6, 6 }, {}))
      assert.equal(1, calls)
      assert.is_true(lucid.is_tensor(b.output))
    end)
    containers.fuse_sums = prev
    if not ok then error(err, 0) end
  end)
end)

describe("fused sums: the primitives", function()
  local C = nn.binding()
  it("add_n / chan_sum equal chained Tensor:add, bitwise (f32, bf16, f16, f64)", function()
    for _, dt in ipairs({ "f32", "bf16", "f16", "f64" }) do
      lucid.manual_seed(9)
      local a = (lucid.randn({ 2, 5, 3, 3 }) * 100):to(dt)
      local b = lucid.randn({ 2, 5, 3, 3 }):to(dt)
      local c = (lucid.randn({ 2, 5, 3, 3 }) * 0.01):to(dt)
      local d = lucid.randn({ 2, 5, 3, 3 }):to(dt)
      assert.equal(hash(a:add(b):add(c):add(d)), hash(C.add_n({ a, b, c, d })), dt)
      assert.equal(hash(a:add(b):add(c)), hash(containers.sum({ a, b, c })), dt)
      assert.equal(hash(a:add(b)), hash(containers.sum({ a, b })), dt)
      -- slices: channels 1..3 of a + channels 2..4 of c, into channels 0..2 of y
      local y = lucid.zeros({ 2, 4, 3, 3 }):to(dt)
      C.chan_sum({ containers.piece(y, 0, 3, { containers.slice(a, 1, 3), containers.slice(c, 2, 3) }),
        { y, 3, 1, d, 4 } })
      local ref = a:narrow(2, 2, 3):contiguous():add(c:narrow(2, 3, 3):contiguous())
      assert.equal(hash(ref), hash(y:narrow(2, 1, 3):contiguous()), dt)
      assert.equal(hash(d:narrow(2, 5, 1):contiguous()), hash(y:narrow(2, 4, 1):contiguous()), dt)
      -- more than four terms: the chain continues over the first four's sum
      local e = lucid.randn({ 2, 5, 3, 3 }):to(dt)
      assert.equal(hash(a:add(b):add(c):add(d):add(e)), hash(containers.sum({ a, b, c, d, e })), dt)
    end
  end)

  it("chan_sum refuses a piece that overlaps, and malformed pieces, naming them", function()
    local a, b = lucid.randn({ 2, 4, 3, 3 }), lucid.randn({ 2, 4, 3, 3 })
    assert.has_error(function() C.chan_sum({ { a, 0, 2, b, 0, a, 1 } }) end)
    local ok, e = pcall(C.chan_sum, { { a, 0, 2, b, 0, a, 1 } })
    assert.is_false(ok)
    assert.matches("piece 0's dst may overlap piece 0's addend", e, 1, true)
    ok, e = pcall(C.chan_sum, { { a, 0 } })
    assert.is_false(ok)
    assert.matches("(pieces[1]): expected {dst, dst_c0, nch", e, 1, true)
    ok, e = pcall(C.chan_sum, { { a, 0, 2, b, 0, b, 0, b, 0, b, 0, b, 0 } })
    assert.is_false(ok)
    assert.matches("at most 4 sources", e, 1, true)
    ok, e = pcall(C.add_n, { a, b }, lucid.zeros({ 2, 5, 3, 3 }))
    assert.is_false(ok)
    assert.matches("add_n", e, 1, true)
  end)

  it("CModule:ensure_buffer keeps a matching buffer and follows a new shape", function()
    local cat = nn.Concat(2)
    nn.materialize(cat)
    local like = lucid.zeros({ 2, 6, 3, 3 })
    local t1 = cat._c:ensure_buffer("output", 1, like, 5)
    assert.same({ 2, 5, 3, 3 }, t1:shape())
    t1:fill_(7)
    local t2 = cat._c:ensure_buffer("output", 1, like, 5)
    assert.equal(hash(t1), hash(t2)) -- the same buffer (not reallocated: its values stay)
    local t3 = cat._c:ensure_buffer("grad_input", 2, like)
    assert.same({ 2, 6, 3, 3 }, t3:shape())
    -- slots are 1-based, checked by the binding with the range in the message
    local msg = err_of(function() cat._c:ensure_buffer("grad_input", 3, like) end)
    assert.truthy(msg:find("grad_input slot: expected 1..2, got 3", 1, true), msg)
    msg = err_of(function() cat._c:ensure_buffer("output", 0, like) end)
    assert.truthy(msg:find("output slot: expected 1..1, got 0", 1, true), msg)
    msg = err_of(function() cat._c:ensure_buffer("output", 2 ^ 32 + 1, like) end)
    assert.truthy(msg:find("expected 1..1", 1, true), msg)
    assert.has_error(function() cat._c:ensure_buffer("state", 1, like) end)
  end)
end)

-- The same checks on cuda (bf16, the training dtype, and f32), and the
-- channel-copy launches of a YOLO11n-pose step counted by the GPU's own
-- counter (lucid_cuda_chan_copy_op_count, through the FFI).
local function op_counter()
  local lib = require("support.ffi_lib").lib_with("lucid_cuda_chan_copy_op_count",
    "unsigned long lucid_cuda_chan_copy_op_count(void);")
  if lib then return function() return tonumber(lib.lucid_cuda_chan_copy_op_count()) end end
end

local describe_gpu = lucid.cuda_available() and describe or pending
describe_gpu("fused sums on cuda #gpu", function()
  local ctx
  -- the options tables get their context in setup (read when the tests run)
  local os_ = { { dtype = "bf16", device = "cuda" }, { dtype = "f32", device = "cuda" } }
  setup(function()
    ctx = lucid.Context({ device = "cuda", seed = 3 })
    for _, o in ipairs(os_) do o.ctx = ctx end
  end)
  for _, o in ipairs(os_) do
    describe(o.dtype, function() check_blocks(o) end)
  end

  it("YOLO11n-pose bf16 step: chan_copy launches 60 unfused, 63 fused (3 head sums), adds 54 -> 19", function()
    local ops = assert(op_counter(), "lucid_cuda_chan_copy_op_count is not reachable through the FFI")
    local counts, reset, remove = counters()
    local prev = containers.fuse_sums
    local prev_terms = containers.dy_terms
    containers.dy_terms = false -- DECISIONS 33's launches (spec/bn_dy_terms_spec.lua: with descriptions)
    local got = {}
    local o = { dtype = "bf16", device = "cuda", ctx = ctx }
    local ok, err = pcall(function()
      for _, fuse in ipairs({ false, true }) do
        containers.fuse_sums = fuse
        local m = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 }, device = "cuda", ctx = ctx })
        local x = lucid.rand({ 4, 3, 64, 64 }):to(o)
        local r
        for _ = 1, 2 do
          reset()
          local c0 = ops()
          local y = m:forward(x)
          local gy = {}
          for _, k in ipairs(KEYS) do gy[k] = lucid.ones(y[k]:shape(), o) end
          m:backward(x, gy)
          ctx:synchronize()
          r = { gpu_chan = ops() - c0, adds = (counts.add or 0) + (counts.add_fwd or 0) }
        end
        got[fuse] = r
      end
    end)
    containers.fuse_sums = prev
    containers.dy_terms = prev_terms
    remove()
    if not ok then error(err, 0) end
    -- the gy ones() are fills, not adds; Tensor:add / Add counted on the host
    assert.same({ gpu_chan = 60, adds = 54 }, got[false])
    assert.same({ gpu_chan = 63, adds = 19 }, got[true])
  end)
end)
