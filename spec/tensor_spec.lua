-- tensor_spec.lua — the Tensor API of the Lua binding on the CPU:
-- construction (empty tensors with PyTorch's shapes), shapes, dtype
-- conversions, views, arithmetic with broadcasting, reductions, matmul,
-- tostring, misuse errors.
local lucid = require "lucid"

local function close(a, b, tol)
  tol = tol or 1e-6
  return math.abs(a - b) <= tol * (1 + math.abs(b))
end

-- assert that nested tables of numbers match within tol
local function assert_table_close(got, want, tol, path)
  path = path or "t"
  if type(want) == "number" then
    assert(type(got) == "number", path .. ": expected a number, got " .. type(got))
    assert(close(got, want, tol), ("%s: got %.9g, expected %.9g"):format(path, got, want))
    return
  end
  assert(type(got) == "table", path .. ": expected a table, got " .. type(got))
  assert.are.equal(#want, #got, path .. ": length")
  for i = 1, #want do assert_table_close(got[i], want[i], tol, path .. "[" .. i .. "]") end
end

describe("lucid tensors: construction", function()
  it("zeros/ones/full/empty take a shape table and opts", function()
    local z = lucid.zeros({2, 3})
    assert.are.same({2, 3}, z:shape())
    assert.are.equal("f32", z:dtype())
    assert.are.equal("cpu", z:device())
    assert.are.same({{0, 0, 0}, {0, 0, 0}}, z:totable())
    assert.are.same({1, 1}, lucid.ones({2}):totable())
    assert.are.same({{7, 7}}, lucid.full({1, 2}, 7):totable())
    local e = lucid.empty({4, 3, 5, 5}, {dtype = "bf16"})
    assert.are.same({4, 3, 5, 5}, e:shape())
    assert.are.equal("bf16", e:dtype())
    assert.are.equal(300, e:numel())
  end)

  it("accepts varargs shapes like Torch7", function()
    assert.are.same({2, 3, 4}, lucid.zeros(2, 3, 4):shape())
    assert.are.equal("f64", lucid.ones(2, 2, {dtype = "f64"}):dtype())
  end)

  it("builds from nested Lua tables and numbers", function()
    local t = lucid.tensor({{1, 2, 3}, {4, 5, 6}})
    assert.are.same({2, 3}, t:shape())
    assert.are.same({{1, 2, 3}, {4, 5, 6}}, t:totable())
    local s = lucid.tensor(3.5)
    assert.are.equal(0, s:dim())
    assert.are.same({}, s:shape())
    assert.are.equal(3.5, s:item())
    assert.are.equal(3.5, s:totable())
    local e = lucid.tensor({})
    assert.are.same({0}, e:shape())
    assert.are.equal(0, e:numel())
    assert.are.equal("i32", lucid.tensor({1, 2}, {dtype = "i32"}):dtype())
  end)

  it("arange counts from 0 or over a range with a step", function()
    assert.are.same({0, 1, 2, 3}, lucid.arange(4):totable())
    assert.are.same({2, 4, 6}, lucid.arange(2, 8, 2):totable())
    assert.are.same({5, 4, 3}, lucid.arange(5, 2, -1):totable())
    assert.are.equal("i64", lucid.arange(3, {dtype = "i64"}):dtype())
  end)

  it("rand/randn draw from the context generator reproducibly", function()
    lucid.manual_seed(42)
    local a = lucid.rand({1000})
    lucid.manual_seed(42)
    local b = lucid.rand({1000})
    assert.are.same(a:totable(), b:totable())
    local c = lucid.rand({1000})
    assert.are_not.same(a:totable(), c:totable())
    assert.is_true(a:min():item() >= 0 and a:max():item() < 1)
    assert.is_true(close(a:mean():item(), 0.5, 0.1))
    local n = lucid.randn({20000})
    assert.is_true(math.abs(n:mean():item()) < 0.05)
    assert.is_true(math.abs((n:norm():item() ^ 2 / 20000) - 1) < 0.05)
  end)
end)

describe("lucid tensors: empty tensors have PyTorch's shapes", function()
  -- torch.tensor([]) is (0,), torch.tensor([[]]) is (1, 0), torch.zeros(0, 3)
  -- is (0, 3): the constructors take size-0 dims as tensor() infers them
  it("tensor({}), tensor({{}}) and zeros/ones/empty/full/rand/randn with a 0 dim agree", function()
    assert.are.same({0}, lucid.tensor({}):shape())
    assert.are.same({1, 0}, lucid.tensor({{}}):shape())
    assert.are.same({2, 0}, lucid.tensor({{}, {}}):shape())
    assert.are.same({0}, lucid.zeros({0}):shape())
    assert.are.same({0, 3}, lucid.zeros({0, 3}):shape())
    assert.are.same({0, 3}, lucid.zeros(0, 3):shape())
    assert.are.same({3, 0}, lucid.ones({3, 0}):shape())
    assert.are.same({2, 0, 4}, lucid.empty({2, 0, 4}, {dtype = "bf16"}):shape())
    assert.are.same({0, 2}, lucid.full({0, 2}, 7):shape())
    assert.are.same({0}, lucid.rand({0}):shape())
    assert.are.same({4, 0}, lucid.randn({4, 0}):shape())
    for _, t in ipairs({ lucid.tensor({}), lucid.tensor({{}}), lucid.zeros({0}), lucid.zeros({0, 3}) }) do
      assert.are.equal(0, t:numel())
    end
    assert.are.equal(1, lucid.zeros({0}):dim())
    assert.are.equal(2, lucid.zeros({0, 3}):dim())
  end)

  it("print, clone, sum, add, totable, view and reshape like PyTorch", function()
    assert.are.equal("tensor([], dtype=f32, device=cpu)", tostring(lucid.tensor({})))
    assert.are.equal("tensor([], dtype=f32, device=cpu)", tostring(lucid.zeros({0})))
    assert.are.equal("tensor([], size=(1, 0), dtype=f32, device=cpu)", tostring(lucid.tensor({{}})))
    assert.are.equal("tensor([], size=(0, 3), dtype=f32, device=cpu)", tostring(lucid.zeros({0, 3})))
    assert.are.equal("tensor([], size=(0, 3), dtype=i64, device=cpu)", tostring(lucid.zeros({0, 3}, {dtype = "i64"})))
    local z = lucid.zeros({0, 3})
    assert.are.same({0, 3}, z:clone():shape())
    assert.are.same({0, 3}, (z + 1):shape())
    assert.are.same({0, 3}, (z + lucid.ones({3})):shape()) -- broadcasting keeps the 0
    assert.are.equal(0, z:sum():item())
    assert.are.equal(0, lucid.tensor({}):sum():item())
    assert.are.same({}, z:totable())
    assert.are.same({{}}, lucid.tensor({{}}):totable())
    assert.are.same({0, 3}, lucid.tensor({}):view({0, 3}):shape())
    assert.are.same({0}, z:reshape({-1}):shape())
    assert.are.same({0, 3}, lucid.tensor({}):reshape({-1, 3}):shape())
    assert.are.same({0}, z:t():reshape({0}):shape()) -- a transposed empty view
    -- an empty tensor is contiguous whatever its strides (PyTorch's is_contiguous)
    assert.is_true(lucid.zeros({3, 0}):is_contiguous())
    assert.are.same({0}, lucid.tensor({{}, {}}):view({0}):shape())
    -- as PyTorch, the -1 of a 0-element tensor beside a 0 dim is ambiguous
    assert.has_error(function() return z:reshape({-1, 0}) end,
      "lucid.Tensor:reshape: bad argument #1 (shape): cannot infer -1 for 0 elements")
    -- max/min of nothing stay errors (torch.max(torch.tensor([])) raises too)
    assert.has_error(function() return z:max() end,
      "lucid.Tensor:max: bad self: expected reduction dim to be specified for an empty tensor ([0,3], 0 elements); "
        .. "max of no elements is undefined (as in PyTorch)")
    -- negative control: a negative or fractional size is still refused
    assert.has_error(function() lucid.zeros({0, -3}) end,
      "lucid.zeros: bad argument #1 (shape[2]): expected a non-negative integer, got -3")
    assert.has_error(function() lucid.tensor({}):view({-2}) end,
      "lucid.Tensor:view: bad argument #1 (shape[1]): expected a non-negative integer or one -1, got -2")
  end)
end)

describe("lucid tensors: metadata", function()
  local t = lucid.zeros({4, 3, 5})
  it("shape, size, dim, numel", function()
    assert.are.same({4, 3, 5}, t:shape())
    assert.are.equal(4, t:size(1))
    assert.are.equal(5, t:size(3))
    assert.are.equal(5, t:size(-1))
    assert.are.same({4, 3, 5}, t:size())
    assert.are.equal(3, t:dim())
    assert.are.equal(60, t:numel())
    assert.are.equal(4, #t)
  end)
  it("is_contiguous and storage_version", function()
    assert.is_true(t:is_contiguous())
    assert.is_false(t:transpose(1, 2):is_contiguous())
    local v0 = t:storage_version()
    t:fill_(1)
    assert.is_true(t:storage_version() > v0)
  end)
end)

describe("lucid tensors: dtype and device conversion", function()
  it("to(dtype), to{...}, float/double/bf16/half", function()
    local t = lucid.tensor({0.1, 1.5, -2})
    local b = t:to("bf16")
    assert.are.equal("bf16", b:dtype())
    -- bf16 keeps 8 significant bits: 0.1 -> 0.10009765625 exactly
    assert.are.equal(0.10009765625, b:totable()[1])
    assert.are.equal("f64", t:to({dtype = "f64"}):dtype())
    assert.are.equal("f64", t:double():dtype())
    assert.are.equal("f16", t:half():dtype())
    assert.are.equal("bf16", t:bf16():dtype())
    assert.are.equal("f32", b:float():dtype())
    assert.are.equal(0.0999755859375, t:half():totable()[1])
    assert.are.equal("cpu", t:to("cpu", "f64"):device())
    assert.are.equal("f64", t:to("cpu", "f64"):dtype())
  end)
  it("returns the same tensor when nothing changes", function()
    local t = lucid.ones({2})
    assert.is_true(rawequal(t, t:to("cpu")))
    assert.is_true(rawequal(t, t:float()))
    assert.is_true(rawequal(t, t:cpu()))
    assert.is_true(rawequal(t, t:contiguous()))
  end)
  it("clone copies", function()
    local t = lucid.ones({2})
    local c = t:clone()
    c:fill_(5)
    assert.are.same({1, 1}, t:totable())
    assert.are.same({5, 5}, c:totable())
  end)
end)

describe("lucid tensors: views", function()
  it("view and reshape (with -1)", function()
    local t = lucid.arange(6)
    assert.are.same({{0, 1, 2}, {3, 4, 5}}, t:view({2, 3}):totable())
    assert.are.same({3, 2}, t:view(3, -1):shape())
    local tt = t:view(2, 3):t()
    assert.are.same({0, 3, 1, 4, 2, 5}, tt:reshape({6}):totable())
  end)
  it("views share storage", function()
    local t = lucid.zeros({2, 3})
    t:select(1, 2):fill_(7)
    assert.are.same({{0, 0, 0}, {7, 7, 7}}, t:totable())
    t:narrow(2, 2, 2):fill_(1)
    assert.are.same({{0, 1, 1}, {7, 1, 1}}, t:totable())
  end)
  it("narrow, select, transpose, permute, t (1-based dims)", function()
    local t = lucid.arange(24):view(2, 3, 4)
    assert.are.same({{{4, 5}, {8, 9}}, {{16, 17}, {20, 21}}}, t:narrow(2, 2, 2):narrow(3, 1, 2):totable())
    assert.are.same({12, 13, 14, 15}, t:select(1, 2):select(1, 1):totable())
    assert.are.same({20, 21, 22, 23}, t:select(1, -1):select(1, -1):totable())
    assert.are.same({4, 3, 2}, t:permute(3, 2, 1):shape())
    assert.are.same({4, 3, 2}, t:permute({3, 2, 1}):shape())
    assert.are.equal(13, t:permute(3, 2, 1):totable()[2][1][2])
    assert.are.same({2, 4, 3}, t:transpose(2, 3):shape())
    assert.are.same({{0, 3}, {1, 4}, {2, 5}}, lucid.arange(6):view(2, 3):t():totable())
  end)
  it("numeric indexing: views for N-D, numbers for 1-D", function()
    local t = lucid.tensor({{1, 2}, {3, 4}})
    assert.are.same({3, 4}, t[2]:totable())
    assert.are.equal(4, t[2][2])
    assert.are.equal(2, t[1][-1])
    t[1] = 9
    assert.are.same({{9, 9}, {3, 4}}, t:totable())
    t[2] = lucid.tensor({5, 6})
    assert.are.same({{9, 9}, {5, 6}}, t:totable())
  end)
  it("contiguous copies a strided view", function()
    local t = lucid.arange(6):view(2, 3):t()
    local c = t:contiguous()
    assert.is_true(c:is_contiguous())
    assert.are.same(t:totable(), c:totable())
  end)
end)

describe("lucid tensors: arithmetic", function()
  local a = lucid.tensor({{1, 2, 3}, {4, 5, 6}})
  it("tensor op tensor, same shape", function()
    assert.are.same({{2, 4, 6}, {8, 10, 12}}, (a + a):totable())
    assert.are.same({{0, 0, 0}, {0, 0, 0}}, (a - a):totable())
    assert.are.same({{1, 4, 9}, {16, 25, 36}}, (a * a):totable())
    assert.are.same({{1, 1, 1}, {1, 1, 1}}, (a / a):totable())
    assert.are.same({{1, 4, 9}, {16, 25, 36}}, a:pow(2):totable())
  end)
  it("broadcasts NumPy-style", function()
    local row = lucid.tensor({10, 20, 30})
    assert.are.same({{11, 22, 33}, {14, 25, 36}}, a:add(row):totable())
    local col = lucid.tensor({{1}, {2}})
    assert.are.same({{1, 2, 3}, {8, 10, 12}}, (a * col):totable())
    assert.are.same({2, 3}, (col + row):shape())
  end)
  it("numbers on either side", function()
    assert.are.same({{2, 3, 4}, {5, 6, 7}}, (a + 1):totable())
    assert.are.same({{9, 8, 7}, {6, 5, 4}}, (10 - a):totable())
    assert.are.same({{2, 4, 8}, {16, 32, 64}}, (2 ^ a):totable())
    assert.are.same({{1, 4, 9}, {16, 25, 36}}, (a ^ 2):totable())
    assert.are.same({{-1, -2, -3}, {-4, -5, -6}}, (-a):totable())
    assert_table_close((1 / a):totable(), {{1, 0.5, 1 / 3}, {0.25, 0.2, 1 / 6}})
  end)
  it("maximum/minimum and in-place ops", function()
    local t = lucid.tensor({-1, 2, -3})
    assert.are.same({0, 2, 0}, t:maximum(0):totable())
    assert.are.same({-1, 1, -3}, t:minimum(lucid.ones({3})):totable())
    local r = t:add_(1)
    assert.is_true(rawequal(r, t))
    assert.are.same({0, 3, -2}, t:totable())
    t:mul_(2)
    assert.are.same({0, 6, -4}, t:totable())
    t:mul_(lucid.tensor({1, 0.5, 0.25}))
    assert.are.same({0, 3, -1}, t:totable())
    t:zero_()
    assert.are.same({0, 0, 0}, t:totable())
    t:copy_(lucid.tensor({1, 2, 3}, {dtype = "f64"}))
    assert.are.same({1, 2, 3}, t:totable())
  end)
  it("promotes mixed float dtypes", function()
    local f = lucid.ones({2})
    assert.are.equal("f64", (f + f:double()):dtype())
    assert.are.equal("f32", (f:bf16() + f:half()):dtype())
    assert.are.equal("bf16", (f:bf16() * 3):dtype())
  end)
  it("unary functions", function()
    local t = lucid.tensor({-1, 0, 2})
    assert_table_close(t:exp():totable(), {math.exp(-1), 1, math.exp(2)})
    assert_table_close(t:abs():totable(), {1, 0, 2})
    assert_table_close(t:neg():totable(), {1, 0, -2})
    assert_table_close(t:relu():totable(), {0, 0, 2})
    assert_table_close(t:tanh():totable(), {math.tanh(-1), 0, math.tanh(2)})
    local sig = function(x) return 1 / (1 + math.exp(-x)) end
    assert_table_close(t:sigmoid():totable(), {sig(-1), 0.5, sig(2)})
    assert_table_close(t:silu():totable(), {-sig(-1), 0, 2 * sig(2)})
    local p = lucid.tensor({1, 4, 9})
    assert_table_close(p:sqrt():totable(), {1, 2, 3})
    assert_table_close(p:log():totable(), {0, math.log(4), math.log(9)})
  end)
end)

describe("lucid tensors: reductions", function()
  local t = lucid.tensor({{1, 2, 3}, {4, 5, 6}})
  it("over all elements return 0-d tensors", function()
    local s = t:sum()
    assert.are.equal(0, s:dim())
    assert.are.equal(21, s:item())
    assert.are.equal(3.5, t:mean():item())
    assert.are.equal(6, t:max():item())
    assert.are.equal(1, t:min():item())
    assert.is_true(close(t:norm():item(), math.sqrt(91)))
    assert.are.equal(21, lucid.sum(t):item())
  end)
  it("along a dim (1-based, negative, keepdim)", function()
    assert.are.same({5, 7, 9}, t:sum(1):totable())
    assert.are.same({6, 15}, t:sum(2):totable())
    assert.are.same({6, 15}, t:sum(-1):totable())
    assert.are.same({{6}, {15}}, t:sum(2, true):totable())
    assert.are.same({2, 5}, t:mean(2):totable())
    assert.are.same({4, 5, 6}, t:max(1):totable())
    assert.are.same({1, 4}, t:min(2):totable())
  end)
end)

describe("lucid tensors: matmul", function()
  it("matches a hand-computed product", function()
    local a = lucid.tensor({{1, 2, 3}, {4, 5, 6}})
    local b = lucid.tensor({{7, 8}, {9, 10}, {11, 12}})
    -- [1*7+2*9+3*11, 1*8+2*10+3*12] = [58, 64]; [4*7+5*9+6*11, ...] = [139, 154]
    assert.are.same({{58, 64}, {139, 154}}, a:matmul(b):totable())
    assert.are.same({{58, 64}, {139, 154}}, lucid.matmul(a, b):totable())
  end)
  it("uses transposed views and 1-D operands", function()
    local a = lucid.tensor({{1, 4}, {2, 5}, {3, 6}}):t() -- {{1,2,3},{4,5,6}}
    local b = lucid.tensor({{7, 9, 11}, {8, 10, 12}}):t()
    assert.are.same({{58, 64}, {139, 154}}, a:matmul(b):totable())
    local v = lucid.tensor({1, 1, 1})
    assert.are.same({6, 15}, a:matmul(v):totable())
    assert.are.same({5, 7, 9}, lucid.tensor({1, 1}):matmul(a):totable())
    assert.are.equal(3, v:matmul(v):item())
  end)
  it("batched", function()
    local a = lucid.arange(8):view(2, 2, 2)
    local i = lucid.tensor({{{1, 0}, {0, 1}}, {{0, 1}, {1, 0}}})
    assert.are.same({{{0, 1}, {2, 3}}, {{5, 4}, {7, 6}}}, a:matmul(i):totable())
  end)
  it("f64 for gradient checks", function()
    local a = lucid.tensor({{1, 2}, {3, 4}}, {dtype = "f64"})
    assert.are.same({{7, 10}, {15, 22}}, a:matmul(a):totable())
  end)
end)

describe("lucid tensors: tostring", function()
  it("prints like PyTorch with dtype and device", function()
    assert.are.equal(
      "tensor([[ 0.1000, -2.0000],\n        [ 3.5000,  4.0000]], dtype=f32, device=cpu)",
      tostring(lucid.tensor({{0.1, -2}, {3.5, 4}})))
  end)
  it("integral floats, integers, scalars, empty", function()
    assert.are.equal("tensor([1., 2., 3.], dtype=f32, device=cpu)", tostring(lucid.tensor({1, 2, 3})))
    assert.are.equal("tensor([  1, -20,   3], dtype=i32, device=cpu)",
      tostring(lucid.tensor({1, -20, 3}, {dtype = "i32"})))
    assert.are.equal("tensor(3.5000, dtype=f32, device=cpu)", tostring(lucid.tensor(3.5)))
    assert.are.equal("tensor([], dtype=f32, device=cpu)", tostring(lucid.tensor({})))
    assert.are.equal("tensor([0., 0.], dtype=f64, device=cpu)", tostring(lucid.zeros({2}, {dtype = "f64"})))
  end)
  it("scientific notation and non-finite values", function()
    assert.are.equal("tensor([1.0000e-05, 1.0000e+00], dtype=f32, device=cpu)",
      tostring(lucid.tensor({1e-5, 1})))
    assert.are.equal("tensor([   nan,    inf,   -inf, 1.5000], dtype=f32, device=cpu)",
      tostring(lucid.tensor({0 / 0, 1 / 0, -1 / 0, 1.5})))
  end)
  it("bf16/f16 show the values they store", function()
    assert.are.equal("tensor([0.1001], dtype=bf16, device=cpu)", tostring(lucid.tensor({0.1}, {dtype = "bf16"})))
    assert.are.equal("tensor([2048.], dtype=f16, device=cpu)", tostring(lucid.tensor({2049}, {dtype = "f16"})))
  end)
  it("3-D blocks are separated by a blank line", function()
    assert.are.equal(
      "tensor([[[0., 1.],\n         [2., 3.]],\n\n        [[4., 5.],\n         [6., 7.]]], dtype=f32, device=cpu)",
      tostring(lucid.arange(8):view(2, 2, 2)))
  end)
  it("wraps long rows at 80 columns", function()
    assert.are.equal(
      "tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,\n"
        .. "        14., 15., 16., 17., 18., 19.], dtype=f32, device=cpu)",
      tostring(lucid.arange(20)))
  end)
  it("summarises beyond 1000 elements with 3 edge items", function()
    local s = tostring(lucid.arange(2000))
    assert.are.equal(
      "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,\n"
        .. "        1.9990e+03], dtype=f32, device=cpu)", s)
    local big = tostring(lucid.zeros({100, 100}))
    assert.are.equal(
      "tensor([[0., 0., 0.,  ..., 0., 0., 0.],\n"
        .. "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
        .. "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
        .. "        ...,\n"
        .. "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
        .. "        [0., 0., 0.,  ..., 0., 0., 0.],\n"
        .. "        [0., 0., 0.,  ..., 0., 0., 0.]], dtype=f32, device=cpu)", big)
    assert.is_true(#tostring(lucid.zeros({64, 64, 64})) < 2000)
  end)
end)

describe("lucid tensors: misuse raises errors naming the argument", function()
  it("bad shapes", function()
    assert.has_error(function() lucid.zeros({2, -3}) end,
      "lucid.zeros: bad argument #1 (shape[2]): expected a non-negative integer, got -3")
    assert.has_error(function() lucid.zeros({2, 1.5}) end,
      "lucid.zeros: bad argument #1 (shape[2]): expected a non-negative integer, got 1.5")
    assert.has_error(function() lucid.ones("x") end,
      "lucid.ones: bad argument #1 (shape): expected a table of sizes, got string")
    assert.has_error(function() lucid.zeros({1, 1, 1, 1, 1, 1, 1, 1, 1}) end,
      "lucid.zeros: bad argument #1 (shape): expected at most 8 dims, got 9")
  end)
  it("unknown dtypes, devices and option keys", function()
    local ok, err = pcall(function() local t = lucid.zeros({2}, {dtype = "fp8"}); return t end)
    assert.is_false(ok)
    assert.matches("unknown dtype 'fp8' %(expected one of f32, f64, bf16, f16, u8, i32, i64%)", err)
    assert.matches("lucid%.zeros: bad argument #2 %(dtype%)", err)
    assert.has_error(function() lucid.zeros({2}, {device = "tpu"}) end,
      "lucid.zeros: bad argument #2 (device): unknown device 'tpu' (expected cpu, cuda, cuda:N or auto)")
    assert.has_error(function() lucid.zeros({2}, {dtpye = "f32"}) end,
      "lucid.zeros: bad argument #2 (opts): unknown key 'dtpye' (expected dtype, device, ctx)")
    assert.has_error(function() lucid.ones({2}):to("fp8") end)
  end)
  it("ragged or non-numeric nested tables name the path", function()
    assert.has_error(function() lucid.tensor({{1, 2}, {3}}) end,
      "lucid.tensor: bad argument #1 (data[2]): ragged nested table: has 1 elements, expected 2")
    assert.has_error(function() lucid.tensor({{1, 2}, {3, "x"}}) end,
      "lucid.tensor: bad argument #1 (data[2][2]): expected a number, got string")
    assert.has_error(function() lucid.tensor({{1, 2}, 3}) end,
      "lucid.tensor: bad argument #1 (data[2]): ragged nested table: expected a table of 2 elements, got number")
  end)
  it("dims, indices and operands", function()
    local t = lucid.zeros({2, 3})
    assert.has_error(function() t:size(3) end, "lucid.Tensor:size: bad argument #1 (dim): expected 1..2 or -2..-1, got 3")
    assert.has_error(function() t:narrow(2, 3, 2) end, "lucid.Tensor:narrow: bad argument #3 (length): expected 0..1, got 2")
    assert.has_error(function() t:select(1, 3) end,
      "lucid.Tensor:select: bad argument #2 (index): expected 1..2 or -2..-1 for dim 1 of size 2, got 3")
    assert.has_error(function() return t + "a" end)
    assert.has_error(function() t:add({}) end,
      "lucid.Tensor:add: bad argument #1 (other): expected lucid.Tensor or number, got table")
    assert.has_error(function() t:add(lucid.zeros({4})) end,
      "lucid.Tensor:add: bad argument #1: shapes {2,3} and {4} do not broadcast")
    assert.has_error(function() t:item() end,
      "lucid.Tensor:item: bad self: expected a tensor with one element, got 6 elements")
    assert.has_error(function() lucid.tensor({1}):matmul(5) end,
      "lucid.Tensor:matmul: bad argument #1 (other): expected lucid.Tensor, got number")
  end)
  it("engine failures raise 'lucid <status>: <function called>: <message>'", function()
    local ok, err = pcall(function() return lucid.zeros({2, 3}):matmul(lucid.zeros({2, 3})) end)
    assert.is_false(ok)
    assert.matches("lucid argument error: lucid%.Tensor:matmul: inner dimensions differ", err)
  end)
  it("view errors name the argument like the other argument errors", function()
    local t = lucid.zeros({2, 3})
    assert.has_error(function() return t:view({4}) end,
      "lucid.Tensor:view: bad argument #1 (shape): [4] has 4 elements but the tensor [2,3] has 6")
    assert.has_error(function() return t:view(4, 2) end,
      "lucid.Tensor:view: bad argument #1 (shape): [4,2] has 8 elements but the tensor [2,3] has 6")
    assert.has_error(function() return t:reshape({4, 4}) end,
      "lucid.Tensor:reshape: bad argument #1 (shape): [4,4] has 16 elements but the tensor [2,3] has 6")
    assert.has_error(function() return t:t():view({6}) end,
      "lucid.Tensor:view: bad self: the tensor is not contiguous; use reshape(), or clone() it first")
    -- negative controls: a matching shape views, a non-contiguous tensor reshapes
    assert.are.same({6}, t:view({6}):shape())
    assert.are.same({6}, t:t():reshape({6}):shape())
  end)
  it("CUDA requests without CUDA raise a clear error", function()
    if lucid.cuda_available() then return end
    local ok, err = pcall(lucid.zeros, {2}, {device = "cuda"})
    assert.is_false(ok)
    assert.matches("lucid unsupported: lucid%.zeros: device cuda:0 requested but CUDA is not available", err)
    ok, err = pcall(function() return lucid.zeros({2}):cuda() end)
    assert.is_false(ok)
    assert.matches("CUDA is not available", err)
    ok, err = pcall(lucid.Context, {device = "cuda"})
    assert.is_false(ok)
    -- a CPU-only build: unsupported; a CUDA build on a machine without a GPU:
    -- a device error that says no device is visible
    assert.is_truthy(err:match("lucid unsupported") or err:match("lucid device error: .*0 CUDA device"), err)
  end)
end)

describe("lucid tensors: copy_ and safetensors load check what they copy", function()
  local bare = function(e) return (tostring(e):gsub("^[^:]+:%d+: ", "")) end
  local function err_of(f, ...)
    local ok, e = pcall(f, ...)
    assert.is_false(ok, "expected an error")
    return bare(e)
  end

  it("copy_ copies equal element counts in row-major order (Torch7's copy), else names the counts", function()
    -- Torch7: "the number of elements must match, but the sizes might be different"
    local d = lucid.zeros({2, 3})
    d:copy_(lucid.arange(6):view(3, 2))
    assert.are.same({{0, 1, 2}, {3, 4, 5}}, d:totable())
    assert.are.equal("lucid.Tensor:copy_: bad argument #1 (src): 9 elements ([3,3]) but self has 6 ([2,3]); "
      .. "copy_ needs equal element counts (copied in row-major order, shapes may differ as in Torch7's copy)",
      err_of(d.copy_, d, lucid.ones({3, 3})))
    assert.are.equal("lucid.Tensor:copy_: bad argument #1 (src): shape [3,2] differs from self's [2,3] and src is "
      .. "not contiguous; a copy between different shapes needs both tensors contiguous (reshape src to self's "
      .. "shape first)",
      err_of(d.copy_, d, lucid.ones({2, 3}):t()))
    assert.are.equal("lucid.Tensor:copy_: bad argument #1 (src): shape [2,3] differs from self's [3,2] and self is "
      .. "not contiguous; a copy between different shapes needs both tensors contiguous (reshape src to self's "
      .. "shape first)",
      err_of(function() return d:t():copy_(lucid.ones({2, 3})) end))
    -- negative control: the advice works
    d:copy_(lucid.ones({2, 3}):t():reshape(d:shape()))
    -- same shape: any strides
    d:t():copy_(lucid.arange(6):view(3, 2))
    assert.are.same({{0, 2, 4}, {1, 3, 5}}, d:totable())
  end)

  it("file:load(name, t) needs the stored shape exactly ([2,2] into [4], [] into [1] are refused)", function()
    local path = os.tmpname()
    lucid.io.safetensors_save(path, { { "w", lucid.tensor({{1, 2}, {3, 4}}) }, { "s", lucid.tensor(7) } })
    local f = lucid.io.safetensors_open(path)
    local flat = lucid.zeros({4})
    assert.are.equal("lucid.SafeTensors:load: bad argument #2 (dst): tensor 'w' of " .. path .. " has shape [2,2]; "
      .. "dst has shape [4] (the shapes must be equal)", err_of(f.load, f, "w", flat))
    assert.are.same({0, 0, 0, 0}, flat:totable(), "nothing loaded")
    assert.are.equal("lucid.SafeTensors:load: bad argument #2 (dst): tensor 's' of " .. path .. " has shape []; "
      .. "dst has shape [1] (the shapes must be equal)", err_of(f.load, f, "s", lucid.zeros({1})))
    -- negative controls: the same shape loads (float dtypes converted); an
    -- absent name is still the engine's format error
    local w = lucid.zeros({2, 2}, {dtype = "bf16"})
    f:load("w", w)
    assert.are.same({{1, 2}, {3, 4}}, w:totable())
    local s = lucid.zeros({})
    f:load("s", s)
    assert.are.equal(7, s:item())
    assert.matches("no tensor named 'x'", err_of(f.load, f, "x", w))
    f:close()
    os.remove(path)
  end)
end)

describe("lucid tensors: empty tensors in reductions and narrow follow PyTorch", function()
  it("mean of nothing is nan (per column over an empty dim); sum stays 0", function()
    local z = lucid.zeros({0, 3})
    local m = z:mean():item()
    assert.is_true(m ~= m, "mean() of an empty tensor is nan")
    local c = z:mean(1)
    assert.are.same({3}, c:shape())
    for _, v in ipairs(c:totable()) do assert.is_true(v ~= v, "mean(1) is nan per column") end
    assert.are.same({1, 3}, z:mean(1, true):shape())
    assert.are.same({0}, z:mean(2):shape())
    local h = lucid.zeros({0}, {dtype = "bf16"}):mean()
    assert.are.equal("bf16", h:dtype())
    assert.is_true(h:item() ~= h:item())
    assert.are.same({0, 0, 0}, z:sum(1):totable())
    assert.are.equal(0, z:norm():item())
    -- negative control: a non-empty mean is unchanged
    assert.are.equal(2, lucid.tensor({1, 2, 3}):mean():item())
  end)

  it("max/min of nothing raise with PyTorch's wording, naming self or the dim", function()
    local z = lucid.zeros({0, 3})
    assert.has_error(function() return z:min() end,
      "lucid.Tensor:min: bad self: expected reduction dim to be specified for an empty tensor ([0,3], 0 elements); "
        .. "min of no elements is undefined (as in PyTorch)")
    assert.has_error(function() return z:max(1) end,
      "lucid.Tensor:max: bad argument #1 (dim): expected reduction dim 1 to have non-zero size, the tensor is [0,3]")
    assert.has_error(function() return z:min(-2, true) end,
      "lucid.Tensor:min: bad argument #1 (dim): expected reduction dim -2 to have non-zero size, the tensor is [0,3]")
    assert.are.same({0}, z:max(2):shape()) -- reducing a non-empty dim of an empty tensor
  end)

  it("narrow takes a zero length at start = size + 1 (PyTorch's start == size)", function()
    assert.are.same({0, 3}, lucid.zeros({0, 3}):narrow(1, 1, 0):shape())
    assert.are.same({0, 3}, lucid.ones({3, 3}):narrow(1, 4, 0):shape())
    assert.are.same({3, 0}, lucid.ones({3, 3}):narrow(2, 4, 0):shape())
    -- negative controls
    assert.has_error(function() return lucid.ones({3, 3}):narrow(1, 4, 1) end,
      "lucid.Tensor:narrow: bad argument #3 (length): expected 0..0, got 1")
    assert.has_error(function() return lucid.ones({3, 3}):narrow(1, 5, 0) end,
      "lucid.Tensor:narrow: bad argument #2 (start): expected 1..4 (4 only with length 0), got 5")
    assert.has_error(function() return lucid.ones({3, 3}):narrow(1, 0, 0) end,
      "lucid.Tensor:narrow: bad argument #2 (start): expected 1..4 (4 only with length 0), got 0")
    assert.has_error(function() return lucid.zeros({0, 3}):narrow(1, 2, 0) end,
      "lucid.Tensor:narrow: bad argument #2 (start): expected 1 (with length 0: the dim is empty), got 2")
  end)
end)
