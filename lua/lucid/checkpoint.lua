--- lucid.checkpoint — training checkpoints and resume (issue 6).
--
--   local checkpoint = require("lucid.checkpoint")
--   checkpoint.save("runs/x/weights/last.safetensors", {
--     model = model, ema = ema, optimizer = opt,
--     epoch = epoch, iteration = ni, last_opt_step = last_opt_step,
--     data = {seed = seed, epoch = epoch}, config = cfg, best_fitness = best,
--   })
--   checkpoint.save({best, last}, state, { async = true }) -- one snapshot, two
--                                               -- files, written in the background
--   checkpoint.wait()                           -- raises a failed background write
--   local ckpt = checkpoint.load(path)          -- validates the file
--   ckpt:restore{model = model, ema = ema, optimizer = opt, scaler = scaler}
--
-- File format: ONE safetensors file (DESIGN.md decision 8), written
-- atomically (engine/io atomic writer: temporary file, fsync, rename, fsync
-- of the directory), so a failed or killed save never replaces the previous
-- good file. checkpoint.save(path, state, {async = true}) snapshots the
-- tensors and returns; a background thread writes the file (the next save,
-- checkpoint.wait, and a load of that path wait for it; docs/DECISIONS.md,
-- "Background checkpoint writes").
--   tensors
--     <name>                      every model parameter and buffer under its
--                                 reference (Ultralytics state-dict) name,
--                                 dtype as in the model (F32; I64 counters)
--     ema.<name>                  the EMA of every parameter and f32 buffer
--     optimizer.<param>.<state>   per-parameter optimizer state of every
--                                 trainable parameter (momentum_buffer;
--                                 exp_avg, exp_avg_sq; momentum_buffer_SGD)
--     grad.<name>                 (state.grads = true) the gradients of an
--                                 accumulation window still open at the
--                                 save, so a resumed run applies them
--   metadata (safetensors __metadata__, all strings)
--     format = "lucid.checkpoint", format_version = "1",
--     lucid_version, date (UTC, ISO 8601),
--     epoch             the last COMPLETED epoch, 0-BASED (Ultralytics'
--                       `epoch`): "2" after the epoch the log shows as
--                       "3/10"; -1 when none was completed. A resume
--                       starts at epoch + 1 (0-based).
--     epochs_completed  how many epochs are complete (= epoch + 1): the
--                       1-based number of the last "N/E" the log printed
--     epochs            (when the saver gives it) the planned total E
--     iteration, last_opt_step,
--     best_fitness (JSON number or null), rng (JSON {seed, offset}: the
--     context generator), data (JSON: data-order state, e.g. {seed, epoch}),
--     config (JSON: the resolved recipe configuration), optimizer (JSON:
--     {name, nesterov, groups = [{name, lr, initial_lr, weight_decay,
--     momentum | betas}]}), param_block (JSON: the device-owned state of the
--     parameter block: step, loss_scale, growth_tracker, ema_updates,
--     skipped_steps, nonfinite_norms, grad_norm, clip_coef), ema (JSON
--     {updates, decay, tau}), scaler (JSON {enabled, scale, growth_tracker}).
--
--   data_crc32, data_crc32_tensors   CRC-32s of the data section and of
--                       each tensor, written and verified by the safetensors
--                       writer/reader (engine/io/safetensors.h)
--
-- Loading validates the file (the C reader checks the header, offsets and
-- sizes, and the data checksums when the file has them: a truncated or
-- corrupt file, or one changed bit in a tensor, is an error naming the file
-- and the tensor and its byte range), then the metadata; ckpt:restore validates EVERY tensor the targets need (name,
-- shape, dtype) before it copies anything, and errors name the file and the
-- tensor. Integer metadata are exact below 2^53.
--
-- The metadata JSON uses this file's own codec, not lua-cjson: cjson's
-- encode_number_precision stops at 14 significant digits, too few for the
-- exact float round trips resume needs (details in the JSON section below).
local lucid = require("lucid")

local M = {}

M.FORMAT = "lucid.checkpoint"
M.FORMAT_VERSION = 1

