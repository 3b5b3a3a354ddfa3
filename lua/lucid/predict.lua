--[[
lucid.predict — run a pose model on image files: annotated PNGs and a COCO
results JSON.

  local predict = require "lucid.predict"
  local report = predict.load_weights(model, "runs/pose_nano/weights/best.safetensors")
  local res = predict.run{ model = model, ctx = ctx, sources = { "a.jpg", "dir/" },
    conf = 0.25, iou = 0.7, max_det = 300, act_dtype = "f32",
    out_dir = "runs/predict" }   -- imgsz: the checkpoint's training imgsz, else 640
  -- res.images[i] = {path, name, image_id, width, height, png, detections =
  --   { {box = {x1,y1,x2,y2}, conf, cls, kpts = {x,y,v,...}} } (original
  --   pixels), input_shape = {1, 3, S, S} (the network input), resized =
  --   {w, h} (the image inside it; the rest is padding), time = {pre,
  --   inference, post} (seconds)}; res.json = path; res.skipped[j] =
  --   {path, index, reason}: images of a folder or list that could not be
  --   decoded (each reported on stderr, the others predicted)

Preprocessing equals the validation loader's exactly (lucid.image.letterbox:
decode with the EXIF orientation, resize the long side to imgsz, LetterBox
to imgsz x imgsz with pad 114), the head is decoded by the validator's C
code (lucid.eval.decode_nms), and detections are mapped back to the
original image (undo the letterbox, clamp to the image).

predictions.json is a COCO results array: one entry per detection
{image_id, category_id = cls + 1 (1 = person), bbox = [x, y, w, h], score,
keypoints = [x, y, v] * K} (v = the keypoint confidence, as Ultralytics
writes it). image_id is the numeric file stem when it is numeric
(000000000785.jpg -> 785), else the 1-based position of the image.
]]
local lucid = require "lucid"
local recipe = require "lucid.recipe"

local predict = {}

local IMAGE_EXT = { jpg = true, jpeg = true, png = true }

local shell_quote = recipe.shell_quote

