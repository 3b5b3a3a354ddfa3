-- recipes/pose_nano.lua — the main job: train a nano YOLO11 pose model on the
-- mini COCO person-keypoint dataset.
--
-- The engine is being assembled issue by issue; until every part the recipe
-- needs exists, this file says which parts are still missing and exits with
-- status 1, so `make run` never pretends to train.
local needed = {
  {"lucid", "the engine's Lua binding (lucid.so)"},
  {"lucid.model", "model assembly (the nano pose layer table)"},
  {"lucid.data", "data pipeline (datasets, augmentation, loader)"},
  {"lucid.trainer", "trainer (fit, validation, checkpoints)"},
}
local missing = {}
for _, m in ipairs(needed) do
  local ok = pcall(require, m[1])
  if not ok then missing[#missing + 1] = m end
end
if #missing > 0 then
  io.stderr:write("recipes/pose_nano.lua: cannot train yet; missing parts:\n")
  for _, m in ipairs(missing) do
    io.stderr:write(string.format("  - %-14s %s\n", m[1], m[2]))
  end
  os.exit(1)
end
