-- Lua bindings of the pose validator and the pose loss: a hand-built
-- perfect prediction scores mAP 1 (COCO 101-point AP), misuse raises
-- clear errors, and the loss runs forward/backward from Lua.
local lucid = require "lucid"

-- Head outputs for a 64x64 input (levels 8x8, 4x4, 2x2 -> 84 anchors) with
-- one confident anchor at level 0, cell (row 3, col 3): centre (28, 28) px.
-- DFL logits peaked at bin 2 on every side -> box (12, 12, 44, 44) px.
-- Keypoint 1 decodes to x = (2*rx + 3) * 8 = 20, y = (2*ry + 3) * 8 = 30.
local A, a = 84, 27
local function outputs()
  local box = lucid.zeros({1, 64, A})
  for side = 0, 3 do box[1][side * 16 + 2 + 1][a + 1] = 40 end
  local cls = lucid.full({1, 1, A}, -20)
  cls[1][1][a + 1] = 5
  local kpt = lucid.zeros({1, 51, A})
  kpt[1][1][a + 1] = -0.25
  kpt[1][2][a + 1] = 0.375
  return box, cls, kpt
end

local function targets(shift)
  shift = shift or 0
  local kp = lucid.zeros({1, 2, 17, 3})
  kp[1][1][1][1] = (20 + shift) / 64
  kp[1][1][1][2] = 30 / 64
  kp[1][1][1][3] = 2
  return {
    cls = lucid.zeros({1, 2}),
    boxes = lucid.tensor({{{28 / 64, 28 / 64, 32 / 64, 32 / 64}, {0, 0, 0, 0}}}),
    kpts = kp,
    mask = lucid.tensor({{1, 0}}),
  }
end

describe("PoseValidator", function()
  it("scores a perfect prediction 1 for boxes and keypoints (COCO AP)", function()
    local val = lucid.PoseValidator{imgsz = 64}
    local box, cls, kpt = outputs()
    val:add_batch(box, cls, kpt, targets(), 1)
    local m = val:compute()
    assert.are.equal(1, m.images)
    assert.is_true(math.abs(m.box.map50_95 - 1) < 1e-12)
    assert.is_true(math.abs(m.pose.map50_95 - 1) < 1e-12)
    assert.is_true(math.abs(m.fitness - 2) < 1e-12)
    local dets = val:detections(1)
    assert.are.equal(1, #dets)
    assert.is_true(math.abs(dets[1].box[1] - 12) < 1e-3 and math.abs(dets[1].box[3] - 44) < 1e-3)
    assert.is_true(math.abs(dets[1].kpts[1] - 20) < 1e-4 and math.abs(dets[1].kpts[2] - 30) < 1e-4)
  end)

  it("gives the Ultralytics value 0.995 for the same prediction with ap='ultralytics'", function()
    local val = lucid.PoseValidator{imgsz = 64, ap = "ultralytics"}
    local box, cls, kpt = outputs()
    val:add_batch(box, cls, kpt, targets(), 1)
    assert.is_true(math.abs(val:compute().box.map50_95 - 0.995) < 1e-12)
  end)

  it("lowers pose mAP when the keypoint is off by a few pixels", function()
    -- box w*h = 32*32 px, area = 1024*0.53; nose sigma 0.026; d = 4 px:
    -- e = 16 / ((0.052)^2 * 542.72 * 2) = 5.4503, OKS = exp(-e) = 0.004295
    -- -> below every threshold: pose AP 0, box AP still 1
    local val = lucid.PoseValidator{imgsz = 64}
    local box, cls, kpt = outputs()
    val:add_batch(box, cls, kpt, targets(4), 1)
    local m = val:compute()
    assert.is_true(math.abs(m.box.map50_95 - 1) < 1e-12)
    assert.are.equal(0, m.pose.map50_95)
  end)

  it("rejects unknown options and wrong tensors by name", function()
    assert.has_error(function() lucid.PoseValidator{imgsz = 64, iou_thres = 0.5} end,
      "PoseValidator: unknown option 'iou_thres' (expected one of imgsz, nc, kpt_shape, reg_max, conf, iou, max_det, ap, reference, threads, ctx)")
    assert.has_error(function() lucid.PoseValidator{imgsz = 60} end,
      "PoseValidator: imgsz must be a multiple of 32, got 60")
    local val = lucid.PoseValidator{imgsz = 64}
    local box, cls, kpt = outputs()
    local ok, err = pcall(val.add_batch, val, box:to("f64"), cls, kpt, targets(), 1)
    assert.is_false(ok)
    assert.matches("pred_box must be a contiguous f32 CPU tensor", err)
  end)
end)

describe("PoseLoss", function()
  it("runs forward and backward from Lua and reuses its buffers", function()
    local crit = lucid.PoseLoss{batch = 1, imgsz = 64, max_gt = 2}
    local box, cls, kpt = outputs()
    local total, items = crit:forward(box, cls, kpt, targets())
    assert.are.same({1}, total:shape())
    assert.are.same({5}, items:shape())
    local t = total:item()
    assert.is_true(t == t and t > 0) -- finite, positive
    local gb, gc, gk = crit:backward()
    assert.are.same(box:shape(), gb:shape())
    assert.are.same(cls:shape(), gc:shape())
    assert.are.same(kpt:shape(), gk:shape())
    local gb2 = crit:backward()
    assert.is_true((gb2 - gb):abs():max():item() == 0)
    -- exactly one anchor is assigned in this image
    local asg = crit:assignment()
    assert.is_true(asg.n_fg >= 1)
  end)

  it("requires forward before backward and checks options", function()
    local crit = lucid.PoseLoss{batch = 1, imgsz = 64, max_gt = 2}
    assert.has_error(function() crit:backward() end)
    assert.has_error(function() lucid.PoseLoss{batch = 1, imgsz = 64, maxgt = 2} end)
    assert.has_error(function() lucid.PoseLoss{imgsz = 64} end, "PoseLoss: option batch is required")
  end)
end)
