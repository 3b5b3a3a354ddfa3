--[[
lucid.pose_nano_defaults — the configuration schema and defaults of the main
job (recipes/pose_nano.lua), shared with the complete-fit benchmark
(bench/fit_once.lua) so both run exactly the same job.

  local defaults = require "lucid.pose_nano_defaults"
  local cfg = require("lucid.recipe").resolve(defaults, arg)

The table is the schema: recipe.resolve copies it and rejects keys it does
not have; callers must not modify it.

Defaults are the public benchmark configuration: nano, batch 4, 640 px,
10 epochs, mosaic for all epochs, 4 loader workers, image cache on, bf16 on
a GPU (fp32 on the CPU), device auto. Values not listed follow Ultralytics
8.4's cfg/default.yaml (see ../shared/reference/yolo_pose_reference.md).
]]
local defaults = {
  -- run
  name = "pose_nano", project = "runs", exist_ok = false, resume = false,
  device = "auto", seed = 0, workers = 4, quiet = false,
  -- model
  model = "yolo11", scale = "n",
  -- data
  data = "coco_pose_mini", imgsz = 640, batch = 4, cache = true,
  max_gt = "auto", -- instance slots per image; auto: 4 x the largest image count (mosaic)
  -- schedule
  epochs = 10, optimizer = "auto", lr0 = 0.01, lrf = 0.01, cos_lr = false,
  momentum = 0.937, weight_decay = 0.0005, nbs = 64,
  warmup_epochs = 3.0, warmup_momentum = 0.8, warmup_bias_lr = 0.1,
  -- precision: auto = bf16 on a GPU, fp32 on the CPU; or bf16 | fp16 | fp32
  precision = "auto",
  -- clipping policy: gradient norm clipped to max_norm every optimizer step
  -- (Ultralytics); capture_gradient_norm records the clip in the CUDA graph
  clip = { max_norm = 10.0, capture_gradient_norm = false },
  -- loss gains (v8PoseLoss)
  loss = { box = 7.5, cls = 0.5, dfl = 1.5, pose = 12.0, kobj = 1.0 },
  -- augmentation schedule: the same values every epoch; close_mosaic = N
  -- turns mosaic off for the last N epochs (0: mosaic for all epochs)
  augment = {
    mosaic = 1.0, close_mosaic = 0, degrees = 0.0, translate = 0.1, scale = 0.5, shear = 0.0,
    perspective = 0.0, flipud = 0.0, fliplr = 0.5, hsv_h = 0.015, hsv_s = 0.7, hsv_v = 0.4,
  },
  -- validation (Ultralytics: conf 0.001, iou 0.7, max_det 300); ap = coco | ultralytics
  conf = 0.001, iou = 0.7, max_det = 300, ap = "coco",
  -- validate / save weights/last every N epochs (and always at the end)
  val_period = 1, save_period = 1,
  -- the recorded (CUDA-graph) training step on a GPU
  record = false,
}

return defaults
