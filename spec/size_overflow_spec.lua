-- size_overflow_spec.lua — shapes whose element count or byte size does not
-- fit in int64 are argument errors naming the function, the argument and
-- the shape ("tensor size overflows"), never a wrapped tiny allocation
-- (the tryout's lucid.zeros({2^62}) printed garbage and its :sum()
-- segfaulted; {2^31, 2^31} segfaulted). The crash cases run in a child
-- luajit so a regression fails this spec instead of killing busted.
local lucid = require "lucid"

local err_of = require("support.errors").err_of

-- run a chunk in a fresh luajit from the repository root; returns the
-- output and the exit status
local function child(code)
  return require("support.errors").run("luajit -e " .. string.format("%q", "local l = require 'lucid'; " .. code))
end

describe("tensor size overflow", function()
  it("the tryout's crashes exit with a named error, not a segfault", function()
    local out, rc = child("local t = l.zeros({2^62}); print(t:sum():item())")
    assert.are.equal(1, rc, out)
    assert.matches("lucid.zeros: bad argument #1 %(shape%): tensor size overflows", out)
    out, rc = child("print(pcall(l.zeros, {2^31, 2^31}))")
    assert.are.equal(0, rc, out)
    assert.matches("^false\tlucid.zeros: bad argument #1 %(shape%): tensor size overflows: "
      .. "{2147483648, 2147483648} of f32", out)
  end)

  it("numel x itemsize past 2^63-1 is rejected for every constructor", function()
    for _, shape in ipairs({{2^62}, {2^31, 2^31}, {2^61}, {2^32, 2^32}, {2^21, 2^21, 2^21}}) do
      local e = err_of(lucid.zeros, shape)
      assert.matches("lucid.zeros: bad argument #1 %(shape%): tensor size overflows", e)
    end
    -- varargs shape, other constructors, the dtype counts
    assert.matches("lucid.empty: bad argument #1 %(shape%): tensor size overflows",
      err_of(lucid.empty, 2^31, 2^31))
    assert.matches("lucid.ones: .*tensor size overflows: {4611686018427387904} of f64",
      err_of(lucid.ones, {2^62}, {dtype = "f64"}))
    assert.matches("lucid.full: bad argument #1 %(shape%): tensor size overflows",
      err_of(lucid.full, {2^31, 2^31}, 1))
    assert.matches("lucid.rand: bad argument #1 %(shape%): tensor size overflows",
      err_of(lucid.rand, {2^62}))
    assert.matches("lucid.graph.pinned: bad argument #1 %(shape%): tensor size overflows",
      err_of(lucid.graph.pinned, {2^31, 2^31}, "f32"))
  end)

  it("sizes that fit are not overflow errors (negative control)", function()
    -- representable in int64 but far beyond memory: out of memory, not overflow.
    -- 2^56 bytes is past any x86-64/arm64 user address space (2^47..2^52), so
    -- the allocation fails even where the kernel overcommits memory (2^40 was
    -- granted on the GPU machine, and zeroing it got busted OOM-killed)
    local e = err_of(lucid.zeros, {2^56}, {dtype = "u8"})
    assert.matches("out of memory", e)
    assert.is_nil(e:find("overflows", 1, true))
    local t = lucid.zeros({2, 3})
    assert.are.equal(6, t:numel())
    assert.are.equal(0, t:sum():item())
  end)

  it("view/reshape shapes whose product wraps are rejected", function()
    local t = lucid.zeros({4})
    assert.matches("lucid.Tensor:view: bad argument #1 %(shape%): tensor size overflows",
      err_of(t.view, t, {2^32, 2^32, 4}))
    assert.matches("lucid.Tensor:reshape: bad argument #1 %(shape%): tensor size overflows",
      err_of(t.reshape, t, 2^32, 2^32, 2^32))
    -- a product that does not wrap but mismatches stays the ordinary error
    assert.matches("has 8 elements", err_of(t.view, t, {2, 4}))
    assert.are.same({2, 2}, t:view({2, 2}):shape())
  end)

  it("the -1 inference message prints large counts exactly", function()
    local t = lucid.zeros({5})
    assert.matches("cannot infer %-1 for 5 elements", err_of(t.view, t, {-1, 2}))
  end)

  it("nn parameter declarations with overflowing shapes are named errors", function()
    local set = lucid.nn.ParamSet()
    local e = err_of(set.declare, set, "w", "param", {2^31, 2^31, 2^31})
    assert.matches("tensor size overflows", e)
    assert.matches("'w'", e)
    set:declare("ok", "param", {2, 3}) -- control
    assert.are.equal(1, set:count())
  end)
end)
