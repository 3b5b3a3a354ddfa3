--[[
lucid.results — runs/<name>/results.csv, one row per epoch with the
reference's columns (Ultralytics PoseTrainer):
  epoch, time, train/box_loss, train/pose_loss, train/kobj_loss,
  train/cls_loss, train/dfl_loss, metrics/precision(B), metrics/recall(B),
  metrics/mAP50(B), metrics/mAP50-95(B), metrics/precision(P),
  metrics/recall(P), metrics/mAP50(P), metrics/mAP50-95(P), val/box_loss,
  val/pose_loss, val/kobj_loss, val/cls_loss, val/dfl_loss, lr/pg0, lr/pg1,
  lr/pg2
Rows are appended and flushed at once (a killed run keeps the finished
epochs); a resumed run appends to the same file. Every epoch has its row
(Ultralytics writes one each epoch); an epoch that was not validated
(val_period) has empty metric and val/ cells.
]]
local results = {}

local LOSSES = { "box", "pose", "kobj", "cls", "dfl" }
local HEADER = { "epoch", "time" }
for _, k in ipairs(LOSSES) do HEADER[#HEADER + 1] = "train/" .. k .. "_loss" end
for _, s in ipairs({ "B", "P" }) do
  for _, m in ipairs({ "precision", "recall", "mAP50", "mAP50-95" }) do
    HEADER[#HEADER + 1] = string.format("metrics/%s(%s)", m, s)
  end
end
for _, k in ipairs(LOSSES) do HEADER[#HEADER + 1] = "val/" .. k .. "_loss" end
for g = 0, 2 do HEADER[#HEADER + 1] = "lr/pg" .. g end
results.HEADER = HEADER

local Csv = {}
Csv.__index = Csv

--- results.open(path) -> csv; writes the header when the file is new.
function results.open(path)
  local f = io.open(path, "r")
  local exists = f ~= nil
  if f then f:close() end
  local self = setmetatable({ path = path }, Csv)
  if not exists then
    local w = assert(io.open(path, "w"))
    w:write(table.concat(HEADER, ","), "\n")
    w:close()
  end
  return self
end

local function num(x)
  if x == nil then return "" end
  return string.format("%.6g", x)
end

--- csv:last_time() -> the time column of the last row (0 when none): a
-- resumed run continues the elapsed-time count.
function Csv:last_time()
  local last
  for l in io.lines(self.path) do last = l end
  local t = last and tonumber(last:match("^[^,]*,([^,]*)"))
  return t or 0
end

--- csv:truncate_after(epochs) — keep the header and the rows of epochs
-- 1..epochs (a resumed run rewrites later ones); atomic (temp + rename).
function Csv:truncate_after(epochs)
  local keep = {}
  for l in io.lines(self.path) do
    local e = tonumber(l:match("^([^,]*),"))
    if not e or e <= epochs then keep[#keep + 1] = l end
  end
  local tmp = self.path .. ".tmp"
  local w = assert(io.open(tmp, "w"))
  w:write(table.concat(keep, "\n"), "\n")
  w:close()
  assert(os.rename(tmp, self.path))
end

--- csv:row(epoch (1-based), seconds, train_losses {box=..}, metrics|nil, val_losses|nil, lrs {pg0, pg1, pg2})
-- metrics nil (an epoch that was not validated, val_period): the metric
-- cells are left empty, as the val/ ones are without val_losses.
function Csv:row(epoch, seconds, tl, m, vl, lrs)
  local r = { tostring(epoch), num(seconds) }
  for _, k in ipairs(LOSSES) do r[#r + 1] = num(tl and tl[k]) end
  for _, s in ipairs({ m and m.box or {}, m and m.pose or {} }) do
    r[#r + 1] = num(s.precision); r[#r + 1] = num(s.recall)
    r[#r + 1] = num(s.map50); r[#r + 1] = num(s.map50_95)
  end
  for _, k in ipairs(LOSSES) do r[#r + 1] = num(vl and vl[k]) end
  for g = 1, 3 do r[#r + 1] = num(lrs and lrs[g]) end
  local w = assert(io.open(self.path, "a"))
  w:write(table.concat(r, ","), "\n")
  w:close()
end

return results
