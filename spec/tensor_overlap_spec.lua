-- tensor_overlap_spec.lua — a written tensor (the self of an in-place op,
-- the `out` of add/sub/mul/div/pow/maximum/minimum, the destination of
-- copy_ and t[i] = x) that partially overlaps one of the inputs is refused,
-- as in PyTorch ("unsupported operation: some elements of the input tensor
-- and the written-to tensor refer to a single memory location. Please
-- clone() the tensor before performing the operation."): an elementwise op
-- on such views reads elements it already wrote (the tryout got
-- [1,2,4,8,16,32] from b[2..6] = 2 * b[1..5]). The identical view (out = self,
-- a:add_(a)) and disjoint parts of one storage stay allowed.
local lucid = require "lucid"
local ffi = require "ffi"
local errors = require "spec.support.errors"
local err_of = errors.err_of

local OVERLAP = "unsupported operation: some elements of the input tensor %(%w+%) and the written%-to tensor "
  .. "%([%w%[%]]+%) refer to a single memory location%. Please clone%(%) the tensor before performing the operation%."

describe("ops whose written tensor partially overlaps an input", function()
  it("refuse an out that overlaps self or other (narrow views, a transpose)", function()
    local b = lucid.tensor({ 1, 2, 3, 4, 5, 6 })
    local p, q = b:narrow(1, 1, 5), b:narrow(1, 2, 5)
    local e = err_of(p.mul, p, 2, { out = q })
    assert.matches("lucid%.Tensor:mul: bad self: " .. OVERLAP, e)
    assert.matches("input tensor %(self%) and the written%-to tensor %(out%)", e)
    assert.are.same({ 1, 2, 3, 4, 5, 6 }, b:totable(), "nothing written")
    -- the functional form names argument #1
    assert.matches("lucid%.mul: bad argument #1 %(self%): " .. OVERLAP, err_of(function() local x = lucid.mul(p, 2, { out = q }); return x end))
    -- other overlapping out
    assert.matches("lucid%.Tensor:add: bad argument #1 %(other%): " .. OVERLAP,
      err_of(p.add, lucid.ones({ 5 }), q, { out = p }))
    -- a transpose of out: the same memory range but another element order
    local m = lucid.tensor({ { 1, 2 }, { 3, 4 } })
    e = err_of(function() return m:t():add(m, { out = m }) end)
    assert.matches("lucid%.Tensor:add: bad self: " .. OVERLAP, e)
    assert.are.same({ { 1, 2 }, { 3, 4 } }, m:totable())
    -- a broadcast row of out
    assert.matches(OVERLAP, err_of(function() return m:add(m[1], { out = m }) end))
    -- a scalar first: lucid.sub(2, t, {out = r})
    assert.matches("lucid%.sub: bad argument #2 %(other%): " .. OVERLAP, err_of(function() local x = lucid.sub(2, q, { out = p }); return x end))
  end)

  it("refuse in-place ops whose other operand overlaps self", function()
    local m = lucid.tensor({ { 1, 2 }, { 3, 4 } })
    local e = err_of(function() return m:add_(m:t()) end)
    assert.matches("lucid%.Tensor:add_: bad argument #1 %(other%): " .. OVERLAP, e)
    assert.matches("%(other%) and the written%-to tensor %(self%)", e)
    assert.are.same({ { 1, 2 }, { 3, 4 } }, m:totable())
    local b = lucid.tensor({ 1, 2, 3, 4, 5, 6 })
    for _, op in ipairs({ "add_", "sub_", "mul_", "div_" }) do
      local w = b:narrow(1, 2, 5)
      assert.matches("lucid%.Tensor:" .. op .. ": bad argument #1 %(other%): " .. OVERLAP,
        err_of(w[op], w, b:narrow(1, 1, 5)))
    end
    assert.are.same({ 1, 2, 3, 4, 5, 6 }, b:totable())
  end)

  it("refuse copy_ and t[i] = x from an overlapping source", function()
    local b = lucid.tensor({ 1, 2, 3, 4, 5, 6 })
    local e = err_of(function() return b:narrow(1, 2, 5):copy_(b:narrow(1, 1, 5)) end)
    assert.matches("lucid%.Tensor:copy_: bad argument #1 %(src%): " .. OVERLAP, e)
    assert.are.same({ 1, 2, 3, 4, 5, 6 }, b:totable())
    local m = lucid.tensor({ { 1, 2 }, { 3, 4 } })
    e = err_of(function() m[1] = m:t()[1] end)
    assert.matches("lucid%.Tensor%.__newindex: bad argument #3 %(value%): " .. OVERLAP, e)
    assert.are.same({ { 1, 2 }, { 3, 4 } }, m:totable())
  end)

  it("still allow the identical view, disjoint parts of one storage and other storages", function()
    -- identical view: elementwise, each element read before it is written
    local a = lucid.tensor({ 1, 2, 3 })
    a:add_(a)
    assert.are.same({ 2, 4, 6 }, a:totable())
    a:mul(a, { out = a })
    assert.are.same({ 4, 16, 36 }, a:totable())
    local v = a:narrow(1, 2, 2)
    v:add_(a:narrow(1, 2, 2)) -- another userdata, the same view
    assert.are.same({ 4, 32, 72 }, a:totable())
    a:copy_(a)
    a:view({ 3, 1 }):copy_(a) -- the same memory in row-major order
    -- disjoint ranges of one storage: the two halves
    local b = lucid.tensor({ 1, 2, 3, 10, 20, 30 })
    local lo, hi = b:narrow(1, 1, 3), b:narrow(1, 4, 3)
    lo:add_(hi)
    assert.are.same({ 11, 22, 33, 10, 20, 30 }, b:totable())
    hi:sub(lo, { out = hi })
    assert.are.same({ 11, 22, 33, -1, -2, -3 }, b:totable())
    lo:copy_(hi)
    assert.are.same({ -1, -2, -3, -1, -2, -3 }, b:totable())
    local m = lucid.tensor({ { 1, 2 }, { 3, 4 } })
    m[1] = m[2]
    assert.are.same({ { 3, 4 }, { 3, 4 } }, m:totable())
    -- empty views overlap nothing
    b:narrow(1, 1, 0):add_(b:narrow(1, 1, 0))
    -- other storages: always fine
    local c = m:clone()
    m:add_(c:t())
    assert.are.same({ { 6, 7 }, { 7, 8 } }, m:totable())
  end)

  it("refuse a written tensor with internal overlap (a stride-0 dim)", function()
    -- the binding creates no stride-0 view; make one by hand (the userdata
    -- holds one lucid_tensor * of lucid.h's layout) to check the guard
    pcall(ffi.cdef, [[
      typedef struct lucid_overlap_spec_tensor {
        void *storage; int dtype; int ndim; int64_t shape[8]; int64_t strides[8];
        int64_t offset; int refcount;
      } lucid_overlap_spec_tensor;
    ]])
    local base = lucid.zeros({ 6 })
    local v = base:narrow(1, 1, 3) -- its own lucid_tensor, shared by nothing
    local t = ffi.cast("lucid_overlap_spec_tensor **", v)[0]
    t.ndim = 2
    t.shape[0], t.shape[1] = 2, 3
    t.strides[0], t.strides[1] = 0, 1
    assert.are.same({ 2, 3 }, v:shape())
    local msg = "unsupported operation: more than one element of the written%-to tensor refers to a single "
      .. "memory location%. Please clone%(%) the tensor before performing the operation%."
    assert.matches("lucid%.Tensor:add_: bad self: " .. msg, err_of(v.add_, v, 1))
    assert.matches("lucid%.Tensor:add: bad argument #2 %(out%): " .. msg,
      err_of(v.add, lucid.ones({ 2, 3 }), 1, { out = v }))
    assert.matches("lucid%.Tensor:copy_: bad self: " .. msg, err_of(v.copy_, v, lucid.ones({ 2, 3 })))
    -- negative control: reading the expanded view is fine
    assert.are.same({ { 1, 1, 1 }, { 1, 1, 1 } }, v:add(1):totable())
    t.ndim = 1 -- back to the narrow view before it is collected
  end)
end)
