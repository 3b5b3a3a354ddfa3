--[[
lucid.trainer — fit a pose model with the reference training mechanics
(Ultralytics 8.4 BaseTrainer / PoseTrainer): warmup, gradient accumulation
to the nominal batch, gradient-norm clipping, mixed precision, EMA, the
learning-rate schedule, the augmentation schedule (close_mosaic),
validation after every epoch on the EMA weights, last/best checkpoints by
the reference fitness, resume, and callbacks.

  local Trainer = require "lucid.trainer"
  local trainer = Trainer.new(cfg)              -- cfg: a resolved recipe table
  local model = build{..., ctx = trainer.ctx}   -- on the trainer's device
  trainer:add_callback("on_epoch_end", function(tr, ev) ... end)
  local results = trainer:fit(model)

Events (each callback gets (trainer, event_table)): on_fit_start,
on_epoch_start, on_batch_end, on_val_end, on_epoch_end, on_fit_end,
on_fit_error. A callback is bound to the fit it was added for unless added
with {persistent = true}: a later fit of another model never calls a stale
callback (the error hook included).

Checkpoints: weights/last.safetensors every save_period epochs (and at the
end; save_period 0: only at the end), and weights/best.safetensors from the
same snapshot when the fitness improved (last is written with it); the
training loop only takes the snapshot (checkpoint.save with
async = true), a background thread writes the files, and fit returns after
they are on disk (a failed write raises, naming the file). A callback that
reads the files with anything but lucid (which waits by itself) should call
require("lucid.checkpoint").wait() first.

Failure path: any error during fit releases the loaders, the loss plans and
the validator, waits for the queued checkpoint writes, leaves the last
checkpoint on disk intact (checkpoints are written atomically), calls
on_fit_error, and re-raises the ORIGINAL error (cleanup errors are reported
on stderr, never raised over it). Ctrl-C under luajit is such an error
("interrupted!", raised where the Lua code was): the checkpoints already
queued are on disk when fit re-raises it, and recipe.run prints it as
"<recipe>: interrupted (Ctrl-C); ..." (a second Ctrl-C kills the process).
SIGTERM (kill, timeout, a job scheduler) takes the same path: while fit runs,
lucid.signal records it (only when its disposition is the default), and
the loop raises "interrupted! (SIGTERM)" (Trainer.stop_error) at the next
training step, validation batch or epoch start; recipe.run prints
"<recipe>: interrupted (SIGTERM); ..." and exits with status 143 (a second
SIGTERM kills the process).

Resume never goes back in time silently: a resume from a checkpoint with
fewer completed epochs than the run folder's weights/last.safetensors (an
older copy) is refused before anything in the folder is written
(Trainer.check_resume_progress).
]]
local lucid = require "lucid"
local recipe = require "lucid.recipe"
local data = require "lucid.data"
local progress = require "lucid.progress"
local results_csv = require "lucid.results"
local checkpoint = require "lucid.checkpoint"
local step_mod = require "lucid.step"
local recorded_step = require "lucid.recorded_step"
local val_output = require "lucid.val_output"
local nn_util = require "lucid.nn.util"

local Trainer = {}
Trainer.__index = Trainer

-- training steps between two full Lua garbage collections (see the loop);
-- LUCID_GC_EVERY=n (read once, a whole number >= 1) for A/B runs, default 8
local GC_EVERY = tonumber(os.getenv("LUCID_GC_EVERY") or "")
if not GC_EVERY or GC_EVERY < 1 or GC_EVERY % 1 ~= 0 then GC_EVERY = 8 end

local EVENTS = { on_fit_start = true, on_epoch_start = true, on_batch_end = true, on_val_end = true,
                 on_epoch_end = true, on_fit_end = true, on_fit_error = true }


--- Trainer.new(cfg) -> trainer. Creates the context (device cfg.device,
-- seed cfg.seed). cfg keys used: see recipes/pose_nano.lua (its defaults
-- table; `luajit recipes/pose_nano.lua --help` lists them); the ones without
-- a fallback are required, and Trainer.check_config names every missing one.
function Trainer.new(cfg)
  assert(type(cfg) == "table", "Trainer.new: cfg must be a table")
  Trainer.check_config(cfg)
  local ctx = lucid.Context{ device = recipe.device_name(cfg.device) or "auto", seed = cfg.seed or 0 }
  local self = setmetatable({ cfg = cfg, ctx = ctx, callbacks = {}, fit_id = 0 }, Trainer)
  self.device = ctx:device()
  self.on_gpu = self.device:sub(1, 4) == "cuda"
  local prec = cfg.precision or "auto"
  if prec == "auto" then prec = self.on_gpu and "bf16" or "fp32" end
  local act = ({ bf16 = "bf16", fp16 = "f16", fp32 = "f32" })[prec]
  if not act then error("trainer: precision = " .. tostring(prec) .. ": expected auto, bf16, fp16 or fp32", 0) end
  if not self.on_gpu and prec ~= "fp32" then
    error("trainer: precision " .. prec .. " needs a GPU; the CPU trains in fp32", 2)
  end
  self.precision, self.act_dtype = prec, act
  return self
end

-- The largest imgsz: the engine's image buffers (lucid_image_alloc) hold at
-- most 2^31 pixels, and training's mosaic canvas is 2 x imgsz on a side
-- (a rotation, shear or perspective warp materialises it), so
-- (2 * imgsz)^2 <= 2^31; the largest multiple of 32 below that. Prediction
-- and validation letterbox to imgsz x imgsz (lucid.predict.MAX_IMGSZ).
Trainer.MAX_IMGSZ = 23168
--- The training steps between two full Lua collections in an epoch (8;
-- LUCID_GC_EVERY at load). Read-only: the loop uses the local.
Trainer.GC_EVERY = GC_EVERY

-- Optimizer names lucid.optim.build takes, by their lower-case spelling:
-- any case is accepted, as Ultralytics' build_optimizer does ({x.lower(): x
-- for x in optimizers}.get(name.lower())), and the canonical spelling is
-- what reaches lucid.optim.build and its log line.
local OPTIMIZERS = { auto = "auto", sgd = "SGD", adamw = "AdamW", musgd = "MuSGD" }
-- Ultralytics' other names (Adam, Adamax, NAdam, RAdam, RMSProp): refused,
-- saying that lucid does not implement them
local ULTRALYTICS_ONLY = { adam = "Adam", adamax = "Adamax", nadam = "NAdam", radam = "RAdam", rmsprop = "RMSProp" }

--- Trainer.optimizer_name(name) -> the canonical spelling of an optimizer
-- name in any case ("adamw" -> "AdamW", "Auto" -> "auto"; nil -> "auto"),
-- or nil when lucid has no such optimizer.
function Trainer.optimizer_name(name)
  if name == nil then return "auto" end
  if type(name) ~= "string" then return nil end
  return OPTIMIZERS[name:lower()]
end

