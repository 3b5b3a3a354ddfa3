-- binding_spec.lua — the Lua binding as a module: no globals, contexts,
-- lifetimes (free, double free, use after free, GC), identity, errors.
local lucid = require "lucid"

describe("lucid module", function()
  it("require returns a table and sets no globals", function()
    local before = {}
    for k in pairs(_G) do before[k] = true end
    package.loaded.lucid = nil
    local m = require "lucid"
    assert.are.equal("table", type(m))
    for k in pairs(_G) do
      assert.is_true(before[k], "require 'lucid' set the global " .. tostring(k))
    end
    for k in pairs(before) do assert.is_not_nil(rawget(_G, k)) end
    assert.is_nil(rawget(_G, "lucid"))
  end)

  it("has a version and the documented functions", function()
    assert.matches("^%d+%.%d+%.%d+", lucid.version)
    for _, name in ipairs({"Context", "default_context", "cuda_available", "cuda_device_count",
        "memory_stats", "empty_cache", "manual_seed", "zeros", "ones", "empty", "full",
        "tensor", "rand", "randn", "arange", "matmul", "is_tensor"}) do
      assert.are.equal("function", type(lucid[name]), name)
    end
    assert.are.equal("boolean", type(lucid.cuda_available()))
    assert.are.equal("number", type(lucid.cuda_device_count()))
  end)

  it("exposes the Tensor method table for extension", function()
    lucid.Tensor.twice = function(self) return self * 2 end
    assert.are.same({2, 4}, lucid.tensor({1, 2}):twice():totable())
    lucid.Tensor.twice = nil
  end)

  it("prepends the Lua library next to lucid.so to package.path", function()
    -- only when lucid.so sits in a tree with lua/lucid/ (the repository)
    local so = package.searchpath and package.searchpath("lucid", package.cpath)
    if not so then return end
    local dir = so:match("^(.*)/[^/]*$") or "."
    local probe = io.open(dir .. "/lua/lucid/", "r")
    if not probe then return end
    probe:close()
    assert.matches("%w/lua/%?%.lua;", package.path)
    assert.matches("%w/lua/%?/init%.lua;", package.path)
  end)
end)