-- What a path is: "dir", "file", or nil and why it cannot be opened (the
-- system's words: "No such file or directory", "Permission denied").
local probe = recipe.path_kind

local function has_image_ext(p)
  local ext = p:match("%.([^./]+)$")
  return ext ~= nil and IMAGE_EXT[ext:lower()] == true
end

--- predict.list_sources(src, [key]) -> paths, from_folder. paths: the
-- image paths; from_folder[i] is true when paths[i] was found in a folder
-- (false: named by an entry of src). src: a path
-- (an image file or a folder) or a list of them; key (default "source")
-- names the setting in errors. A file must exist and have an extension
-- the decoder reads (.jpg, .jpeg, .png, any case); a folder gives its
-- .jpg/.jpeg/.png files sorted by name and must hold at least one (as
-- Ultralytics' "No images or videos found"). Every entry is checked here,
-- before a model is built; errors name the key, the value and why:
--   predict: source = 'README.md': not an image file (supported formats:
--     .jpg, .jpeg, .png; or a folder of them)
--   predict: source = 'x.jpg': cannot open it (No such file or directory)
--   predict: source = 'dir': no images found in the folder (supported
--     formats: .jpg, .jpeg, .png)
-- and, for a list, the whole value then the entry at fault:
--   predict: source = 'a.jpg,README.md': README.md: not an image file (...)
function predict.list_sources(src, key)
  key = key or "source"
  local list = type(src) == "table" and src or { src }
  if #list == 0 then error("predict: " .. key .. ": expected an image, a folder or a list of them, got none", 0) end
  local out, from_folder = {}, {}
  local function fail(p, why)
    local value = #list == 1 and tostring(list[1]) or table.concat(list, ",")
    error(string.format("predict: %s = '%s': %s%s", key, value, #list == 1 and "" or (tostring(p) .. ": "), why), 0)
  end
  for _, p in ipairs(list) do
    if type(p) ~= "string" then error("predict: " .. key .. " must be paths, got " .. type(p), 0) end
    local kind, why = probe(p)
    if kind == "dir" then
      local pipe = io.popen("ls -1 " .. shell_quote(p) .. " 2>/dev/null")
      local names = {}
      for name in pipe:lines() do
        if has_image_ext(name) then names[#names + 1] = name end
      end
      pipe:close()
      if #names == 0 then fail(p, "no images found in the folder (supported formats: .jpg, .jpeg, .png)") end
      table.sort(names)
      local base = p:gsub("/+$", "")
      for _, n in ipairs(names) do
        out[#out + 1] = base .. "/" .. n
        from_folder[#out] = true
      end
    elseif kind == "file" then
      if not has_image_ext(p) then
        fail(p, "not an image file (supported formats: .jpg, .jpeg, .png; or a folder of them)")
      end
      out[#out + 1] = p
      from_folder[#out] = false
    else
      fail(p, "cannot open it (" .. why .. ")")
    end
  end
  return out, from_folder
end

--- predict.split_sources(text) -> list: the entries of a comma-separated
-- source= value, each trimmed of the spaces around it ("a.jpg, b.jpg" ->
-- {"a.jpg", "b.jpg"}); empty entries are dropped.
function predict.split_sources(text)
  local out = {}
  for item in tostring(text):gmatch("[^,]+") do
    item = item:match("^%s*(.-)%s*$")
    if item ~= "" then out[#out + 1] = item end
  end
  return out
end

--- predict.check_images(paths, [key], [value]): every file of paths (the
-- list predict.list_sources returns) starts as an image the decoder reads:
-- a JPEG (FF D8 FF) or a PNG (its 8-byte signature), the same test by
-- content as lucid.image.read. Only the first bytes are read (cheap for
-- thousands of files), so a file named .jpg that is no image is refused
-- before a model is built or an output written, naming key (default
-- "source"), value (the setting as given; default the file) and the file:
--   predict: source = 'dir': dir/a.jpg: not a JPEG or PNG image (first
--     bytes 6e 6f 74 20, 10 bytes)
-- An image corrupt past its first bytes (a truncated JPEG) fails only when
-- it is decoded: predict.run skips it with a warning naming it, or raises
-- when it is the only image, named as a file.
function predict.check_images(paths, key, value)
  key = key or "source"
  for _, p in ipairs(paths) do
    local function fail(why)
      if value == nil or value == p then error(string.format("predict: %s = '%s': %s", key, p, why), 0) end
      error(string.format("predict: %s = '%s': %s: %s", key, tostring(value), p, why), 0)
    end
    local f, err = io.open(p, "rb")
    if not f then fail("cannot open it (" .. tostring(err):gsub("^.*: ", "") .. ")") end
    local head = f:read(8) or ""
    local size = #head > 0 and f:seek("end") or 0
    f:close()
    local b = { head:byte(1, 8) }
    local jpeg = b[1] == 0xFF and b[2] == 0xD8 and b[3] == 0xFF
    local png = head == "\137PNG\r\n\26\n"
    if size == 0 then fail("an empty file (0 bytes), not an image") end
    if not (jpeg or png) then
      local hex = {}
      for i = 1, math.min(#b, 4) do hex[i] = string.format("%02x", b[i]) end
      fail(string.format("not a JPEG or PNG image (first bytes %s, %d bytes)", table.concat(hex, " "), size))
    end
  end
end

-- The largest imgsz: imgsz x imgsz letterboxed images, and the engine's
-- image buffers (lucid_image_alloc) hold at most 2^31 pixels; the largest
-- multiple of 32 with imgsz^2 <= 2^31.
predict.MAX_IMGSZ = 46336

-- The imgsz when none is given and the weights carry no training imgsz
-- (Ultralytics' default imgsz).
predict.DEFAULT_IMGSZ = 640

--- predict.check_options(o): raise a clear error naming the setting and its
-- value ("predict: conf = -1: expected a confidence threshold in [0, 1]"),
-- before a model is built or a file read. o: the predict recipe's settings
-- or predict.run's options (absent keys are not checked): imgsz (a
-- multiple of 32 in [32, predict.MAX_IMGSZ], or "auto": the checkpoint's
-- training imgsz, else predict.DEFAULT_IMGSZ: predict.resolve_imgsz),
-- conf, iou, kpt_threshold (in [0, 1], Ultralytics' fraction keys), max_det (an integer in [1, 2^31 - 1]:
-- the engine counts it in a C int), every number finite; the paths
-- weights, source, out (out_dir) non-empty strings; ema a boolean; device
-- a name lucid.Context takes (recipe.is_device: cpu, cuda, cuda:N or
-- auto).
function predict.check_options(o)
  local function fail(k, want) error(string.format("predict: %s = %s: expected %s", k, recipe.show(o[k]), want), 0) end
  local function finite(v) return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge end
  for k, v in pairs(o) do
    if type(v) == "number" and not finite(v) then fail(k, "a finite number") end
    -- the thresholds are f32 in the engine: 1e-50 would be 0 there
    if type(v) == "number" and v ~= 0 and math.abs(v) < recipe.F32_MIN_NORMAL then
      fail(k, "0 or a magnitude of at least 1.1754944e-38 (the smallest normal f32; the engine computes in f32, "
        .. "where this value would be 0 or subnormal)")
    end
  end
  local S = o.imgsz
  if type(S) == "string" and S:lower() ~= "auto" then
    fail("imgsz", "a multiple of 32 (the network's largest stride), at least 32, or auto (the imgsz the weights "
      .. "were trained at, else " .. predict.DEFAULT_IMGSZ .. ")")
  end
  if S ~= nil and type(S) ~= "string" then
    if not finite(S) or S < 32 or S % 32 ~= 0 then
      fail("imgsz", "a multiple of 32 (the network's largest stride), at least 32")
    end
    if S > predict.MAX_IMGSZ then
      fail("imgsz", string.format("at most %d (the letterboxed input is imgsz x imgsz, and the engine's image "
        .. "buffers hold at most 2^31 pixels)", predict.MAX_IMGSZ))
    end
  end
  for _, k in ipairs({ "conf", "iou", "kpt_threshold" }) do
    local v = o[k]
    if v ~= nil and (not finite(v) or v < 0 or v > 1) then
      fail(k, k == "iou" and "an IoU threshold in [0, 1]" or "a confidence threshold in [0, 1]")
    end
  end
  local m = o.max_det
  if m ~= nil and (not finite(m) or m ~= math.floor(m) or m < 1) then fail("max_det", "an integer >= 1") end
  if m ~= nil and m > recipe.INT_MAX then
    fail("max_det", string.format("an integer in [1, %d] (the engine counts it in a C int)", recipe.INT_MAX))
  end
  if o.device ~= nil and not recipe.is_device(o.device) then fail("device", recipe.DEVICES) end
  for _, k in ipairs({ "weights", "source", "out", "out_dir" }) do
    local v = o[k]
    if v ~= nil and (type(v) ~= "string" or v == "") then fail(k, "a non-empty path") end
  end
  if o.ema ~= nil and type(o.ema) ~= "boolean" then fail("ema", "true or false") end
end

--- The COCO image id of a path: its numeric stem, else `index`.
function predict.image_id(path, index)
  local stem = path:match("([^/]+)$"):gsub("%.[^.]*$", "")
  if stem:match("^%d+$") then return tonumber(stem) end
  return index
end

-- The training arguments of an open safetensors file's metadata md (its
-- `config` entry, JSON), or nil when it has none. Raises naming path.
local function args_of(path, md)
  local text = md.config
  if text == nil then return nil end
  local ok, v = pcall(require("lucid.checkpoint").json_decode, text)
  if not ok or type(v) ~= "table" then
    error(string.format("predict: %s: its training arguments (metadata 'config') are not a JSON object (%s)", path,
      ok and type(v) or tostring(v)), 0)
  end
  return v
end

--- predict.train_args(path) -> table | nil: the training arguments a lucid
-- checkpoint stores (its `config` metadata: the resolved recipe settings the
-- run trained with, imgsz among them; Ultralytics' ckpt["train_args"]); nil
-- for a file without them (a model:save file, a PyTorch safetensors file).
-- Raises naming the file when it does not open or `config` is not a JSON
-- object.
function predict.train_args(path)
  if not (lucid.io and lucid.io.safetensors_open) then error("predict: lucid.io is not available", 2) end
  local f = lucid.io.safetensors_open(path)
  local md = f:metadata()
  f:close()
  return args_of(path, md)
end

--- predict.train_imgsz(args, [path]) -> imgsz | nil: args.imgsz of training
-- arguments (predict.train_args), or nil when args is nil or holds none. A
-- value prediction cannot use (not a multiple of 32 in [32,
-- predict.MAX_IMGSZ]) is an error naming path (default "the weights"), the
-- value and the way out:
--   predict: w.safetensors: the imgsz of its training arguments (metadata
--     'config') is 100: expected a multiple of 32 ...; give imgsz= to choose
function predict.train_imgsz(args, path)
  local v = args and args.imgsz
  if v == nil then return nil end
  local ok, err = pcall(predict.check_options, { imgsz = type(v) == "number" and v or recipe.show(v) })
  if not ok or type(v) ~= "number" then
    local why = tostring(err):match(": expected (.*)$") or "expected a number"
    if ok then why = "a multiple of 32 (a number)" end
    error(string.format("predict: %s: the imgsz of its training arguments (metadata 'config') is %s: expected %s; "
      .. "give imgsz= to choose one", path or "the weights", recipe.show(v), why), 0)
  end
  return v
end

--- predict.is_auto(v) -> whether v is the string "auto", in any case.
function predict.is_auto(v) return type(v) == "string" and v:lower() == "auto" end

--- predict.resolve_imgsz(imgsz, [train_imgsz]) -> S, from: the network
-- input side (pixels) prediction uses. imgsz (a number) always wins (from =
-- "imgsz"); nil or "auto" takes train_imgsz, the imgsz the weights were
-- trained at (predict.train_imgsz; from = "weights"), else
-- predict.DEFAULT_IMGSZ = 640 (from = "default"), as Ultralytics predicts at
-- the checkpoint's train_args imgsz.
function predict.resolve_imgsz(imgsz, train_imgsz)
  if imgsz ~= nil and not predict.is_auto(imgsz) then return imgsz, "imgsz" end
  if train_imgsz ~= nil then return train_imgsz, "weights" end
  return predict.DEFAULT_IMGSZ, "default"
end

--- predict.load_weights(model, path, [opts]) -> report. Loads a model file
-- (model:save) or a training checkpoint (lucid.checkpoint): the plain
-- tensors first (model:load with strict = false), then, when the file has
-- EMA tensors (ema.<name>) and opts.ema ~= false, the EMA weights over them
-- — the weights validation used. report = {loaded, ema (bool), ema_loaded,
-- missing = {names}, mismatched = {...}, unexpected = {names other than
-- ema./optimizer./grad. entries}, train_args (predict.train_args: the
-- checkpoint's training arguments, or nil), imgsz (the imgsz it was trained
-- at, or nil when it has none or one prediction cannot use: then
-- predict.train_imgsz(report.train_args, path) raises naming it)}.
-- model.train_args is set to report.train_args (nil for a file without
-- them): predict.run without an imgsz predicts at its imgsz.
function predict.load_weights(model, path, opts)
  opts = require("lucid.nn.util").check_options("predict.load_weights", opts, { "ema", "partial" })
  if not (lucid.io and lucid.io.safetensors_open) then error("predict: lucid.io is not available", 2) end
  local rep = model:load(path, { strict = false })
  local unexpected, has_ema = {}, false
  for _, n in ipairs(rep.unexpected) do
    local pre = n:match("^([%a_]+)%.")
    if pre == "ema" then has_ema = true
    elseif pre ~= "optimizer" and pre ~= "grad" then unexpected[#unexpected + 1] = n end
  end
  rep.unexpected = unexpected
  -- a file for another architecture or scale is an error, not a model left
  -- mostly at its initial values (opts.partial = true allows it)
  if not opts.partial then
    local misfit = predict.misfit(rep)
    if misfit then
      error(string.format("predict: %s does not fit this model: %s; build the model with the architecture and "
        .. "scale the weights were trained with, or pass partial = true to load only the tensors that fit", path,
        misfit), 0)
    end
  end
  rep.ema, rep.ema_loaded = false, 0
  local f = lucid.io.safetensors_open(path)
  local ok, err = pcall(function()
    rep.train_args = args_of(path, f:metadata())
    -- a bad stored imgsz is raised only where it would be used (no imgsz given)
    local iok, imgsz = pcall(predict.train_imgsz, rep.train_args, path)
    rep.imgsz = iok and imgsz or nil
    if has_ema and opts.ema ~= false then
      for _, p in ipairs(model.params:list()) do
        local info = f:info("ema." .. p.name)
        if info and table.concat(info.shape, ",") == table.concat(p.shape, ",") then
          f:load("ema." .. p.name, p:data())
          rep.ema_loaded = rep.ema_loaded + 1
        end
      end
    end
  end)
  f:close()
  if not ok then error(err, 0) end
  rep.ema = rep.ema_loaded > 0
  model.train_args = rep.train_args
  return rep
end

--- predict.misfit(report) -> nil when a load report (model:load,
-- predict.load_weights) has no missing or mis-shaped tensor, else what did
-- not fit: "N tensors missing (names), M of another shape (names)" (five
-- names each at most). The callers add the hint their users can act on
-- (predict_pose: "check model= and scale="; the library: partial = true).
function predict.misfit(rep)
  if #rep.missing == 0 and #rep.mismatched == 0 then return nil end
  local function names(list)
    local t = {}
    for i = 1, math.min(#list, 5) do
      local e = list[i]
      t[i] = type(e) == "table" and (e.name or e[1]) or tostring(e)
    end
    return table.concat(t, ", ") .. (#list > 5 and string.format(", ... (%d more)", #list - 5) or "")
  end
  local function count(n, what) return string.format("%d %s%s", n, what, n == 1 and "" or "s") end
  local parts = {}
  if #rep.missing > 0 then parts[#parts + 1] = count(#rep.missing, "tensor") .. " missing (" .. names(rep.missing) .. ")" end
  if #rep.mismatched > 0 then
    parts[#parts + 1] = count(#rep.mismatched, "tensor") .. " of another shape (" .. names(rep.mismatched) .. ")"
  end
  return table.concat(parts, ", ")
end

--- Map one detection (network-input pixels) back to the original image of
-- geometry g (lucid.image.geometry or the letterbox returns). Returns a new
-- detection table; coordinates are clamped to [0, w] x [0, h].
function predict.unletterbox(det, g)
  local rx, ry, px, py, w, h = g.rx, g.ry, g.pad_x, g.pad_y, g.w, g.h
  local function X(x) x = (x - px) / rx; return x < 0 and 0 or (x > w and w or x) end
  local function Y(y) y = (y - py) / ry; return y < 0 and 0 or (y > h and h or y) end
  local b = det.box
  local out = { conf = det.conf, cls = det.cls, box = { X(b[1]), Y(b[2]), X(b[3]), Y(b[4]) } }
  if det.kpts then
    local k = {}
    for i = 1, #det.kpts, 3 do
      k[i], k[i + 1], k[i + 2] = X(det.kpts[i]), Y(det.kpts[i + 1]), det.kpts[i + 2]
    end
    out.kpts = k
  end
  return out
end

local function round(x, d)
  local m = 10 ^ d
  return math.floor(x * m + 0.5) / m
end

--- COCO results entries of one image's detections (original pixels).
function predict.coco_entries(image_id, dets, out)
  out = out or {}
  for _, d in ipairs(dets) do
    local b = d.box
    local e = {
      image_id = image_id,
      category_id = (d.cls or 0) + 1,
      bbox = { round(b[1], 3), round(b[2], 3), round(b[3] - b[1], 3), round(b[4] - b[2], 3) },
      score = round(d.conf, 5),
    }
    if d.kpts then
      local k = {}
      for i = 1, #d.kpts, 3 do
        k[i], k[i + 1], k[i + 2] = round(d.kpts[i], 3), round(d.kpts[i + 1], 3), round(d.kpts[i + 2], 5)
      end
      e.keypoints = k
    end
    out[#out + 1] = e
  end
  return out
end

--- Write a COCO results array to path (temporary file + rename, so a
-- failed write never leaves half a file). Raises naming the path.
function predict.write_json(path, entries)
  local cjson = require "cjson"
  local text = #entries == 0 and "[]" or cjson.encode(entries)
  local tmp = path .. ".tmp"
  local f, err = io.open(tmp, "wb")
  if not f then error("predict: cannot write " .. path .. ": " .. tostring(err), 2) end
  local ok, werr = f:write(text, "\n")
  f:close()
  if not ok then os.remove(tmp); error("predict: cannot write " .. path .. ": " .. tostring(werr), 2) end
  local rok, rerr = os.rename(tmp, path)
  if not rok then os.remove(tmp); error("predict: cannot write " .. path .. ": " .. tostring(rerr), 2) end
end

local RUN_KEYS = { model = true, ctx = true, sources = true, imgsz = true, conf = true, iou = true,
  max_det = true, act_dtype = true, out_dir = true, save = true, kpt_threshold = true,
  names = true, on_image = true, on_skip = true }

local function device_of(model)
  local list = model.params and model.params:list()
  if not list or #list == 0 then error("predict: model is not materialised", 3) end
  return list[1]:data():device()
end

--- predict.read_error(path, msg) -> the decoder's reason without the path
-- it starts with: lucid.image.read's "<path>: corrupt or truncated JPEG:
-- Premature end of JPEG file" -> "corrupt or truncated JPEG: Premature end
-- of JPEG file".
function predict.read_error(path, msg)
  local why = tostring(msg)
  if why:sub(1, #path + 2) == path .. ": " then why = why:sub(#path + 3) end
  return why
end

--- predict.warn_skipped(skip, i, n): the default predict.run on_skip: one
-- line on stderr naming the image, its place and the decoder's reason, as
-- Ultralytics warns of an image it cannot read:
--   WARNING: predict: skipping image 2/3 dir/b.jpg: corrupt or truncated
--     JPEG: Premature end of JPEG file
function predict.warn_skipped(skip, i, n)
  io.stdout:flush() -- the image lines before it keep their order in a shared log
  io.stderr:write(string.format("WARNING: predict: skipping image %d/%d %s: %s\n", i, n, skip.path, skip.reason))
end

--- predict.run(opts) -> {images = {...}, skipped = {...}, json = path | nil,
-- out_dir, entries}.
-- Before the model runs: the sources are listed (predict.list_sources) and
-- their first bytes checked (predict.check_images), and out_dir is made
-- (a file in the way, or a folder mkdir cannot make, is an error naming
-- out_dir, never mkdir's raw output). An image that fails to decode later
-- (corrupt past its first bytes: a truncated JPEG) is skipped when the
-- sources hold more than one image or a folder (as Ultralytics skips an
-- image it cannot read): skipped[j] = {path, index (its place in the
-- sources, 1-based), reason (the decoder's message)}, on_skip(skip, i, n)
-- is called (default predict.warn_skipped: one line on stderr), and the
-- other images are predicted. Errors: the only image, named as a file,
-- that cannot be decoded ("predict: cannot read image a.jpg: corrupt or
-- truncated JPEG: ..."), and sources none of whose images could be decoded
-- ("predict: none of the 2 images could be read (the first, dir/a.jpg:
-- ...); predictions.json was not written"; a folder of one: "the only
-- image could not be read (...)"). predictions.json is written
-- when every image is done (atomically: predict.write_json), with the
-- predicted images only.
-- opts: model (required), ctx, sources (path or list, required), imgsz
-- (nil or "auto": model.train_args.imgsz, the imgsz predict.load_weights
-- found in the checkpoint, else 640; predict.resolve_imgsz), conf (0.25),
-- iou (0.7), max_det (300), act_dtype ("f32"; "bf16" or "f16" on a GPU),
-- out_dir (required unless save = false), save (true: write PNGs and
-- predictions.json), kpt_threshold (0.5, drawing only), names
-- ({"person"}), on_image (function(result, i, n) after each image; i its
-- place in the n sources), on_skip (function(skip, i, n) for each image
-- skipped).
function predict.run(opts)
  assert(type(opts) == "table", "predict.run: opts must be a table")
  for k in pairs(opts) do
    if not RUN_KEYS[k] then error("predict.run: unknown option '" .. tostring(k) .. "'", 2) end
  end
  local model = opts.model or error("predict.run: model is required", 2)
  predict.check_options({ imgsz = opts.imgsz, conf = opts.conf, iou = opts.iou, max_det = opts.max_det,
    kpt_threshold = opts.kpt_threshold, out_dir = opts.out_dir })
  -- an explicit imgsz wins; else the one the weights were trained at
  local auto = opts.imgsz == nil or predict.is_auto(opts.imgsz)
  local S = predict.resolve_imgsz(opts.imgsz, auto and predict.train_imgsz(model.train_args, "model.train_args") or nil)
  local save = opts.save ~= false
  local out_dir = opts.out_dir
  if save and not out_dir then error("predict.run: out_dir is required (or save = false)", 2) end
  local paths, from_folder = predict.list_sources(opts.sources or error("predict.run: sources is required", 2),
    "sources")
  predict.check_images(paths, "sources", type(opts.sources) == "table" and table.concat(opts.sources, ",")
    or opts.sources)
  -- one image named as a file: an image it cannot read is an error, not a skip
  local single_file = #paths == 1 and not from_folder[1]
  local on_skip = opts.on_skip or predict.warn_skipped
  if save then
    recipe.check_folder(out_dir, "out_dir", "predict")
    recipe.make_folder(out_dir, "out_dir", "predict")
  end
  local names = opts.names or { "person" }
  local ctx = opts.ctx
  local device = device_of(model)
  local x = lucid.empty({ 1, 3, S, S }, { ctx = ctx, device = device, dtype = opts.act_dtype or "f32" })
  local nms = { imgsz = S, conf = opts.conf or 0.25, iou = opts.iou or 0.7, max_det = opts.max_det or 300 }
  local was_training = model.training
  model:eval()
  local res = { images = {}, skipped = {}, out_dir = out_dir }
  local entries = {}
  local used = {}

  -- Image i of the sources (at path): decoded, predicted, drawn; its result
  -- appended to res.images, or, when it cannot be decoded, the skip to
  -- res.skipped.
  local function predict_one(i, path)
    local t0 = lucid.wall_time()
    local img, msg = lucid.image.read(path, ctx)
    if not img then
      -- corrupt past its first bytes (predict.check_images passed it)
      local why = predict.read_error(path, msg)
      if single_file then error(string.format("predict: cannot read image %s: %s", path, why), 0) end
      local skip = { path = path, index = i, reason = why }
      res.skipped[#res.skipped + 1] = skip
      on_skip(skip, i, #paths)
      return
    end
    local H, W = img:size(1), img:size(2)
    local lb, rx, px, py, ry = lucid.image.letterbox(img, S)
    local chw = lb:permute(3, 1, 2):contiguous()
    x:copy_(chw:view({ 1, 3, S, S }))
    x:mul_(1 / 255)
    chw:free()
    lb:free()
    local t1 = lucid.wall_time()
    local o = model:forward(x)
    if ctx then ctx:synchronize() end
    local t2 = lucid.wall_time()
    local raw = lucid.eval.decode_nms(o.boxes, o.scores, o.kpts, nms)
    local g = { rx = rx, ry = ry, pad_x = px, pad_y = py, w = W, h = H }
    local dets = {}
    for k, d in ipairs(raw) do dets[k] = predict.unletterbox(d, g) end
    local stem = path:match("([^/]+)$"):gsub("%.[^.]*$", "")
    local name = stem
    local n = 2
    while used[name] do name = stem .. "_" .. n; n = n + 1 end
    used[name] = true
    local geo = lucid.image.geometry(W, H, S)
    local r = { path = path, name = name, image_id = predict.image_id(path, i), width = W, height = H,
      input_shape = { 1, 3, S, S }, resized = { geo.uw, geo.uh }, detections = dets }
    if save then
      lucid.image.draw_pose(img, dets, { kpt_threshold = opts.kpt_threshold or 0.5, names = names })
      r.png = out_dir .. "/" .. name .. ".png"
      assert(lucid.image.write_png(r.png, img))
    end
    img:free()
    predict.coco_entries(r.image_id, dets, entries)
    local t3 = lucid.wall_time()
    r.time = { pre = t1 - t0, inference = t2 - t1, post = t3 - t2 }
    res.images[#res.images + 1] = r
    if opts.on_image then opts.on_image(r, i, #paths) end
  end

  local ok, err = pcall(function()
    for i, path in ipairs(paths) do predict_one(i, path) end
  end)
  x:free()
  model:train(was_training ~= false)
  if not ok then error(err, 0) end
  if #res.images == 0 then
    local first = res.skipped[1]
    local what = #paths == 1 and "the only image could not be read (" or
      string.format("none of the %d images could be read (the first, ", #paths)
    local note = ""
    if save then
      local old = io.open(out_dir .. "/predictions.json", "rb")
      note = "; predictions.json was not written" .. (old and " (the one already in " .. out_dir
        .. " is left as it was)" or "")
      if old then old:close() end
    end
    error(string.format("predict: %s%s: %s)%s", what, first.path, first.reason, note), 0)
  end
  if save then
    res.json = out_dir .. "/predictions.json"
    predict.write_json(res.json, entries)
  end
  res.entries = entries
  return res
end

return predict
