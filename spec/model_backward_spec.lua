-- model_backward_spec.lua — Model:backward checks what it is given against
-- the forward it differentiates (the tryout: gradients for 189 anchors after
-- an 84-anchor forward, gy = nil or a tensor, and a 96x96 input after a
-- 64x64 forward all "succeeded"; backward before any forward said
-- "lucid.CModule:backward: bad argument #1 (input): expected lucid.Tensor,
-- got nil"; a wrong channel count surfaced as head.lua's view error).
local lucid = require("lucid")
local yolo11 = require("lucid.models.yolo11_pose")

local err_of = require("support.errors").err_of

local function plain(s) return (s:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0")) end

local function grads(A, nk)
  return { boxes = lucid.ones({ 1, 64, A }), scores = lucid.ones({ 1, 1, A }), kpts = lucid.ones({ 1, nk or 51, A }) }
end

describe("Model:backward validates its arguments", function()
  local m, x
  setup(function()
    lucid.manual_seed(0)
    m = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 } })
    x = lucid.rand({ 1, 3, 64, 64 })
  end)

  it("before any forward: says forward must run first", function()
    local fresh = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 } })
    local e = err_of(fresh.backward, fresh, x, grads(84))
    assert.matches("model:backward: forward must run first", e, 1, true)
    assert.is_nil(e:find("CModule", 1, true))
    -- also with an empty gradient table (used to return nil silently)
    assert.matches("forward must run first", err_of(fresh.backward, fresh, x, {}), 1, true)
  end)

  it("gradients of another anchor count name the key and both shapes", function()
    m:forward(x)
    local e = err_of(m.backward, m, x, grads(189))
    assert.matches(plain("model:backward: bad argument #2 (gy): gy.boxes: expected shape [1, 64, 84] "
      .. "(the forward output's), got [1, 64, 189]"), e)
    e = err_of(m.backward, m, x, { scores = lucid.ones({ 1, 1, 189 }) })
    assert.matches(plain("gy.scores: expected shape [1, 1, 84] (the forward output's), got [1, 1, 189]"), e)
    e = err_of(m.backward, m, x, { kpts = lucid.ones({ 1, 51, 80 }) })
    assert.matches(plain("gy.kpts: expected shape [1, 51, 84] (the forward output's), got [1, 51, 80]"), e)
  end)

  it("wrong channel counts are caught before the head's internals", function()
    m:forward(x)
    local e = err_of(m.backward, m, x, { scores = lucid.ones({ 1, 2, 84 }) })
    assert.matches(plain("gy.scores: expected shape [1, 1, 84] (the forward output's), got [1, 2, 84]"), e)
    assert.is_nil(e:find("head.lua", 1, true))
    e = err_of(m.backward, m, x, { boxes = lucid.ones({ 1, 80, 84 }) })
    assert.matches(plain("gy.boxes: expected shape [1, 64, 84]"), e)
    assert.is_nil(e:find("channel_copy", 1, true))
  end)

  it("gy must be a table of tensors with known keys", function()
    m:forward(x)
    local want = plain("model:backward: bad argument #2 (gy): expected a table {boxes=, scores=, kpts=} of "
      .. "gradients (a missing key is a zero gradient), got ")
    assert.matches(want .. "nil", err_of(m.backward, m, x, nil))
    assert.matches(want .. plain("a lucid.Tensor of shape [1, 64, 84]"),
      err_of(m.backward, m, x, lucid.ones({ 1, 64, 84 })))
    assert.matches(want .. "1", err_of(m.backward, m, x, 1))
    assert.matches("unexpected key 'box'", err_of(m.backward, m, x, { box = lucid.ones({ 1, 64, 84 }) }), 1, true)
    assert.matches("unexpected key 'feats'", err_of(m.backward, m, x, { feats = {} }), 1, true)
    assert.matches(plain("gy.scores: expected a lucid.Tensor of shape [1, 1, 84], got 1"),
      err_of(m.backward, m, x, { scores = 1 }))
  end)

  it("the input must be the last forward's (or one of its shape)", function()
    m:forward(x)
    local e = err_of(m.backward, m, lucid.rand({ 1, 3, 96, 96 }), grads(84))
    assert.matches(plain("model:backward: bad argument #1 (x): expected the input of the last forward "
      .. "(a lucid.Tensor of shape [1, 3, 64, 64]), got a lucid.Tensor of shape [1, 3, 96, 96]"), e)
    assert.matches("bad argument #1 (x)", err_of(m.backward, m, nil, grads(84)), 1, true)
    -- after a 96x96 forward, the 96x96 input and its gradients are right
    local y = lucid.rand({ 1, 3, 96, 96 })
    m:forward(y)
    m:backward(y, grads(189))
    assert.matches("expected shape [1, 64, 189]", err_of(m.backward, m, y, grads(84)), 1, true)
  end)

  it("a forward that fails leaves nothing to differentiate", function()
    m:forward(x)
    assert.has_error(function() m:forward(lucid.rand({ 1, 3, 70, 70 })) end)
    assert.matches("forward must run first", err_of(m.backward, m, x, grads(84)), 1, true)
  end)

  it("negative controls: right gradients, partial and empty tables, another handle", function()
    m:forward(x)
    m:zero_grad()
    m:backward(x, {}) -- every key missing: zero gradient
    assert.equal(0, m:param("model.0.conv.weight"):grad():abs():sum():item())
    m:backward(x, { scores = lucid.ones({ 1, 1, 84 }) })
    local g1 = m:param("model.0.conv.weight"):grad():abs():sum():item()
    assert.is_true(g1 > 0)
    m:zero_grad()
    m:backward(x:clone(), { scores = lucid.ones({ 1, 1, 84 }) }) -- same shape: the forward's input
    assert.near(g1, m:param("model.0.conv.weight"):grad():abs():sum():item(), 1e-6 * g1)
    m:zero_grad()
    m:backward(x, grads(84))
  end)

  it("the head checks its own backward too (nn.Pose:backward)", function()
    local out = m:forward(x)
    local e = err_of(m.head.backward, m.head, out.feats, { kpts = lucid.ones({ 1, 51, 189 }) })
    assert.matches(plain("nn.Pose:backward: bad argument #2 (gy): gy.kpts: expected shape [1, 51, 84]"), e)
    m.head:backward(out.feats, { kpts = lucid.ones({ 1, 51, 84 }) })
  end)
