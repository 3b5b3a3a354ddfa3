--[[
lucid.val_output — what a user expects after the final validation of a fit:
  <save_dir>/val_predictions.json   COCO results for every validation image,
                                    in the ORIGINAL image pixels (letterbox
                                    undone with each image's geometry)
  <save_dir>/val_batch0_pred.png    a mosaic (2x2 by default) of the first
                                    validation images with their predicted
                                    boxes and skeletons (conf >= 0.25, as
                                    Ultralytics' plot_predictions)

  local val_output = require "lucid.val_output"
  local vout = val_output.new{ dataset = val_ds, imgsz = S, save_dir = save_dir,
                               names = desc.names }
  -- in the validation loop, right after val:add_batch(...) of batch vb:
  vout:add_batch(val, vb)
  -- after the loop:
  local files = vout:finish()   -- {json = path, png = path | nil, predictions = n}

The detections are the validator's (network-input pixels of the imgsz x
imgsz letterboxed image); the original size of each image comes from the
dataset (lucid.image.dataset_image_size, no decoding) and the letterbox
geometry from lucid.image.geometry, which is the loader's validation path.
Entries are what lucid.predict.unletterbox + coco_entries + cjson.encode
give (image_id = numeric file stem, else the dataset index; category_id =
cls + 1), written by the validator in C (val:coco_json: no Lua table per
detection); only the preview images take their detections to Lua.
]]
local lucid = require "lucid"
local predict = require "lucid.predict"

local M = {}
local VO = {}
VO.__index = VO

local NEW_KEYS = { dataset = true, imgsz = true, save_dir = true, names = true, plot_images = true,
  plot_conf = true, kpt_threshold = true, json_name = true, png_name = true }

--- val_output.new(o) -> collector. o: dataset (lucid.Dataset, required),
-- imgsz (required), save_dir (required), names ({"person"}), plot_images
-- (4; 0 = no PNG), plot_conf (0.25), kpt_threshold (0.5), json_name
-- ("val_predictions.json"), png_name ("val_batch0_pred.png").
function M.new(o)
  assert(type(o) == "table", "val_output.new: expected a table")
  for k in pairs(o) do
    if not NEW_KEYS[k] then error("val_output.new: unknown option '" .. tostring(k) .. "'", 2) end
  end
  if not o.dataset then error("val_output.new: dataset is required", 2) end
  if not o.imgsz then error("val_output.new: imgsz is required", 2) end
  if not o.save_dir then error("val_output.new: save_dir is required", 2) end
  local self = setmetatable({}, VO)
  self.dataset, self.imgsz, self.save_dir = o.dataset, o.imgsz, o.save_dir
  self.names = o.names or { "person" }
  self.plot_images = o.plot_images or 4
  self.plot_conf = o.plot_conf or 0.25
  self.kpt_threshold = o.kpt_threshold or 0.5
  self.json_name = o.json_name or "val_predictions.json"
  self.png_name = o.png_name or "val_batch0_pred.png"
  self:reset()
  return self
end

function VO:reset()
  self:_free_tiles()
  self.chunks, self.predictions, self.tiles, self.images = {}, 0, {}, 0
end

function VO:_free_tiles()
  for _, t in ipairs(self.tiles or {}) do t:free() end
  self.tiles = {}
end

--- Collect the detections of batch vb (the loader's table) from val, the
-- validator that has just been given that batch.
function VO:add_batch(val, vb)
  local S = self.imgsz
  for i = 1, vb.n do
    local idx = vb.sample_index[i]
    if idx and idx > 0 then
      local w, h = lucid.image.dataset_image_size(self.dataset, idx)
      local g = lucid.image.geometry(w, h, S)
      local text, n = val:coco_json(i, predict.image_id(self.dataset:image_path(idx), idx), g)
      if n > 0 then self.chunks[#self.chunks + 1] = text end
      self.predictions = self.predictions + n
      self.images = self.images + 1
      if #self.tiles < self.plot_images then
        -- the network input itself (CHW u8) as an HWC image, predictions on it
        local img = vb.images:select(1, i):to("cpu", "u8"):permute(2, 3, 1):contiguous()
        lucid.image.draw_pose(img, val:detections(i), { conf = self.plot_conf,
          kpt_threshold = self.kpt_threshold, names = self.names })
        self.tiles[#self.tiles + 1] = img
      end
    end
  end
end

--- Tiles side by side in a grid of ceil(sqrt(n)) columns, pad 114.
local function mosaic(tiles)
  local n = #tiles
  local H, W = tiles[1]:size(1), tiles[1]:size(2)
  local cols = math.ceil(math.sqrt(n))
  local rows = math.ceil(n / cols)
  local canvas = lucid.full({ rows * H, cols * W, 3 }, 114, { dtype = "u8" })
  for k, t in ipairs(tiles) do
    local r, c = math.floor((k - 1) / cols), (k - 1) % cols
    canvas:narrow(1, r * H + 1, H):narrow(2, c * W + 1, W):copy_(t)
  end
  return canvas
end

--- Write the JSON (always) and the mosaic PNG (when there are tiles).
-- Returns {json = path, png = path | nil, predictions = n, images = n}.
function VO:finish()
  os.execute("mkdir -p '" .. self.save_dir:gsub("'", "'\\''") .. "'")
  local res = { json = self.save_dir .. "/" .. self.json_name, predictions = self.predictions,
    images = self.images }
  -- the array cjson.encode writes for the entries ("[]" when empty), then a
  -- newline; a temporary file renamed into place (as predict.write_json)
  local text = #self.chunks == 0 and "[]" or ("[" .. table.concat(self.chunks, ",") .. "]")
  local tmp = res.json .. ".tmp"
  local f, err = io.open(tmp, "wb")
  if not f then error("val_output: cannot write " .. res.json .. ": " .. tostring(err), 2) end
  local ok, werr = f:write(text, "\n")
  f:close()
  if not ok then os.remove(tmp); error("val_output: cannot write " .. res.json .. ": " .. tostring(werr), 2) end
  local rok, rerr = os.rename(tmp, res.json)
  if not rok then os.remove(tmp); error("val_output: cannot write " .. res.json .. ": " .. tostring(rerr), 2) end
  self.chunks = {}
  if #self.tiles > 0 then
    local canvas = mosaic(self.tiles)
    res.png = self.save_dir .. "/" .. self.png_name
    local ok, msg = lucid.image.write_png(res.png, canvas)
    canvas:free()
    if not ok then error("val_output: " .. tostring(msg), 2) end
  end
  self:_free_tiles()
  return res
end

return M
