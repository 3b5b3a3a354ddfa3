--- lucid.models.yolov8_pose — the YOLOv8 pose network (Ultralytics
-- cfg/models/v8/yolov8-pose.yaml) as a layer table, assembled from the
-- same blocks as YOLO11 (C2f instead of C3k2, no C2PSA, legacy cls branch).
--
--   local model = require("lucid.models.yolov8_pose"){scale = "n", nc = 1}
--
-- YOLOv8n-pose (nc=1, 17x3): 3,295,470 parameters.
local M = {}

--- The layer table as data (a fresh copy on each call).
function M.config()
  return {
    name = "yolov8-pose",
    nc = 1,
    kpt_shape = { 17, 3 },
    scales = {
      n = { 0.33, 0.25, 1024 },
      s = { 0.33, 0.50, 1024 },
      m = { 0.67, 0.75, 768 },
      l = { 1.00, 1.00, 512 },
      x = { 1.00, 1.25, 512 },
    },
    backbone = {
      { -1, 1, "Conv", { 64, 3, 2 } },            -- 0-P1/2
      { -1, 1, "Conv", { 128, 3, 2 } },           -- 1-P2/4
      { -1, 3, "C2f", { 128, true } },
      { -1, 1, "Conv", { 256, 3, 2 } },           -- 3-P3/8
      { -1, 6, "C2f", { 256, true } },
      { -1, 1, "Conv", { 512, 3, 2 } },           -- 5-P4/16
      { -1, 6, "C2f", { 512, true } },
      { -1, 1, "Conv", { 1024, 3, 2 } },          -- 7-P5/32
      { -1, 3, "C2f", { 1024, true } },
      { -1, 1, "SPPF", { 1024, 5 } },             -- 9
    },
    head = {
      { -1, 1, "Upsample", { "None", 2, "nearest" } },
      { { -1, 6 }, 1, "Concat", { 1 } },          -- cat backbone P4
      { -1, 3, "C2f", { 512 } },                  -- 12
      { -1, 1, "Upsample", { "None", 2, "nearest" } },
      { { -1, 4 }, 1, "Concat", { 1 } },          -- cat backbone P3
      { -1, 3, "C2f", { 256 } },                  -- 15 (P3/8-small)
      { -1, 1, "Conv", { 256, 3, 2 } },
      { { -1, 12 }, 1, "Concat", { 1 } },         -- cat head P4
      { -1, 3, "C2f", { 512 } },                  -- 18 (P4/16-medium)
      { -1, 1, "Conv", { 512, 3, 2 } },
      { { -1, 9 }, 1, "Concat", { 1 } },          -- cat head P5
      { -1, 3, "C2f", { 1024 } },                 -- 21 (P5/32-large)
      { { 15, 18, 21 }, 1, "Pose", { "nc", "kpt_shape" } }, -- 22 Pose(P3, P4, P5)
    },
  }
end

--- Build the model (options as lucid.models.yolo11_pose.build).
function M.build(opts)
  return require("lucid.model").new(M.config(), opts)
end

return setmetatable(M, { __call = function(_, opts) return M.build(opts) end })
