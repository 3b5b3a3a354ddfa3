--[[
recipes/predict_pose.lua — run a trained pose model on images: annotated
PNGs (boxes + skeletons) and a COCO results JSON.

  luajit recipes/predict_pose.lua weights=runs/pose_nano/weights/best.safetensors \
      source=path/to/image_or_folder [imgsz=640 conf=0.25 iou=0.7 device=auto out=runs/predict]

`weights` is a training checkpoint (its EMA weights are used when present:
the weights the validation scored) or a model file from model:save.
`source` is an image file, a folder (its .jpg/.jpeg/.png files) or a
comma-separated list of them. Writes <out>/<image stem>.png for every image
and <out>/predictions.json (COCO results: bbox [x, y, w, h] and keypoints
[x, y, v] x 17 in original image pixels). Unknown keys are rejected by name.
]]
local lucid = require "lucid" -- also puts the Lua library (lua/lucid/) on package.path
local recipe = require "lucid.recipe"
local predict = require "lucid.predict"

local defaults = {
  weights = "runs/pose_nano/weights/best.safetensors",
  source = "",
  model = "yolo11", scale = "n",
  imgsz = 640, conf = 0.25, iou = 0.7, max_det = 300,
  kpt_threshold = 0.5,
  device = "auto",
  -- activations: auto = bf16 on a GPU, fp32 on the CPU; or bf16 | fp16 | fp32
  precision = "auto",
  out = "runs/predict",
  ema = true, -- prefer a checkpoint's EMA weights
}

-- Errors (a bad setting, a missing or corrupt checkpoint, an unreadable
-- image) print their message and exit with status 1; LUCID_DEBUG=1 adds the
-- Lua traceback.
local function main()
local cfg = recipe.resolve(defaults, arg)
recipe.print(cfg)
if cfg.source == "" then
  error("predict_pose: source=<image, folder or comma-separated list> is required", 0)
end

local ctx = lucid.Context{ device = cfg.device }
local device = ctx:device()
local on_gpu = device:sub(1, 4) == "cuda"
local prec = cfg.precision
if prec == "auto" then prec = on_gpu and "bf16" or "fp32" end
local act = ({ bf16 = "bf16", fp16 = "f16", fp32 = "f32" })[prec]
if not act then error("predict_pose: precision must be auto, bf16, fp16 or fp32, got '" .. prec .. "'", 0) end
if not on_gpu and act ~= "f32" then error("predict_pose: precision " .. prec .. " needs a GPU", 0) end

local builders = { yolo11 = "lucid.models.yolo11_pose", yolov8 = "lucid.models.yolov8_pose" }
local build = require(assert(builders[cfg.model], "model must be yolo11 or yolov8"))
local model = build{ scale = cfg.scale, nc = 1, kpt_shape = { 17, 3 }, ctx = ctx, device = device }

local rep = predict.load_weights(model, cfg.weights, { ema = cfg.ema })
print(string.format("weights %s: %d tensors loaded%s", cfg.weights, rep.loaded,
  rep.ema and string.format(", EMA weights used (%d tensors)", rep.ema_loaded) or ""))
local function report(what, list)
  if #list > 0 then
    print(string.format("  %s %d: %s%s", what, #list, table.concat(list, ", ", 1, math.min(#list, 8)),
      #list > 8 and string.format(", ... (%d more)", #list - 8) or ""))
  end
end
report("missing (left at their initial values)", rep.missing)
report("mis-shaped (skipped)", rep.mismatched)
report("unexpected (skipped)", rep.unexpected)
if rep.loaded == 0 then error("predict_pose: no tensor of " .. cfg.weights .. " matches the model", 0) end

local sources = {}
for s in cfg.source:gmatch("[^,]+") do sources[#sources + 1] = s end

print(string.format("device %s, precision %s, imgsz %d, conf %.3g, iou %.3g", device, prec, cfg.imgsz,
  cfg.conf, cfg.iou))
local res = predict.run{ model = model, ctx = ctx, sources = sources, imgsz = cfg.imgsz, conf = cfg.conf,
  iou = cfg.iou, max_det = cfg.max_det, act_dtype = act, out_dir = cfg.out,
  kpt_threshold = cfg.kpt_threshold,
  on_image = function(r, i, n)
    local t = r.time
    print(string.format("image %d/%d %s: %dx%d, %d %s, %.1fms pre, %.1fms inference, %.1fms post",
      i, n, r.path, r.width, r.height, #r.detections, #r.detections == 1 and "person" or "persons",
      1000 * t.pre, 1000 * t.inference, 1000 * t.post))
  end }
local pre, inf, post = 0, 0, 0
for _, r in ipairs(res.images) do pre, inf, post = pre + r.time.pre, inf + r.time.inference, post + r.time.post end
local n = math.max(#res.images, 1)
print(string.format("Speed: %.1fms preprocess, %.1fms inference, %.1fms postprocess per image at shape (1, 3, %d, %d)",
  1000 * pre / n, 1000 * inf / n, 1000 * post / n, cfg.imgsz, cfg.imgsz))
print(string.format("Results saved to %s (%d images, %d detections in %s)", cfg.out, #res.images,
  #res.entries, res.json))
end

recipe.run("predict_pose", main)
