--[[
coco_pose_mini — the default dataset of the recipes: real COCO 2017 person
images with their keypoint labels (137 train + 32 val; see
datasets/fetch_coco_pose.py to rebuild it from the public COCO files).

The folder "coco-pose-mini" is searched in $LUCID_DATASETS, then
../shared/datasets, then datasets/ (relative to the working directory, then
to the repository root). `path` is nil when it is not found; data.open then
fails with the list of places searched.
]]

local data = require "lucid.data"
local path, searched = data.find_dataset("coco-pose-mini")

return {
  name = "coco-pose-mini",
  path = path,
  searched = searched,
  train = "images/train",
  val = "images/val",
  -- official COCO records: complete for val, partial (28 of 137) for train
  coco_json = { val = "annotations/person_keypoints_val.json" },
  kpt_shape = { 17, 3 },
  -- 0-based, as in the Ultralytics data YAML
  flip_idx = { 0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15 },
  names = { "person" },
  kpt_names = { "nose", "left_eye", "right_eye", "left_ear", "right_ear",
                "left_shoulder", "right_shoulder", "left_elbow", "right_elbow",
                "left_wrist", "right_wrist", "left_hip", "right_hip",
                "left_knee", "right_knee", "left_ankle", "right_ankle" },
  images = { train = 137, val = 32 },
  instances = { train = 422, val = 68 },
}
