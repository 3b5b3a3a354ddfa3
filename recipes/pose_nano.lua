--[[
recipes/pose_nano.lua — the main job: train the YOLO11 nano pose model
(1 class, 17 COCO keypoints) on the mini COCO person-keypoint dataset.

  luajit recipes/pose_nano.lua                      # the defaults below
  luajit recipes/pose_nano.lua epochs=3 imgsz=320 device=cpu name=try
  luajit recipes/pose_nano.lua data=datasets/coco_pose_mini.yaml   # an Ultralytics data YAML

Every setting is in `defaults` below (the complete-fit benchmark
bench/fit_pairs.lua runs this same table) and can be overridden on the
command line as key=value (nested ones with dots: clip.max_norm=5,
augment.mosaic=0, loss.pose=10). Unknown keys are rejected by name. The resolved
configuration is printed at start; `--help` (or -h, help) lists every key
with its default and a one-line description.

Defaults are the public benchmark configuration: nano, batch 4, 640 px,
10 epochs, mosaic for all epochs, 4 loader workers, image cache on, bf16 on
a GPU (fp32 on the CPU), device auto. Values not listed follow Ultralytics
8.4's cfg/default.yaml (see ../shared/reference/yolo_pose_reference.md).
]]
local lucid = require "lucid" -- also puts the Lua library (lua/lucid/) on package.path
local recipe = require "lucid.recipe"

-- The schema: every setting and its default. recipe.resolve copies it and
-- rejects keys it does not have.
local defaults = {
  -- run
  name = "pose_nano", project = "runs", exist_ok = false, resume = false,
  device = "auto", seed = 0, workers = 4, quiet = false,
  -- model
  model = "yolo11", scale = "n",
  -- data
  -- data: a descriptor of datasets/ (coco_pose_mini), a descriptor .lua, or an
  -- Ultralytics data YAML (path/train/val/kpt_shape/flip_idx/names; lucid.data.load_yaml)
  -- cache: true (or ram) keeps the prepared images in RAM; false decodes them every epoch
  data = "coco_pose_mini", imgsz = 640, batch = 4, cache = true,
  -- the largest fraction of a split's images that may be rejected (bad
  -- labels, unreadable images: each one named in a WARNING) before the
  -- split is refused (lucid's; Ultralytics only warns)
  max_reject_fraction = 0.1,
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
  -- validate / save weights/last every N epochs (and always at the end; 0: only at the end)
  val_period = 1, save_period = 1,
  -- the recorded (CUDA-graph) training step on a GPU
  record = false,
  -- with record = true: micro-step k+1's forward beside micro-step k's
  -- backward (a second context and a twin of the model; docs/PIPELINE.md)
  pipeline = true,
  -- RandomHSV on the GPU (lucid.input_prepare in the step) instead of in the
  -- loader threads; ignored on the CPU. The batches are byte-identical.
  device_hsv = true,
}


-- One line per key for --help (recipe.usage; a spec checks every key has one).
local descriptions = {
  name = "the run folder under project (runs/<name>, then <name>2, 3, ... when taken)",
  project = "the folder that holds the run folders",
  exist_ok = "write into an existing run folder instead of a new <name>N",
  resume = "true: continue <project>/<name> from its weights/last.safetensors; or a checkpoint path",
  device = "cpu, cuda, cuda:N or auto (any case)",
  seed = "random seed (shuffling, augmentation, initial weights)",
  workers = "loader threads (at most the CPUs; 0: batches made in the training thread)",
  quiet = "no configuration listing or progress output (warnings still go to stderr)",
  model = "architecture: yolo11 or yolov8",
  scale = "model scale: n, s, m, l or x",
  data = "a dataset descriptor name, a descriptor .lua, or an Ultralytics data .yaml",
  imgsz = "training and validation image side (a multiple of 32)",
  batch = "images per training step",
  cache = "true (or ram): keep the prepared images in RAM; false: decode them every epoch",
  max_reject_fraction = "the largest fraction of a split's images that may be rejected (each named) before the split is refused",
  max_gt = "instance slots per image; auto: 4 x the largest instance count of an image",
  epochs = "passes over the training set",
  optimizer = "auto, SGD, AdamW or MuSGD (any case, as Ultralytics)",
  lr0 = "initial learning rate (ignored by optimizer=auto)",
  lrf = "final learning rate as a fraction of lr0",
  cos_lr = "cosine learning-rate schedule instead of linear",
  momentum = "SGD momentum / Adam beta1 (ignored by optimizer=auto)",
  weight_decay = "weight decay (scaled by batch x accumulation / nbs)",
  nbs = "nominal batch size: gradients are accumulated to about this many images",
  warmup_epochs = "warmup length in epochs (fractions allowed)",
  warmup_momentum = "momentum at the start of warmup",
  warmup_bias_lr = "bias learning rate at the start of warmup",
  precision = "auto (bf16 on a GPU, fp32 on the CPU), bf16, fp16 or fp32",
  ["clip.max_norm"] = "gradient-norm limit of every optimizer step",
  ["clip.capture_gradient_norm"] = "record the clip in the CUDA graph (record=true)",
  ["loss.box"] = "box loss gain",
  ["loss.cls"] = "classification loss gain",
  ["loss.dfl"] = "distribution focal loss gain",
  ["loss.pose"] = "keypoint location loss gain",
  ["loss.kobj"] = "keypoint visibility loss gain",
  ["augment.mosaic"] = "mosaic probability",
  ["augment.close_mosaic"] = "turn mosaic off for the last N epochs (0: never)",
  ["augment.degrees"] = "rotation range in degrees",
  ["augment.translate"] = "translation fraction",
  ["augment.scale"] = "scale gain",
  ["augment.shear"] = "shear range in degrees",
  ["augment.perspective"] = "perspective fraction",
  ["augment.flipud"] = "vertical flip probability",
  ["augment.fliplr"] = "horizontal flip probability (needs the data's flip_idx)",
  ["augment.hsv_h"] = "hue gain",
  ["augment.hsv_s"] = "saturation gain",
  ["augment.hsv_v"] = "value gain",
  conf = "validation confidence threshold",
  iou = "validation NMS IoU threshold",
  max_det = "validation detections per image at most",
  ap = "AP interpolation: coco or ultralytics",
  val_period = "validate every N epochs (and at the end; 0: only at the end)",
  save_period = "write weights/last.safetensors every N epochs (and at the end; 0: only at the end and "
    .. "whenever best.safetensors improves)",
  record = "the recorded (CUDA-graph) training step on a GPU",
  pipeline = "with record=true: the next step's forward beside this step's backward (a second context and "
    .. "a twin of the model; same bits; LUCID_PIPELINE=0|1 overrides it)",
  device_hsv = "RandomHSV on the GPU instead of in the loader threads (ignored on the CPU)",
}

