-- tensor_out_spec.lua — the `out` option of the out-of-place binary ops
-- (t:add(x, {out = r}), as torch.add's out=): r receives the result, bit for
-- bit the values of the call without out, and is returned; shape, dtype and
-- unknown keys are refused. nn.containers.accumulate writes its persistent
-- buffer through it (one launch instead of a copy and an add).
local lucid = require "lucid"
local containers = require "lucid.nn.containers"
local errors = require "spec.support.errors"
local err_of = errors.err_of

local function bits(t)
  return lucid.hash_tensor(t)
end

local function cases(device)
  local ctx = device == "cuda" and lucid.Context({ device = "cuda", seed = 3 }) or nil
  for _, dt in ipairs({ "f32", "bf16", "f16" }) do
    local a = lucid.randn({ 3, 5, 7 }, { dtype = dt, ctx = ctx })
    local b = lucid.randn({ 3, 5, 7 }, { dtype = dt, ctx = ctx })
    for _, op in ipairs({ "add", "sub", "mul", "div", "maximum", "minimum" }) do
      local r = lucid.zeros({ 3, 5, 7 }, { dtype = dt, ctx = ctx })
      local got = a[op](a, b, { out = r })
      assert.is_true(rawequal(got, r), op .. " returns out itself")
      assert.are.equal(bits(a[op](a, b)), bits(r), dt .. " " .. op .. " bitwise")
    end
    -- a scalar operand and broadcasting
    local r = lucid.zeros({ 3, 5, 7 }, { dtype = dt, ctx = ctx })
    a:mul(2.5, { out = r })
    assert.are.equal(bits(a:mul(2.5)), bits(r))
    local row = lucid.randn({ 7 }, { dtype = dt, ctx = ctx })
    a:add(row, { out = r })
    assert.are.equal(bits(a:add(row)), bits(r))
    -- out may be an operand (elementwise)
    local c = a:clone()
    c:add(b, { out = c })
    assert.are.equal(bits(a:add(b)), bits(c))
  end
end

describe("binary ops with out", function()
  it("write the same bits as without out, into out, on the CPU", function()
    cases("cpu")
  end)

  it("write the same bits as without out, into out, on cuda #gpu", function()
    cases("cuda")
  end)

  it("refuse an out of another shape or dtype, and unknown options", function()
    local a, b = lucid.randn({ 2, 3 }), lucid.randn({ 2, 3 })
    assert.matches("bad argument #2 %(out%): its shape differs",
      err_of(a.add, a, b, { out = lucid.zeros({ 3, 2 }) }))
    assert.matches("bad argument #2 %(out%): dtype f16, the result is f32",
      err_of(a.add, a, b, { out = lucid.zeros({ 2, 3 }, { dtype = "f16" }) }))
    assert.matches("unknown option 'into'", err_of(a.add, a, b, { into = a }))
    assert.matches("expected an options table", err_of(a.add, a, b, 3))
    -- negative control: without out a new tensor comes back
    local r = a:add(b)
    assert.is_false(rawequal(r, a))
  end)

  it("name the argument of a bad out value as the other out errors do (#2 in the method form, #3 in lucid.add)",
    function()
      local a = lucid.ones({ 2 })
      local bare = function(e) return (e:gsub("^[^:]+:%d+: ", "")) end
      assert.are.equal("lucid.Tensor:add: bad argument #2 (out): expected lucid.Tensor, got number",
        bare(err_of(a.add, a, a, { out = 5 })))
      assert.are.equal("lucid.Tensor:mul: bad argument #2 (out): expected lucid.Tensor, got string",
        bare(err_of(a.mul, a, a, { out = "x" })))
      assert.are.equal("lucid.add: bad argument #3 (out): expected lucid.Tensor, got number",
        bare(err_of(function() local x = lucid.add(a, a, { out = 5 }); return x end)))
      local freed = lucid.zeros({ 2 })
      freed:free()
      assert.are.equal("lucid.Tensor:add: bad argument #2 (out): tensor was freed",
        bare(err_of(a.add, a, a, { out = freed })))
      -- (a call site the name comes from: through pcall(lucid.add, ...) the
      -- argument machinery cannot tell lucid.add from lucid.Tensor:add)
      -- the other out errors agree on the number (negative control)
      assert.are.equal("lucid.add: bad argument #3 (out): its shape differs from the result's",
        bare(err_of(function() local x = lucid.add(a, a, { out = lucid.zeros({ 3 }) }); return x end)))
      -- a positional entry ({r} for {out = r}) is named as such
      local e = bare(err_of(a.add, a, a, { a }))
      assert.are.equal("lucid.Tensor:add: bad argument #2 (opts): positional entry [1] (a lucid.Tensor) in the "
        .. "options table; options are named: {out = tensor}", e)
      assert.are.equal("lucid.Tensor:add: bad argument #2 (opts): unknown option 'into' (expected one of out)",
        bare(err_of(a.add, a, a, { into = a })))
    end)

  it("accept an out of another CPU context, as the inputs are accepted (same device)", function()
    local ctx2 = lucid.Context({ device = "cpu" })
    local a = lucid.tensor({ 1, 2 })
    local o = lucid.zeros({ 2 }, { ctx = ctx2 })
    -- inputs of another context on the same device were always accepted
    assert.are.same({ 2, 4 }, a:add(o:add(a)):totable())
    local got = a:add(a, { out = o })
    assert.is_true(rawequal(got, o))
    assert.are.same({ 2, 4 }, o:totable())
    a:mul(3, { out = o })
    assert.are.same({ 3, 6 }, o:totable())
    -- negative control: another device is still refused (when there is one)
    if lucid.cuda_available() then
      assert.matches("bad argument #2 %(out%): on another device",
        err_of(a.add, a, a, { out = lucid.zeros({ 2 }, { device = "cuda" }) }))
    end
  end)

  it("accumulate reuses one buffer per position and equals a:add(b)", function()
    local a, b = lucid.randn({ 4, 6 }, { dtype = "bf16" }), lucid.randn({ 4, 6 }, { dtype = "bf16" })
    local scope = { slots = {}, pos = 0 }
    local prev = containers.set_accumulate_scope(scope)
    local r1 = containers.accumulate(a, b)
    scope.pos = 0
    local a2, b2 = lucid.randn({ 4, 6 }, { dtype = "bf16" }), lucid.randn({ 4, 6 }, { dtype = "bf16" })
    local r2 = containers.accumulate(a2, b2)
    containers.set_accumulate_scope(prev)
    assert.is_true(rawequal(r1, r2), "the position's buffer is reused")
    assert.are.equal(bits(a2:add(b2)), bits(r2))
    assert.is_false(rawequal(r2, a2))
  end)
end)