describe("lucid contexts", function()
  it("default context is shared and reported", function()
    local d = lucid.default_context()
    assert.is_true(rawequal(d, lucid.default_context()))
    assert.are.equal(lucid.cuda_available() and "cuda:0" or "cpu", d:device())
    assert.matches("^lucid%.Context%(device=", tostring(d))
  end)

  it("Context{} creates an independent context", function()
    local c = lucid.Context({device = "cpu", seed = 3})
    assert.are.equal("cpu", c:device())
    c:synchronize()
    c:empty_cache()
    local st = c:memory_stats()
    for _, k in ipairs({"allocated", "reserved", "peak_allocated", "peak_reserved", "num_allocs",
        "num_device_allocs"}) do
      assert.are.equal("number", type(st[k]), k)
    end
    assert.are.equal("table", type(lucid.memory_stats()))
    assert.are.equal("table", type(lucid.memory_stats("cpu")))
    c:free()
  end)

  it("grad_lane: reports and sets the parameter-gradient lane; checks its argument", function()
    local c = lucid.Context({device = "cpu"})
    assert.is_false(c:grad_lane())
    assert.is_false(c:grad_lane(true)) -- the state before the call
    assert.is_true(c:grad_lane())
    assert.is_true(c:grad_lane(false))
    assert.is_false(c:grad_lane())
    assert.has_error(function() c:grad_lane(1) end,
      "lucid.Context:grad_lane: bad argument #1: expected a boolean, got number")
    assert.has_error(function() c:grad_lane(true, 2) end)
    -- lane_backward joins (turns it off) also when the backward raises
    local step = require("lucid.step")
    local model = {backward = function() error("boom", 0) end}
    assert.has_error(function() step.lane_backward(c, model, nil, {}) end, "boom")
    assert.is_false(c:grad_lane())
    c:free()
  end)

  it("branch lanes: a no-op on the CPU; lucid.nn.lanes runs the branches in order and re-raises", function()
    local c = lucid.Context({device = "cpu"})
    assert.is_false(c:branch_fork(1))
    c:branch_return() -- nothing open: a no-op
    c:branch_join()
    c:branch_join(3)
    assert.has_error(function() c:branch_fork(0) end,
      "lucid.Context:branch_fork: bad argument #1: expected a branch 1..3, got 0")
    assert.has_error(function() c:branch_fork(1.5) end,
      "lucid.Context:branch_fork: bad argument #1: expected a branch 1..3, got 1.5")
    assert.has_error(function() c:branch_mark(1, 5) end,
      "lucid.Context:branch_mark: bad argument #2: expected a mark 1..4, got 5")
    c:branch_mark(1, 1) -- outside a fork: a no-op
    c:branch_wait(1, 1) -- nothing marked: a no-op
    assert.has_error(function() c:branch_fork(4) end)
    assert.has_error(function() c:branch_join(7) end)
    local lanes = require("lucid.nn.lanes")
    local t = lucid.zeros({2}, {ctx = c})
    assert.is_nil(lanes.ctx_for(c, t)) -- CPU tensors: plain calls
    assert.is_nil(lanes.ctx_for(nil, t))
    local seen = {}
    lanes.run(c, 3, function(b) seen[#seen + 1] = b end)
    lanes.run(nil, 2, function(b) seen[#seen + 1] = b end)
    assert.are.same({1, 2, 3, 1, 2}, seen)
    assert.has_error(function() lanes.run(c, 3, function(b) if b == 2 then error("b2", 0) end end) end, "b2")
    -- argument checks, before any branch runs (tryout 3)
    local ran = 0
    local count = function() ran = ran + 1 end
    assert.has_error(function() lanes.run(c, 5, count) end,
      "lanes.run: bad argument #2 (n): expected a branch count 1..3, got 5")
    assert.has_error(function() lanes.run(nil, 2.5, count) end,
      "lanes.run: bad argument #2 (n): expected a branch count 1..3, got 2.5")
    assert.has_error(function() lanes.queue(c, 2, nil) end,
      "lanes.queue: bad argument #3 (fn): expected a function, got nil")
    assert.has_error(function() lanes.run("ctx", 2, count) end,
      "lanes.run: bad argument #1 (ctx): expected a lucid.Context or nil, got string")
    assert.has_error(function() lanes.ctx_for(c, nil) end,
      "lanes.ctx_for: bad argument #2 (t): expected a lucid.Tensor, got nil")
    assert.are.equal(0, ran)
    assert.are.equal(lanes, require("lucid.nn").lanes)
    c:free()
  end)

  it("rejects unknown options and devices", function()
    assert.has_error(function() lucid.Context({devcie = "cpu"}) end,
      "lucid.Context: bad argument #1: unknown option 'devcie' (expected device, seed, threads)")
    assert.has_error(function() lucid.Context({device = "tpu"}) end,
      "lucid.Context: bad argument #1 (device): unknown device 'tpu' (expected cpu, cuda, cuda:N or auto)")
    assert.has_error(function() lucid.zeros({2}, {ctx = 5}) end,
      "lucid.zeros: bad argument #2 (ctx): expected lucid.Context, got number")
  end)

  it("two contexts keep separate generators and memory accounting", function()
    local c1 = lucid.Context({seed = 1})
    local c2 = lucid.Context({seed = 1})
    local a = lucid.rand({64}, {ctx = c1})
    local b = lucid.rand({64}, {ctx = c2})
    assert.are.same(a:totable(), b:totable())
    c2:manual_seed(2)
    local d = lucid.rand({64}, {ctx = c2})
    assert.are_not.same(lucid.rand({64}, {ctx = c1}):totable(), d:totable())
    local before2 = c2:memory_stats().allocated
    local big = lucid.zeros({1024}, {ctx = c1})
    assert.are.equal(before2, c2:memory_stats().allocated)
    assert.is_true(c1:memory_stats().allocated >= 4096)
    -- tensors from two cpu contexts combine
    assert.are.same(((a + b) / 2):totable(), a:totable())
    big:free()
    c1:free()
    c2:free()
  end)

  it("tensors keep their context alive after ctx:free()", function()
    local c = lucid.Context({})
    local t = lucid.ones({3}, {ctx = c})
    c:free()
    c:free() -- double free is a no-op
    assert.has_error(function() c:device() end, "lucid.Context:device: bad self: context was freed")
    assert.are.equal("lucid.Context(freed)", tostring(c))
    assert.are.same({2, 2, 2}, (t + t):totable())
    assert.are.equal(3, t:sum():item())
  end)
end)

describe("lucid tensor lifetimes", function()
  it("free drops the storage now; later use raises", function()
    local c = lucid.Context({})
    local t = lucid.zeros({256}, {ctx = c})
    local used = c:memory_stats().allocated
    assert.is_true(used >= 1024)
    t:free()
    assert.are.equal(used - 1024, c:memory_stats().allocated)
    assert.has_error(function() t:numel() end, "lucid.Tensor:numel: bad self: tensor was freed")
    assert.has_error(function() return t + 1 end)
    assert.has_error(function() lucid.ones({256}):add(t) end,
      "lucid.Tensor:add: bad argument #1 (other): tensor was freed")
    assert.are.equal("lucid.Tensor(freed)", tostring(t))
    t:free() -- double free is a no-op
    assert.is_true(lucid.is_tensor(t))
    c:free()
  end)

  it("a view keeps the storage after its base is freed", function()
    local t = lucid.arange(6)
    local v = t:view(2, 3)
    t:free()
    assert.are.same({{0, 1, 2}, {3, 4, 5}}, v:totable())
  end)

  it("__gc releases collected tensors (and tolerates freed ones)", function()
    local c = lucid.Context({})
    collectgarbage()
    local base = c:memory_stats().allocated
    for i = 1, 200 do
      local t = lucid.zeros({1000}, {ctx = c})
      if i % 2 == 0 then t:free() end
    end
    collectgarbage()
    collectgarbage()
    assert.are.equal(base, c:memory_stats().allocated)
    c:free()
  end)

  it("== is identity", function()
    local t = lucid.ones({2})
    assert.is_true(t == t)
    assert.is_false(t == t:clone())
    assert.is_true(t == t:to("cpu"))
    assert.is_false(t == 1)
  end)

  it("errors carry the caller's position", function()
    local ok, err = pcall(function() local x = lucid.zeros({-1}); return x end)
    assert.is_false(ok)
    assert.matches("^spec/binding_spec%.lua:%d+: lucid%.zeros: bad argument", err)
    ok, err = pcall(function() local x = lucid.zeros({2, 3}):matmul(lucid.zeros({2, 3})); return x end)
    assert.matches("^spec/binding_spec%.lua:%d+: lucid argument error:", err)
  end)
end)
