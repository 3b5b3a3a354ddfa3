--[[
recipes/predict_pose.lua — run a trained pose model on images: annotated
PNGs (boxes + skeletons) and a COCO results JSON.

  luajit recipes/predict_pose.lua weights=runs/pose_nano/weights/best.safetensors \
      source=path/to/image_or_folder [imgsz=640 conf=0.25 iou=0.7 device=auto out=runs/predict]

`weights` is a training checkpoint (its EMA weights are used when present:
the weights the validation scored) or a model file from model:save.
`source` is an image file (.jpg/.jpeg/.png), a folder (its .jpg/.jpeg/.png
files) or a comma-separated list of them. Writes <out>/<image stem>.png for
every image and <out>/predictions.json (COCO results: bbox [x, y, w, h] and
keypoints [x, y, v] x 17 in original image pixels). Unknown keys are
rejected by name, and every value is checked before the model is built
(predict.check_options: imgsz a multiple of 32 up to 46336,
conf/iou/kpt_threshold in [0, 1], max_det an integer in [1, 2^31 - 1],
device cpu/cuda/cuda:N/auto, no empty path; predict.list_sources: every
source entry an existing image file or a folder with at least one image,
else an error naming source, the value and why, e.g. "source =
'README.md': not an image file"); the weights file must open. Each image's
line gives its size and the network input it was letterboxed to.
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

local builders = { yolo11 = "lucid.models.yolo11_pose", yolov8 = "lucid.models.yolov8_pose" }

-- Errors (a bad setting, a missing or corrupt checkpoint, an unreadable
-- image, no image in source) print their message and exit with status 1;
-- LUCID_DEBUG=1 adds the Lua traceback. Every setting is checked before
-- the model is built or a file is read.
local function main()
local cfg = recipe.resolve(defaults, arg)
if cfg.source == nil or cfg.source == "" then
  error("source=<image, folder or comma-separated list> is required", 0)
end
predict.check_options(cfg)
if cfg.weights == nil then error("weights=<checkpoint or model file> is required", 0) end
if not builders[cfg.model] then
  error(string.format("model = '%s': expected yolo11 or yolov8", tostring(cfg.model)), 0)
end
local act = ({ auto = true, bf16 = "bf16", fp16 = "f16", fp32 = "f32" })[cfg.precision]
if not act then error("precision must be auto, bf16, fp16 or fp32, got '" .. tostring(cfg.precision) .. "'", 0) end
-- the images (a missing path, a file that is no image, a folder without
-- images is an error now, naming source and the entry at fault)
local sources = {}
for s in cfg.source:gmatch("[^,]+") do sources[#sources + 1] = s end
if #sources == 0 then error("source = '" .. cfg.source .. "': expected an image, a folder or a comma-separated list", 0) end
local images = predict.list_sources(sources, "source")
-- and the weights file opens (its content is checked when it is loaded)
local wf, werr = io.open(cfg.weights, "rb")
if not wf then
  local why = tostring(werr):gsub("^.*: ", "") -- "No such file or directory", "Permission denied"
  error(string.format("predict: weights = '%s': cannot open it (%s)", cfg.weights, why), 0)
end
wf:close()
recipe.print(cfg)

local ctx = lucid.Context{ device = cfg.device }
local device = ctx:device()
local on_gpu = device:sub(1, 4) == "cuda"
local prec = cfg.precision
if prec == "auto" then prec = on_gpu and "bf16" or "fp32" end
act = ({ bf16 = "bf16", fp16 = "f16", fp32 = "f32" })[prec]
if not on_gpu and act ~= "f32" then error("precision " .. prec .. " needs a GPU", 0) end

local build = require(builders[cfg.model])
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
if rep.loaded == 0 then error("no tensor of " .. cfg.weights .. " matches the model", 0) end

print(string.format("device %s, precision %s, imgsz %d, conf %.3g, iou %.3g", device, prec, cfg.imgsz,
  cfg.conf, cfg.iou))
local res = predict.run{ model = model, ctx = ctx, sources = images, imgsz = cfg.imgsz, conf = cfg.conf,
  iou = cfg.iou, max_det = cfg.max_det, act_dtype = act, out_dir = cfg.out,
  kpt_threshold = cfg.kpt_threshold,
  on_image = function(r, i, n)
    local t = r.time
    -- the image's size, then the network input: every image is letterboxed
    -- (resized to fit, padded) to imgsz x imgsz
    print(string.format("image %d/%d %s: %dx%d, input (1, 3, %d, %d) with the image resized to %dx%d, %d %s, "
      .. "%.1fms pre, %.1fms inference, %.1fms post", i, n, r.path, r.width, r.height, r.input_shape[3],
      r.input_shape[4], r.resized[1], r.resized[2], #r.detections, #r.detections == 1 and "person" or "persons",
      1000 * t.pre, 1000 * t.inference, 1000 * t.post))
  end }
local pre, inf, post = 0, 0, 0
for _, r in ipairs(res.images) do pre, inf, post = pre + r.time.pre, inf + r.time.inference, post + r.time.post end
local n = math.max(#res.images, 1)
print(string.format("Speed: %.1fms preprocess, %.1fms inference, %.1fms postprocess per image (each letterboxed "
  .. "to shape (1, 3, %d, %d))", 1000 * pre / n, 1000 * inf / n, 1000 * post / n, cfg.imgsz, cfg.imgsz))
print(string.format("Results saved to %s (%d images, %d detections in %s)", cfg.out, #res.images,
  #res.entries, res.json))
end

recipe.run("predict_pose", main)
