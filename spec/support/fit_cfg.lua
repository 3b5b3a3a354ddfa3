-- Shared by the trainer specs (spec/trainer_spec.lua on the CPU,
-- spec/resume_gpu_spec.lua on CUDA): a small, fast Trainer configuration
-- on the mini dataset, and the nano pose model on the trainer's device.
local M = {}

--- M.cfg(project, over) -> a resolved-recipe-like table: yolo11 nano,
-- imgsz 64, batch 8, 3 epochs, SGD, warmup 1 epoch, nbs 16 (accumulation 2),
-- mosaic with close_mosaic 1, CPU fp32; `over` replaces any key.
function M.cfg(project, over)
  local c = {
    name = "t", project = project, exist_ok = true, resume = false, device = "cpu", seed = 0, workers = 2,
    quiet = true, model = "yolo11", scale = "n", data = "coco_pose_mini", imgsz = 64, batch = 8,
    cache = true, max_gt = "auto", epochs = 3, optimizer = "SGD", lr0 = 0.01, lrf = 0.01, cos_lr = false,
    momentum = 0.937, weight_decay = 5e-4, nbs = 16, warmup_epochs = 1, warmup_momentum = 0.8,
    warmup_bias_lr = 0.1, precision = "auto", clip = { max_norm = 10.0 },
    loss = { box = 7.5, cls = 0.5, dfl = 1.5, pose = 12.0, kobj = 1.0 },
    augment = { mosaic = 1.0, close_mosaic = 1 }, conf = 0.001, iou = 0.7, max_det = 300, ap = "coco",
  }
  for k, v in pairs(over or {}) do c[k] = v end
  return c
end

--- M.build(trainer) -> the YOLO11n pose model (nc 1, 17x3) on the trainer's device.
function M.build(tr)
  return require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { 17, 3 }, ctx = tr.ctx,
    device = tr.device }
end

return M
