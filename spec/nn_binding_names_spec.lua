-- nn_binding_names_spec.lua — lucid.nn of require "lucid" is the C
-- primitives table; the nn blocks live in the Lua library require
-- "lucid.nn". A name the C table does not have raises at the read, naming
-- it and pointing at the library when it is one of its blocks (the
-- tryout's lucid.nn.Conv(...) failed with "attempt to call field 'Conv' (a
-- nil value)"). Probes of optional fields use rawget.
local lucid = require("lucid")

local err_of = require("support.errors").err_of

describe("lucid.nn (the C primitives) and the Lua nn library", function()
  it("a block of the Lua library read from lucid.nn names where it is", function()
    local e = err_of(function() return lucid.nn.Conv(3, 16, 3) end)
    assert.matches("^spec/nn_binding_names_spec%.lua:%d+: ", e)
    assert.is_truthy(e:find('lucid.nn.Conv: no such primitive; the nn blocks (Conv, C2f, ...) are in require "lucid.nn"',
      1, true), e)
    assert.is_nil(e:find("a nil value", 1, true))
    assert.is_truthy(err_of(function() return lucid.nn.C2f end):find("lucid.nn.C2f: no such primitive", 1, true))
    assert.is_truthy(err_of(function() return lucid.nn.materialize end)
      :find('lucid.nn.materialize: no such primitive; materialize is in the Lua library: require "lucid.nn"', 1, true))
  end)

  it("any other unknown name is 'no such field'", function()
    local e = err_of(function() return lucid.nn.no_such_thing end)
    assert.is_truthy(e:find("lucid.nn.no_such_thing: no such field", 1, true), e)
  end)

  it("negative control: the primitives, rawget probes and the library itself", function()
    assert.equal("function", type(lucid.nn.ParamSet))
    assert.equal("function", type(lucid.nn.conv2d))
    assert.equal("function", type(lucid.nn.concat))
    assert.is_nil(rawget(lucid.nn, "Conv"))
    assert.is_nil(rawget(lucid.nn, "no_such_thing"))
    assert.is_nil(lucid.nn[1]) -- non-string keys read nil
    local nn = require("lucid.nn")
    local C = nn.binding()
    assert.equal(lucid.nn, C)
    local m = nn.Conv(3, 4, 3)
    nn.materialize(m)
    assert.same({ 1, 4, 8, 8 }, m:forward(lucid.randn({ 1, 3, 8, 8 })):shape())
    -- the fused BN+SiLU probe (rawget of an optional binding field) still finds it
    assert.is_true(require("lucid.nn.prim").bn_silu_fusable(m.bn, m.act))
  end)

  it("no Lua file probes lucid.nn fields by plain indexing", function()
    -- `if lucid.nn.x then` would now raise for an absent x: probes use rawget
    local p = io.popen("grep -rnE 'lucid\\.nn\\.[A-Za-z_]+ (then|and|or)|not lucid\\.nn\\.[A-Za-z_]' lua bench tools "
      .. "examples recipes --include=*.lua 2>/dev/null")
    local out = p:read("*a")
    p:close()
    assert.equal("", out)
  end)
end)
