-- lucid.model and the nano pose networks: parameter counts, reference names
-- and shapes, initialisation, forward shapes, the DAG's gradient
-- accumulation (float64 finite differences), save/load in safetensors.
local lucid = require("lucid")
local G = require("support.nn_gradcheck")
local yolo11 = require("lucid.models.yolo11_pose")
local yolov8 = require("lucid.models.yolov8_pose")

local function tmpname(tag) return os.tmpname() .. "_" .. tag .. ".safetensors" end

describe("YOLO11n-pose (nc=1, kpt 17x3)", function()
  local m
  setup(function()
    lucid.manual_seed(0)
    m = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 } })
  end)

  it("has 2,874,462 parameters, 2,874,446 trainable (16 DFL weights frozen)", function()
    assert.equal(2874462, m:num_params())
    assert.equal(2874446, m:num_params(true))
    assert.equal(2874462, m.params:numel("param"))
    assert.equal(2874446, m.params:numel("param", true))
  end)

  it("matches the reference per-layer parameter counts", function()
    local ref = { 464, 4672, 6640, 36992, 26080, 147712, 87040, 295424, 346112, 164608, 249728,
      0, 0, 111296, 0, 0, 32096, 36992, 0, 86720, 147712, 0, 378880, 715294 }
    assert.equal(#ref, #m.layers)
    for i, L in ipairs(m.layers) do assert.equal(ref[i], L.np, "layer " .. L.i) end
  end)

  it("splits the head like the reference (cv2, cv3, cv4, dfl)", function()
    local head = m.head
    assert.equal(381888, head.cv2:num_params())
    assert.equal(48963, head.cv3:num_params())
    assert.equal(284427, head.cv4:num_params())
    assert.equal(16, head.dfl:num_params())
  end)

  it("names and shapes follow the Ultralytics state dict", function()
    local expect = {
      ["model.0.conv.weight"] = { 16, 3, 3, 3 },
      ["model.0.bn.running_mean"] = { 16 },
      ["model.0.bn.num_batches_tracked"] = {},
      ["model.2.cv1.conv.weight"] = { 32, 32, 1, 1 },
      ["model.2.m.0.cv1.conv.weight"] = { 8, 16, 3, 3 },
      ["model.6.m.0.m.1.cv2.conv.weight"] = { 32, 32, 3, 3 },
      ["model.6.m.0.cv3.conv.weight"] = { 64, 64, 1, 1 },
      ["model.9.cv2.conv.weight"] = { 256, 512, 1, 1 },
      ["model.10.m.0.attn.qkv.conv.weight"] = { 256, 128, 1, 1 },
      ["model.10.m.0.attn.pe.conv.weight"] = { 128, 1, 3, 3 },
      ["model.10.m.0.ffn.1.bn.bias"] = { 128 },
      ["model.23.cv2.0.2.weight"] = { 64, 64, 1, 1 },
      ["model.23.cv2.2.0.conv.weight"] = { 64, 256, 3, 3 },
      ["model.23.cv3.0.0.0.conv.weight"] = { 64, 1, 3, 3 },
      ["model.23.cv3.1.1.1.conv.weight"] = { 64, 64, 1, 1 },
      ["model.23.cv3.2.2.bias"] = { 1 },
      ["model.23.cv4.0.2.bias"] = { 51 },
      ["model.23.cv4.2.0.conv.weight"] = { 51, 256, 3, 3 },
      ["model.23.dfl.conv.weight"] = { 1, 16, 1, 1 },
    }
    for name, shape in pairs(expect) do
      local p = m:param(name)
      assert.is_not_nil(p, name)
      assert.same(shape, p.shape, name)
    end
    local list = m:state()
    assert.equal(541, #list)
    assert.equal("model.0.conv.weight", list[1].name)
    assert.equal("model.23.cv4.2.2.bias", list[#list].name)
    -- registration order of Detect/Pose: cv2, cv3, dfl, cv4
    assert.is_true(m:param("model.23.cv3.2.2.bias").index < m:param("model.23.dfl.conv.weight").index)
    assert.is_true(m:param("model.23.dfl.conv.weight").index < m:param("model.23.cv4.0.0.conv.weight").index)
  end)

  it("initialises the head biases by stride and freezes the DFL projection", function()
    for i = 0, 2 do
      assert.equal(2.0, m:param("model.23.cv2." .. i .. ".2.bias"):data():min():item())
      assert.equal(2.0, m:param("model.23.cv2." .. i .. ".2.bias"):data():max():item())
    end
    local expect = { -7.15462, -5.76832, -4.38203 }
    for i = 0, 2 do
      local b = m:param("model.23.cv3." .. i .. ".2.bias"):data():item()
      assert.is_true(math.abs(b - expect[i + 1]) < 1e-5, "cv3." .. i .. " bias " .. b)
    end
    local dfl = m:param("model.23.dfl.conv.weight")
    assert.is_false(dfl.trainable)
    local w = dfl:data():view({ -1 })
    for k = 1, 16 do assert.equal(k - 1, w[k]) end
    assert.same({ 8, 16, 32 }, m.stride)
  end)

  it("prints the layer table like PyTorch and the summary like Ultralytics", function()
    local s = tostring(m)
    assert.equal(1, s:find("PoseModel(\n  (model): Sequential(\n    (0): Conv(\n      (conv): Conv2d(3, 16, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), bias=False)", 1, true))
    assert.truthy(s:find("(23): Pose(", 1, true))
    assert.truthy(s:find("(dfl): DFL(", 1, true))
    assert.truthy(s:find("(11): Upsample(scale_factor=2.0, mode='nearest')", 1, true))
    local summary = m:summary()
    assert.truthy(summary:find("197 layers, 2874462 parameters, 2874446 gradients", 1, true))
  end)

  it("infers the 640x640 output shapes (8400 anchors)", function()
    local shp = m:infer_shapes(2, 640, 640)
    assert.same({ 2, 16, 320, 320 }, shp[1])
    assert.same({ 2, 64, 80, 80 }, shp[17])
    assert.same({ 2, 384, 40, 40 }, shp[13])
    assert.same({ 2, 256, 20, 20 }, shp[23])
    assert.same({ 2, 64, 8400 }, shp[24].boxes)
    assert.same({ 2, 1, 8400 }, shp[24].scores)
    assert.same({ 2, 51, 8400 }, shp[24].kpts)
  end)

  it("runs forward and backward on 1x3x64x64 (84 anchors)", function()
    local x = lucid.rand({ 1, 3, 64, 64 })
    local out = m:forward(x)
    assert.same({ 1, 64, 84 }, out.boxes:shape())
    assert.same({ 1, 1, 84 }, out.scores:shape())
    assert.same({ 1, 51, 84 }, out.kpts:shape())
    assert.equal(3, #out.feats)
    m:zero_grad()
    local gx = m:backward(x, { boxes = lucid.ones({ 1, 64, 84 }), scores = lucid.ones({ 1, 1, 84 }),
      kpts = lucid.ones({ 1, 51, 84 }) })
    assert.is_nil(gx) -- layer 0 skips the image gradient by default
    local g0 = m:param("model.0.conv.weight"):grad():abs():sum():item()
    assert.is_true(g0 > 0 and g0 < math.huge)
    assert.equal(0, m:param("model.23.dfl.conv.weight"):grad():abs():max():item())
  end)

  it("train()/eval() reach every BatchNorm", function()
    m:eval()
    assert.is_false(m.model:get(1).bn._c.training)
    assert.is_false(m.head.cv4:get(3):get(1).bn._c.training)
    m:train()
    assert.is_true(m.head.cv4:get(3):get(1).bn._c.training)
  end)

  it("is deterministic for a seed", function()
    lucid.manual_seed(123)
    local a = yolo11({ scale = "n", nc = 1 })
    lucid.manual_seed(123)
    local b = yolo11({ scale = "n", nc = 1 })
    local pa, pb = a.params:flat_params(), b.params:flat_params()
    assert.equal(0, pa:sub(pb):abs():max():item())
  end)
end)

describe("YOLOv8n-pose (nc=1)", function()
  it("has 3,295,470 parameters and the reference per-layer counts", function()
    local m = yolov8({ scale = "n", nc = 1, materialize = false })
    assert.equal(3295470, m:num_params())
    local ref = { 464, 4672, 7360, 18560, 49664, 73984, 197632, 295424, 460288, 164608,
      0, 0, 148224, 0, 0, 37248, 36992, 0, 123648, 147712, 0, 493056, 1035934 }
    for i, L in ipairs(m.layers) do assert.equal(ref[i], L.np, "layer " .. L.i) end
    assert.is_true(m.head.legacy)
  end)
  it("assembles and runs from the same blocks", function()
    local m = yolov8({ scale = "n", nc = 1 })
    local out = m:forward(lucid.rand({ 2, 3, 64, 64 }))
    assert.same({ 2, 64, 84 }, out.boxes:shape())
    assert.same({ 2, 51, 84 }, out.kpts:shape())
    assert.same({ 64, 64, 3, 3 }, m:param("model.22.cv3.0.0.conv.weight").shape)
  end)
end)

describe("the model DAG", function()
  it("accumulates gradients where an output feeds several layers (float64 FD)", function()
    lucid.manual_seed(3)
    -- the YOLO11 pose table at width 1/8: every skip connection of the real
    -- network, small enough for finite differences
    local m = yolo11({ scale = { 0.5, 0.125, 1024 }, nc = 2, kpt_shape = { 2, 3 }, dtype = "f64",
      input_grad = true })
    local x = lucid.randn({ 2, 3, 64, 64 }, { dtype = "f64" })
    local gx
    local targets = { { name = "input", value = x, grad = function() return gx end } }
    -- parameters of layers whose outputs feed two consumers (4, 6, 10, 13,
    -- 16, 19), and a head parameter
    for _, name in ipairs({ "model.4.cv2.conv.weight", "model.6.cv1.bn.weight", "model.10.cv2.conv.weight",
      "model.13.cv2.bn.bias", "model.16.m.0.cv2.conv.weight", "model.19.cv2.conv.weight",
      "model.3.conv.weight", "model.23.cv4.1.0.conv.weight" }) do
      local p = m:param(name)
      targets[#targets + 1] = { name = name, value = p:data(), grad = function() return p:grad() end }
    end
    local err, where = G.check({
      forward = function() return m:forward(x) end,
      backward = function(r) gx = m:backward(x, r) end,
      zero = function() m:zero_grad() end,
      targets = targets, n = 3,
    })
    -- deep BN stacks at 2x2..8x8 make the loss strongly curved and its sum
    -- of ~2e4 outputs carries rounding: 1e-5 still separates a missing or
    -- doubled accumulation (an O(1) error) from numeric noise
    assert.is_true(err < 1e-5, where)
  end)

  it("rejects an unknown scale", function()
    assert.has_error(function() yolo11({ scale = "q", materialize = false }) end)
  end)
end)

describe("model:save / model:load (safetensors)", function()
  local m
  setup(function()
    lucid.manual_seed(5)
    m = yolo11({ scale = "n", nc = 1 })
    m:forward(lucid.rand({ 2, 3, 64, 64 })) -- move the BN running statistics
  end)

  it("round-trips bitwise", function()
    local path = tmpname("rt")
    m:save(path)
    lucid.manual_seed(99)
    local m2 = yolo11({ scale = "n", nc = 1 })
    assert.is_true(m2.params:flat_params():sub(m.params:flat_params()):abs():max():item() > 0)
    local rep = m2:load(path)
    assert.equal(541, rep.loaded)
    local a, b = m.params:list(), m2.params:list()
    for i = 1, #a do
      local da, db = a[i]:data(), b[i]:data()
      if a[i].dtype == "i64" then
        assert.equal(da:item(), db:item(), a[i].name)
      else
        assert.equal(0, da:sub(db):abs():max():item(), a[i].name)
      end
    end
    os.remove(path)
  end)

  it("a missing or mis-shaped tensor is an error naming it; nothing is loaded", function()
    local full = tmpname("full")
    m:save(full)
    local f = lucid.io.safetensors_open(full)
    local entries = {}
    for _, name in ipairs(f:names()) do
      if name ~= "model.23.cv4.0.2.bias" then
        local info = f:info(name)
        local t = lucid.zeros(info.shape, { dtype = info.dtype })
        f:load(name, t)
        if name == "model.0.conv.weight" then t = lucid.zeros({ 16, 3, 5, 5 }) end
        entries[#entries + 1] = { name, t }
      end
    end
    entries[#entries + 1] = { "model.99.extra.weight", lucid.zeros({ 2 }) }
    f:close()
    local bad = tmpname("bad")
    lucid.io.safetensors_save(bad, entries)
    lucid.manual_seed(17)
    local m2 = yolo11({ scale = "n", nc = 1 })
    local before = m2.params:flat_params():clone()
    local ok, err = pcall(m2.load, m2, bad)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("model.23.cv4.0.2.bias", 1, true))
    assert.truthy(tostring(err):find("model.0.conv.weight: file [16, 3, 5, 5] vs model [16, 3, 3, 3]", 1, true))
    assert.truthy(tostring(err):find("model.99.extra.weight", 1, true))
    assert.equal(0, m2.params:flat_params():sub(before):abs():max():item())
    -- partial load reports what was skipped
    local rep = m2:load(bad, { strict = false })
    assert.equal(539, rep.loaded)
    assert.same({ "model.23.cv4.0.2.bias" }, rep.missing)
    assert.same({ "model.99.extra.weight" }, rep.unexpected)
    assert.equal(1, #rep.mismatched)
    os.remove(full)
    os.remove(bad)
  end)
end)
