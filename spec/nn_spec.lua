-- lucid.nn: the Lua modules over the C primitives — names, shapes, counts,
-- printing, finite-difference checks of the compositions (float64, CPU),
-- freezing, train/eval.
local lucid = require("lucid")
local nn = require("lucid.nn")
local util = require("lucid.nn.util")
local G = require("support.nn_gradcheck")

local function f64(shape) return lucid.randn(shape, { dtype = "f64" }) end

local function names_of(m)
  local out = {}
  for _, e in ipairs(m:state_decls()) do out[#out + 1] = e.name end
  return out
end

-- FD check of a materialised-on-demand module on input x.
local function gradcheck(m, x, n)
  local set = nn.materialize(m, { dtype = "f64" })
  local gx
  return G.check({
    forward = function() return m:forward(x) end,
    backward = function(r) gx = m:backward(x, r) end,
    zero = function() set:zero_grad() end,
    targets = G.targets(m, x, function() return gx end),
    n = n or 5,
  })
end

describe("lucid.nn.util scaling rules", function()
  it("make_divisible rounds up to a multiple of 8", function()
    assert.equal(16, util.scale_channels(64, 0.25, 1024))
    assert.equal(256, util.scale_channels(1024, 0.25, 1024))
    assert.equal(8, util.make_divisible(1, 8))
    assert.equal(384, util.scale_channels(1024, 0.75, 512))
  end)
  it("depth rounding follows Python round (half to even)", function()
    assert.equal(1, util.scale_depth(2, 0.5))
    assert.equal(1, util.scale_depth(3, 0.33))
    assert.equal(2, util.scale_depth(6, 0.33))
    assert.equal(1, util.scale_depth(1, 0.33))
    assert.equal(2, util.round(2.5))
    assert.equal(4, util.round(3.5))
  end)
end)

describe("lucid.nn block structure", function()
  it("Conv declares conv/bn tensors with reference names and shapes", function()
    local c = nn.Conv(3, 16, 3, 2)
    assert.same({ "conv.weight", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
      "bn.num_batches_tracked" }, names_of(c))
    local d = c:state_decls()
    assert.same({ 16, 3, 3, 3 }, d[1].decl.shape)
    assert.same({}, d[6].decl.shape)
    assert.equal("i64", d[6].decl.dtype)
    assert.equal(464, c:num_params())
  end)

  it("per-block parameter counts match the reference table", function()
    assert.equal(6640, nn.C3k2(32, 64, 1, false, 0.25):num_params())
    assert.equal(87040, nn.C3k2(128, 128, 1, true, 0.5):num_params())
    assert.equal(164608, nn.SPPF(256, 256, 5):num_params())
    assert.equal(249728, nn.C2PSA(256, 256, 1):num_params())
    assert.equal(7360, nn.C2f(32, 32, 1, true):num_params())
    assert.equal(49664, nn.C2f(64, 64, 2, true):num_params())
  end)

  it("C2PSA names follow Ultralytics (attn.qkv/proj/pe, ffn.0/1)", function()
    local names = table.concat(names_of(nn.C2PSA(256, 256, 1)), " ")
    for _, n in ipairs({ "cv1.conv.weight", "m.0.attn.qkv.conv.weight", "m.0.attn.proj.bn.bias",
      "m.0.attn.pe.conv.weight", "m.0.ffn.0.conv.weight", "m.0.ffn.1.bn.running_var", "cv2.bn.weight" }) do
      assert.truthy(names:find(n, 1, true), n)
    end
    local d = {}
    for _, e in ipairs(nn.C2PSA(256, 256, 1):state_decls()) do d[e.name] = e.decl.shape end
    assert.same({ 256, 128, 1, 1 }, d["m.0.attn.qkv.conv.weight"])
    assert.same({ 128, 1, 3, 3 }, d["m.0.attn.pe.conv.weight"])
  end)

  it("SPPF cv1 has no activation (8.4) and cv2 has SiLU", function()
    local s = nn.SPPF(256, 256, 5)
    assert.equal("Identity()", s.cv1.act:repr())
    assert.equal("SiLU(inplace=True)", s.cv2.act:repr())
  end)

  it("prints like PyTorch", function()
    local expect = table.concat({
      "Conv(",
      "  (conv): Conv2d(3, 16, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), bias=False)",
      "  (bn): BatchNorm2d(16, eps=0.001, momentum=0.03, affine=True, track_running_stats=True)",
      "  (act): SiLU(inplace=True)",
      ")" }, "\n")
    assert.equal(expect, tostring(nn.Conv(3, 16, 3, 2)))
    local dw = tostring(nn.DWConv(64, 64, 3))
    assert.truthy(dw:find("DWConv(\n  (conv): Conv2d(64, 64, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), groups=64, bias=False)", 1, true))
    local sp = tostring(nn.SPPF(16, 16, 5))
    assert.truthy(sp:find("(m): MaxPool2d(kernel_size=5, stride=1, padding=2, dilation=1, ceil_mode=False)", 1, true))
  end)
end)

describe("lucid.nn forward/backward of compositions (float64 finite differences)", function()
  setup(function() lucid.manual_seed(7) end)

  it("Conv", function()
    local err, where = gradcheck(nn.Conv(4, 6, 3, 2), f64({ 2, 4, 7, 7 }))
    assert.is_true(err < 1e-6, where)
  end)
  it("Bottleneck with residual", function()
    local err, where = gradcheck(nn.Bottleneck(8, 8), f64({ 2, 8, 5, 5 }))
    assert.is_true(err < 1e-6, where)
  end)
  it("C3k2 (c3k=false)", function()
    local err, where = gradcheck(nn.C3k2(8, 16, 1, false, 0.5), f64({ 2, 8, 6, 6 }))
    assert.is_true(err < 1e-6, where)
  end)
  it("C3k2 (c3k=true, inner C3k)", function()
    local err, where = gradcheck(nn.C3k2(8, 16, 1, true, 0.5), f64({ 2, 8, 6, 6 }))
    assert.is_true(err < 1e-6, where)
  end)
  it("C2f with two chained bottlenecks", function()
    local err, where = gradcheck(nn.C2f(8, 16, 2, true), f64({ 2, 8, 6, 6 }))
    assert.is_true(err < 1e-6, where)
  end)
  it("C3", function()
    local err, where = gradcheck(nn.C3(8, 8, 1), f64({ 2, 8, 5, 5 }))
    assert.is_true(err < 1e-6, where)
  end)
  it("SPPF (three chained pools feeding the concatenation)", function()
    local err, where = gradcheck(nn.SPPF(16, 16, 5), f64({ 2, 16, 6, 6 }))
    assert.is_true(err < 1e-6, where)
  end)
  it("C2PSA (attention: split, matmul, softmax, pe)", function()
    local err, where = gradcheck(nn.C2PSA(128, 128, 1), f64({ 2, 128, 3, 3 }))
    assert.is_true(err < 1e-6, where)
  end)
  it("a small Pose head (three levels, boxes/scores/kpts)", function()
    local head = nn.Pose(2, { 3, 3 }, 16, { 8, 16, 32 }, false)
    local set = nn.materialize(head, { dtype = "f64" })
    local x = { f64({ 2, 8, 4, 4 }), f64({ 2, 16, 2, 2 }), f64({ 2, 32, 2, 1 }) }
    local gx
    local targets = {}
    for i = 1, 3 do targets[i] = { name = "x" .. i, value = x[i], grad = function() return gx[i] end } end
    for _, p in ipairs(head:parameters()) do
      if p.trainable and (p.name:find("%.2%.") or p.name:find("cv3%.%d%.0%.0")) then
        targets[#targets + 1] = { name = p.name, value = p:data(), grad = function() return p:grad() end }
      end
    end
    local err, where = G.check({
      forward = function() return head:forward(x) end,
      backward = function(r) gx = head:backward(x, r) end,
      zero = function() set:zero_grad() end,
      targets = targets, n = 4,
    })
    assert.is_true(err < 1e-6, where)
    local out = head:forward(x)
    assert.same({ 2, 64, 22 }, out.boxes:shape())
    assert.same({ 2, 2, 22 }, out.scores:shape())
    assert.same({ 2, 9, 22 }, out.kpts:shape())
  end)
  it("a missing output gradient counts as zero", function()
    local head = nn.Pose(1, { 2, 3 }, 16, { 8, 8 }, true)
    nn.materialize(head, { dtype = "f64" })
    local x = { f64({ 2, 8, 2, 2 }), f64({ 2, 8, 1, 1 }) }
    local out = head:forward(x)
    local g = head:backward(x, { scores = lucid.ones(out.scores:shape(), { dtype = "f64" }) })
    assert.equal(2, #g)
    assert.same({ 2, 8, 2, 2 }, g[1]:shape())
  end)
end)

describe("lucid.nn parameters", function()
  it("materialize binds Param userdata with names, shapes and views", function()
    local c = nn.Conv(3, 8, 3)
    local set = nn.materialize(c, { prefix = "model.0" })
    local ps = c:parameters()
    assert.equal(3, #ps)
    assert.equal("model.0.conv.weight", ps[1].name)
    assert.same({ 8, 3, 3, 3 }, ps[1].shape)
    assert.same({ 8, 3, 3, 3 }, ps[1]:data():shape())
    assert.same({ 8, 3, 3, 3 }, ps[1]:grad():shape())
    local bufs = c:buffers()
    assert.equal("model.0.bn.running_mean", bufs[1].name)
    assert.is_nil(bufs[1]:grad())
    assert.equal(6, set:count())
    -- PyTorch default conv init: U(+-1/sqrt(fan_in)), fan_in = 27
    local w = ps[1]:data()
    assert.is_true(w:abs():max():item() <= 1 / math.sqrt(27))
    assert.equal(1, c.bn:parameters()[1]:data():min():item())
    assert.equal(0, c.bn:parameters()[2]:data():abs():max():item())
  end)

  it("freezing a parameter stops its gradient", function()
    local c = nn.Conv(3, 4, 3)
    local set = nn.materialize(c, { dtype = "f64" })
    local w, bw = c.conv:parameters()[1], c.bn:parameters()[1]
    w.trainable = false
    assert.is_false(w.trainable)
    local x = f64({ 2, 3, 5, 5 })
    set:zero_grad()
    local y = c:forward(x)
    c:backward(x, lucid.ones(y:shape(), { dtype = "f64" }))
    assert.equal(0, w:grad():abs():max():item())
    assert.is_true(bw:grad():abs():max():item() > 0)
    w.trainable = true
    c:forward(x)
    c:backward(x, lucid.ones(y:shape(), { dtype = "f64" }))
    assert.is_true(w:grad():abs():max():item() > 0)
  end)

  it("train/eval switches BatchNorm between batch and running statistics", function()
    local c = nn.Conv(2, 3, 1)
    nn.materialize(c)
    local x = lucid.randn({ 4, 2, 3, 3 }):add(3.0)
    assert.is_true(c.training and c.bn._c.training)
    local rm = c.bn:buffers()[1]:data()
    local y_train = c:forward(x):clone()
    local rm1 = rm:clone()
    assert.is_true(rm1:abs():max():item() > 0) -- running mean moved (momentum 0.03)
    c:eval()
    assert.is_false(c.training)
    assert.is_false(c.bn._c.training)
    local y_eval = c:forward(x):clone()
    assert.equal(0, rm:sub(rm1):abs():max():item()) -- eval does not update
    assert.is_true(y_train:sub(y_eval):abs():max():item() > 1e-3)
    c:train()
    assert.is_true(c.bn._c.training)
  end)
end)
