-- arg_errors_spec.lua — argument errors of the C binding name the function
-- as the user calls it ("lucid.Tensor:reshape: bad argument #1 (shape):
-- ..."), however it was called: a plain call, a tail call, through pcall,
-- through a local alias (lauxlib's luaL_argerror said "to '?'" for the last
-- three). The naming lives in one place, lua/lua_args.c; lua_common.h
-- poisons lauxlib's checkers in lua/, so no binding bypasses it.
local lucid = require "lucid"

local err_of = require("support.errors").err_of

-- the message without the "file:line: " of the caller
local function bare(e) return (e:gsub("^[^:]*:%d+: ", "")) end

describe("argument errors name their function", function()
  local t

  before_each(function() t = lucid.zeros({2, 3}) end)

  it("a method: class and method, arguments counted after self", function()
    local want = "lucid.Tensor:reshape: bad argument #1 (shape): expected a table of sizes, got string"
    -- plain call (the caller's position comes first)
    local e = err_of(function() local x = t:reshape("x"); return x end)
    assert.matches("^spec/arg_errors_spec%.lua:%d+: ", e)
    assert.are.equal(want, bare(e))
    -- tail call, alias, pcall of the function itself: no call-site name
    assert.are.equal(want, bare(err_of(function() return t:reshape("x") end)))
    local reshape = t.reshape
    assert.are.equal(want, bare(err_of(function() return reshape(t, "x") end)))
    assert.are.equal(want, bare(err_of(t.reshape, t, "x")))
    assert.is_nil(e:find("'?'", 1, true))
  end)

  it("module functions and nested sub-libraries", function()
    assert.are.equal("lucid.zeros: bad argument #1 (shape): expected a table of sizes, got string",
      bare(err_of(lucid.zeros, "a")))
    assert.are.equal("lucid.zeros: bad argument #2 (dtype): unknown dtype 'zz' "
      .. "(expected one of f32, f64, bf16, f16, u8, i32, i64)",
      bare(err_of(function() return lucid.zeros({2}, { dtype = "zz" }) end)))
    assert.are.equal("lucid.io.safetensors_open: bad argument #1: expected a string, got no value",
      bare(err_of(lucid.io.safetensors_open)))
    assert.are.equal("lucid.data.Loader: bad argument #1: expected lucid.Dataset, got nil",
      bare(err_of(lucid.data.Loader, nil, {})))
    assert.are.equal("lucid.optim.schedule.lf: bad argument #1: invalid option 'x' (expected one of linear, cos)",
      bare(err_of(lucid.optim.schedule.lf, "x")))
  end)

  it("a module function that is also a method is named as called", function()
    assert.are.equal("lucid.add: bad argument #2 (other): expected lucid.Tensor or number, got string",
      bare(err_of(function() local x = lucid.add(t, "x"); return x end)))
    assert.are.equal("lucid.Tensor:add: bad argument #1 (other): expected lucid.Tensor or number, got string",
      bare(err_of(function() local x = t:add("x"); return x end)))
  end)

  it("metamethods and a bad self", function()
    assert.are.equal("lucid.Tensor.__add: bad argument #2 (other): expected lucid.Tensor or number, got string",
      bare(err_of(function() return t + "x" end)))
    local u = lucid.zeros({2})
    u:free()
    assert.are.equal("lucid.Tensor:numel: bad self: tensor was freed",
      bare(err_of(function() return u:numel() end)))
  end)

  it("a field assignment names the class and the field", function()
    local set = lucid.nn.ParamSet()
    set:declare("w", "param", { 2 })
    set:materialize({})
    local opt = lucid.optim.SGD({ params = set })
    assert.are.equal("lucid.ParamGroup: setting 'betas': only AdamW groups have betas (use momentum)",
      bare(err_of(function() opt.param_groups[1].betas = { 0.9, 0.999 } end)))
  end)

  it("methods of the other classes (lucid.SafeTensors)", function()
    local path = os.tmpname()
    lucid.io.safetensors_save(path, { { "w", lucid.ones({2}) } })
    local f = lucid.io.safetensors_open(path)
    assert.are.equal("lucid.SafeTensors:load: bad argument #2 (dst): expected lucid.Tensor, got number",
      bare(err_of(function() return f:load("w", 5) end)))
    assert.are.equal("lucid.SafeTensors:info: bad argument #1: expected a string, got no value",
      bare(err_of(function() return f:info() end)))
    f:close()
    os.remove(path)
  end)

  it("engine failures of tensor functions name the function called, not the engine op", function()
    -- each: the call (non-tail, so the call site is known) and the message
    -- after "file:line: "
    local i64 = lucid.zeros({2, 3}, { dtype = "i64" })
    local cases = {
      { function() local x = t:reshape({4, 4}); return x end,
        "lucid.Tensor:reshape: bad argument #1 (shape): [4,4] has 16 elements but the tensor [2,3] has 6" },
      { function() local x = t:view({4, 4}); return x end,
        "lucid.Tensor:view: bad argument #1 (shape): [4,4] has 16 elements but the tensor [2,3] has 6" },
      { function() local x = t:t():view({6}); return x end,
        "lucid.Tensor:view: bad self: the tensor is not contiguous; use reshape(), or clone() it first" },
      { function() local x = t:copy_(lucid.zeros({3})); return x end,
        "lucid.Tensor:copy_: bad argument #1 (src): 3 elements ([3]) but self has 6 ([2,3]); copy_ needs equal "
          .. "element counts (copied in row-major order, shapes may differ as in Torch7's copy)" },
      { function() local x = t:add_(lucid.zeros({4})); return x end,
        "lucid argument error: lucid.Tensor:add_: shape [4] does not broadcast to [2,3]" },
      { function() local x = lucid.matmul(t, lucid.zeros({4, 2})); return x end,
        "lucid argument error: lucid.matmul: inner dimensions differ: op(a) is 2x3 (K = 3) but op(b) is 4x2 (K = 4)" },
      { function() local x = lucid.empty({2 ^ 40, 2 ^ 40}); return x end,
        "lucid.empty: bad argument #1 (shape): tensor size overflows: {1099511627776, 1099511627776} of f32 "
          .. "(4 bytes per element) needs more than 2^63-1 elements or bytes" },
      { function() local x = lucid.rand({2}, { dtype = "i64" }); return x end,
        "lucid.rand: bad argument #2 (opts.dtype): expected a float dtype (f32, f64, bf16 or f16), got i64; "
          .. "convert with :float() first" },
      { function() local x = lucid.randn(2, 3, { dtype = "u8" }); return x end,
        "lucid.randn: bad argument #3 (opts.dtype): expected a float dtype (f32, f64, bf16 or f16), got u8; "
          .. "convert with :float() first" },
      { function() local x = i64:log(); return x end,
        "lucid.Tensor:log: bad self: expected a float dtype (f32, f64, bf16 or f16), got i64; convert with :float() first" },
      { function() local x = lucid.exp(i64); return x end,
        "lucid.exp: bad argument #1 (self): expected a float dtype (f32, f64, bf16 or f16), got i64; "
          .. "convert with :float() first" },
      { function() local x = i64:div(2); return x end,
        "lucid.Tensor:div: bad self: expected a float dtype (f32, f64, bf16 or f16), got i64; convert with :float() first" },
      { function() local x = 2 - i64; return x end,
        "lucid.Tensor.__sub: bad argument #2 (other): expected a float dtype (f32, f64, bf16 or f16), got i64; "
          .. "convert with :float() first" },
      { function() local x = t:matmul(lucid.zeros({3, 2}, { dtype = "i32" })); return x end,
        "lucid.Tensor:matmul: bad argument #1 (other): expected a float dtype (f32, f64, bf16 or f16), got i32; "
          .. "convert with :float() first" },
    }
    if not lucid.cuda_available() then
      cases[#cases + 1] = { function() local x = t:cuda(); return x end,
        "lucid unsupported: lucid.Tensor:cuda: device cuda:0 requested but CUDA is not available "
          .. "(CPU-only build or no GPU visible)" }
    end
    for _, c in ipairs(cases) do
      local e = err_of(c[1])
      assert.matches("^spec/arg_errors_spec%.lua:%d+: ", e)
      assert.are.equal(c[2], bare(e))
      -- the message names a public function first, no engine-internal op
      assert.is_truthy(bare(e):match("^lucid %a[%a ]*: lucid%.[%w_.:]+: ") or bare(e):match("^lucid%.[%w_.:]+: bad "), e)
      for _, op in ipairs({ "rand_uniform", "rand_normal", "unary", "binary", " view:", " copy:", " matmul:" }) do
        assert.is_nil(bare(e):find(op, 1, true), op .. " in " .. e)
      end
    end
    -- negative control: valid calls and mixed float/integer arithmetic work
    assert.are.same({ 3, 2 }, t:reshape({3, 2}):shape())
    assert.are.equal("f32", t:add(i64):dtype())
    assert.are.equal("f64", lucid.rand({2}, { dtype = "f64" }):dtype())
    assert.are.equal(0, i64:sum():item())
  end)

  it("Lua constructors and options name the function, the argument and the value", function()
    local nn = require("lucid.nn")
    local function msg(f, ...)
      local ok, err = pcall(f, ...)
      assert.is_false(ok)
      return tostring(err)
    end
    assert.truthy(msg(nn.Conv2d, "a", 16, 3):find("nn.Conv2d: bad argument c1: expected an integer >= 1, got string 'a'", 1, true))
    assert.truthy(msg(nn.Conv2d, 3, -16, 3):find("nn.Conv2d: bad argument c2: expected an integer >= 1, got -16", 1, true))
    assert.truthy(msg(nn.Conv2d, 3, 16, 3, 1.5):find("nn.Conv2d: bad argument s: expected an integer >= 1, got 1.5", 1, true))
    assert.truthy(msg(nn.Conv2d, 3, 16, 3, nil, -1):find("nn.Conv2d: bad argument p: expected an integer >= 0, got -1", 1, true))
    assert.is_truthy(nn.Conv2d(3, 16, 3, nil, 0)) -- padding 0 is valid
    local yolo = require("lucid.models.yolo11_pose")
    assert.truthy(msg(yolo, "n"):find("model: expected an options table", 1, true))
    assert.truthy(msg(yolo, { scale = "n", kpt_shape = { 17 } })
      :find("model: kpt_shape: expected {K, 2} or {K, 3} (K keypoints >= 1; x, y[, visibility]), got {17}", 1, true))
    assert.truthy(msg(yolo, { scale = "q" }):find("model: scale: expected one of l, m, n, s, x or a {depth, width, max_channels} triple, got q", 1, true))
    assert.truthy(msg(yolo, { nc = 0 }):find("model: nc: expected an integer >= 1 (the number of classes), got 0", 1, true))
    local checkpoint = require("lucid.checkpoint")
    local set = nn.Conv2d(2, 2, 1)
    assert.truthy(msg(checkpoint.save, os.tmpname(), { model = set }, { asnc = true })
      :find("checkpoint.save: opts: unknown option 'asnc' (expected async)", 1, true))
  end)
end)
