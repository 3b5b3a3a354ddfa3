--[[
recipes/predict_pose.lua — run a trained pose model on images: annotated
PNGs (boxes + skeletons) and a COCO results JSON.

  luajit recipes/predict_pose.lua weights=runs/pose_nano/weights/best.safetensors \
      source=path/to/image_or_folder [imgsz=auto conf=0.25 iou=0.7 device=auto out=runs/predict]

`weights` is a training checkpoint (its EMA weights are used when present:
the weights the validation scored) or a model file from model:save.
`imgsz` (default auto) is the imgsz the checkpoint was trained at (the
imgsz of its training arguments, the `config` metadata lucid's trainer
stores, as Ultralytics predicts at ckpt["train_args"]["imgsz"]), else 640
for weights without one (a model:save file); an explicit imgsz=N always
wins. The line "device ..., imgsz N (...)" says which it took.
`source` is an image file (.jpg/.jpeg/.png), a folder (its .jpg/.jpeg/.png
files) or a comma-separated list of them (spaces around the entries are
trimmed: source="a.jpg, b.jpg"). Writes <out>/<image stem>.png for
every image and <out>/predictions.json (COCO results: bbox [x, y, w, h] and
keypoints [x, y, v] x 17 in original image pixels). Unknown keys are
rejected by name, and every value is checked before the model is built
(predict.check_options: imgsz a multiple of 32 up to 46336,
conf/iou/kpt_threshold in [0, 1], max_det an integer in [1, 2^31 - 1],
device cpu/cuda/cuda:N/auto, no empty path; predict.list_sources: every
source entry an existing image file or a folder with at least one image,
else an error naming source, the value and why, e.g. "source =
'README.md': not an image file"; predict.check_images: every image starts
as a JPEG or a PNG, so a .jpg that is no image is refused before anything
is written); weights must be a file that opens; out must be a folder or a
path where one can be made (an existing file is refused by name, a folder
or parent that takes no new file, e.g. read-only, is refused by name before
the model is built, and a folder mkdir cannot make is named by out= with
mkdir's reason). Weights of
another model or scale are refused naming weights=, model= and scale=. An
image corrupt past its first bytes (a truncated JPEG) in a folder or a
list is skipped: one line on stderr names it and the decoder's reason
("WARNING: predict: skipping image 2/3 dir/b.jpg: corrupt or truncated
JPEG: Premature end of JPEG file"), the other images are predicted, and
the summary counts the skipped images; a single image file that cannot be
decoded, or a source none of whose images can, is an error naming the file
(predictions.json is written, atomically, once every image is done). Each
image's line gives its size and the network input it was letterboxed to.

  luajit recipes/predict_pose.lua --help   # every key, its default and what it does
]]
local lucid = require "lucid" -- also puts the Lua library (lua/lucid/) on package.path
local recipe = require "lucid.recipe"
local predict = require "lucid.predict"

local defaults = {
  weights = "runs/pose_nano/weights/best.safetensors",
  source = "",
  model = "yolo11", scale = "n",
  -- auto: the imgsz the checkpoint was trained at, else 640
  imgsz = "auto", conf = 0.25, iou = 0.7, max_det = 300,
  kpt_threshold = 0.5,
  device = "auto",
  -- activations: auto = bf16 on a GPU, fp32 on the CPU; or bf16 | fp16 | fp32
  precision = "auto",
  out = "runs/predict",
  ema = true, -- prefer a checkpoint's EMA weights
}

-- One line per key for --help (recipe.usage).
local descriptions = {
  weights = "a training checkpoint (its EMA weights when present) or a model:save file",
  source = "an image (.jpg/.jpeg/.png), a folder of them, or a comma-separated list",
  model = "the architecture the weights were trained with: yolo11 or yolov8",
  scale = "the model scale the weights were trained with: n, s, m, l or x",
  imgsz = "network input side (a multiple of 32; every image is letterboxed to imgsz x imgsz); auto: the "
    .. "checkpoint's training imgsz, else 640",
  conf = "confidence threshold in [0, 1]",
  iou = "NMS IoU threshold in [0, 1]",
  max_det = "at most this many detections per image",
  kpt_threshold = "keypoints drawn when their confidence is at least this (drawing only)",
  device = "cpu, cuda, cuda:N or auto",
  precision = "activations: auto (bf16 on a GPU, fp32 on the CPU), bf16, fp16 or fp32",
  out = "the folder for <image stem>.png and predictions.json",
  ema = "prefer a checkpoint's EMA weights (true/false)",
}

-- bench and specs load this file with "--defaults" to get the table above.
if ... == "--defaults" then return defaults end

local builders = { yolo11 = "lucid.models.yolo11_pose", yolov8 = "lucid.models.yolov8_pose" }

-- Errors (a bad setting, a missing or corrupt checkpoint, a single image
-- file that cannot be decoded, no image in source) print their message and
-- exit with status 1; LUCID_DEBUG=1 adds the Lua traceback. Every setting is checked before
-- the model is built or a file is read.
local function main()
if recipe.help_requested(arg) then
  io.stdout:write(recipe.usage(arg[0] or "recipes/predict_pose.lua", defaults, descriptions,
    "Runs a trained pose model on images: annotated PNGs and a COCO results JSON (predictions.json).",
    recipe.program(arg)))
  return
end
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
-- (the entries of a list are trimmed: "a.jpg, b.jpg" is a.jpg and b.jpg)
local sources = predict.split_sources(cfg.source)
if #sources == 0 then error("source = '" .. cfg.source .. "': expected an image, a folder or a comma-separated list", 0) end
local images = predict.list_sources(sources, "source")
-- every image's first bytes: a JPEG or a PNG (a .jpg that is no image is
-- refused now, not after some outputs were written)
predict.check_images(images, "source", #sources == 1 and sources[1] or table.concat(sources, ","))
-- the weights file opens and is a file (its content is checked when it is loaded)
local wkind, wwhy = recipe.path_kind(cfg.weights)
if not wkind then
  error(string.format("predict: weights = '%s': cannot open it (%s)", cfg.weights, wwhy), 0)
elseif wkind == "dir" then
  error(string.format("predict: weights = '%s': a folder, not a weights file (a training checkpoint or a "
    .. "model:save file)", cfg.weights), 0)
end
-- out: a folder or a path where one can be made (created after the model loads),
-- in a place that takes new files
recipe.check_writable(cfg.out, "out", "predict", "the annotated images and predictions.json go into it")
recipe.print(cfg)

local ctx = lucid.Context{ device = recipe.device_name(cfg.device) }
local device = ctx:device()
local on_gpu = device:sub(1, 4) == "cuda"
local prec = cfg.precision
if prec == "auto" then prec = on_gpu and "bf16" or "fp32" end
act = ({ bf16 = "bf16", fp16 = "f16", fp32 = "f32" })[prec]
if not on_gpu and act ~= "f32" then error("precision " .. prec .. " needs a GPU", 0) end

local build = require(builders[cfg.model])
local model = build{ scale = cfg.scale, nc = 1, kpt_shape = { 17, 3 }, ctx = ctx, device = device }

-- weights of another architecture or scale: named by weights=, with the
-- keys of this recipe that fix it (partial loading is not offered: a model
-- left partly at its initial values predicts nothing useful)
local lok, rep = pcall(predict.load_weights, model, cfg.weights, { ema = cfg.ema, partial = true })
if not lok then
  local msg = recipe.message(rep):gsub("^predict: ", "")
  if msg:find(cfg.weights, 1, true) == 1 then msg = msg:sub(#cfg.weights + 1):gsub("^:? *", "") end
  error(string.format("predict: weights = '%s': %s", cfg.weights, msg), 0)
end
local misfit = predict.misfit(rep)
if misfit then
  error(string.format("predict: weights = '%s' does not fit the model (model=%s scale=%s): %s; check model= and "
    .. "scale= (they must be those the weights were trained with)", cfg.weights, cfg.model, cfg.scale, misfit), 0)
end
print(string.format("weights %s: %d tensors loaded%s", cfg.weights, rep.loaded,
  rep.ema and string.format(", EMA weights used (%d tensors)", rep.ema_loaded) or ""))
local function report(what, list)
  if #list > 0 then
    print(string.format("  %s %d: %s%s", what, #list, table.concat(list, ", ", 1, math.min(#list, 8)),
      #list > 8 and string.format(", ... (%d more)", #list - 8) or ""))
  end
end
report("unexpected (skipped)", rep.unexpected)
if rep.loaded == 0 then error("no tensor of " .. cfg.weights .. " matches the model", 0) end

-- imgsz: given, else the checkpoint's training imgsz (a stored value
-- prediction cannot use is an error naming weights), else 640
local auto = cfg.imgsz == nil or cfg.imgsz == "auto"
local S, from = predict.resolve_imgsz(cfg.imgsz, auto
  and predict.train_imgsz(rep.train_args, "weights = '" .. cfg.weights .. "'") or nil)
local from_text = ({ imgsz = "given", weights = "the imgsz the weights were trained at",
  default = "the default; the weights carry no training imgsz" })[from]
print(string.format("device %s, precision %s, imgsz %d (%s), conf %.3g, iou %.3g", device, prec, S, from_text,
  cfg.conf, cfg.iou))
recipe.make_folder(cfg.out, "out", "predict")
-- the sources as given (predict.run skips an unreadable image of a folder or
-- a list, with a warning on stderr; a single image file is an error)
local res = predict.run{ model = model, ctx = ctx, sources = sources, imgsz = S, conf = cfg.conf,
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
  .. "to shape (1, 3, %d, %d))", 1000 * pre / n, 1000 * inf / n, 1000 * post / n, S, S))
local function count(n, what) return string.format("%d %s%s", n, what, n == 1 and "" or "s") end
local nskip = #res.skipped
print(string.format("Results saved to %s (%s, %s in %s)%s", cfg.out, count(#res.images, "image"),
  count(#res.entries, "detection"), res.json, nskip == 0 and ""
    or string.format("; %s skipped (could not be read; each named in a WARNING line on stderr)", count(nskip, "image"))))
end

recipe.run("predict_pose", main)
