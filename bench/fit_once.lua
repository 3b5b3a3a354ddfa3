--[[
bench/fit_once.lua — one complete fit of the main job, measured: the child
process of bench/fit_pairs.lua (run it by hand to measure a single fit).

  luajit bench/fit_once.lua [key=value ...]

Runs exactly what recipes/pose_nano.lua runs (same defaults table,
recipes/pose_nano.lua; same keys accepted) with quiet output
and every step's loss items kept (cfg.record_losses), then prints ONE JSON
line on stdout:

  fit_s             complete fit: lucid.wall_time() from before the trainer
                    (context), model, data and loaders are constructed to the
                    end of training (validation and checkpoints included, the
                    stream synchronized)
  steady_step_ms    training windows of the epochs after the first three
                    (all epochs when there are three or fewer), each window
                    fenced on the stream before its first step and after its
                    last one, before validation and the EMA swap: sum of the
                    windows' seconds / sum of their steps
  windows           per epoch {seconds, steps}
  steady_from       the first window of steady_step_ms (4, or 1 with three
                    epochs or fewer)
  loader_wait_ms    the host's time in the loader's next() over those
                    windows, ms per step (the trainer's steady_loader_wait_ms)
  peak_allocated_mib, peak_reserved_mib   ctx:memory_stats() after the fit;
                    with the pipelined route plus its second context's
                    (step stats' lane_b_memory): the sum of the two peaks
  hashes            FNV-1a 64 of value bytes (lucid.hash_tensor), each one
                    stream over its tensors in a fixed order:
                      model      every parameter and buffer (model.params:list())
                      optimizer  every optimizer state tensor (opt:state_views())
                      ema        every EMA tensor (ema:views())
                      losses     every training step's loss items, in order
                      metrics    the numbers the validation table prints
                                 (images, instances, box P R mAP50 mAP50-95,
                                 pose P R mAP50 mAP50-95) and fitness, "%.17g",
                                 of every validation of the fit, in order
  steps, device, precision, route (eager|recorded), step (step:stats()),
  metrics (the final box/pose mAP50-95), config (the overrides given)

Hashing happens after the fit_s stamp (it is part of the whole-process time
the driver measures). Errors: a bad key raises before anything is built
(recipe.resolve); a failing fit exits with status 1 and the error on stderr.
]]
local lucid = require "lucid"
local recipe = require "lucid.recipe"
local cjson = require "cjson"

-- the main job's settings, from the recipe itself (recipes/pose_nano.lua
-- returns its defaults table when given "--defaults")
local function recipe_defaults()
  local src = debug.getinfo(1, "S").source:sub(2)
  local root = src:match("^(.*)/bench/[^/]*$") or "."
  return assert(loadfile(root .. "/recipes/pose_nano.lua"))("--defaults")
end
local defaults = recipe_defaults()
local cfg = recipe.resolve(defaults, arg, { quiet = true })
cfg.record_losses = true -- not a recipe key: every step's loss items stay on the device

local MIB = 1024 * 1024

-- metrics as printed by the validation table, plus fitness, at full precision
local function metric_text(m)
  local v = { m.images, m.box.instances, m.box.precision, m.box.recall, m.box.map50, m.box.map50_95,
    m.pose.precision, m.pose.recall, m.pose.map50, m.pose.map50_95, m.fitness }
  local p = {}
  for i, x in ipairs(v) do p[i] = string.format("%.17g", x) end
  return table.concat(p, " ") .. "\n"
end

local function hash_list(list, get)
  local h = lucid.hash_string("") -- the FNV offset basis: an empty stream
  for _, x in ipairs(list) do h = lucid.hash_tensor(get(x), h) end
  return h
end

-- the measured fit: construction of trainer, model, data and loaders included
local t0 = lucid.wall_time()
local Trainer = require "lucid.trainer"
local trainer = Trainer.new(cfg)
local builders = { yolo11 = "lucid.models.yolo11_pose", yolov8 = "lucid.models.yolov8_pose" }
local build = require(assert(builders[cfg.model], "model must be yolo11 or yolov8"))
local model = build{ scale = cfg.scale, nc = 1, kpt_shape = { 17, 3 }, ctx = trainer.ctx, device = trainer.device }
local metrics_h = lucid.hash_string("")
trainer:add_callback("on_val_end", function(_, ev) metrics_h = lucid.hash_string(metric_text(ev.metrics), metrics_h) end)
local res = trainer:fit(model)
trainer.ctx:synchronize()
local fit_s = lucid.wall_time() - t0

local hashes = {
  model = hash_list(model.params:list(), function(p) return p:data() end),
  optimizer = hash_list(res.optimizer:state_views(), function(v) return v.tensor end),
  ema = hash_list(res.ema:views(), function(v) return v.tensor end),
  losses = hash_list(res.losses or {}, function(t) return t end),
  metrics = metrics_h,
}
local mem = trainer.ctx:memory_stats()
local mem_b = (res.step or {}).lane_b_memory or {} -- the pipelined route's second context
local windows = {}
for i, w in ipairs(res.step_windows or {}) do windows[i] = { w.seconds, w.steps } end
local overrides = {}
for _, a in ipairs(arg) do overrides[#overrides + 1] = a end
-- step:stats() as JSON: finite numbers, strings and booleans only
local st = {}
for k, v in pairs(res.step or {}) do
  if type(v) == "string" or type(v) == "boolean" or (type(v) == "number" and v == v and math.abs(v) ~= math.huge) then
    st[k] = v
  end
end
print(cjson.encode{
  fit_s = fit_s,
  steady_step_ms = res.steady_step_ms or cjson.null,
  windows = windows,
  steady_from = res.steady_from or cjson.null,
  loader_wait_ms = res.steady_loader_wait_ms or cjson.null,
  peak_allocated_mib = ((mem.peak_allocated or 0) + (mem_b.peak_allocated or 0)) / MIB,
  peak_reserved_mib = ((mem.peak_reserved or 0) + (mem_b.peak_reserved or 0)) / MIB,
  hashes = hashes,
  steps = #(res.losses or {}),
  epochs = res.epochs,
  device = trainer.device,
  precision = trainer.precision,
  route = st.route or (cfg.record and "recorded" or "eager"),
  step = st,
  metrics = { box_map50_95 = res.metrics.box.map50_95, pose_map50_95 = res.metrics.pose.map50_95,
    fitness = res.metrics.fitness },
  config = table.concat(overrides, " "),
  lucid_version = lucid.version,
})