-- The settings Trainer.new needs (the rest have defaults: Ultralytics' or
-- the trainer's own), in the order they are reported when missing.
local REQUIRED = { "data", "imgsz", "batch", "epochs", "lr0", "lrf", "momentum", "weight_decay", "warmup_epochs",
  "warmup_momentum", "warmup_bias_lr" }

--- Trainer.check_config(cfg): raise a clear error naming the setting and its
-- value before anything is opened or built. Missing settings come first,
-- all of them named ("trainer: missing settings: data, batch (...)": the
-- keys of recipes/pose_nano.lua's defaults without a fallback). Every
-- number must be finite and within the f32 range (the engine computes in
-- f32), and a non-zero one at least the smallest normal f32 in magnitude
-- (lr0=1e-50 would be 0 there; recipe.F32_MIN_NORMAL); numbers are printed
-- by recipe.show (integers in all their digits). optimizer is auto, SGD,
-- AdamW or MuSGD in any case (as Ultralytics; Trainer.optimizer_name gives
-- the canonical spelling), and Ultralytics' Adam, Adamax, NAdam, RAdam and
-- RMSProp are refused as not implemented in lucid. The integer
-- settings are at most 2^31 - 1 (the engine counts them in a C int; seed at
-- most 2^53 - 1); device a name lucid.Context takes (recipe.is_device:
-- cpu, cuda, cuda:N or auto; whether it exists is the context's check);
-- the ranges are Ultralytics' (cfg/__init__.py check_cfg: its fraction keys
-- lr0, lrf, momentum, weight_decay, warmup_momentum, warmup_bias_lr, conf,
-- iou and the augmentation probabilities in [0, 1]; its integer keys) plus
-- lr0 > 0, momentum < 1, warmup_epochs >= 0, loss gains >= 0,
-- clip.max_norm > 0 and max_det >= 1. val_period and save_period are
-- integers >= 0: N validates / writes weights/last.safetensors every N
-- epochs; 0 only at the end (save_period 0: and whenever best.safetensors
-- improves), as Ultralytics' val=False still validates the final epoch. The
-- boolean settings take true/false only (cache also 'ram' = true: the
-- prepared images kept in RAM; 'disk' is not supported); resume takes
-- true/false or a checkpoint path.
function Trainer.check_config(cfg)
  local show = recipe.show
  -- missing settings first, all of them named (not "batch = nil")
  local missing = {}
  for _, k in ipairs(REQUIRED) do
    if cfg[k] == nil then missing[#missing + 1] = k end
  end
  if #missing > 0 then
    error(string.format("trainer: missing setting%s: %s (Trainer.new takes a resolved recipe table: every key of "
      .. "recipes/pose_nano.lua's defaults, listed with their values by luajit recipes/pose_nano.lua --help)",
      #missing == 1 and "" or "s", table.concat(missing, ", ")), 0)
  end
  local function fail(key, v, want)
    error(string.format("trainer: %s = %s: expected %s", key, show(v), want), 0)
  end
  local function get(key)
    local node = cfg
    for part in key:gmatch("[^.]+") do
      if type(node) ~= "table" then return nil end
      node = node[part]
    end
    return node
  end
  local function finite(v) return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge end
  -- every number anywhere in cfg is finite (lr0=1e999 would train an epoch
  -- and fail at the checkpoint's JSON) and an f32 (clip.max_norm=1e300
  -- reached the optimizer binding, augment.degrees=1e300 the loader as inf)
  local function walk(t, prefix, depth)
    if depth > 4 then return end
    for k, v in pairs(t) do
      local name = prefix and (prefix .. "." .. tostring(k)) or tostring(k)
      if type(v) == "number" and not finite(v) then fail(name, v, "a finite number") end
      if type(v) == "number" and math.abs(v) > recipe.F32_MAX then
        fail(name, v, "a finite number of magnitude at most 3.4e+38 (the engine computes in f32)")
      end
      -- lr0=1e-50 passed lr0 > 0 and trained with lr 0
      if type(v) == "number" and v ~= 0 and math.abs(v) < recipe.F32_MIN_NORMAL then
        fail(name, v, "0 or a magnitude of at least 1.1754944e-38 (the smallest normal f32; the engine computes in "
          .. "f32, where this value would be 0 or subnormal)")
      end
      if type(v) == "table" and getmetatable(v) == nil then walk(v, name, depth + 1) end
    end
  end
  walk(cfg, nil, 1)
  -- an integer >= lo, and at most hi (default: a C int's largest, for the
  -- engine's counts; batch=1e12 reached the loader as -2147483648)
  local function int_at_least(key, lo, hi, why)
    local v = get(key)
    if v == nil and key ~= "batch" and key ~= "epochs" and key ~= "imgsz" then return end
    if not finite(v) or v ~= math.floor(v) or v < lo then fail(key, v, "an integer >= " .. lo) end
    if v > (hi or recipe.INT_MAX) then
      fail(key, v, string.format("an integer in [%d, %.0f] (%s)", lo, hi or recipe.INT_MAX,
        why or "the engine counts it in a C int"))
    end
  end
  -- a number in a range; lo_open / hi_open: the bound itself excluded
  local function range(key, lo, hi, lo_open, hi_open, what)
    local v = get(key)
    if v == nil then return end
    if not finite(v) or (lo and (v < lo or (lo_open and v == lo))) or (hi and (v > hi or (hi_open and v == hi))) then
      local want = what
      if not want then
        if lo and hi then
          want = string.format("a number in %s%g, %g%s", lo_open and "(" or "[", lo, hi, hi_open and ")" or "]")
        elseif lo then
          want = string.format("a number %s %g", lo_open and ">" or ">=", lo)
        else
          want = string.format("a number %s %g", hi_open and "<" or "<=", hi)
        end
      end
      fail(key, v, want)
    end
  end
  local function boolean(key)
    local v = get(key)
    if v ~= nil and type(v) ~= "boolean" then fail(key, v, "true or false") end
  end
  local function nonempty(key, what)
    local v = get(key)
    if v ~= nil and (type(v) ~= "string" or v == "") then fail(key, v, what) end
  end
  int_at_least("batch", 1)
  int_at_least("epochs", 1)
  -- workers = 0: the batches are made in the training thread (Ultralytics workers=0)
  int_at_least("workers", 0)
  int_at_least("seed", 0, recipe.SEED_MAX, "the largest integer a Lua number holds exactly")
  int_at_least("nbs", 1)
  local S = cfg.imgsz
  if not finite(S) or S < 32 or S % 32 ~= 0 then
    fail("imgsz", S, "a multiple of 32 (the network's largest stride), at least 32")
  end
  if S > Trainer.MAX_IMGSZ then
    fail("imgsz", S, string.format("at most %d (the engine's image buffers hold at most 2^31 pixels, and the "
      .. "training mosaic canvas is 2 x imgsz on a side)", Trainer.MAX_IMGSZ))
  end
  if cfg.device ~= nil and not recipe.is_device(cfg.device) then fail("device", cfg.device, recipe.DEVICES) end
  if cfg.name ~= nil and (type(cfg.name) ~= "string" or cfg.name == "" or cfg.name:find("/", 1, true)) then
    fail("name", cfg.name, "a non-empty name without '/' (the run folder under project)")
  end
  nonempty("project", "a non-empty folder (the run folders go under it)")
  if type(cfg.data) ~= "table" and (type(cfg.data) ~= "string" or cfg.data == "") then
    fail("data", cfg.data, "a dataset descriptor name, a descriptor .lua or a data .yaml")
  end
  if cfg.max_gt ~= nil and cfg.max_gt ~= "auto" then int_at_least("max_gt", 1) end
  -- schedule and optimizer (Ultralytics fraction keys in [0, 1])
  range("lr0", 0, 1, true, false)
  range("lrf", 0, 1)
  range("momentum", 0, 1, false, true)
  range("weight_decay", 0, 1)
  range("warmup_epochs", 0)
  range("warmup_momentum", 0, 1)
  range("warmup_bias_lr", 0, 1)
  if not Trainer.optimizer_name(cfg.optimizer) then
    local other = type(cfg.optimizer) == "string" and ULTRALYTICS_ONLY[cfg.optimizer:lower()]
    fail("optimizer", cfg.optimizer, "auto, SGD, AdamW or MuSGD (any case, as Ultralytics)"
      .. (other and string.format("; Ultralytics' %s is not implemented in lucid", other) or ""))
  end
  range("clip.max_norm", 0, nil, true, false, "a number > 0 (the gradient-norm limit of every optimizer step)")
  for _, k in ipairs({ "box", "cls", "dfl", "pose", "kobj" }) do range("loss." .. k, 0) end
  -- augmentation: probabilities and fractions in [0, 1] (Ultralytics); degrees and shear any finite number
  for _, k in ipairs({ "mosaic", "fliplr", "flipud", "hsv_h", "hsv_s", "hsv_v", "translate", "scale", "perspective" }) do
    range("augment." .. k, 0, 1, false, false, (k == "mosaic" or k:sub(1, 4) == "flip")
      and "a probability in [0, 1]" or "a fraction in [0, 1]")
  end
  int_at_least("augment.close_mosaic", 0)
  -- validation
  range("conf", 0, 1, false, false, "a confidence threshold in [0, 1]")
  range("iou", 0, 1, false, false, "an IoU threshold in [0, 1]")
  int_at_least("max_det", 1)
  if cfg.ap ~= nil and cfg.ap ~= "coco" and cfg.ap ~= "ultralytics" then fail("ap", cfg.ap, "coco or ultralytics") end
  -- 0: only at the end (see above)
  int_at_least("val_period", 0)
  int_at_least("save_period", 0)
  range("max_reject_fraction", 0, 1, false, false, "a fraction in [0, 1]")
  for _, k in ipairs({ "quiet", "exist_ok", "cos_lr", "record", "device_hsv", "clip.capture_gradient_norm" }) do
    boolean(k)
  end
  local c = cfg.cache
  if c ~= nil and type(c) ~= "boolean" and c ~= "ram" then
    if c == "disk" then
      fail("cache", c, "true, false or 'ram' (cache='disk' is not supported: lucid caches the prepared images "
        .. "in RAM only)")
    end
    fail("cache", c, "true, false or 'ram' (the prepared images kept in RAM)")
  end
  local r = cfg.resume
  if r ~= nil and type(r) ~= "boolean" and (type(r) ~= "string" or r == "") then
    fail("resume", r, "true, false or a checkpoint path")
  end
end

--- Trainer.check_paths(cfg): the filesystem side of the settings, before
-- anything is built (check_config checks values only): a file where the
-- run folder goes raises "trainer: project = '<p>': exists and is not a
-- folder (...)" (or names the parent that is a file), and a file at
-- <project>/<name> raises "trainer: name = '<n>': <project>/<n> exists and
-- is not a folder (...)". Nothing is created (fit does, and a folder mkdir
-- cannot make is named by project= and name=, without mkdir's raw output).
-- The recipes call it after check_config; fit calls it first thing.
function Trainer.check_paths(cfg)
  local project = cfg.project or "runs"
  recipe.check_folder(project, "project", "trainer", "the run folders go under it")
  local base = project .. "/" .. (cfg.name or "train")
  if recipe.path_kind(base) == "file" then
    error(string.format("trainer: name = %s: %s exists and is not a folder (the run folder under project)",
      recipe.show(cfg.name or "train"), base), 0)
  end
  -- the run goes into base itself unless base holds a run and a new folder
  -- is chosen (run_dir: not exist_ok, not resuming); then its weights/
  -- must be a folder too
  local reused = not (cfg.exist_ok or cfg.resume) and recipe.path_kind(base .. "/results.csv") ~= nil
  if not reused and recipe.path_kind(base .. "/weights") == "file" then
    error(string.format("trainer: name = %s: %s/weights exists and is not a folder (the run's checkpoints go "
      .. "there)", recipe.show(cfg.name or "train"), base), 0)
  end
end

--- Where a fit's warnings go (rejected files, flips turned off, a batch
-- larger than the split): the run's messages (`out`, stdout), or stderr with
-- quiet=true, whose `out` discards everything: quiet silences the listing
-- and the progress, never a warning that data was left out.
-- @param cfg table: the run's configuration (cfg.quiet)
-- @param out file: where the run's messages go
-- @return file
function Trainer.warn_stream(cfg, out)
  if cfg.quiet == true then return io.stderr end
  return out
end

local REJECTS_SHOWN = 20
--- Say which files a split left out, as Ultralytics' "WARNING ... ignoring
-- corrupt image/label: <reason>": one line per rejected file (its path,
-- line and value, from the dataset's checks), at most REJECTS_SHOWN of them
-- and a count of the rest, then the split's summary. Silent when nothing
-- was rejected. (The dataset refuses a split that rejects more than its
-- max_reject_fraction; below that, training goes on without them.)
-- @param out file: where the run's messages go
-- @param split string: "train" | "val"
-- @param ds lucid.Dataset
function Trainer.warn_rejects(out, split, ds)
  local r = ds:rejects()
  if #r == 0 then return end
  for i = 1, math.min(#r, REJECTS_SHOWN) do
    out:write(string.format("WARNING: %s: ignoring %s\n", split, r[i]))
  end
  if #r > REJECTS_SHOWN then
    out:write(string.format("WARNING: %s: ... and %d more files ignored\n", split, #r - REJECTS_SHOWN))
  end
  out:write(string.format("WARNING: %s: %s\n", split, ds:summary()))
end

--- Trainer.check_last_batch(imgsz, batch, n): raise when a training batch
-- would hold a single image while the network's last feature map (stride
-- 32) is 1x1, i.e. imgsz 32 with batch 1 or n % batch == 1 (the short last
-- batch; the loader keeps it, as Ultralytics does): batch normalisation in
-- training then sees 1 value per channel, which it (like PyTorch) refuses.
-- The batches are not recomposed silently; the message suggests settings
-- that work. fit calls it once the training images are counted.
function Trainer.check_last_batch(imgsz, batch, n)
  local side = math.floor(imgsz / 32)
  if side ~= 1 or n < 1 then return end
  local last = n % batch
  if batch ~= 1 and last ~= 1 then return end
  local alt
  for d = 1, 64 do
    for _, b in ipairs({ batch + d, batch - d }) do
      if not alt and b >= 2 and n % b ~= 1 then alt = b end
    end
    if alt then break end
  end
  local what = batch == 1 and "batch=1 gives batches of 1 image"
    or string.format("batch=%d on %d training images leaves a last batch of 1 image", batch, n)
  error(string.format("trainer: imgsz=%d with %s; at imgsz %d the network's last feature map is 1x1, so batch "
    .. "normalisation in training would see 1 value per channel (PyTorch refuses this too). Use imgsz=64 or "
    .. "more%s", imgsz, what, imgsz, alt and string.format(", or batch=%d", alt) or ""), 0)
end

--- The signal that stops a fit cleanly besides Ctrl-C (lucid.signal).
Trainer.STOP_SIGNAL = "SIGTERM"

--- Trainer.stop_error(name) -> the error a fit raises when signal `name`
-- ("SIGTERM") asked it to stop: "interrupted! (SIGTERM)", as LuaJIT's
-- "interrupted!" for Ctrl-C (recipe.interruption reads both).
function Trainer.stop_error(name) return "interrupted! (" .. tostring(name) .. ")" end

--- Trainer.check_stop(): raise Trainer.stop_error(name) when lucid.signal
-- recorded a stop signal (SIGTERM) since the fit began; nothing otherwise.
-- The fit calls it between units of work (each training step, each
-- validation batch, each epoch start), so the stop takes fit's failure path:
-- queued checkpoint writes finish, resources are released.
function Trainer.check_stop()
  local name = lucid.signal.caught()
  if name then error(Trainer.stop_error(name), 0) end
end

--- trainer:add_callback(event, fn, [opts]) — opts.persistent keeps the
-- callback for later fits (default: only the next or current fit); another
-- key is an error.
function Trainer:add_callback(event, fn, opts)
  if not EVENTS[event] then error("add_callback: unknown event '" .. tostring(event) .. "'", 2) end
  if type(fn) ~= "function" then error("add_callback: fn must be a function", 2) end
  nn_util.check_options("trainer:add_callback", opts, { "persistent" })
  local list = self.callbacks[event] or {}
  list[#list + 1] = { fn = fn, fit = (opts and opts.persistent) and "all" or (self.fitting and self.fit_id or self.fit_id + 1) }
  self.callbacks[event] = list
end

-- A callback runs in the fit it was added during or for, or in every fit
-- when persistent.
local function active(self, cb) return cb.fit == "all" or cb.fit == self.fit_id end

--- Whether a callback for `event` would run in the current fit.
function Trainer:has_callbacks(event)
  for _, cb in ipairs(self.callbacks[event] or {}) do
    if active(self, cb) then return true end
  end
  return false
end

function Trainer:run_callbacks(event, ev)
  for _, cb in ipairs(self.callbacks[event] or {}) do
    if active(self, cb) then cb.fn(self, ev) end
  end
end

-- ----------------------------------------------------------------- helpers

-- The run folder (and its parents); mkdir's own words in a clean message
-- (never its raw stderr), naming the settings that chose the folder.
local function make_run_folder(path, cfg)
  local ok, why = recipe.mkdir(path)
  if not ok then
    error(string.format("trainer: project = %s: cannot create the run folder %s (%s); check project= and name=",
      recipe.show(cfg.project or "runs"), path, why), 0)
  end
end

local function file_exists(p)
  local f = io.open(p, "rb")
  if f then f:close() return true end
  return false
end

-- A run folder runs/<name>, or runs/<name>2, 3, ... when it exists
-- (Ultralytics increment_path), unless resuming or exist_ok.
local function run_dir(cfg)
  local base = (cfg.project or "runs") .. "/" .. (cfg.name or "train")
  if cfg.resume or cfg.exist_ok then return base end
  local dir, n = base, 2
  while file_exists(dir .. "/results.csv") or file_exists(dir .. "/weights/last.safetensors") do
    dir = base .. n
    n = n + 1
  end
  return dir
end

--- Trainer.check_resume_progress(path, save_dir): refuse a resume that would
-- overwrite newer progress. path: the checkpoint the run resumes from;
-- save_dir: the run folder it continues (where weights/ and results.csv are
-- written). When <save_dir>/weights/last.safetensors exists, is not path
-- (as given) and has completed more epochs than path (e.g. path is an
-- older copy of it), raise an error naming both files, both epoch counts
-- (1-based, as the log's "N/E") and the ways on: resume from the newer file,
-- or branch off into a new run folder with name= / project=, or move the
-- newer file away to go back on purpose. A folder checkpoint that cannot be
-- read (corrupt, another format) is refused too, since its progress is
-- unknown. Reads only (checkpoint.load of both; a bad path raises its own
-- error first); nothing is created or written. Equal progress passes.
function Trainer.check_resume_progress(path, save_dir)
  local last = save_dir .. "/weights/last.safetensors"
  if path == last or not file_exists(last) then return end
  local ck = checkpoint.load(path)
  local done = ck.epochs_completed
  ck:close()
  local ok, lk = pcall(checkpoint.load, last)
  if not ok then
    error(string.format("trainer: resume: %s is to continue the run in %s, whose %s cannot be read (%s), so "
      .. "whether it holds newer progress is unknown; nothing was written. Resume from that folder's own "
      .. "checkpoint after repairing it, or continue from %s in a new run folder with name= (and project=), or "
      .. "move %s out of the folder first", path, save_dir, last, recipe.message(lk), path, last), 0)
  end
  local newer = lk.epochs_completed
  lk:close()
  if newer <= done then return end
  local function epochs(n) return string.format("%d epoch%s", n, n == 1 and "" or "s") end
  error(string.format("trainer: resume: %s has completed %s, but the run folder it would continue, %s, holds "
    .. "newer progress: %s has completed %s. Resuming would overwrite that folder's weights/last.safetensors, "
    .. "weights/best.safetensors and its results.csv rows from epoch %d on, so nothing was written. Resume from "
    .. "the newer checkpoint (resume=%s), or branch off from %s into a new run folder with name= (and project=); "
    .. "to continue %s from the older file on purpose, move %s out of it first", path, epochs(done), save_dir,
    last, epochs(newer), done + 1, last, path, save_dir, last), 0)
end

local function losses_table(items)
  local t = {}
  for i, k in ipairs(progress.LOSS_NAMES) do t[k] = items[i] end
  return t
end

-- ------------------------------------------------------------------- fit

--- trainer:fit(model, [opts]) -> results {epochs, metrics (last), best_fitness,
-- save_dir, fit_seconds, steady_step_ms, step_windows ({seconds, steps,
-- loader_s} per epoch: the stream fenced before the first step and after the
-- last one, before validation; loader_s: the host's time in the loader's
-- next() inside that window, i.e. waiting for batches), steady_from (the
-- first window of steady_step_ms: 4, or 1 with three epochs or fewer),
-- steady_loader_wait_ms (loader_s over those windows, ms per step), memory (ctx:memory_stats() at the end), losses (every
-- step, when cfg.record_losses), step (step:stats(): route, recorded, replays,
-- retirements, contract_us_per_replay and its parts when cfg.record),
-- optimizer and ema (the fit's final lucid.Optimizer and lucid.EMA)}.
-- opts.resume = true | checkpoint path overrides cfg.resume (another key
-- is an error). Resume: true continues <project>/<name> from its
-- weights/last.safetensors; a path resumes from that file. Either way the
-- run continues in the run folder <project>/<name> of cfg (no increment):
-- its weights/ and results.csv are updated there, never beside a copied
-- checkpoint. The recipes fill cfg from the settings saved in the
-- checkpoint, whose name is the folder the run wrote (runs/try2 when
-- runs/try was taken), so a checkpoint copied anywhere resumes into its
-- original run folder, as Ultralytics' resume does; project= and name= on
-- the command line choose another. Printed at the start: "Continuing the
-- run in <folder> (...)".
function Trainer:fit(model, opts)
  if self.fitting then error("trainer:fit: a fit is already running on this trainer", 2) end
  opts = nn_util.check_options("trainer:fit", opts, { "resume" })
  progress.is_tty() -- a bad LUCID_PROGRESS is an error before anything is built or written
  -- SIGTERM while fitting: recorded, and raised by Trainer.check_stop in the
  -- loop (released below, on every path, once the queued writes are on disk)
  lucid.signal.catch(Trainer.STOP_SIGNAL)
  self.fit_id = self.fit_id + 1
  self.fitting = true
  local state = { model = model, resources = {} }
  self.state = state
  -- the original error object goes back to the caller unchanged; its
  -- traceback is kept aside (printed with LUCID_DEBUG=1)
  local trace
  local ok, res = xpcall(function() return self:_fit(state, opts or {}) end, function(e)
    trace = debug.traceback(tostring(e), 2)
    return e
  end)
  if not ok and os.getenv("LUCID_DEBUG") == "1" and trace then io.stderr:write(trace, "\n") end
  -- release everything the fit created, whatever happened
  local cleanup_errors = {}
  for i = #state.resources, 1, -1 do
    local r = state.resources[i]
    local cok, cerr = pcall(r.free, r.obj)
    if not cok then cleanup_errors[#cleanup_errors + 1] = tostring(cerr) end
  end
  if state.step then
    local rok, rerr = pcall(state.step.release, state.step)
    if not rok then cleanup_errors[#cleanup_errors + 1] = "step release: " .. tostring(rerr) end
  end
  if not ok then
    -- a failed fit still leaves its queued checkpoints on disk (or says why not)
    local wok, werr = pcall(checkpoint.wait)
    if not wok then cleanup_errors[#cleanup_errors + 1] = "checkpoint write: " .. tostring(werr) end
  end
  self.fitting = false
  self.state = nil
  -- the queued writes are on disk: a SIGTERM from here on takes its default action
  local sok, serr = pcall(lucid.signal.release, Trainer.STOP_SIGNAL)
  if not sok then cleanup_errors[#cleanup_errors + 1] = "signal release: " .. tostring(serr) end
  if not ok then
    for _, k in ipairs({ "ema", "opt" }) do
      local o = state[k]
      if o then
        local fok, ferr = pcall(o.free, o)
        if not fok then cleanup_errors[#cleanup_errors + 1] = tostring(ferr) end
      end
    end
    for _, e in ipairs(cleanup_errors) do io.stderr:write("trainer: cleanup after failure: " .. e .. "\n") end
    local hok, herr = pcall(self.run_callbacks, self, "on_fit_error", { error = res })
    if not hok then io.stderr:write("trainer: on_fit_error callback failed: " .. tostring(herr) .. "\n") end
    error(res, 0)
  end
  if #cleanup_errors > 0 then error("trainer: cleanup failed: " .. table.concat(cleanup_errors, "; "), 2) end
  return res
end

local function own(state, obj, free)
  state.resources[#state.resources + 1] = { obj = obj, free = free or function(o) o:free() end }
  return obj
end

function Trainer:_fit(state, opts)
  local cfg, ctx = self.cfg, self.ctx
  local model = state.model
  local out = cfg.quiet and io.open("/dev/null", "w") or io.stdout
  local warn = Trainer.warn_stream(cfg, out)
  local t_fit0 = lucid.wall_time()
  local B, S = cfg.batch, cfg.imgsz
  local E = cfg.epochs
  local resume = opts.resume
  if resume == nil then resume = cfg.resume end
  if resume == "true" then resume = true elseif resume == "false" or resume == "" then resume = false end

  Trainer.check_paths(cfg)
  -- a resume from an older checkpoint than the run folder's own last is
  -- refused here, before the folder (or anything else) is written
  if resume then
    local dir = run_dir(cfg)
    Trainer.check_resume_progress(type(resume) == "string" and resume or (dir .. "/weights/last.safetensors"), dir)
  end

  -- data ------------------------------------------------------------------
  local desc = data.load_descriptor(cfg.data)
  local nkpt = desc.kpt_shape and desc.kpt_shape[1] or 17
  if desc.kpt_shape and not desc.flip_idx and ((cfg.augment or {}).fliplr or data.defaults.fliplr) > 0 then
    -- the loader then never flips (a flip without the map would swap left and right)
    warn:write(string.format("WARNING: no 'flip_idx' in %s, horizontal flips (fliplr) are off\n",
      tostring(desc.descriptor_file or desc.name)))
  end
  local nc = desc.names and #desc.names or desc.nc or 1
  -- a model built for other classes or keypoints fails here, naming the data's keys,
  -- not later inside the loss
  local dfile = tostring(desc.descriptor_file or desc.name or cfg.data)
  if model.nc and model.nc ~= nc then
    error(string.format("trainer: the model has nc=%d classes, the data %s has %d (names/nc); build the model "
      .. "with nc=%d", model.nc, dfile, nc, nc), 0)
  end
  local mk = model.kpt_shape
  if mk and desc.kpt_shape and (mk[1] ~= desc.kpt_shape[1] or mk[2] ~= desc.kpt_shape[2]) then
    error(string.format("trainer: the model has kpt_shape={%d,%d}, the data %s has kpt_shape={%d,%d}; build the "
      .. "model with the data's kpt_shape", mk[1], mk[2], dfile, desc.kpt_shape[1], desc.kpt_shape[2]), 0)
  end
  local cache = cfg.cache
  if cache == "ram" then cache = true end -- Ultralytics' cache='ram' is lucid's cache (check_config)
  local open_opts = { imgsz = S, cache = cache, ctx = ctx, max_reject_fraction = cfg.max_reject_fraction }
  local train_ds = own(state, assert(data.open(desc, "train", open_opts)))
  local val_ds = own(state, assert(data.open(desc, "val", open_opts)))
  Trainer.warn_rejects(warn, "train", train_ds)
  Trainer.warn_rejects(warn, "val", val_ds)
  -- the loaders' batches are at most the split's image count, as Ultralytics'
  -- build_dataloader (batch = min(batch, len(dataset))); the optimizer's
  -- accumulate, weight decay and iteration count keep the requested batch,
  -- as its trainer does (batch_size is not capped there)
  local B_req = B
  if B > #train_ds then
    warn:write(string.format("WARNING: batch=%d is more than the %d training images; the loader makes batches of %d\n",
      B, #train_ds, #train_ds))
    B = #train_ds
  end
  Trainer.check_last_batch(S, B, #train_ds)
  local max_inst = train_ds:stats().max_instances or 0
  local max_gt = cfg.max_gt
  if max_gt == "auto" or max_gt == nil then
    -- mosaic puts up to 4 images on one canvas
    max_gt = math.max(16, 8 * math.ceil(4 * max_inst / 8))
  end
  -- loader threads: min(workers, CPUs), as Ultralytics build_dataloader
  -- (batches are byte-identical whatever the thread count; 0: no loader
  -- thread, each batch is made in this thread when the step asks for it)
  local workers = math.min(cfg.workers or 4, lucid.cpu_count())
  local function make_loader(ds, batch, shuffle)
    return own(state, data.loader(ds, { batch = batch, imgsz = S, max_gt = max_gt, threads = workers,
      seed = cfg.seed, shuffle = shuffle, ctx = ctx }))
  end
  local train_loader = make_loader(train_ds, B, true)
  local val_batch = math.max(1, math.min(cfg.val_batch or 2 * B_req, #val_ds))
  local val_loader = make_loader(val_ds, val_batch, false)
  local nb = train_loader:num_batches()
  local aug_schedule = data.schedule(cfg.augment or {}, E)

  -- optimisation -------------------------------------------------------------
  local S_ = lucid.optim.schedule
  local nbs = cfg.nbs or 64
  local accumulate = S_.accumulate(nbs, B_req)
  local weight_decay = S_.weight_decay(cfg.weight_decay, B_req, accumulate, nbs)
  local iterations = math.ceil(#train_ds / math.max(B_req, nbs)) * E
  local opt, oinfo = lucid.optim.build{ model = model, name = Trainer.optimizer_name(cfg.optimizer), lr0 = cfg.lr0,
    momentum = cfg.momentum, decay = weight_decay, iterations = iterations, nc = nc }
  local warmup_bias_lr = oinfo.warmup_bias_lr or cfg.warmup_bias_lr
  local ema = lucid.EMA{ model = model, decay = cfg.ema_decay or 0.9999, tau = cfg.ema_tau or 2000, block = opt }
  state.opt, state.ema = opt, ema -- released at once if the fit fails (returned to the caller otherwise)
  local scaler
  if self.precision == "fp16" then
    scaler = lucid.amp.GradScaler{ optimizer = opt }
  end
  local nw = S_.warmup_iters(cfg.warmup_epochs, E, nb)
  local clip = cfg.clip or { max_norm = 10.0 }

  -- loss, validator, step ------------------------------------------------------
  -- device HSV (cfg.device_hsv, default on a GPU; ignored on the CPU): the
  -- loader leaves RandomHSV to lucid.input_prepare in the step
  local device_hsv = self.on_gpu and cfg.device_hsv ~= false
  local step_opts = { trainer = self, model = model, optimizer = opt, ema = ema, scaler = scaler,
    ctx = ctx, batch = B, imgsz = S, max_gt = max_gt, nc = nc, nkpt = nkpt, act_dtype = self.act_dtype,
    gains = cfg.loss, clip = clip, accumulate = accumulate, device_hsv = device_hsv }
  local step
  if cfg.record then
    -- the recorded step (CUDA graphs; on the CPU it reports route "eager")
    step_opts.record_losses = cfg.record_losses
    step_opts.warmup = cfg.record_warmup
    step_opts.pipeline = cfg.pipeline -- the recipe's (docs/PIPELINE.md); LUCID_PIPELINE=0|1 wins
    step_opts.log = function(line) out:write(line, "\n") end
    step = recorded_step.new(step_opts)
  else
    step_opts.record = cfg.record_losses
    step = step_mod.new(step_opts)
  end
  state.step = step
  local val = own(state, lucid.PoseValidator{ imgsz = S, nc = nc, kpt_shape = { nkpt, 3 }, ap = cfg.ap or "coco",
    conf = cfg.conf, iou = cfg.iou, max_det = cfg.max_det })

  -- run folder, resume ---------------------------------------------------------
  local save_dir = run_dir(cfg)
  -- the settings saved in the checkpoints name the folder this run writes
  -- (runs/try2 when runs/try was taken): a resume from such a file, even a
  -- copy elsewhere, continues in that folder (Ultralytics keeps save_dir in
  -- the checkpoint's args)
  local saved_cfg = {}
  for k, v in pairs(cfg) do saved_cfg[k] = v end
  saved_cfg.name = save_dir:match("([^/]+)$") or cfg.name
  local start_epoch, best_fitness, last_opt_step = 0, nil, -1
  if resume then
    local path = type(resume) == "string" and resume or (save_dir .. "/weights/last.safetensors")
    local ck = checkpoint.resume(path, { model = model, ema = ema, optimizer = opt, scaler = scaler, ctx = ctx })
    -- ck.epoch is the last completed epoch, 0-based (Ultralytics): the next
    -- one, 0-based, is the number of completed epochs
    start_epoch = ck.epochs_completed
    best_fitness = ck.best_fitness
    last_opt_step = ck.last_opt_step or -1
    -- the accumulation window in force at the save (after warmup it keeps the
    -- last warmup value, as the reference trainer does)
    local acc = ck.metadata and tonumber(ck.metadata.accumulate)
    if acc then accumulate = acc; step.accumulate = acc end
    if start_epoch >= E then
      error(string.format("trainer: %s has completed %d epoch%s and epochs=%d; nothing to resume (raise epochs= "
        .. "to train longer, or start a new run without resume)", path, start_epoch, start_epoch == 1 and "" or "s",
        E), 0)
    end
    -- epochs are shown 1-based, as the progress lines print them
    out:write(string.format("Resuming training from %s: epoch %d/%d completed, continuing with epoch %d/%d\n", path,
      start_epoch, E, start_epoch + 1, E))
    -- where the resumed run writes: its run folder (project/name), not the
    -- checkpoint's folder when the file was copied elsewhere
    local function abs(p) return p:sub(1, 1) == "/" and p or ((os.getenv("PWD") or ".") .. "/" .. p) end
    local inside = abs(path):sub(1, #abs(save_dir) + 1) == abs(save_dir) .. "/"
    -- printed with quiet=true too: it says where this run's output goes
    io.stdout:write(string.format("Continuing the run in %s (its weights/ and results.csv are updated there%s)\n", save_dir,
      inside and "" or string.format("; the checkpoint %s lies outside it: a resumed run continues in the folder "
        .. "its project= and name= settings give", path)))
  end
  make_run_folder(save_dir .. "/weights", cfg)
  local probe = io.open(save_dir .. "/weights/.write_test", "w")
  if not probe then
    error(string.format("trainer: cannot write the run folder %s (check project= and its permissions)", save_dir), 0)
  end
  probe:close()
  os.remove(save_dir .. "/weights/.write_test")
  -- temporary files a killed run left beside its checkpoints (up to a
  -- checkpoint's size each); this state's own writes of them are waited for
  local stale = 0
  for _, f in ipairs({ "last.safetensors", "best.safetensors" }) do
    stale = stale + lucid.io.remove_stale_temps(save_dir .. "/weights/" .. f)
  end
  if stale > 0 then
    out:write(string.format("removed %d temporary checkpoint file(s) an interrupted run left in %s/weights\n",
      stale, save_dir))
  end
  local csv = results_csv.open(save_dir .. "/results.csv")
  local time_offset = 0
  if resume then
    csv:truncate_after(start_epoch) -- rows of epochs the checkpoint does not hold
    time_offset = csv:last_time()
  end

  if Trainer.optimizer_name(cfg.optimizer) == "auto" then
    -- as Ultralytics build_optimizer says it: the printed lr/momentum are the rule's
    out:write(string.format("optimizer: 'optimizer=auto' found, ignoring 'lr0=%g' and 'momentum=%g' and "
      .. "determining best 'optimizer', 'lr0' and 'momentum' automatically...\n", cfg.lr0, cfg.momentum))
  end
  out:write(string.format("%s %s\n", oinfo.log or "", ""))
  out:write(string.format("Image sizes %d train, %d val\nUsing %d dataloader workers\n", S, S, workers))
  out:write(string.format("Logging results to %s\nStarting training for %d epochs...\n", save_dir, E))
  self:run_callbacks("on_fit_start", { save_dir = save_dir, epochs = E, nb = nb })

  local last_metrics
  local step_times = {}
  -- wall seconds by phase (setup: from fit start to the first epoch);
  -- val_parts splits validation (Trainer:validate's parts, and the final
  -- epoch's JSON/PNG writing under outputs)
  -- checkpoints: the training loop's time in checkpoint.save (snapshot,
  -- including any wait for the previous write) and in the final wait;
  -- ckpt_parts.background: the writer thread's own seconds (off the loop)
  local phase = { setup = lucid.wall_time() - t_fit0, training = 0, validation = 0, checkpoints = 0,
    val_parts = {}, ckpt_parts = { snapshot = 0, final_wait = 0, background = 0 } }
  local writer0 = checkpoint.writer_stats()
  for epoch = start_epoch, E - 1 do
    -- schedule: lr = initial_lr * lf(epoch) at the start of the epoch
    local lf = S_.lf(cfg.cos_lr and true or false, epoch, E, cfg.lrf)
    opt:set_lr_factor(lf)
    local aug = aug_schedule(epoch)
    aug.hsv_on_cpu = not device_hsv
    if epoch > start_epoch and aug.mosaic == 0 and aug_schedule(epoch - 1).mosaic ~= 0 then
      out:write("Closing dataloader mosaic\n")
    end
    Trainer.check_stop() -- SIGTERM: stop before the epoch starts
    self:run_callbacks("on_epoch_start", { epoch = epoch })
    model:train()
    local t_train0 = lucid.wall_time()
    train_loader:start_epoch(epoch, aug)
    local bar = progress.bar{ total = nb, epoch = epoch + 1, epochs = E, out = out }
    step:reset_running()
    local t_epoch0
    local i = 0
    local loader_s = 0 -- host time waiting in train_loader:next() inside the window
    while true do
      local tl0 = i > 0 and lucid.wall_time() or nil
      local batch = train_loader:next()
      if tl0 then loader_s = loader_s + (lucid.wall_time() - tl0) end
      if not batch then break end
      if batch.overflow > 0 then
        error(string.format("trainer: batch %d of epoch %d has an image with %d instances, more than max_gt = %d; "
          .. "set max_gt=%d or higher in the recipe", i + 1, epoch + 1, batch.max_count, max_gt,
          8 * math.ceil(batch.max_count / 8)), 0)
      end
      -- the training window opens on a fenced stream (work queued since the
      -- last window -- validation, checkpoint, schedule -- is not counted)
      if i == 0 then ctx:synchronize(); t_epoch0 = lucid.wall_time() end
      local ni = i + nb * epoch
      -- warmup: accumulate, lr and momentum interpolated per iteration
      if ni <= nw then
        accumulate = S_.warmup_accumulate(ni, nw, nbs, B_req)
        step.accumulate = accumulate
        opt:warmup(ni, nw, lf, { warmup_bias_lr = warmup_bias_lr, warmup_momentum = cfg.warmup_momentum,
          momentum = cfg.momentum })
      end
      local do_opt = ni - last_opt_step >= accumulate
      step:run(batch, do_opt)
      if do_opt then last_opt_step = ni end
      i = i + 1
      if bar.tty and (i == nb or lucid.wall_time() - (bar.last_t or 0) > 0.25) then
        bar.last_t = lucid.wall_time()
        bar:update(i, losses_table(step:running_losses()), self:mem_gb(), batch.max_count, S)
      end
      -- a callback sees the step's work as the eager route leaves it, and
      -- the next step sees the callback's (the pipelined route's second
      -- lane joined before, handed off after; no-ops otherwise)
      local cbs = self:has_callbacks("on_batch_end")
      if cbs then step:join() end
      self:run_callbacks("on_batch_end", { epoch = epoch, i = i, ni = ni })
      if cbs then step:handoff() end
      Trainer.check_stop() -- SIGTERM: stop after this step
      -- device memory held by tensors that are already garbage is invisible
      -- to Lua's collector (it sees only the small userdata), so without a
      -- regular full cycle the caching allocator keeps growing over an
      -- epoch; a full collection every GC_EVERY steps bounds it
      if i % GC_EVERY == 0 then collectgarbage() end
    end
    collectgarbage()
    step:join() -- the fence covers both lanes of a pipelined step
    ctx:synchronize()
    local t_epoch1 = lucid.wall_time()
    step_times[#step_times + 1] = { seconds = t_epoch1 - (t_epoch0 or t_epoch1), steps = i, loader_s = loader_s }
    phase.training = phase.training + (t_epoch1 - t_train0)
    local train_losses = losses_table(step:running_losses())
    -- non-finite gradient norms and skipped (fp16 overflow) steps are counted
    -- on the device; say when they moved, never hide them
    local bst = opt.block:state()
    local nonfinite, skipped = bst.nonfinite_norms or 0, bst.skipped_steps or 0
    if nonfinite ~= (state.nonfinite or 0) or skipped ~= (state.skipped or 0) then
      out:write(string.format("warning: epoch %d: %d non-finite gradient norm(s), %d skipped optimizer step(s) "
        .. "so far (last pre-clip norm %g)\n", epoch + 1, nonfinite, skipped, bst.grad_norm or 0))
    end
    state.nonfinite, state.skipped = nonfinite, skipped
    bar:finish(train_losses, self:mem_gb(), nil, S)

    -- validation on the EMA weights (every val_period epochs and at the end)
    local final = epoch == E - 1
    local vp = cfg.val_period or 1
    local metrics, val_losses
    -- val_period 0: only the final epoch (check_config)
    if final or (vp > 0 and (epoch + 1) % vp == 0) then
      -- the final validation also writes val_predictions.json and val_batch0_pred.png
      local vout = final and cfg.val_outputs ~= false
        and val_output.new{ dataset = val_ds, imgsz = S, save_dir = save_dir, names = desc.names } or nil
      local tv0 = lucid.wall_time()
      metrics, val_losses = self:validate(model, ema, val, val_loader, step, out, vout)
      local files
      if vout then
        local tf0 = lucid.wall_time()
        files = vout:finish()
        self.val_times.outputs = self.val_times.outputs + lucid.wall_time() - tf0
      end
      phase.validation = phase.validation + lucid.wall_time() - tv0
      for k, v in pairs(self.val_times) do phase.val_parts[k] = (phase.val_parts[k] or 0) + v end
      if files then
        out:write(string.format("Predictions saved to %s (%d detections on %d images), %s\n", files.json,
          files.predictions, files.images, files.png or "no preview"))
      end
      last_metrics = metrics
      local fitness = metrics.fitness
      if not best_fitness or fitness > best_fitness then best_fitness = fitness; state.is_best = true else state.is_best = false end
      self:run_callbacks("on_val_end", { epoch = epoch, metrics = metrics })
    else
      state.is_best = false
    end

    -- results.csv and checkpoints
    -- lr/pg0..2 in Ultralytics' group order: bias, weight (decay), bn
    local lr_by = {}
    for _, g in ipairs(opt.param_groups) do lr_by[g.name] = lr_by[g.name] or g.lr end
    local lrs = { lr_by.bias, lr_by.weight, lr_by.bn }
    -- epoch: this (completed) epoch 0-based, as Ultralytics stores it; the
    -- checkpoint adds epochs_completed = epoch + 1 (the "N/E" shown above)
    local ck = { model = model, ema = ema, optimizer = opt, scaler = scaler, ctx = ctx, epoch = epoch, epochs = E,
      iteration = nb * (epoch + 1), last_opt_step = last_opt_step, best_fitness = best_fitness,
      data = { seed = cfg.seed, epoch = epoch }, config = saved_cfg,
      grads = last_opt_step < nb * (epoch + 1) - 1, metadata = { accumulate = tostring(accumulate) } }
    local sp = cfg.save_period or 1
    -- best and last, from the same snapshot (one serialisation, two
    -- independent files), are written by the background writer; the loop
    -- only pays for the snapshot, and for waiting when the previous epoch's
    -- write is still running (its failure is raised here). best goes first:
    -- a kill between the two leaves the previous last, whose resume redoes
    -- this epoch and writes best again; the other order could leave a last
    -- whose best_fitness points at weights no file holds.
    local paths = {}
    if state.is_best then paths[#paths + 1] = save_dir .. "/weights/best.safetensors" end
    if final or (sp > 0 and (epoch + 1) % sp == 0) or state.is_best then paths[#paths + 1] = save_dir .. "/weights/last.safetensors" end
    if #paths > 0 then
      local tc0 = lucid.wall_time()
      checkpoint.save(paths, ck, { async = true })
      local dt = lucid.wall_time() - tc0
      phase.checkpoints = phase.checkpoints + dt
      phase.ckpt_parts.snapshot = phase.ckpt_parts.snapshot + dt
    end
    -- the row goes in after the checkpoint's snapshot: a run killed before
    -- that write is on disk resumes from the previous checkpoint, and
    -- csv:truncate_after drops this epoch's row
    csv:row(epoch + 1, time_offset + lucid.wall_time() - t_fit0, train_losses, metrics, val_losses, lrs)
    self:run_callbacks("on_epoch_end", { epoch = epoch, metrics = metrics, fitness = metrics and metrics.fitness,
      train_losses = train_losses })
  end
  -- every checkpoint on disk before fit returns (a failed write raises here)
  local tw0 = lucid.wall_time()
  checkpoint.wait()
  phase.ckpt_parts.final_wait = lucid.wall_time() - tw0
  phase.checkpoints = phase.checkpoints + phase.ckpt_parts.final_wait
  phase.ckpt_parts.background = checkpoint.writer_stats().seconds - writer0.seconds
  ctx:synchronize()
  local fit_seconds = lucid.wall_time() - t_fit0
  -- steady step: epochs after the first three (all of them when fewer);
  -- the host's wait for batches over the same windows
  local steady_from = #step_times > 3 and 4 or 1
  local st, sn, sl = 0, 0, 0
  for k = steady_from, #step_times do
    local w = step_times[k]
    st, sn, sl = st + w.seconds, sn + w.steps, sl + w.loader_s
  end
  local res = { epochs = E, metrics = last_metrics, best_fitness = best_fitness, save_dir = save_dir,
    fit_seconds = fit_seconds, steady_step_ms = sn > 0 and 1000 * st / sn or nil, step_windows = step_times,
    steady_from = steady_from, steady_loader_wait_ms = sn > 0 and 1000 * sl / sn or nil,
    memory = ctx:memory_stats(), step = step:stats(), losses = step.recorded_losses, optimizer = opt, ema = ema,
    phases = phase, nonfinite_norms = state.nonfinite or 0, skipped_steps = state.skipped or 0 }
  local vp = phase.val_parts
  local cp = phase.ckpt_parts
  out:write(string.format("time by phase: setup %.1f s, training %.1f s (first epoch %.1f s), validation %.2f s "
    .. "(loader %.2f, forward+copy %.2f, decode+nms %.2f, match %.2f, metrics %.2f, ema swap %.2f, outputs %.2f), "
    .. "checkpoints %.2f s (snapshot %.2f, final wait %.2f; written in the background %.2f)\n", phase.setup,
    phase.training, step_times[1] and step_times[1].seconds or 0,
    phase.validation, vp.loader or 0, (vp.forward or 0) + (vp.copy or 0), vp.nms or 0, vp.match or 0,
    vp.metrics or 0, vp.swap or 0, vp.outputs or 0, phase.checkpoints, cp.snapshot, cp.final_wait, cp.background))
  local sst = res.step
  if cfg.record and sst then
    out:write(string.format("recorded step: route %s, %d graphs recorded, %d replays, %d retirements%s, "
      .. "contract check %.2f us/step (cheap path %.2f us; %d mode round trips, %.1f us each; %d full checks, "
      .. "%.0f us each)\n", sst.route, sst.recorded or 0, sst.replays or 0, sst.retirements or 0,
      sst.last_retire_reason and (" (last: " .. sst.last_retire_reason .. ")") or "", sst.contract_us_per_replay or 0,
      sst.contract_check_us or 0, sst.mode_checks or 0, sst.mode_check_us or 0, sst.full_checks or 0,
      sst.full_check_us or 0))
  end
  out:write(string.format("\n%d epoch%s completed in %.3f hours.\n", E - start_epoch, E - start_epoch == 1 and "" or "s",
    fit_seconds / 3600))
  out:write(string.format("Results saved to %s\n", save_dir))
  self:run_callbacks("on_fit_end", res)
  return res
end

--- Device memory in GB (allocated) for the progress line.
function Trainer:mem_gb()
  local ok, st = pcall(self.ctx.memory_stats, self.ctx)
  if ok and st and self.on_gpu then return (st.reserved or 0) / 1e9 end
  return 0
end

-- The head outputs of a validation batch of n images as contiguous f32 CPU
-- tensors for the validator. On the CPU they are already that (views, no
-- copy); from a GPU, one device-to-host copy per output into host buffers
-- kept for the fit (one set per batch size), instead of a fresh allocation
-- of every output of every batch.
function Trainer:_val_host(o, n)
  if not self.on_gpu then
    local function view(t) return t:narrow(1, 1, n):to("cpu", "f32"):contiguous() end
    return view(o.boxes), view(o.scores), view(o.kpts)
  end
  local state = self.state
  local cache = state and state.val_host or {}
  if state then state.val_host = cache end
  local b = cache[n]
  local function same(t, buf)
    return buf and table.concat(buf:shape(), ",") == table.concat(t:narrow(1, 1, n):shape(), ",")
  end
  if not (b and same(o.boxes, b.boxes) and same(o.scores, b.scores) and same(o.kpts, b.kpts)) then
    if b then for _, t in pairs(b) do t:free() end end
    b = {}
    for _, k in ipairs({ "boxes", "scores", "kpts" }) do
      b[k] = lucid.empty(o[k]:narrow(1, 1, n):shape(), { ctx = self.ctx, device = "cpu", dtype = "f32" })
    end
    cache[n] = b
    if state and not state.val_host_owned then
      state.val_host_owned = true
      state.resources[#state.resources + 1] = { obj = cache, free = function(c)
        for _, bb in pairs(c) do for _, t in pairs(bb) do t:free() end end
      end }
    end
  end
  b.boxes:copy_(o.boxes:narrow(1, 1, n))
  b.scores:copy_(o.scores:narrow(1, 1, n))
  b.kpts:copy_(o.kpts:narrow(1, 1, n))
  return b.boxes, b.scores, b.kpts
end

--- Validation pass: EMA weights swapped in, eval mode, letterboxed val
-- batches, metrics (and mean val losses) out; the training weights are
-- swapped back afterwards, also on error. Wall seconds of its parts go to
-- self.val_times: loader (waiting for batches), forward (the forward and the
-- validation loss; on a GPU only their launch), copy (the head outputs to the
-- host, which waits for the forward on a GPU, and the targets), nms and
-- match (the validator: decode + NMS + keypoints, and matching + AP
-- accumulation, its wall time split by the share of its stage times),
-- outputs (collect:add_batch), swap (the EMA weights in and out, mode
-- switches), metrics (AP/P/R, the table, the validation losses).
function Trainer:validate(model, ema, val, loader, step, out, collect)
  local now = lucid.wall_time
  local vt = { loader = 0, forward = 0, copy = 0, nms = 0, match = 0, outputs = 0, swap = 0, metrics = 0 }
  self.val_times = vt
  local t0 = now()
  ema:swap(model)
  model:eval()
  val:reset()
  vt.swap = now() - t0
  local ok, err = pcall(function()
    local ta = now()
    loader:start_epoch(0, data.val)
    while true do
      Trainer.check_stop() -- SIGTERM: stop between validation batches
      local vb = loader:next()
      local tb = now()
      vt.loader = vt.loader + (tb - ta)
      if not vb then break end
      local o = step:predict(vb)
      local n = vb.n
      if step.val_loss then step:val_loss(o, vb, n) end
      local tc = now()
      local pb, ps, pk = self:_val_host(o, n)
      local tg = { cls = vb.cls:narrow(1, 1, n):contiguous(), boxes = vb.boxes:narrow(1, 1, n):contiguous(),
        kpts = vb.kpts:narrow(1, 1, n):contiguous(), mask = vb.mask:narrow(1, 1, n):to("f32"):contiguous() }
      local td = now()
      val:add_batch(pb, ps, pk, tg, n)
      local te = now()
      if collect then collect:add_batch(val, vb) end
      ta = now()
      vt.forward = vt.forward + (tc - tb)
      vt.copy = vt.copy + (td - tc)
      vt.nms = vt.nms + (te - td) -- split below
      vt.outputs = vt.outputs + (ta - te)
    end
  end)
  local ts = now()
  model:train()
  local sok, serr = pcall(ema.swap, ema, model)
  vt.swap = vt.swap + now() - ts
  if not ok then
    if not sok then io.stderr:write("trainer: swapping the EMA weights back failed too: " .. tostring(serr) .. "\n") end
    error(err, 0)
  end
  if not sok then error(serr, 0) end
  local tm0 = now()
  local m = val:compute()
  progress.val_table(m, out)
  local vl = step.val_losses and step:val_losses() or nil
  vt.metrics = now() - tm0
  -- the validator's wall time by the share of its stages (CPU time summed
  -- over images, which may run in parallel)
  local st = val.timings and val:timings()
  if st then
    local dn = st.select + st.decode + st.nms + st.kpts
    local mt = st.match + st.accum
    local wall = vt.nms
    if dn + mt > 0 then vt.nms, vt.match = wall * dn / (dn + mt), wall * mt / (dn + mt) end
  end
  return m, vl and losses_table(vl) or nil
end

return Trainer
