-- nn_bnsilu_spec.lua — the fused BatchNorm2d + SiLU of the Conv block
-- (lucid.nn.prim bn_silu_*, lucid.nn.blocks Conv): which route a Conv takes,
-- equal results on both routes (forward bitwise in f32 on the CPU, gradients
-- within 1e-5, running statistics bitwise), float64 finite differences
-- through the fused route, frozen parameters, train/eval, unchanged module
-- tree/names/printing, and the recorded step (fake recorder) identical to
-- the eager one on the fused route and after a retirement onto the separate
-- one. The kernels themselves: spec/c/test_nn_bnsilu.c (CPU) and
-- spec/c/test_nn_bnsilu_cuda.c (GPU).
package.path = "spec/support/?.lua;" .. package.path
local lucid = require("lucid")
local nn = require("lucid.nn")
local P = require("lucid.nn.prim")
local G = require("support.nn_gradcheck")

local function maxdiff(a, b) return (a:to("f64") - b:to("f64")):abs():max():item() end
local function maxabs(a) return a:to("f64"):abs():max():item() end
local function same_bytes(a, b) return lucid.hash_tensor(a) == lucid.hash_tensor(b) end

-- A Conv(c1, c2, k, s) materialised on ctx (same seed: same weights), with
-- non-trivial BN weight/bias.
local function conv(ctx, dtype, c1, c2, k, s)
  local m = nn.Conv(c1, c2, k, s)
  nn.materialize(m, { ctx = ctx, dtype = dtype or "f32" })
  local w, b = m.bn:parameters()[1]:data(), m.bn:parameters()[2]:data()
  w:copy_(lucid.rand(w:shape(), { ctx = ctx, dtype = w:dtype() }):add(0.5))
  b:copy_(lucid.rand(b:shape(), { ctx = ctx, dtype = b:dtype() }):sub(0.5))
  return m
end

-- Two equal Convs (fresh contexts, same seed) and equal input/gradient.
local function twins(dtype, shape)
  local out = {}
  for i = 1, 2 do
    local ctx = lucid.Context{ device = "cpu", seed = 11 }
    local m = conv(ctx, dtype, shape[2], 8, 3, 1)
    local x = lucid.randn(shape, { ctx = ctx, dtype = dtype })
    local gy = lucid.randn({ shape[1], 8, shape[3], shape[4] }, { ctx = ctx, dtype = dtype })
    out[i] = { m = m, x = x, gy = gy }
  end
  return out[1], out[2]
end

-- Forward + backward; returns output, input gradient (clones).
local function run(t)
  for _, p in ipairs(t.m:parameters()) do p:grad():zero_() end
  local y = t.m:forward(t.x):clone()
  local gx = t.m:backward(t.x, t.gy):clone()
  return y, gx
end

-- Assert two Convs hold equal results: y bitwise, gradients within tol,
-- BN buffers bitwise.
local function assert_equal_routes(a, b, ya, yb, ga, gb, tol)
  assert.is_true(same_bytes(ya, yb), "forward differs: " .. maxdiff(ya, yb))
  assert.is_true(maxdiff(ga, gb) <= tol * maxabs(gb), "grad_input " .. maxdiff(ga, gb))
  local pa, pb = a.m:parameters(), b.m:parameters()
  for i = 1, #pa do
    local d, m = maxdiff(pa[i]:grad(), pb[i]:grad()), maxabs(pb[i]:grad())
    assert.is_true(d <= tol * m, pa[i].name .. " grad differs: " .. d .. " of " .. m)
  end
  local ba, bb = a.m:buffers(), b.m:buffers()
  for i = 1, #ba do
    assert.is_true(same_bytes(ba[i]:data(), bb[i]:data()), ba[i].name .. " differs")
  end
end

local Leaf = P.Leaf
local function plain_forward(self, x) return Leaf.forward(self, x) end

