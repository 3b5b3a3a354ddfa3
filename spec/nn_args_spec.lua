-- nn_args_spec.lua — every public nn constructor checks its arguments
-- before building anything: a bad value raises at the user's call, naming
-- the constructor, the argument and the value ("nn.C3k2: bad argument n:
-- expected an integer >= 1, got string 'one'"), never a Lua arithmetic
-- error from inside a block. The table below is the specification; a
-- constructor exported by lucid.nn but missing here fails the first test.
local nn = require("lucid.nn")

-- what each kind of argument expects, and bad values with how they print
local WANT = {
  int0 = "an integer >= 0", int1 = "an integer >= 1", int2 = "an integer >= 2",
  odd = "an odd integer >= 1", pos = "a number > 0", prob = "a number >= 0 and <= 1",
  number = "a number", boolean = "a boolean",
  kpt_shape = "{K, 2} or {K, 3} (K keypoints >= 1; x, y[, visibility])",
  k2 = "a list of 2 integers >= 1 (kernels of cv1 and cv2)",
  ch = "a list of 1 to 3 integers >= 1 (input channels per level, strides 8, 16, 32)",
  n32 = "an integer in 1..32",
  ncat = "an integer in 2..32 (the number of inputs; unlike Ultralytics' Concat(dimension), the dimension is the "
    .. "second argument: nn.Concat(n, 1))",
  sizes = "a list of 1 to 32 integers >= 1",
  modules = "a list of nn modules", module = "an nn module (or one list of modules)",
}
local BAD = {
  int0 = { { "one", "string 'one'" }, { 1.5, "1.5" }, { -1, "-1" }, { true, "boolean" } },
  int1 = { { "one", "string 'one'" }, { 2.5, "2.5" }, { 0, "0" }, { {}, "table" } },
  int2 = { { "two", "string 'two'" }, { 1, "1" }, { 3.5, "3.5" } },
  odd = { { 4, "4" }, { "5", "string '5'" }, { -3, "-3" } },
  pos = { { "half", "string 'half'" }, { 0, "0" }, { -0.5, "-0.5" } },
  prob = { { 1.5, "1.5" }, { -0.1, "-0.1" }, { "x", "string 'x'" } },
  number = { { "x", "string 'x'" }, { {}, "table" } },
  boolean = { { "yes", "string 'yes'" }, { 1, "1" } },
  kpt_shape = { { { 17 }, "{17}" }, { { 17, 4 }, "{17, 4}" }, { 17, "17" } },
  k2 = { { 3, "3" }, { { 3 }, "{3}" }, { { 3, 0 }, "{3, 0}" } },
  ch = { { 16, "16" }, { { 16, 0 }, "{16, 0}" }, { { 8, 16, 32, 64 }, "{8, 16, 32, 64}" }, { { "a" }, "{'a'}" } },
  n32 = { { 0, "0" }, { 33, "33" }, { "2", "string '2'" } },
  ncat = { { 1, "1" }, { 0, "0" }, { 33, "33" }, { "2", "string '2'" }, { 1 / 0, "inf" } },
  sizes = { { 3, "3" }, { { 0, 8 }, "{0, 8}" } },
  modules = { { 1, "1" }, { { 1 }, "{1}" } },
  module = { { 1, "1" }, { "x", "string 'x'" } },
}

-- name = {valid arguments, {argument name, kind} in order}
local function A(...) return { ... } end
local CTORS = {
  Leaf = { A(), {} }, SiLU = { A(), {} }, Identity = { A(), {} }, Add = { A(), {} }, Softmax = { A(), {} },
  Conv2d = { A(3, 16, 3, 1, 1, 1, 1, true), { { "c1", "int1" }, { "c2", "int1" }, { "k", "int1" },
    { "s", "int1" }, { "p", "int0" }, { "g", "int1" }, { "d", "int1" }, { "bias", "boolean" } } },
  BatchNorm2d = { A(8, 1e-3, 0.03), { { "c", "int1" }, { "eps", "pos" }, { "momentum", "prob" } } },
  MaxPool2d = { A(3, 1, 1), { { "k", "int1" }, { "s", "int1" }, { "p", "int0" } } },
  Upsample = { A(2), { { "scale", "int1" } } },
  Concat = { A(2, 1), { { "n", "ncat" }, { "dim", "int1" } } },
  Split = { A(2, { 3, 5 }), { { "n", "n32" }, { "sizes", "sizes" } } },
  MatMul = { A(true, false, 0.5), { { "trans_a", "boolean" }, { "trans_b", "boolean" }, { "alpha", "number" } } },
  Sequential = { A(nn.SiLU(), nn.Identity()), { { "#1", "module" } }, vararg = true },
  ModuleList = { A({ nn.SiLU() }), { { "list", "modules" } } },
  Conv = { A(3, 16, 3, 2, 1, 1, 1, false), { { "c1", "int1" }, { "c2", "int1" }, { "k", "int1" },
    { "s", "int1" }, { "p", "int0" }, { "g", "int1" }, { "d", "int1" }, { "act", "boolean" } } },
  DWConv = { A(8, 16, 3, 1, 1, true), { { "c1", "int1" }, { "c2", "int1" }, { "k", "int1" },
    { "s", "int1" }, { "d", "int1" }, { "act", "boolean" } } },
  Bottleneck = { A(8, 8, true, 1, { 3, 3 }, 0.5), { { "c1", "int1" }, { "c2", "int1" }, { "shortcut", "boolean" },
    { "g", "int1" }, { "k", "k2" }, { "e", "pos" } } },
  C2f = { A(8, 16, 1, true, 1, 0.5), { { "c1", "int1" }, { "c2", "int1" }, { "n", "int1" },
    { "shortcut", "boolean" }, { "g", "int1" }, { "e", "pos" } } },
  C3 = { A(8, 8, 1, true, 1, 0.5), { { "c1", "int1" }, { "c2", "int1" }, { "n", "int1" },
    { "shortcut", "boolean" }, { "g", "int1" }, { "e", "pos" } } },
  C3k = { A(8, 8, 1, true, 1, 0.5, 3), { { "c1", "int1" }, { "c2", "int1" }, { "n", "int1" },
    { "shortcut", "boolean" }, { "g", "int1" }, { "e", "pos" }, { "k", "int1" } } },
  C3k2 = { A(8, 16, 1, false, 0.5, false, 1, true), { { "c1", "int1" }, { "c2", "int1" }, { "n", "int1" },
    { "c3k", "boolean" }, { "e", "pos" }, { "attn", "boolean" }, { "g", "int1" }, { "shortcut", "boolean" } } },
  SPPF = { A(16, 16, 5, 3, false), { { "c1", "int2" }, { "c2", "int1" }, { "k", "odd" }, { "n", "int1" },
    { "shortcut", "boolean" } } },
  Attention = { A(16, 2, 0.5), { { "dim", "int1" }, { "num_heads", "int1" }, { "attn_ratio", "pos" } } },
  PSABlock = { A(16, 0.5, 2, true), { { "c", "int1" }, { "attn_ratio", "pos" }, { "num_heads", "int1" },
    { "shortcut", "boolean" } } },
  C2PSA = { A(128, 128, 1, 0.5), { { "c1", "int1" }, { "c2", "int1" }, { "n", "int1" }, { "e", "pos" } } },
  DFL = { A(16), { { "c1", "int1" } } },
  Detect = { A(1, 16, { 16, 32, 64 }, false), { { "nc", "int1" }, { "reg_max", "int1" }, { "ch", "ch" },
    { "legacy", "boolean" } } },
  Pose = { A(1, { 17, 3 }, 16, { 16, 32, 64 }, false), { { "nc", "int1" }, { "kpt_shape", "kpt_shape" },
    { "reg_max", "int1" }, { "ch", "ch" }, { "legacy", "boolean" } } },
}

-- the error of a non-tail call of nn[name] with args (n of them)
local function err_of(name, args, n)
  local ok, e = pcall(function()
    local m = nn[name](unpack(args, 1, n))
    return m
  end)
  return ok, tostring(e)
end

local function copy(t, n)
  local c = {}
  for i = 1, n do c[i] = t[i] end
  return c
end

describe("nn constructors check their arguments", function()
  it("every exported constructor is specified here", function()
    local names = {}
    for name in pairs(nn.classes) do names[#names + 1] = name end
    table.sort(names)
    assert.is_true(#names >= 28)
    for _, name in ipairs(names) do
      assert.is_truthy(CTORS[name], "nn." .. name .. " has no entry in nn_args_spec.lua")
      assert.is_truthy(rawget(nn.classes[name], "_args"), "nn." .. name .. " declares no argument signature")
    end
  end)

  it("valid arguments build (negative control), with and without the optional ones", function()
    for name, c in pairs(CTORS) do
      local n = #c[2]
      local ok, e = err_of(name, c[1], c.vararg and #c[1] or n)
      assert.is_true(ok, "nn." .. name .. ": " .. e)
      -- trailing nils are absent arguments, not extra ones
      ok, e = err_of(name, c[1], (c.vararg and #c[1] or n) + 2)
      assert.is_true(ok, "nn." .. name .. " with trailing nils: " .. e)
    end
    -- boundary values that are valid
    assert.is_truthy(nn.Conv2d(3, 16, 3, nil, 0))
    assert.is_truthy(nn.MaxPool2d(5, 1, 2))
    assert.is_truthy(nn.SPPF(2, 1, 1, 1))
    assert.is_truthy(nn.C3k2(32, 64, 1, false, 0.25))
    assert.is_truthy(nn.Detect(nil, nil, { 8 }))
    assert.is_truthy(nn.Sequential({ nn.SiLU() }))
    assert.is_truthy(nn.Sequential())
  end)

  it("each bad argument of each constructor names the constructor, the argument and the value", function()
    local checked = 0
    for name, c in pairs(CTORS) do
      local n = #c[2]
      for i, a in ipairs(c[2]) do
        for _, bad in ipairs(BAD[a[2]]) do
          local args = copy(c[1], n)
          args[i] = bad[1]
          local ok, e = err_of(name, args, math.max(n, i))
          assert.is_false(ok, string.format("nn.%s accepted %s = %s", name, a[1], bad[2]))
          local want = string.format("nn.%s: bad argument %s: expected %s, got %s", name, a[1], WANT[a[2]], bad[2])
          assert.matches("^spec/nn_args_spec%.lua:%d+: ", e) -- raised at the user's call
          assert.is_truthy(e:find(want, 1, true), "\nwant: " .. want .. "\ngot:  " .. e)
          checked = checked + 1
        end
      end
      if not c.vararg then -- one argument too many
        local args = copy(c[1], n)
        args[n + 1] = 7
        local ok, e = err_of(name, args, n + 1)
        assert.is_false(ok)
        local most = n == 0 and "no arguments" or string.format("at most %d argument%s", n, n == 1 and "" or "s")
        local want = string.format("nn.%s: bad argument #%d: expected %s, got %d (extra: 7)", name, n + 1, most, n + 1)
        assert.is_truthy(e:find(want, 1, true), "\nwant: " .. want .. "\ngot:  " .. e)
      end
    end
    assert.is_true(checked > 150)
  end)

  it("the fresh-user case and combinations that cannot work", function()
    local function msg(f)
      local ok, e = pcall(f)
      assert.is_false(ok)
      assert.matches("^spec/nn_args_spec%.lua:%d+: nn%.", e)
      assert.is_nil(e:find("arithmetic", 1, true))
      return (e:gsub("^[^:]*:%d+: ", ""))
    end
    assert.equal("nn.C3k2: bad argument n: expected an integer >= 1, got string 'one'",
      msg(function() local m = nn.C3k2(32, 64, "one"); return m end))
    assert.equal("nn.Conv2d: bad argument g: groups 2 must divide c1 = 3 and c2 = 16",
      msg(function() local m = nn.Conv2d(3, 16, 3, 1, nil, 2); return m end))
    assert.equal("nn.Conv: bad argument g: groups 4 must divide c1 = 6 and c2 = 16",
      msg(function() local m = nn.Conv(6, 16, 3, 1, nil, 4); return m end))
    assert.equal("nn.Bottleneck: bad argument g: groups 3 must divide the hidden channels c_ = 4",
      msg(function() local m = nn.Bottleneck(8, 8, true, 3); return m end))
    assert.equal("nn.Bottleneck: bad argument e: hidden channels c_ = int(c2 * e) = int(8 * 0.1) = 0; expected >= 1",
      msg(function() local m = nn.Bottleneck(8, 8, true, 1, nil, 0.1); return m end))
    assert.equal("nn.C3k2: bad argument c2: hidden channels c = int(c2 * e) = int(3 * 0.5) = 1; expected >= 2",
      msg(function() local m = nn.C3k2(32, 3); return m end))
    assert.equal("nn.C2f: bad argument g: groups 3 must divide the hidden channels c = 4",
      msg(function() local m = nn.C2f(8, 8, 1, false, 3); return m end))
    assert.equal("nn.C2PSA: bad argument c2: expected c2 == c1 (256), got 128",
      msg(function() local m = nn.C2PSA(256, 128); return m end))
    assert.equal("nn.C2PSA: bad argument c1: hidden channels c = int(c1 * e) = int(32 * 0.5) = 16; expected >= 64 "
      .. "(num_heads = c // 64)", msg(function() local m = nn.C2PSA(32, 32); return m end))
    assert.equal("nn.Attention: bad argument num_heads: num_heads = 3 must divide the channels (10)",
      msg(function() local m = nn.Attention(10, 3); return m end))
    assert.equal("nn.PSABlock: bad argument attn_ratio: key_dim = int(16 // 4 * 0.1) = 0; expected >= 1",
      msg(function() local m = nn.PSABlock(16, 0.1, 4); return m end))
    assert.equal("nn.MaxPool2d: bad argument p: padding 2 must be at most k/2 (k = 3)",
      msg(function() local m = nn.MaxPool2d(3, 1, 2); return m end))
    assert.equal("nn.Concat: bad argument dim: only dim 1 (channels) is supported, got 2",
      msg(function() local m = nn.Concat(2, 2); return m end))
    assert.equal("nn.Split: bad argument sizes: expected 2 entries (one per piece), got 1",
      msg(function() local m = nn.Split(2, { 8 }); return m end))
    assert.equal("nn.Sequential: bad argument #1: entry 2: expected an nn module, got string 'x'",
      msg(function() local m = nn.Sequential({ nn.SiLU(), "x" }); return m end))
    assert.equal("nn.Sequential: bad argument #2: expected an nn module (or one list of modules), got 3",
      msg(function() local m = nn.Sequential(nn.SiLU(), 3); return m end))
  end)

  it("a model whose scaling makes a block impossible names the layer, at the user's call", function()
    local build = require("lucid.models.yolo11_pose")
    local ok, e = pcall(function()
      local m = build({ scale = { 0.25, 0.0625, 1024 }, nc = 1, materialize = false })
      return m
    end)
    assert.is_false(ok)
    assert.equal("spec/nn_args_spec.lua:" .. e:match("^spec/nn_args_spec%.lua:(%d+): ")
      .. ": model: layer 10 (C2PSA): nn.C2PSA: bad argument c1: hidden channels c = int(c1 * e) = int(64 * 0.5) "
      .. "= 32; expected >= 64 (num_heads = c // 64)", e)
    -- negative control: one width step up builds
    assert.is_truthy(build({ scale = { 0.25, 0.125, 1024 }, nc = 1, materialize = false }))
  end)
end)

describe("nn.Concat: the first argument is the number of inputs", function()
  local lucid = require("lucid")

  local function msg(f)
    local ok, e = pcall(f)
    assert.is_false(ok, "expected an error")
    return (tostring(e):gsub("^[^:]*:%d+: ", ""))
  end

  it("an Ultralytics-style nn.Concat(1) fails at construction, explaining the argument", function()
    local e = msg(function() local m = nn.Concat(1); return m end)
    assert.equal("nn.Concat: bad argument n: expected " .. WANT.ncat .. ", got 1", e)
    assert.matches("nn.Concat: bad argument n: expected an integer in 2..32",
      msg(function() local m = nn.Concat(); return m end))
  end)

  it("a list of another length than n is a named error at forward", function()
    local c = nn.Concat(9)
    nn.materialize(c)
    local x = { lucid.zeros({ 1, 2, 4, 4 }), lucid.zeros({ 1, 3, 4, 4 }) }
    assert.equal("nn.Concat:forward: bad argument #1 (x): expected a list of 9 tensors (this nn.Concat(9) "
      .. "concatenates 9 inputs), got a list of 2", msg(function() return c:forward(x) end))
    -- negative control: n matching the inputs concatenates along channels
    local c2 = nn.Concat(2)
    nn.materialize(c2)
    assert.same({ 1, 5, 4, 4 }, c2:forward(x):shape())
  end)

  it("a one-level head (nothing to concatenate) still runs", function()
    local d = nn.Pose(1, { 2, 3 }, 16, { 8 }, false)
    nn.materialize(d)
    local x = { lucid.randn({ 2, 8, 4, 4 }) }
    local out = d:forward(x)
    assert.same({ 2, 64, 16 }, out.boxes:shape())
    assert.same({ 2, 6, 16 }, out.kpts:shape())
    local gx = d:backward(x, { boxes = lucid.ones({ 2, 64, 16 }), kpts = lucid.ones({ 2, 6, 16 }) })
    assert.same({ 2, 8, 4, 4 }, gx[1]:shape())
  end)
end)

describe("train(mode) takes a boolean", function()
  local lucid = require("lucid")

  local function msg(f)
    local ok, e = pcall(f)
    assert.is_false(ok, "expected an error")
    return (tostring(e):gsub("^[^:]*:%d+: ", ""))
  end

  it("model:train, module:train and the C module refuse strings and numbers", function()
    local m = require("lucid.models.yolo11_pose")({ scale = "n", nc = 1, materialize = false })
    assert.equal("model:train: bad argument #1 (mode): expected a boolean (or nothing for true), got string 'x'",
      msg(function() m:train("x") end))
    assert.equal("model:train: bad argument #1 (mode): expected a boolean (or nothing for true), got 0",
      msg(function() m:train(0) end))
    local c = nn.Conv(3, 4, 3)
    assert.equal("nn.Conv:train: bad argument #1 (mode): expected a boolean (or nothing for true), got 1",
      msg(function() c:train(1) end))
    local leaf = nn.Conv2d(3, 4, 3)
    nn.materialize(leaf)
    assert.equal("lucid.CModule:train: bad argument #1 (mode): expected a boolean (or nothing for true), got "
      .. "string", msg(function() leaf._c:train("yes") end))
    -- negative control: booleans and nothing
    assert.is_false(m:train(false).training)
    assert.is_true(m:train().training)
    assert.is_false(m:eval().training)
    assert.is_true(m:train(true).training)
    assert.is_false(c:train(false).training)
    assert.is_false(leaf._c:train(false).training)
    assert.is_true(leaf._c:train().training)
  end)
end)
