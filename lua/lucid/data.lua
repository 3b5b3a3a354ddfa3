--[[
lucid.data — the Lua side of the data pipeline.

  local data = require "lucid.data"
  local desc = data.load_descriptor("coco_pose_mini")   -- datasets/coco_pose_mini.lua
  local train = assert(data.open(desc, "train", {imgsz = 640}))
  local loader = data.loader(train, {batch = 16, threads = 4, seed = 0})
  local aug = data.schedule({close_mosaic = 10}, 100)    -- table or function of epoch
  for epoch = 0, 99 do
    for batch in data.batches(loader, epoch, aug(epoch)) do ... end
  end

Epochs are 0-based (as the reference trainer counts them) and seed the
per-sample randomness together with the sample index; dataset indices seen
from Lua are 1-based.

Augmentation tables use the Ultralytics names: mosaic, degrees, translate,
scale, shear, perspective, flipud, fliplr, hsv_h, hsv_s, hsv_v, plus
augment (false = validation letterbox only), hsv_on_cpu (false when the
device applies HSV from batch.hsv) and close_mosaic (schedule only).
Unknown keys are errors.

Errors: opening a dataset returns nil, message (naming the file and line)
on an environmental failure; misuse raises.
]]

local lucid = require "lucid"
local C = lucid.data

local data = {}

-- The C API (lucid.data): open_yolo, open_coco, read_yaml, decode, Loader.
for k, v in pairs(C) do data[k] = v end

-- Pose training defaults (cfg/default.yaml; reference doc §3.1, §4.2).
data.defaults = {
  augment = true,
  mosaic = 1.0, degrees = 0.0, translate = 0.1, scale = 0.5, shear = 0.0,
  perspective = 0.0, flipud = 0.0, fliplr = 0.5,
  hsv_h = 0.015, hsv_s = 0.7, hsv_v = 0.4,
  hsv_on_cpu = true,
  close_mosaic = 10,
}

-- Validation: letterbox only.
data.val = { augment = false }

local AUG_KEYS = {}
for k in pairs(data.defaults) do AUG_KEYS[k] = true end

local function copy(t)
  local r = {}
  for k, v in pairs(t) do r[k] = v end
  return r
end

local function merge(base, over, what)
  local r = copy(base)
  for k, v in pairs(over or {}) do
    if not AUG_KEYS[k] then
      error(string.format("%s: unknown augmentation key '%s'", what, tostring(k)), 3)
    end
    r[k] = v
  end
  return r
end

--[[ data.schedule(spec, epochs) -> function(epoch) -> augmentation table

spec is either
  - a table of augmentation values (merged over data.defaults); its
    close_mosaic = N switches mosaic off from epoch `epochs - N` on, exactly
    as the reference: the switch happens when epoch == epochs - N, so with
    epochs < N mosaic stays on throughout and with epochs == N it is off from
    epoch 0; close_mosaic = 0 never switches;
  - a function(epoch, epochs) returning such a table (merged over the
    defaults; close_mosaic is then not applied — the function decides).
]]
function data.schedule(spec, epochs)
  assert(type(epochs) == "number" and epochs >= 1, "schedule: epochs must be >= 1")
  if type(spec) == "function" then
    return function(epoch)
      local t = spec(epoch, epochs)
      if type(t) ~= "table" then
        error("schedule function must return a table, got " .. type(t), 2)
      end
      return merge(data.defaults, t, "schedule(" .. epoch .. ")")
    end
  end
  local base = merge(data.defaults, spec or {}, "schedule")
  local n = base.close_mosaic or 0
  local switch = epochs - n
  return function(epoch)
    local t = copy(base)
    if n > 0 and switch >= 0 and epoch >= switch then t.mosaic = 0.0 end
    return t
  end
end

-- Is mosaic closed at this epoch? (for logging "Closing dataloader mosaic")
function data.mosaic_closed(schedule_fn, epoch)
  return schedule_fn(epoch).mosaic == 0
