--[[
recipes/pose_nano.lua — the main job: train the YOLO11 nano pose model
(1 class, 17 COCO keypoints) on the mini COCO person-keypoint dataset.

  luajit recipes/pose_nano.lua                      # the defaults below
  luajit recipes/pose_nano.lua epochs=3 imgsz=320 device=cpu name=try

Every setting is in `defaults` (lua/lucid/pose_nano_defaults.lua, shared
with the complete-fit benchmark bench/fit_pairs.lua) and can be overridden
on the command line as key=value (nested ones with dots: clip.max_norm=5,
augment.mosaic=0, loss.pose=10). Unknown keys are rejected by name. The resolved
configuration is printed at start.

Defaults are the public benchmark configuration: nano, batch 4, 640 px,
10 epochs, mosaic for all epochs, 4 loader workers, image cache on, bf16 on
a GPU (fp32 on the CPU), device auto. Values not listed follow Ultralytics
8.4's cfg/default.yaml (see ../shared/reference/yolo_pose_reference.md).
]]
local lucid = require "lucid" -- also puts the Lua library (lua/lucid/) on package.path
local recipe = require "lucid.recipe"

local defaults = {} -- the schema: every key and its default
for k, v in pairs(require "lucid.pose_nano_defaults") do defaults[k] = v end
-- RandomHSV on the GPU (lucid.input_prepare in the step) instead of in the
-- loader threads; ignored on the CPU. The batches are byte-identical.
if defaults.device_hsv == nil then defaults.device_hsv = true end

-- Errors (a bad setting, a missing dataset, a failed fit) print their
-- message and exit with status 1; LUCID_DEBUG=1 adds the Lua traceback.
local function main()
  local cfg = recipe.resolve(defaults, arg)
  recipe.print(cfg)

  local Trainer = require "lucid.trainer"
  local trainer = Trainer.new(cfg)
  print(string.format("device %s, precision %s", trainer.device, trainer.precision))

  local builders = { yolo11 = "lucid.models.yolo11_pose", yolov8 = "lucid.models.yolov8_pose" }
  local build = require(assert(builders[cfg.model], "model must be yolo11 or yolov8"))
  local model = build{ scale = cfg.scale, nc = 1, kpt_shape = { 17, 3 }, ctx = trainer.ctx, device = trainer.device }

  local res = trainer:fit(model)
  local m = res.metrics
  print(string.format("final: box mAP50 %.4f mAP50-95 %.4f | pose mAP50 %.4f mAP50-95 %.4f | fit %.1f s",
    m.box.map50, m.box.map50_95, m.pose.map50, m.pose.map50_95, res.fit_seconds))
end

local ok, err = xpcall(main, function(e)
  if os.getenv("LUCID_DEBUG") == "1" then return debug.traceback(tostring(e), 2) end
  return tostring(e)
end)
if not ok then
  io.stderr:write("pose_nano: ", err, "\n")
  os.exit(1)
end