-- ------------------------------------------------------------------ JSON
-- A small JSON codec (RFC 8259) for the metadata: numbers are written with
-- 17 significant digits (integers plainly), so they round-trip exactly.
--
-- Why not lua-cjson (a project dependency, `require "cjson"`): it cannot
-- keep these numbers exact. The Debian build (2.1.0+dfsg-2.2, checked when
-- this was written) caps cjson.encode_number_precision at 14 significant
-- digits ("expected integer between 1 and 14" for 15..17), and a double
-- needs 17 to round-trip. With precision 14: 0.1 + 0.2 encodes as 0.3,
-- 1/3 as 0.33333333333333, a warmup-interpolated lr 0.012345678901234568
-- as 0.012345678901235 — all decode to a different double — and integers
-- from 1e14 up lose digits too (123456789012345 -> 1.2345678901234e+14,
-- 2^53-1 -> 9.007199254741e+15; rng seeds/offsets and counters can be that
-- large). Resume must restore lr, best_fitness, the EMA decay and the
-- counters bit for bit (a resumed run is bitwise equal to an uninterrupted
-- one), so the metadata keep this codec. (cjson also decodes null to the
-- cjson.null sentinel, not nil, which the readers below would need to
-- handle.) Revisit if a cjson build allows precision 17.

local encode

local function encode_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    local map = { ['"'] = '\\"', ['\\'] = '\\\\', ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t' }
    return map[c] or string.format("\\u%04x", c:byte())
  end) .. '"'
end

local function encode_number(x)
  if x ~= x or x == math.huge or x == -math.huge then
    error("json: cannot encode non-finite number " .. tostring(x), 0)
  end
  if x == math.floor(x) and math.abs(x) < 2 ^ 53 then return string.format("%d", x) end
  return string.format("%.17g", x)
end

local function is_array(t)
  local n = #t
  for k in pairs(t) do
    if type(k) ~= "number" or k < 1 or k > n or k ~= math.floor(k) then return false end
  end
  return true
end

