--- lucid.models.yolo11_pose — the YOLO11 pose network (Ultralytics
-- cfg/models/11/yolo11-pose.yaml, 8.4.114) as a layer table.
--
--   local build = require("lucid.models.yolo11_pose")
--   local model = build{scale = "n", nc = 1, kpt_shape = {17, 3}}
--
-- Rows are {from, repeats, module, args} before scaling (parse_model rules
-- in lucid.model). YOLO11n-pose (nc=1, 17x3): 2,874,462 parameters.
local M = {}

--- The layer table as data (a fresh copy on each call).
-- @return table {nc, kpt_shape, scales, backbone, head}
function M.config()
  return {
    name = "yolo11-pose",
    nc = 80,
    kpt_shape = { 17, 3 },
    scales = { -- [depth, width, max_channels]
      n = { 0.50, 0.25, 1024 },
      s = { 0.50, 0.50, 1024 },
      m = { 0.50, 1.00, 512 },
      l = { 1.00, 1.00, 512 },
      x = { 1.00, 1.50, 512 },
    },
    backbone = {
      { -1, 1, "Conv", { 64, 3, 2 } },            -- 0-P1/2
      { -1, 1, "Conv", { 128, 3, 2 } },           -- 1-P2/4
      { -1, 2, "C3k2", { 256, false, 0.25 } },
      { -1, 1, "Conv", { 256, 3, 2 } },           -- 3-P3/8
      { -1, 2, "C3k2", { 512, false, 0.25 } },
      { -1, 1, "Conv", { 512, 3, 2 } },           -- 5-P4/16
      { -1, 2, "C3k2", { 512, true } },
      { -1, 1, "Conv", { 1024, 3, 2 } },          -- 7-P5/32
      { -1, 2, "C3k2", { 1024, true } },
      { -1, 1, "SPPF", { 1024, 5 } },             -- 9
      { -1, 2, "C2PSA", { 1024 } },               -- 10
    },
    head = {
      { -1, 1, "Upsample", { "None", 2, "nearest" } },
      { { -1, 6 }, 1, "Concat", { 1 } },          -- cat backbone P4
      { -1, 2, "C3k2", { 512, false } },          -- 13
      { -1, 1, "Upsample", { "None", 2, "nearest" } },
      { { -1, 4 }, 1, "Concat", { 1 } },          -- cat backbone P3
      { -1, 2, "C3k2", { 256, false } },          -- 16 (P3/8-small)
      { -1, 1, "Conv", { 256, 3, 2 } },
      { { -1, 13 }, 1, "Concat", { 1 } },         -- cat head P4
      { -1, 2, "C3k2", { 512, false } },          -- 19 (P4/16-medium)
      { -1, 1, "Conv", { 512, 3, 2 } },
      { { -1, 10 }, 1, "Concat", { 1 } },         -- cat head P5
      { -1, 2, "C3k2", { 1024, true } },          -- 22 (P5/32-large)
      { { 16, 19, 22 }, 1, "Pose", { "nc", "kpt_shape" } }, -- 23 Pose(P3, P4, P5)
    },
  }
end

--- Build the model. opts: scale ("n"), nc (80), kpt_shape ({17, 3}), ch (3),
-- materialize (true when the C binding is present), device, dtype, ctx.
-- @return lucid.model.Model
function M.build(opts)
  return require("lucid.model").new(M.config(), opts)
end

return setmetatable(M, { __call = function(_, opts) return M.build(opts) end })