-- bench/fit_once.lua runs this same job: it loads this file with the
-- argument "--defaults" to get the table above.
if ... == "--defaults" then return defaults end

-- Errors (a bad setting, a missing dataset, a failed fit) print their
-- message and exit with status 1 (recipe.run); LUCID_DEBUG=1 adds the Lua traceback.
local builders = { yolo11 = "lucid.models.yolo11_pose", yolov8 = "lucid.models.yolov8_pose" }

local function main()
  if recipe.help_requested(arg) then
    io.stdout:write(recipe.usage(arg[0] or "recipes/pose_nano.lua", defaults, descriptions,
      "Trains the YOLO11 nano pose model (1 class, 17 COCO keypoints) on the mini COCO person-keypoint dataset.",
      recipe.program(arg)))
    return
  end
  local cfg = recipe.resolve(defaults, arg)
  -- resume: the run's saved settings, with only the overrides a resume allows
  local note
  cfg, note = recipe.apply_resume(cfg, defaults, arg, require("lucid.checkpoint").load)
  -- every setting checked before anything is opened, built or trained
  if not builders[cfg.model] then
    error(string.format("model = '%s': expected yolo11 or yolov8", tostring(cfg.model)), 0)
  end
  local Trainer = require "lucid.trainer"
  Trainer.check_config(cfg)
  Trainer.check_paths(cfg) -- a file where the run folder goes
  if note then print(note) end
  recipe.print(cfg)

  local trainer = Trainer.new(cfg)
  print(string.format("device %s, precision %s", trainer.device, trainer.precision))
  -- Ctrl-C or SIGTERM: the trainer waits for the checkpoint writes it queued,
  -- then the error reaches recipe.run, which prints this note
  local save_dir
  trainer:add_callback("on_fit_start", function(_, ev) save_dir = ev.save_dir end)
  recipe.interrupt_note = function()
    if not save_dir then return nil end
    local last = save_dir .. "/weights/last.safetensors"
    local f = io.open(last, "rb")
    if not f then return string.format("no checkpoint was written yet in %s", save_dir) end
    f:close()
    local project, name = save_dir:match("^(.*)/([^/]+)$")
    return string.format("the checkpoints written so far are kept in %s/weights; continue with resume=true "
      .. "project=%s name=%s", save_dir, project or ".", name or save_dir)
  end

  local build = require(builders[cfg.model])
  -- the head follows the dataset: its classes (names) and keypoint shape (as Ultralytics
  -- builds the model from the data YAML's nc and kpt_shape)
  local desc = require("lucid.data").load_descriptor(cfg.data)
  local nc = desc.names and #desc.names or desc.nc or 1
  local model = build{ scale = cfg.scale, nc = nc, kpt_shape = desc.kpt_shape or { 17, 3 }, ctx = trainer.ctx,
    device = trainer.device }

  local res = trainer:fit(model)
  local m = res.metrics
  print(string.format("final: box mAP50 %.4f mAP50-95 %.4f | pose mAP50 %.4f mAP50-95 %.4f | fit %.1f s",
    m.box.map50, m.box.map50_95, m.pose.map50, m.pose.map50_95, res.fit_seconds))
end

recipe.run("pose_nano", main)
