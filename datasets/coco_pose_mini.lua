--[[
coco_pose_mini — the default dataset of the recipes: real COCO 2017 person
images with their keypoint labels (137 train + 32 val; see
datasets/fetch_coco_pose.sh to rebuild it from the public COCO files).

The folder "coco-pose-mini" is searched in $LUCID_DATASETS, then
../shared/datasets, then datasets/ (relative to the working directory, then
to the repository root). `path` is nil when it is not found; data.open then
fails with the list of places searched.
]]

local function is_dir(p)
  local f = io.open(p, "r")
  if not f then return false end
  local ok, _, code = f:read(1)
  f:close()
  return ok == nil and code == 21
end

local function find(name)
  local src = debug.getinfo(1, "S").source
  local root = src:sub(1, 1) == "@" and src:sub(2):match("^(.*)/datasets/[^/]*$") or "."
  local bases = {}
  local env = os.getenv("LUCID_DATASETS")
  if env and env ~= "" then bases[#bases + 1] = env end
  for _, r in ipairs({ ".", root }) do
    bases[#bases + 1] = r .. "/../shared/datasets"
    bases[#bases + 1] = r .. "/datasets"
  end
  local searched = {}
  for _, b in ipairs(bases) do
    local p = b .. "/" .. name
    searched[#searched + 1] = p
    if is_dir(p .. "/images") then return p, table.concat(searched, ", ") end
  end
  return nil, table.concat(searched, ", ")
end

local path, searched = find("coco-pose-mini")

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