end)

describe("Model:forward checks its input", function()
  it("names the argument when x is not a tensor", function()
    local m = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 } })
    local e = err_of(m.forward, m, nil)
    assert.matches("model:forward: bad argument #1 (x): expected a lucid.Tensor [B, 3, H, W], got nil", e, 1, true)
    e = err_of(m.forward, m, 3)
    assert.matches("model:forward: bad argument #1 (x): expected a lucid.Tensor [B, 3, H, W], got 3", e, 1, true)
  end)
end)

describe("Model runs the head level by level", function()
  it("same outputs, parameter and input gradients as the head's own forward/backward, bitwise", function()
    lucid.manual_seed(3)
    local m = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 }, input_grad = true })
    local x = lucid.rand({ 2, 3, 64, 64 })
    local out = m:forward(x)
    local g = {}
    for _, k in ipairs({ "boxes", "scores", "kpts" }) do g[k] = lucid.rand(out[k]:shape()) - 0.5 end
    local function pass()
      m:zero_grad()
      local outs, gin = {}, nil
      for _ = 1, 2 do -- two passes: the persistent sum buffers are reused
        local o = m:forward(x)
        for _, k in ipairs({ "boxes", "scores", "kpts" }) do outs[#outs + 1] = o[k]:clone() end
        gin = m:backward(x, g):clone()
      end
      return outs, m.params:flat_grads():clone(), gin
    end
    local o1, g1, x1 = pass() -- level by level (forward_level, backward_start/level/finish)
    -- an instance override of the head's backward makes Model call it as it is
    local Detect = require("lucid.nn.head").Detect
    local calls = 0
    m.head.backward = function(self, ...)
      calls = calls + 1
      return Detect.backward(self, ...)
    end
    local o2, g2, x2 = pass()
    assert.are.equal(2, calls)
    m.head.backward = nil
    -- the lane route's host logic (levels queued early, marks, waits) with
    -- a context whose lanes are no-ops (CPU): lanes.ctx_for says "use it"
    local lanes = require("lucid.nn.lanes")
    local ctx_for = lanes.ctx_for
    lanes.ctx_for = function() return lucid.default_context() end
    local ok, o3, g3, x3 = pcall(pass)
    lanes.ctx_for = ctx_for
    assert(ok, o3)
    for i = 1, #o1 do
      assert.are.equal(lucid.hash_tensor(o1[i]), lucid.hash_tensor(o2[i]))
      assert.are.equal(lucid.hash_tensor(o1[i]), lucid.hash_tensor(o3[i]))
    end
    assert.are.equal(lucid.hash_tensor(g1), lucid.hash_tensor(g2))
    assert.are.equal(lucid.hash_tensor(x1), lucid.hash_tensor(x2))
    assert.are.equal(lucid.hash_tensor(g1), lucid.hash_tensor(g3))
    assert.are.equal(lucid.hash_tensor(x1), lucid.hash_tensor(x3))
    assert.is_true(g1:abs():sum():item() > 0)
  end)
end)
