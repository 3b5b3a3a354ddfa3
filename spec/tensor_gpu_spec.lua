-- tensor_gpu_spec.lua — every tensor op of the binding on cuda against the
-- CPU reference, for f32, bf16 and f16, on fresh random inputs.
-- Tagged #gpu: `make test` skips it, `make test-gpu` runs it on the GPU box.
--
-- Reference: the op on the CPU in f32 over the inputs already rounded to
-- the dtype, then rounded once to the dtype (what the CUDA kernels do:
-- compute in f32, round on store). Tolerances (|got - ref| <= atol + rtol *
-- |ref|): f32 1e-5/1e-5, f16 1e-3/2e-3, bf16 1e-2/1.6e-2 (about two ulps,
-- for transcendental functions that differ by an ulp before rounding).
-- Reductions and matmul accumulate differently on each device, so their
-- atol scales with the sum of magnitudes. NaN never passes.
local lucid = require "lucid"

local TOL = {
  f32 = {atol = 1e-5, rtol = 1e-5},
  f16 = {atol = 1e-3, rtol = 2e-3},
  bf16 = {atol = 1e-2, rtol = 1.6e-2},
}
local DTYPES = {"f32", "bf16", "f16"}

local function flat(t)
  local out = {}
  local function rec(x)
    if type(x) == "number" then out[#out + 1] = x else for _, v in ipairs(x) do rec(v) end end
  end
  rec(t:float():cpu():totable())
  return out
end

-- Compare a cuda result with the cpu reference element by element.
local function assert_close(got, ref, dtype, what, scale)
  assert.are.same(ref:shape(), got:shape(), what .. ": shape")
  assert.are.equal("cuda", got:device():sub(1, 4), what .. ": device")
  local g, r = flat(got), flat(ref)
  local tol = TOL[dtype]
  local atol = tol.atol * (scale or 1)
  for i = 1, #r do
    local ok = g[i] == g[i] and math.abs(g[i] - r[i]) <= atol + tol.rtol * math.abs(r[i])
    if r[i] ~= r[i] then ok = false end -- NaN in the reference is a test bug
    assert(ok, ("%s [%s]: element %d: cuda %.9g vs cpu %.9g"):format(what, dtype, i, g[i], r[i]))
  end
end

-- Random f32 cpu tensor in [lo, hi), rounded to dtype (and kept as f32).
local function rnd(shape, dtype, lo, hi)
  local t = lucid.rand(shape) * (hi - lo) + lo
  return t:to(dtype):float()
end

local function on_cuda(t, dtype) return t:to({device = "cuda", dtype = dtype}) end
local function round_to(t, dtype) return t:to(dtype):float() end

describe("cuda tensors vs cpu #gpu", function()
  setup(function()
    assert(lucid.cuda_available(), "no CUDA device: run this spec on the GPU machine")
    lucid.manual_seed(1234)
  end)

  for _, dt in ipairs(DTYPES) do
    describe(dt, function()
      it("construction, fill, copy and conversions round-trip", function()
        local c = lucid.zeros({3, 5}, {device = "cuda", dtype = dt})
        assert.are.equal("cuda:0", c:device())
        assert.are.equal(dt, c:dtype())
        assert_close(c:fill_(1.5), lucid.full({3, 5}, 1.5), dt, "fill_")
        local x = rnd({4, 7}, dt, -3, 3)
        assert_close(on_cuda(x, dt), x, dt, "to cuda")
        assert.are.same(x:totable(), on_cuda(x, dt):float():cpu():totable())
        local y = lucid.empty({4, 7}, {device = "cuda", dtype = dt}):copy_(x)
        assert_close(y, x, dt, "copy_ from cpu")
        assert_close(on_cuda(x, dt):clone(), x, dt, "clone")
        assert_close(on_cuda(x, dt):t():contiguous(), x:t():contiguous(), dt, "transpose+contiguous")
        assert_close(on_cuda(lucid.tensor({{1, 2}, {3, 4}}), dt), lucid.tensor({{1, 2}, {3, 4}}), dt, "tensor")
        assert_close(lucid.arange(10, {device = "cuda", dtype = dt}), round_to(lucid.arange(10), dt), dt, "arange")
      end)

      it("binary ops with broadcasting and scalars", function()
        local a = rnd({6, 33}, dt, 0.5, 2)
        local b = rnd({6, 33}, dt, 0.5, 2)
        local row = rnd({33}, dt, 0.5, 2)
        local col = rnd({6, 1}, dt, 0.5, 2)
        local ca, cb, crow, ccol = on_cuda(a, dt), on_cuda(b, dt), on_cuda(row, dt), on_cuda(col, dt)
        for _, op in ipairs({"add", "sub", "mul", "div", "pow", "maximum", "minimum"}) do
          assert_close(ca[op](ca, cb), round_to(a[op](a, b), dt), dt, op)
          assert_close(ca[op](ca, crow), round_to(a[op](a, row), dt), dt, op .. " row")
          assert_close(ca[op](ca, ccol), round_to(a[op](a, col), dt), dt, op .. " col")
          assert_close(ca[op](ca, 1.5), round_to(a[op](a, 1.5), dt), dt, op .. " scalar")
        end
        assert_close(2 - ca, round_to(2 - a, dt), dt, "reverse sub")
        assert_close(2 / ca, round_to(2 / a, dt), dt, "reverse div")
        assert_close(-ca, round_to(-a, dt), dt, "unm")
        local ia, ib = ca:clone(), on_cuda(a, dt):clone()
        ia:add_(cb)
        assert_close(ia, round_to(a + b, dt), dt, "add_")
        ib:mul_(2)
        assert_close(ib, round_to(a * 2, dt), dt, "mul_")
      end)

      it("unary ops", function()
        local a = rnd({5, 41}, dt, -4, 4)
        local p = rnd({5, 41}, dt, 0.1, 4)
        local ca, cp = on_cuda(a, dt), on_cuda(p, dt)
        for _, op in ipairs({"exp", "abs", "neg", "sigmoid", "silu", "tanh", "relu", "square"}) do
          assert_close(ca[op](ca), round_to(a[op](a), dt), dt, op)
        end
        assert_close(cp:log(), round_to(p:log(), dt), dt, "log")
        assert_close(cp:sqrt(), round_to(p:sqrt(), dt), dt, "sqrt")
      end)

      it("reductions", function()
        local a = rnd({17, 63}, dt, -1, 1)
        local ca = on_cuda(a, dt)
        local mag = a:abs():sum():item()
        local function ref(x) return round_to(x, dt) end
        assert_close(ca:sum(), ref(a:sum()), dt, "sum", mag)
        assert_close(ca:mean(), ref(a:mean()), dt, "mean")
        assert_close(ca:max(), ref(a:max()), dt, "max")
        assert_close(ca:min(), ref(a:min()), dt, "min")
        assert_close(ca:norm(), ref(a:norm()), dt, "norm")
        assert_close(ca:sum(1), ref(a:sum(1)), dt, "sum(1)", 17)
        assert_close(ca:sum(2, true), ref(a:sum(2, true)), dt, "sum(2, keepdim)", 63)
        assert_close(ca:mean(-1), ref(a:mean(-1)), dt, "mean(-1)")
        assert_close(ca:max(1), ref(a:max(1)), dt, "max(1)")
        assert_close(ca:min(2), ref(a:min(2)), dt, "min(2)")
        assert.is_true(math.abs(ca:sum():item() - a:sum():item()) <= TOL[dt].atol * mag + 1e-3 * mag)
      end)

      it("matmul (plain, transposed, batched, 1-D)", function()
        local a = rnd({33, 47}, dt, -1, 1)
        local b = rnd({47, 29}, dt, -1, 1)
        local ca, cb = on_cuda(a, dt), on_cuda(b, dt)
        assert_close(ca:matmul(cb), round_to(a:matmul(b), dt), dt, "matmul", 47)
        assert_close(cb:t():matmul(ca:t()), round_to(b:t():matmul(a:t()), dt), dt, "matmul^T", 47)
        local ba, bb = rnd({3, 8, 16}, dt, -1, 1), rnd({3, 16, 5}, dt, -1, 1)
        assert_close(on_cuda(ba, dt):matmul(on_cuda(bb, dt)), round_to(ba:matmul(bb), dt), dt, "bmm", 16)
        local v = rnd({47}, dt, -1, 1)
        assert_close(ca:matmul(on_cuda(v, dt)), round_to(a:matmul(v), dt), dt, "matvec", 47)
      end)

      it("random numbers equal the cpu draws for the same seed", function()
        local c1 = lucid.Context({device = "cuda", seed = 7})
        local c2 = lucid.Context({device = "cpu", seed = 7})
        local g = lucid.rand({1000}, {ctx = c1, dtype = dt})
        local r = lucid.rand({1000}, {ctx = c2, dtype = dt})
        assert_close(g, r, dt, "rand")
        g = lucid.randn({1000}, {ctx = c1, dtype = dt})
        r = lucid.randn({1000}, {ctx = c2, dtype = dt})
        assert_close(g, r, dt, "randn")
      end)

      it("tostring copies to the cpu and names the device", function()
        local s = tostring(lucid.ones({2}, {device = "cuda", dtype = dt}))
        assert.are.equal("tensor([1., 1.], dtype=" .. dt .. ", device=cuda:0)", s)
      end)
    end)
  end

  describe("device bookkeeping", function()
    it("memory stats, empty_cache, free and keep-alive", function()
      local c = lucid.Context({device = "cuda"})
      local before = c:memory_stats().allocated
      local t = lucid.zeros({1024, 1024}, {ctx = c})
      assert.are.equal("cuda:0", t:device())
      assert.is_true(c:memory_stats().allocated >= before + 4 * 1024 * 1024)
      assert.is_true(c:memory_stats().peak_allocated >= 4 * 1024 * 1024)
      t:free()
      assert.are.equal(before, c:memory_stats().allocated)
      c:empty_cache()
      local keep = lucid.ones({8}, {ctx = c})
      c:free()
      assert.are.equal(8, keep:sum():item())
      c = nil
      collectgarbage()
      assert.are.equal(8, keep:cpu():sum():item())
    end)
    it("cpu and cuda tensors do not mix silently", function()
      local ok, err = pcall(function() local r = lucid.ones({2}, {device = "cuda"}) + lucid.ones({2}); return r end)
      assert.is_false(ok)
      assert.matches("different devices", err)
    end)
  end)
end)