describe("fused BatchNorm2d+SiLU in the Conv block", function()
  it("a plain Conv takes the fused route: act holds the output, bn computes none", function()
    local a = twins("f32", { 2, 3, 9, 7 })
    assert.is_true(P.bn_silu_fusable(a.m.bn, a.m.act))
    local y = a.m:forward(a.x)
    assert.is_true(a.m._fused)
    assert.are.equal(y, a.m.act.output)
    assert.is_nil(a.m.bn.output)
    local gx = a.m:backward(a.x, a.gy)
    assert.are.equal(gx, a.m.grad_input)
    assert.is_not_nil(a.m.bn.grad_input)
    assert.is_nil(a.m.act.grad_input)
  end)

  it("equals the separate route when act's forward is replaced (f32: forward bitwise, grads 1e-5, running stats bitwise)", function()
    local a, b = twins("f32", { 2, 3, 17, 19 })
    b.m.act.forward = plain_forward -- an instance override: not fusable
    assert.is_false(P.bn_silu_fusable(b.m.bn, b.m.act))
    for step = 1, 3 do
      local ya, ga = run(a)
      local yb, gb = run(b)
      assert.is_true(a.m._fused)
      assert.is_false(b.m._fused)
      assert_equal_routes(a, b, ya, yb, ga, gb, 1e-5)
      assert.are.equal(step, a.m.bn:buffers()[3]:data():item()) -- num_batches_tracked
    end
    -- eval: running statistics, equal again, buffers untouched
    a.m:eval(); b.m:eval()
    local rm = a.m.bn:buffers()[1]:data():clone()
    local ya, ga = run(a)
    local yb, gb = run(b)
    assert.is_true(a.m._fused)
    assert_equal_routes(a, b, ya, yb, ga, gb, 1e-5)
    assert.is_true(same_bytes(rm, a.m.bn:buffers()[1]:data()))
  end)

  it("float64: both routes agree to 1e-12", function()
    local a, b = twins("f64", { 3, 4, 5, 6 })
    b.m.bn.backward = function(self, x, gy) return Leaf.backward(self, x, gy) end
    local ya, ga = run(a)
    local yb, gb = run(b)
    assert.is_true(a.m._fused and not b.m._fused)
    assert_equal_routes(a, b, ya, yb, ga, gb, 1e-12)
  end)

  it("float64 finite differences through the fused route (input, conv weight, BN weight and bias; train and eval)", function()
    for _, mode in ipairs({ "train", "eval" }) do
      lucid.manual_seed(5)
      local m = nn.Conv(3, 5, 3, 1)
      local set = nn.materialize(m, { dtype = "f64" })
      local x = lucid.randn({ 2, 3, 5, 4 }, { dtype = "f64" })
      if mode == "eval" then
        m:forward(x) -- running statistics away from their init
        m:eval()
      end
      local gx
      local err, where = G.check({
        forward = function() return m:forward(x) end,
        backward = function(r) gx = m:backward(x, r) end,
        zero = function() set:zero_grad() end,
        targets = G.targets(m, x, function() return gx end),
        n = 6,
      })
      assert.is_true(m._fused, mode)
      assert.is_true(err < 1e-6, mode .. ": " .. tostring(where))
    end
  end)

  it("the separate route is taken for a replaced class forward, a SiLU subclass, Identity, or the switch off", function()
    local a = twins("f32", { 1, 3, 5, 5 })
    local m = a.m
    -- class-level replacement
    local SiLU = P.SiLU
    local saved = rawget(SiLU, "forward")
    SiLU.forward = plain_forward
    local ok, err = pcall(function()
      assert.is_false(P.bn_silu_fusable(m.bn, m.act))
      m:forward(a.x)
      assert.is_false(m._fused)
    end)
    SiLU.forward = saved
    assert(ok, err)
    assert.is_true(P.bn_silu_fusable(m.bn, m.act))
    -- the switch
    P.fuse_bn_silu = false
    ok, err = pcall(function()
      m:forward(a.x)
      assert.is_false(m._fused)
    end)
    P.fuse_bn_silu = true
    assert(ok, err)
    -- a subclass of SiLU, and Conv(act=false) (Identity)
    local util = require("lucid.nn.util")
    local MySiLU = util.class("MySiLU", SiLU)
    MySiLU.__init = function(self) SiLU.__init(self) end
    assert.is_false(P.bn_silu_fusable(m.bn, MySiLU.new()))
    local c = nn.Conv(3, 4, 1, 1, nil, 1, 1, false)
    nn.materialize(c)
    c:forward(a.x)
    assert.is_false(c._fused)
    -- not materialised
    assert.is_false(P.bn_silu_fusable(nn.BatchNorm2d(4), nn.SiLU()))
  end)

  it("frozen BN weight and bias get no gradient on the fused route", function()
    local a = twins("f32", { 2, 3, 6, 6 })
    local bw, bb = a.m.bn:parameters()[1], a.m.bn:parameters()[2]
    bw.trainable = false
    run(a)
    assert.is_true(a.m._fused)
    assert.are.equal(0, maxabs(bw:grad()))
    assert.is_true(maxabs(bb:grad()) > 0)
    bw.trainable, bb.trainable = true, false
    run(a)
    assert.is_true(maxabs(bw:grad()) > 0)
    assert.are.equal(0, maxabs(bb:grad()))
  end)

  it("keeps the module tree, state names, printing and parameter set of the Conv", function()
    local a = twins("f32", { 1, 3, 5, 5 })
    local before = tostring(a.m)
    local names = {}
    for _, e in ipairs(a.m:state_decls()) do names[#names + 1] = e.name end
    a.m:forward(a.x)
    a.m:backward(a.x, a.gy)
    assert.are.equal(before, tostring(a.m))
    assert.are.equal(table.concat({ "conv.weight", "bn.weight", "bn.bias", "bn.running_mean",
      "bn.running_var", "bn.num_batches_tracked" }, ","), table.concat(names, ","))
    assert.are.equal(
      "Conv(\n  (conv): Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), bias=False)\n"
        .. "  (bn): BatchNorm2d(8, eps=0.001, momentum=0.03, affine=True, track_running_stats=True)\n"
        .. "  (act): SiLU(inplace=True)\n)", tostring(a.m))
    local kids = {}
    for n in a.m:children() do kids[#kids + 1] = n end
    assert.are.same({ "conv", "bn", "act" }, kids)
  end)

  it("bf16 on a GPU: running stats bitwise, output within 4u of the separate route #gpu", function()
    local outs = {}
    for i, fuse in ipairs({ true, false }) do
      P.fuse_bn_silu = fuse
      local ok, err = pcall(function()
        local ctx = lucid.Context{ device = "cuda", seed = 3 }
        local m = nn.Conv(16, 32, 3, 1)
        nn.materialize(m, { ctx = ctx, device = ctx:device() })
        local x = lucid.randn({ 4, 16, 40, 40 }, { ctx = ctx, dtype = "bf16" })
        local y = m:forward(x)
        local gx = m:backward(x, lucid.randn(y:shape(), { ctx = ctx, dtype = "bf16" }))
        outs[i] = { fused = m._fused, y = y:to("cpu"), gx = gx:to("cpu"),
          rm = m.bn:buffers()[1]:data():to("cpu"), rv = m.bn:buffers()[2]:data():to("cpu"),
          gw = m.bn:parameters()[1]:grad():to("cpu") }
      end)
      P.fuse_bn_silu = true
      assert(ok, err)
    end
    local a, b = outs[1], outs[2]
    assert.is_true(a.fused and not b.fused)
    assert.is_true(same_bytes(a.rm, b.rm) and same_bytes(a.rv, b.rv))
    local u = 1 / 256
    assert.is_true(maxdiff(a.y, b.y) <= 4 * u * maxabs(b.y))
    assert.is_true(maxdiff(a.gx, b.gx) <= 8 * u * maxabs(b.gx))
    assert.is_true(maxdiff(a.gw, b.gw) <= 10 * u * maxabs(b.gw))
  end)
end)

describe("fused BatchNorm2d+SiLU and the recorded step (fake recorder)", function()
  local H = require "step_harness"
  local RS = require "lucid.recorded_step"
  local S, B = 64, 2

  local function pair()
    local e = H.stack{ B = B, S = S }
    local r = H.stack{ B = B, S = S, recorded = true, recorder = RS.fake_recorder(), warmup = 2,
      trainer = {}, log = function() end }
    return e, r
  end

  local function fused_convs(model)
    local n, fused = 0, 0
    model:apply(function(m)
      if m.bn and m.act and m._fused ~= nil then
        n = n + 1
        if m._fused then fused = fused + 1 end
      end
    end)
    return n, fused
  end

  it("records and replays the fused route identically to eager; replacing an act's forward retires once onto the separate route, still identical", function()
    local e, r = pair()
    for i = 1, 4 do
      e.step:run(H.batch(B, S, i), true)
      r.step:run(H.batch(B, S, i), true)
    end
    local n, fused = fused_convs(r.model)
    local nsilu = 0
    r.model:apply(function(m) if m.bn and m.act and getmetatable(m.act) == P.SiLU then nsilu = nsilu + 1 end end)
    assert.is_true(n > 50)
    assert.are.equal(nsilu, fused) -- every Conv with a SiLU is fused, the act=false ones are not
    assert.are.equal(1, r.step:stats().recorded)
    assert.is_true(r.step:stats().replays >= 1)
    H.same(e, r, "fused route, after 4 steps")
    -- replace the act of layer 0's Conv on both models: separate route there
    for _, st in ipairs({ e, r }) do
      local m = st.model.layers[1].module
      st.model:replace_forward(m.act, plain_forward)
    end
    for i = 5, 7 do
      e.step:run(H.batch(B, S, i), true)
      r.step:run(H.batch(B, S, i), true)
    end
    assert.is_false(r.model.layers[1].module._fused)
    assert.is_true(r.model.layers[2].module._fused)
    assert.are.equal(1, r.step.retirements)
    H.same(e, r, "after the retirement")
    e.step:release(); r.step:release()
  end)
end)