end

--------------------------------------------------------------- descriptors

local function file_exists(p)
  local f = io.open(p, "r")
  if f then f:close() return true end
  return false
end

local function dir_exists(p)
  -- a directory can be opened for reading on Linux; reading fails
  local f = io.open(p, "r")
  if not f then return false end
  local ok, _, code = f:read(1)
  f:close()
  return ok == nil and code == 21
end

-- Root of the repository (the folder holding lua/lucid/data.lua's lua/).
local function repo_root()
  local src = debug.getinfo(1, "S").source
  if src:sub(1, 1) ~= "@" then return "." end
  local dir = src:sub(2):match("^(.*)/lua/lucid/[^/]*$")
  return dir or "."
end
data.repo_root = repo_root

-- The datasets folders, in search order: $LUCID_DATASETS, then
-- ../shared/datasets and datasets/ relative to the working directory and to
-- the repository root (lucid's Ultralytics DATASETS_DIR).
local function dataset_roots()
  local roots = {}
  local env = os.getenv("LUCID_DATASETS")
  if env and env ~= "" then roots[#roots + 1] = env end
  local rr = repo_root()
  -- the repository root only when it is not the working directory itself
  -- (else each folder would be searched, and named in the error, twice)
  local bases = { "." }
  if rr ~= "." and rr ~= os.getenv("PWD") then bases[2] = rr end
  for _, base in ipairs(bases) do
    roots[#roots + 1] = base .. "/../shared/datasets"
    roots[#roots + 1] = base .. "/datasets"
  end
  return roots
end

--[[ data.find_dataset(name) -> folder | nil, searched
Looks for <name> (a folder, e.g. "coco-pose-mini") in $LUCID_DATASETS, then
../shared/datasets, then datasets/ — relative to the working directory and
to the repository root. ]]
function data.find_dataset(name)
  local searched, seen = {}, {}
  for _, r in ipairs(dataset_roots()) do
    local p = r .. "/" .. name
    if not seen[p] then
      seen[p] = true
      searched[#searched + 1] = p
      if dir_exists(p .. "/images") then return p end
    end
  end
  return nil, table.concat(searched, ", ") .. " (set LUCID_DATASETS to the folder that holds " .. name .. ")"
end

--[[ data.load_yaml(file) -> descriptor
An Ultralytics data YAML (e.g. coco8-pose.yaml), read with libyaml
(lucid.data.read_yaml) and resolved as Ultralytics' check_det_dataset does:
  path   the dataset root. Absent: the YAML's folder. Relative: relative to
         the working directory when it exists there, else to the datasets
         folder (Ultralytics' DATASETS_DIR; here the first of
         $LUCID_DATASETS, ../shared/datasets, datasets/ that has it).
  train, val   required; image folders relative to path (absolute ones as
         they are); when path/x does not exist and x starts with "../",
         path/x-without-"../" (Ultralytics' rule). Lists of folders and
         image-list .txt files are not supported (one folder per split).
  kpt_shape    required, [K, 2|3] (the pose models need it).
  flip_idx     0-based keypoint permutation of a horizontal flip; absent:
         horizontal flips are off (Ultralytics disables fliplr).
  names  a list or a mapping {id: name} of the ids 0..n-1; nc (when given)
         must agree; only nc: class_0 .. class_{nc-1}.
A bare file name not found in the working directory is looked for in the
repository's datasets/ too.
Returns {name = file, yaml = file, descriptor_file = file, path (the
resolved root), train, val (relative to path, or absolute), kpt_shape,
flip_idx, names, nc}. Errors name the file and the key:
"data YAML <file>: 'val' = images/va: <p> does not exist"; libyaml's
syntax errors name the file and line. ]]
function data.load_yaml(file)
  if not file_exists(file) and not file:find("/", 1, true) then
    -- a bare name: also the repository's datasets/ (as Ultralytics finds
    -- coco8-pose.yaml in its own cfg/datasets)
    local p = repo_root() .. "/datasets/" .. file
    if file_exists(p) then file = p end
  end
  if not file_exists(file) then
    error(string.format("data YAML %s: file not found", file), 0)
  end
  local y, err = C.read_yaml(file)
  if not y then error("data YAML " .. tostring(err), 0) end
  local function bad(key, fmt, ...)
    error(string.format("data YAML %s: '%s' %s", file, key, string.format(fmt, ...)), 0)
  end
  -- the dataset root
  local root
  -- YAML's null spellings (the reader returns scalars as written): absent, as Ultralytics reads them
  local nulls = { ["~"] = true, null = true, Null = true, NULL = true }
  if y.path ~= nil and nulls[y.path] then y.path = nil end
  if y.path == nil or y.path == "" then
    root = y.dir
  elseif y.path:sub(1, 1) == "/" or dir_exists(y.path) then
    root = y.path
  else
    local tried = { y.path .. " (working directory)" }
    for _, r in ipairs(dataset_roots()) do
      local p = r .. "/" .. y.path
      if dir_exists(p) then root = p break end
      tried[#tried + 1] = p
    end
    if not root then
      bad("path", "= %s: no such folder (tried %s; set LUCID_DATASETS to the folder that holds it)", y.path,
        table.concat(tried, ", "))
    end
  end
  if not dir_exists(root) then bad("path", "= %s: no such folder", tostring(y.path or root)) end
  local d = { name = file, yaml = file, descriptor_file = file, path = root }
  for _, split in ipairs({ "train", "val" }) do
    local rel = y[split]
    if rel == nil or rel == "" then
      bad(split, "is missing ('train' and 'val' are required in a data YAML)")
    end
    local p = rel:sub(1, 1) == "/" and rel or (root .. "/" .. rel)
    if not dir_exists(p) and rel:sub(1, 3) == "../" then rel, p = rel:sub(4), root .. "/" .. rel:sub(4) end
    if not dir_exists(p) then
      if file_exists(p) then
        bad(split, "= %s: %s is a file; lucid reads a folder of images per split (image-list files are "
          .. "not supported)", rel, p)
      end
      bad(split, "= %s: %s does not exist (path = %s)", rel, p, root)
    end
    d[split] = rel -- relative to path (or absolute), as in a .lua descriptor
  end
  if not y.kpt_shape then
    bad("kpt_shape", "is missing (a pose data YAML gives kpt_shape: [K, 3], e.g. [17, 3] for COCO keypoints)")
  end
  d.kpt_shape = y.kpt_shape
  d.flip_idx = y.flip_idx
  d.names = y.names
  d.nc = y.nc
  return d
end

--[[ data.load_descriptor(name_or_path) -> descriptor table
A descriptor is a Lua file returning { name, path, train, val, kpt_shape,
flip_idx (0-based), names, coco_json = {split = file} (optional), yaml
(optional: an Ultralytics data YAML that supplies the fields) }. name may be
"coco_pose_mini" (datasets/coco_pose_mini.lua), a path to a .lua file, or a
path to an Ultralytics data YAML (.yaml / .yml; see data.load_yaml). ]]
function data.load_descriptor(name)
  if type(name) ~= "string" or name == "" then
    error("data: expected a dataset name, a descriptor .lua or a data .yaml path, got " .. tostring(name), 0)
  end
  if name:match("%.ya?ml$") then return data.load_yaml(name) end
  local cands = {}
  if name:match("%.lua$") or name:find("/", 1, true) then
    cands[1] = name:match("%.lua$") and name or (name .. ".lua") -- a path: that file only
  else
    cands[1] = "datasets/" .. name .. ".lua"
    cands[2] = repo_root() .. "/datasets/" .. name .. ".lua"
  end
  for _, p in ipairs(cands) do
    if file_exists(p) then
      local chunk, err = loadfile(p)
      if not chunk then error("dataset descriptor " .. p .. ": " .. err, 2) end
      local d = chunk()
      if type(d) ~= "table" then
        error("dataset descriptor " .. p .. " must return a table", 2)
      end
      d.descriptor_file = p
      return d
    end
  end
  error("dataset descriptor '" .. name .. "' not found (tried " .. table.concat(cands, ", ")
    .. "; data= takes a descriptor name of datasets/, the path of a descriptor .lua file or of an "
    .. "Ultralytics data .yaml)", 0)
end

local OPEN_KEYS = { imgsz = true, cache = true, policy = true, max_reject_fraction = true,
                    exif_labels = true, threads = true, ctx = true, format = true }

--[[ data.open(desc, split, opts) -> Dataset | nil, message
split is "train" or "val". opts: imgsz, cache, policy ("skip"|"fail"),
max_reject_fraction, exif_labels ("display"|"stored"), threads (scan),
format ("yolo" | "coco": COCO JSON when the descriptor has one for the
split; default "yolo"), ctx. kpt_shape, flip_idx and nc come from the
descriptor (or its data YAML). ]]
function data.open(desc, split, opts)
  opts = opts or {}
  for k in pairs(opts) do
    if not OPEN_KEYS[k] then error("data.open: unknown option '" .. tostring(k) .. "'", 2) end
  end
  local d = copy(desc)
  if d.yaml and d.descriptor_file ~= d.yaml then
    -- a .lua descriptor that takes the fields it lacks from a data YAML
    local ok, y = pcall(data.load_yaml, d.yaml)
    if not ok then return nil, y end
    for k, v in pairs(y) do if d[k] == nil then d[k] = v end end
  end
  if not d.path then
    return nil, string.format("dataset %s: folder not found (%s)", tostring(d.name),
                              tostring(d.searched or "no path"))
  end
  local rel = d[split]
  if not rel then return nil, string.format("dataset %s has no split '%s'", tostring(d.name), split) end
  local images = rel:sub(1, 1) == "/" and rel or (d.path .. "/" .. rel)
  local o = {}
  for k, v in pairs(opts) do if k ~= "format" then o[k] = v end end
  o.kpt_shape = d.kpt_shape
  o.flip_idx = d.flip_idx
  o.nc = d.names and #d.names or d.nc or 1
  if opts.format == "coco" then
    local json = d.coco_json and d.coco_json[split]
    if not json then
      return nil, string.format("dataset %s has no COCO JSON for split '%s'", tostring(d.name), split)
    end
    if json:sub(1, 1) ~= "/" then json = d.path .. "/" .. json end
    return C.open_coco(json, images, o)
  end
  return C.open_yolo(images, o)
end

local LOADER_KEYS = { batch = true, imgsz = true, max_gt = true, threads = true, prefetch = true,
                      shuffle = true, drop_last = true, seed = true, ctx = true }

-- data.loader(dataset, opts) -> Loader (persistent worker threads; threads = 0:
-- none, each batch is made in the calling thread by loader:next(), with the
-- same bytes as any thread count).
function data.loader(ds, opts)
  for k in pairs(opts or {}) do
    if not LOADER_KEYS[k] then error("data.loader: unknown option '" .. tostring(k) .. "'", 2) end
  end
  return C.Loader(ds, opts or {})
end

--[[ for batch in data.batches(loader, epoch, aug) do ... end
Starts the epoch and yields batch tables: images u8 [B,3,S,S] (RGB), cls
f32 [B,G], boxes f32 [B,G,4] (cx cy w h / S), kpts f32 [B,G,K,3] (x/S,
y/S, v), mask u8 [B,G], counts i32 [B], hsv f32 [B,3], n (real images),
overflow / max_count (images over max_gt), sample_index (1-based, 0 = pad).
The tensors are views of the loader's buffers, valid until the next batch. ]]
function data.batches(loader, epoch, aug)
  loader:start_epoch(epoch, aug or data.defaults)
  return function()
    return loader:next()
  end
end

return data