encode = function(v, seen)
  local ty = type(v)
  if ty == "nil" then return "null"
  elseif ty == "boolean" then return tostring(v)
  elseif ty == "number" then return encode_number(v)
  elseif ty == "string" then return encode_string(v)
  elseif ty == "table" then
    seen = seen or {}
    if seen[v] then error("json: cannot encode a cyclic table", 0) end
    seen[v] = true
    local parts = {}
    if next(v) ~= nil and is_array(v) then
      for i = 1, #v do parts[i] = encode(v[i], seen) end
      seen[v] = nil
      return "[" .. table.concat(parts, ",") .. "]"
    end
    if next(v) == nil then seen[v] = nil; return "{}" end
    local keys = {}
    for k in pairs(v) do
      if type(k) ~= "string" and type(k) ~= "number" then
        error("json: cannot encode a key of type " .. type(k), 0)
      end
      keys[#keys + 1] = tostring(k)
    end
    table.sort(keys)
    for i, k in ipairs(keys) do
      local val = v[k]
      if val == nil then val = v[tonumber(k)] end
      parts[i] = encode_string(k) .. ":" .. encode(val, seen)
    end
    seen[v] = nil
    return "{" .. table.concat(parts, ",") .. "}"
  end
  error("json: cannot encode a value of type " .. ty, 0)
end

local function decode(s)
  local pos = 1
  local function fail(msg) error(string.format("json: %s at character %d", msg, pos), 0) end
  local function ws() pos = s:find("[^ \t\r\n]", pos) or #s + 1 end
  local value
  local function str()
    pos = pos + 1
    local out = {}
    while true do
      local c = s:sub(pos, pos)
      if c == "" then fail("unterminated string") end
      if c == '"' then pos = pos + 1; break end
      if c == "\\" then
        local e = s:sub(pos + 1, pos + 1)
        local map = { ['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f', n = '\n', r = '\r', t = '\t' }
        if map[e] then out[#out + 1] = map[e]; pos = pos + 2
        elseif e == "u" then
          local h = tonumber(s:sub(pos + 2, pos + 5), 16)
          if not h then fail("bad \\u escape") end
          if h < 128 then out[#out + 1] = string.char(h)
          elseif h < 2048 then out[#out + 1] = string.char(192 + math.floor(h / 64), 128 + h % 64)
          else out[#out + 1] = string.char(224 + math.floor(h / 4096), 128 + math.floor(h / 64) % 64, 128 + h % 64) end
          pos = pos + 6
        else fail("bad escape") end
      else
        out[#out + 1] = c
        pos = pos + 1
      end
    end
    return table.concat(out)
  end
  value = function()
    ws()
    local c = s:sub(pos, pos)
    if c == "{" then
      pos = pos + 1
      local t = {}
      ws()
      if s:sub(pos, pos) == "}" then pos = pos + 1; return t end
      while true do
        ws()
        if s:sub(pos, pos) ~= '"' then fail("expected a string key") end
        local k = str()
        ws()
        if s:sub(pos, pos) ~= ":" then fail("expected ':'") end
        pos = pos + 1
        t[k] = value()
        ws()
        local d = s:sub(pos, pos)
        pos = pos + 1
        if d == "}" then return t end
        if d ~= "," then fail("expected ',' or '}'") end
      end
    elseif c == "[" then
      pos = pos + 1
      local t = {}
      ws()
      if s:sub(pos, pos) == "]" then pos = pos + 1; return t end
      while true do
        t[#t + 1] = value()
        ws()
        local d = s:sub(pos, pos)
        pos = pos + 1
        if d == "]" then return t end
        if d ~= "," then fail("expected ',' or ']'") end
      end
    elseif c == '"' then return str()
    elseif s:sub(pos, pos + 3) == "true" then pos = pos + 4; return true
    elseif s:sub(pos, pos + 4) == "false" then pos = pos + 5; return false
    elseif s:sub(pos, pos + 3) == "null" then pos = pos + 4; return nil
    else
      local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
      if not num or num == "" or not tonumber(num) then fail("unexpected character") end
      pos = pos + #num
      return tonumber(num)
    end
  end
  local v = value()
  ws()
  if pos <= #s then fail("trailing characters") end
  return v
end

--- JSON text of a Lua value (tables with string keys -> objects, sorted;
-- sequences -> arrays). Raises on cycles, functions and non-finite numbers.
M.json_encode = function(v) return encode(v) end
--- Lua value of a JSON text (null -> nil). Raises naming the position.
M.json_decode = decode

-- --------------------------------------------------------------- helpers

local function mt_name(x)
  local mt = getmetatable(x)
  return type(mt) == "table" and mt.__name or nil
end

--- The ParamSet of a model argument (lucid.ParamSet, or a table with a
-- materialised .params / ._set).
local function set_of(model, what)
  if mt_name(model) == "lucid.ParamSet" then return model end
  if type(model) == "table" then
    if mt_name(model.params) == "lucid.ParamSet" then return model.params end
    if mt_name(model._set) == "lucid.ParamSet" then return model._set end
  end
  error(string.format("%s: expected a model (with a materialised .params) or a lucid.ParamSet, got %s",
    what, mt_name(model) or type(model)), 3)
end

local function shape_str(s)
  local p = {}
  for i = 1, #s do p[i] = string.format("%d", s[i]) end
  return "[" .. table.concat(p, ", ") .. "]"
end

local function int_field(state, k, default)
  local v = state[k]
  if v == nil then return default end
  if type(v) ~= "number" or v ~= math.floor(v) then
    error(string.format("checkpoint.save: state.%s: expected an integer, got %s", k, tostring(v)), 3)
  end
  return v
end

--- Host copy of the optimizer's hyperparameters (per group).
local function optimizer_meta(opt)
  local groups = {}
  for i, g in ipairs(opt.param_groups) do
    groups[i] = { name = g.name, lr = g.lr, initial_lr = g.initial_lr,
      weight_decay = g.weight_decay, momentum = g.momentum, betas = g.betas }
  end
  return { name = opt.name, nesterov = opt.nesterov, groups = groups }
end

local BLOCK_FIELDS = { "step", "loss_scale", "growth_tracker", "ema_updates", "skipped_steps",
  "nonfinite_norms", "grad_norm", "clip_coef" }

-- --------------------------------------------------------------- saving

--- checkpoint.save(path, state, [opts]) — write one checkpoint atomically.
-- @param path string | {string, ...}: target file(s) (their directories
--   must exist). Several paths get the same bytes from ONE snapshot
--   (serialised once; each file written, fsynced and renamed on its own:
--   independent files, e.g. {best, last} in the trainer); a failed path
--   stops the job, and the paths after it keep their previous contents.
-- @param state table:
--   model        Model | ParamSet (required): parameters and buffers
--   ema          lucid.EMA | nil
--   optimizer    lucid.Optimizer | nil: state buffers + hyperparameters
--   scaler       lucid.GradScaler | nil (its scale lives in the block)
--   block        lucid.ParamBlock | nil (default: optimizer.block, else
--                ema.block): its device-owned state is saved
--   epoch        integer: the last completed epoch, 0-based (default -1:
--                none); epochs_completed = epoch + 1 is stored with it
--   epochs       integer | nil: the planned number of epochs
--   iteration, last_opt_step   integers (default 0, -1)
--   rng          {seed=, offset=} | nil (default: lucid.rng_state(ctx))
--   ctx          Context whose generator to record (default context)
--   data         table | nil: data-order state, e.g. {seed=, epoch=}
--   config       table | string | nil: resolved recipe configuration
--                (tables are JSON-encoded; strings must already be JSON)
--   best_fitness number | nil
--   metadata     table | nil: extra string -> string entries
-- @param opts table | nil:
--   async        boolean (default false). false: returns when every file
--                is written. true: returns once the tensors are copied to
--                host memory (the snapshot); the files are written by the
--                background writer (lucid.io, one thread, saves in order)
--                and the model may train on at once. See checkpoint.wait.
-- Every save first waits for the previous one (one write in flight, one
-- snapshot in host memory), and raises ITS failure if it failed. Then the
-- device is synchronized and every tensor copied to the host. Errors: a bad
-- state field raises naming it; an I/O failure raises "lucid io error:
-- write of <path> failed: ..." here when synchronous, "lucid io error:
-- background write of <path> failed: ..." at the next save, checkpoint.wait,
-- or load of that path when async, and leaves the existing file at path
-- untouched. A process killed while writing leaves its temporary file
-- ".<name>.tmp.XXXXXX" beside the target (the target itself is intact); a
-- save does not remove other writers' temporaries (another process may be
-- writing that target). lucid.io.remove_stale_temps(path) removes them when
-- no one else writes there (the Trainer does it for its weights at the
-- start of a fit).
function M.save(path, state, opts)
  local paths = path
  if type(path) == "string" then
    paths = { path }
  elseif type(path) == "table" and #path >= 1 then
    for i = 1, #path do
      if type(path[i]) ~= "string" then
        error(string.format("checkpoint.save: path[%d]: expected a string, got %s", i, type(path[i])), 2)
      end
    end
  else
    error("checkpoint.save: path: expected a string or a list of strings, got " .. type(path), 2)
  end
  if type(state) ~= "table" then error("checkpoint.save: state: expected a table, got " .. type(state), 2) end
  if opts ~= nil and type(opts) ~= "table" then error("checkpoint.save: opts: expected a table, got " .. type(opts), 2) end
  for k in pairs(opts or {}) do
    if k ~= "async" then
      error(string.format("checkpoint.save: opts: unknown option '%s' (expected async)", tostring(k)), 2)
    end
  end
  local async = opts and opts.async or false
  if type(async) ~= "boolean" then error("checkpoint.save: opts.async: expected a boolean, got " .. type(async), 2) end
  local set = set_of(state.model, "checkpoint.save: state.model")
  local entries, seen = {}, {}
  local function add(name, t)
    if seen[name] then error("checkpoint.save: duplicate tensor name '" .. name .. "'", 3) end
    seen[name] = true
    entries[#entries + 1] = { name, t }
  end
  for _, p in ipairs(set:list()) do add(p.name, p:data()) end
  -- gradients of an open accumulation window (backward passes since the
  -- last optimizer step): without them a resumed run would drop them
  if state.grads then
    for _, p in ipairs(set:list()) do
      local g = p.trainable and p:grad() or nil
      if g then add("grad." .. p.name, g) end
    end
  end
  local meta = {
    format = M.FORMAT, format_version = tostring(M.FORMAT_VERSION),
    lucid_version = lucid.version or "?", date = os.date("!%Y-%m-%dT%H:%M:%SZ"),
    epoch = encode_number(int_field(state, "epoch", -1)),
    epochs_completed = encode_number(int_field(state, "epoch", -1) + 1),
    iteration = encode_number(int_field(state, "iteration", 0)),
    last_opt_step = encode_number(int_field(state, "last_opt_step", -1)),
  }
  if int_field(state, "epoch", -1) < -1 then
    error("checkpoint.save: state.epoch: expected the last completed epoch (0-based) or -1, got "
      .. tostring(state.epoch), 2)
  end
  if state.epochs ~= nil then meta.epochs = encode_number(int_field(state, "epochs", 0)) end
  if state.best_fitness ~= nil and type(state.best_fitness) ~= "number" then
    error("checkpoint.save: state.best_fitness: expected a number, got " .. type(state.best_fitness), 2)
  end
  local bf = state.best_fitness
  meta.best_fitness = (bf == nil or bf ~= bf or math.abs(bf) == math.huge) and "null" or encode_number(bf)
  local rng = state.rng
  if rng == nil then
    local seed, offset = lucid.rng_state(state.ctx)
    rng = { seed = seed, offset = offset }
  end
  meta.rng = encode({ seed = rng.seed, offset = rng.offset })
  if state.data ~= nil then meta.data = encode(state.data) end
  if type(state.config) == "string" then
    local ok, err = pcall(decode, state.config)
    if not ok then error("checkpoint.save: state.config: not valid JSON (" .. err .. ")", 2) end
    meta.config = state.config
  elseif state.config ~= nil then
    local ok, js = pcall(encode, state.config)
    if not ok then error("checkpoint.save: state.config: " .. js, 2) end
    meta.config = js
  end
  local ema, opt = state.ema, state.optimizer
  if ema ~= nil then
    if mt_name(ema) ~= "lucid.EMA" then error("checkpoint.save: state.ema: expected lucid.EMA, got " .. (mt_name(ema) or type(ema)), 2) end
    for _, v in ipairs(ema:views()) do add("ema." .. v.name, v.tensor) end
    meta.ema = encode({ updates = ema.updates, decay = ema.decay, tau = ema.tau })
  end
  if opt ~= nil then
    if mt_name(opt) ~= "lucid.Optimizer" then error("checkpoint.save: state.optimizer: expected lucid.Optimizer, got " .. (mt_name(opt) or type(opt)), 2) end
    for _, v in ipairs(opt:state_views()) do add("optimizer." .. v.name, v.tensor) end
    meta.optimizer = encode(optimizer_meta(opt))
  end
  local block = state.block or (opt and opt.block) or (ema and ema.block)
  if block ~= nil then
    local st, out = block:state(), {}
    for _, k in ipairs(BLOCK_FIELDS) do
      local v = st[k]
      if v ~= v or math.abs(v) == math.huge then v = nil end -- JSON has no NaN
      out[k] = v
    end
    meta.param_block = encode(out)
  end
  if state.scaler ~= nil then
    local sc = state.scaler
    local s = { enabled = sc:is_enabled(), scale = sc:get_scale() }
    meta.scaler = encode(s)
  end
  for k, v in pairs(state.metadata or {}) do
    if meta[k] ~= nil then error("checkpoint.save: state.metadata." .. tostring(k) .. " would overwrite a reserved key", 2) end
    meta[k] = tostring(v)
  end
  lucid.io.safetensors_save(paths, entries, meta, { ctx = state.ctx, async = async })
end

--- checkpoint.wait([path]) — block until the pending background writes are
-- on disk (all of them, or those of path). Raises the first failed write
-- not yet reported ("lucid io error: background write of <path> failed:
-- <why>"; the previous file at that path is intact). Each failure is
-- raised once. The trainer calls it before fit returns, on success and on
-- error.
function M.wait(path)
  if path ~= nil and type(path) ~= "string" then
    error("checkpoint.wait: path: expected a string or nil, got " .. type(path), 2)
  end
  lucid.io.wait(path)
end

--- checkpoint.pending() -> number of saves not yet written to disk.
function M.pending() return lucid.io.pending() end

--- checkpoint.writer_stats() -> {jobs, failed, files, bytes, seconds}:
-- the background writer's counters (seconds: wall time it spent writing,
-- off the caller's thread).
function M.writer_stats() return lucid.io.writer_stats() end

-- -------------------------------------------------------------- loading

local Ckpt = {}
Ckpt.__index = Ckpt

local function meta_json(path, md, key, required)
  local s = md[key]
  if s == nil then
    if required then error(string.format("checkpoint %s: metadata '%s' is missing", path, key), 3) end
    return nil
  end
  local ok, v = pcall(decode, s)
  if not ok then error(string.format("checkpoint %s: metadata '%s' is not valid JSON (%s)", path, key, v), 3) end
  return v
end

local function meta_int(path, md, key)
  local v = meta_json(path, md, key, true)
  if type(v) ~= "number" or v ~= math.floor(v) then
    error(string.format("checkpoint %s: metadata '%s' = %q is not an integer", path, key, tostring(md[key])), 3)
  end
  return v
end

--- checkpoint.load(path, [opts]) -> ckpt: open and validate a checkpoint.
-- A pending background write of path is waited for first (its failure is
-- raised). The whole file is read and its structure checked by the C reader (a
-- truncated or corrupt file raises "lucid format: <path>: ..."); then the
-- format marker and every metadata entry are decoded.
-- @param opts table|nil: ctx (Context for the reader)
-- @return ckpt table: path, epoch (last completed, 0-based; -1: none),
--   epochs_completed (epoch + 1; derived for files written before it was
--   stored), epochs (planned total or nil), checksummed (the file carried
--   data checksums, verified), iteration, last_opt_step, best_fitness
--   (number or nil), rng {seed, offset}, data, config (decoded table),
--   config_json (string), optimizer, param_block, ema, scaler (decoded
--   tables or nil), lucid_version, date, metadata (raw strings), names
--   (tensor names), and methods ckpt:info(name) -> {dtype, shape} | nil,
--   ckpt:tensor(name) -> new CPU tensor, ckpt:restore(targets),
--   ckpt:close().
function M.load(path, opts)
  if type(path) ~= "string" then error("checkpoint.load: path: expected a string, got " .. type(path), 2) end
  require("lucid.nn.util").check_options("checkpoint.load", opts, { "ctx" })
  local f = lucid.io.safetensors_open(path, opts and opts.ctx and { ctx = opts.ctx } or nil)
  local md = f:metadata()
  if md.format ~= M.FORMAT then
    f:close()
    error(string.format("checkpoint %s: not a lucid checkpoint (metadata 'format' is %s; expected %q)",
      path, md.format and string.format("%q", md.format) or "absent", M.FORMAT), 2)
  end
  local ver = tonumber(md.format_version or "")
  if not ver or ver > M.FORMAT_VERSION then
    f:close()
    error(string.format("checkpoint %s: format_version %s is not supported (this lucid reads <= %d)",
      path, tostring(md.format_version), M.FORMAT_VERSION), 2)
  end
  local ok, ck = pcall(function()
    local c = setmetatable({ path = path, file = f, metadata = md, names = f:names() }, Ckpt)
    c.epoch = meta_int(path, md, "epoch")
    if md.epochs_completed ~= nil then
      c.epochs_completed = meta_int(path, md, "epochs_completed")
      if c.epochs_completed ~= c.epoch + 1 then
        error(string.format("checkpoint %s: metadata epochs_completed = %d but epoch = %d (the last completed "
          .. "epoch, 0-based) says %d: inconsistent metadata", path, c.epochs_completed, c.epoch, c.epoch + 1), 0)
      end
    else
      c.epochs_completed = c.epoch + 1 -- written before epochs_completed was stored
    end
    if md.epochs ~= nil then c.epochs = meta_int(path, md, "epochs") end
    c.checksummed = f:checksummed()
    c.iteration = meta_int(path, md, "iteration")
    c.last_opt_step = meta_int(path, md, "last_opt_step")
    c.best_fitness = meta_json(path, md, "best_fitness", false)
    c.rng = meta_json(path, md, "rng", false)
    c.data = meta_json(path, md, "data", false)
    c.config_json = md.config
    c.config = meta_json(path, md, "config", false)
    c.optimizer = meta_json(path, md, "optimizer", false)
    c.param_block = meta_json(path, md, "param_block", false)
    c.ema = meta_json(path, md, "ema", false)
    c.scaler = meta_json(path, md, "scaler", false)
    c.lucid_version = md.lucid_version
    c.date = md.date
    return c
  end)
  if not ok then
    f:close()
    error(ck, 2)
  end
  return ck
end

--- ckpt:info(name) -> {dtype = "f32", shape = {..}} or nil.
function Ckpt:info(name) return self.file:info(name) end

--- ckpt:tensor(name) -> a new CPU tensor with the stored values (dtype and
-- shape of the file). Raises naming the file when the tensor is absent.
function Ckpt:tensor(name)
  local info = self.file:info(name)
  if not info then error(string.format("checkpoint %s: no tensor '%s'", self.path, name), 2) end
  local t = lucid.empty(#info.shape > 0 and info.shape or {1}, { dtype = info.dtype, device = "cpu" })
  if #info.shape == 0 then t = t:view({}) end
  self.file:load(name, t)
  return t
end

--- ckpt:close() — release the file (also done by the garbage collector).
function Ckpt:close()
  if self.file then self.file:close() end
end

-- Check one stored tensor against a destination (name, shape, dtype).
local function check_tensor(self, name, dst, what, problems)
  local info = self.file:info(name)
  if not info then
    problems[#problems + 1] = string.format("tensor '%s' is missing (%s)", name, what)
    return
  end
  local shape = dst:shape()
  if shape_str(info.shape) ~= shape_str(shape) then
    problems[#problems + 1] = string.format("tensor '%s': shape %s in the file, %s in the %s",
      name, shape_str(info.shape), shape_str(shape), what)
  elseif info.dtype ~= dst:dtype() then
    problems[#problems + 1] = string.format("tensor '%s': dtype %s in the file, %s in the %s",
      name, info.dtype, dst:dtype(), what)
  end
end

--- ckpt:restore(targets) — copy the checkpoint into live objects.
-- Every needed tensor is validated (present, same shape, same dtype) before
-- anything is copied; the file's tensors must all be claimed by a target
-- kind that was given or skipped on purpose (unknown names are an error).
-- @param targets table:
--   model      Model | ParamSet (required)
--   ema        lucid.EMA | nil: values, updates, decay, tau
--   optimizer  lucid.Optimizer | nil: state buffers, group hyperparameters
--              (the optimizer kind must match), and the block state
--   scaler     lucid.GradScaler | nil: bound to targets.optimizer first so
--              the restored loss scale stands
--   block      lucid.ParamBlock | nil (default optimizer.block or
--              ema.block): receives the saved device-owned state
--   rng        false to leave the generator alone; default: restore it
--   ctx        Context whose generator to restore (default context)
-- @return self (epoch, iteration, last_opt_step ... for the trainer)
function Ckpt:restore(targets)
  if type(targets) ~= "table" then error("ckpt:restore: targets: expected a table", 2) end
  require("lucid.nn.util").check_options("ckpt:restore", targets,
    { "model", "ema", "optimizer", "scaler", "block", "rng", "ctx" }, 2, "targets")
  local path = self.path
  local set = set_of(targets.model, "ckpt:restore: targets.model")
  local opt, ema = targets.optimizer, targets.ema
  local plan, problems, claimed = {}, {}, {}
  for _, p in ipairs(set:list()) do
    local t = p:data()
    check_tensor(self, p.name, t, "model", problems)
    plan[#plan + 1] = { p.name, t }
    claimed[p.name] = true
  end
  if ema ~= nil then
    if not self.ema then problems[#problems + 1] = "no EMA in the file (metadata 'ema' absent)" end
    for _, v in ipairs(ema:views()) do
      local n = "ema." .. v.name
      check_tensor(self, n, v.tensor, "EMA", problems)
      plan[#plan + 1] = { n, v.tensor }
      claimed[n] = true
    end
  end
  if opt ~= nil then
    local om = self.optimizer
    if not om then
      problems[#problems + 1] = "no optimizer state in the file (metadata 'optimizer' absent)"
    elseif om.name ~= opt.name then
      problems[#problems + 1] = string.format("optimizer is %s in the file, %s in the run", tostring(om.name), opt.name)
    elseif #om.groups ~= #opt.param_groups then
      problems[#problems + 1] = string.format("optimizer has %d groups in the file, %d in the run", #om.groups, #opt.param_groups)
    end
    for _, v in ipairs(opt:state_views()) do
      local n = "optimizer." .. v.name
      check_tensor(self, n, v.tensor, "optimizer", problems)
      plan[#plan + 1] = { n, v.tensor }
      claimed[n] = true
    end
  end
  -- gradients of an open accumulation window, when the file has them;
  -- without them the gradients are zeroed (a window closed at the save)
  local has_grads = false
  for _, n in ipairs(self.names) do if n:sub(1, 5) == "grad." then has_grads = true break end end
  local zero_grads = {}
  for _, p in ipairs(set:list()) do
    local g = p.trainable and p:grad() or nil
    if g then
      local n = "grad." .. p.name
      if has_grads then
        check_tensor(self, n, g, "gradient", problems)
        plan[#plan + 1] = { n, g }
        claimed[n] = true
      else
        zero_grads[#zero_grads + 1] = g
      end
    end
  end
  for _, n in ipairs(self.names) do
    local skipped = (ema == nil and n:sub(1, 4) == "ema.") or (opt == nil and n:sub(1, 10) == "optimizer.")
    if not claimed[n] and not skipped then
      problems[#problems + 1] = string.format("tensor '%s' in the file matches nothing in the targets", n)
    end
  end
  if #problems > 0 then
    local shown = {}
    for i = 1, math.min(#problems, 8) do shown[i] = problems[i] end
    local more = #problems > 8 and string.format(" (and %d more)", #problems - 8) or ""
    error(string.format("checkpoint %s: %s%s; nothing was restored", path, table.concat(shown, "; "), more), 2)
  end
  -- everything checked: copy
  if targets.scaler ~= nil and opt ~= nil then targets.scaler:bind(opt) end
  for _, e in ipairs(plan) do self.file:load(e[1], e[2]) end
  for _, g in ipairs(zero_grads) do g:zero_() end
  if opt ~= nil then
    for i, g in ipairs(opt.param_groups) do
      local s = self.optimizer.groups[i]
      g.initial_lr = s.initial_lr
      g.lr = s.lr
      g.weight_decay = s.weight_decay
      if s.momentum ~= nil and g.momentum ~= nil then g.momentum = s.momentum end
      if s.betas ~= nil and g.betas ~= nil then g.betas = s.betas end
    end
    opt:upload()
  end
  local block = targets.block or (opt and opt.block) or (ema and ema.block)
  if block ~= nil and self.param_block then
    local st = {}
    for _, k in ipairs(BLOCK_FIELDS) do st[k] = self.param_block[k] end
    st.found_inf = 0
    block:set_state(st)
  end
  if ema ~= nil and self.ema then
    ema.decay = self.ema.decay
    ema.tau = self.ema.tau
    ema.updates = self.ema.updates
  end
  if targets.rng ~= false and self.rng then
    lucid.set_rng_state(self.rng.seed, self.rng.offset, targets.ctx)
  end
  return self
end

--- checkpoint.resume(path, targets) -> ckpt: load + restore (+ close).
function M.resume(path, targets)
  local ck = M.load(path, targets and targets.ctx and { ctx = targets.ctx } or nil)
  local ok, err = pcall(Ckpt.restore, ck, targets)
  ck:close()
  if not ok then error(err, 2) end
  return ck
end

M.restore = function(ckpt, targets) return Ckpt.restore(ckpt, targets) end

return M
