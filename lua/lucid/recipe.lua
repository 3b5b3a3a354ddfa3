--[[
lucid.recipe — recipe configuration: one schema table of defaults,
command-line overrides `key=value`, unknown keys rejected by name, values
parsed to the type of their default, and the resolved configuration printed
at start (style_anchors Avoid 14: recipes that silently accept typos).

  local recipe = require "lucid.recipe"
  local cfg = recipe.resolve(defaults, arg)   -- arg: the script's arg table
  recipe.print(cfg)

Values: a default that is a number accepts finite numbers ("0.01", "1e-3";
inf and nan are refused); a boolean accepts true/false/1/0/yes/no (any
case) and nothing else, except the Ultralytics keys that take more:
resume= also takes a checkpoint path (one that contains '/' or ends in
.safetensors: resume=runs/x/weights/last.safetensors) and cache= also takes
'ram' (= true: the prepared images are kept in RAM; 'disk' is refused, lucid
has no disk cache); a string accepts any non-empty text (an empty value is
refused for every key: an empty path would write to the filesystem root); a
string that reads as a number becomes one (max_gt=64 for the default
"auto"), and must be finite. Nested tables are addressed with dots: clip.max_norm=5.
Ranges (lr0 > 0, conf in [0, 1], ...) are checked by the consumer
(lucid.trainer's check_config, lucid.predict's check_options), before any
work starts.
An integer typed in digits that a number does not hold exactly (past 2^53)
is refused as typed. `--help`, `-h` or `help` among the arguments: the
recipe prints recipe.usage (its keys, defaults and descriptions) and exits 0.
Errors: recipe.resolve raises "recipe: unknown key 'x' (did you mean 'y'?)"
(the suggestion ignores case: EPOCHS suggests epochs) or "recipe: key=value
expected, got 'x'" or "recipe: batch: expected a number, got 'abc'".
]]
local recipe = {}

-- Edit distance, for "did you mean" hints.
local function distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:sub(i, i) == b:sub(j, j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

local function deep_copy(t)
  if type(t) ~= "table" then return t end
  local r = {}
  for k, v in pairs(t) do r[k] = deep_copy(v) end
  return r
end

local function all_keys(t, prefix, out)
  out = out or {}
  for k, v in pairs(t) do
    local name = prefix and (prefix .. "." .. k) or k
    if type(v) == "table" and next(v) ~= nil and #v == 0 then
      all_keys(v, name, out)
    else
      out[#out + 1] = name
    end
  end
  return out
end

-- "did you mean": the nearest key by edit distance, case ignored (EPOCHS=1
-- suggests epochs; the keys themselves are case-sensitive); failing that,
-- the one nested key whose last part is the key (fliplr=0.5 suggests
-- augment.fliplr: Ultralytics' keys are flat, lucid groups some)
local function suggest(key, defaults)
  local best, bd
  local lkey = key:lower()
  local keys = all_keys(defaults)
  for _, k in ipairs(keys) do
    local d = distance(lkey, k:lower())
    if not bd or d < bd then best, bd = k, d end
  end
  if bd and bd <= math.max(2, math.floor(#key / 3)) then
    return string.format(" (did you mean '%s'?)", best)
  end
  local nested
  for _, k in ipairs(keys) do
    if k:lower():sub(-#lkey - 1) == "." .. lkey then
      if nested then return "" end -- two of them: no single answer
      nested = k
    end
  end
  return nested and string.format(" (did you mean '%s'?)", nested) or ""
end

local function finite(v) return v == v and v ~= math.huge and v ~= -math.huge end

-- An integer typed in digits that a number does not hold exactly (past
-- 2^53: seed=9007199254740993 would silently become ...992) is refused as
-- typed; integers that are exact (2^60 in digits) and exponent forms (1e20)
-- are read as usual.
local function check_exact(key, text, v)
  local digits = text:match("^%s*[+-]?0*(%d+)%s*$")
  if not digits or math.abs(v) < 2 ^ 53 then return end
  if digits ~= string.format("%.0f", math.abs(v)) then
    error(string.format("recipe: %s: %s is not held exactly by a number (integers are exact up to 2^53 = "
      .. "9007199254740992; it would be read as %.0f)", key, text, v), 0)
  end
end

-- Boolean keys that take more than true/false (Ultralytics cfg): the value
-- to use for the extra text, or nil (then an error).
local BOOLEAN_EXTRA = {
  -- resume: true/false or the checkpoint file to resume from
  resume = function(key, text)
    if text:find("/", 1, true) or text:match("%.safetensors$") then return text end
    error(string.format("recipe: %s: expected true, false or a checkpoint path (containing '/' or ending in "
      .. ".safetensors), got '%s'", key, text), 0)
  end,
  -- cache: Ultralytics True/False/'ram'/'disk'; lucid's cache (cache=true)
  -- keeps the prepared images in host RAM
  cache = function(key, text)
    local l = text:lower()
    if l == "ram" then return true end
    if l == "disk" then
      error(string.format("recipe: %s=disk is not supported: lucid caches the prepared images in RAM only "
        .. "(%s=true or %s=ram; %s=false decodes every image each epoch)", key, key, key, key), 0)
    end
    error(string.format("recipe: %s: expected true, false or ram, got '%s'", key, text), 0)
  end,
}

local function parse_value(key, text, default)
  local kind = type(default)
  if text == "" then
    -- never an empty path: out= would write /predictions.json, project= log to /<name>
    local example = (type(default) == "string" and default ~= "") or type(default) == "number"
      or type(default) == "boolean"
    error(string.format("recipe: %s: empty value; give one%s", key,
      example and string.format(" (the default is %s=%s)", key, tostring(default)) or ""), 0)
  end
  if kind == "number" then
    local v = tonumber(text)
    if not v then error(string.format("recipe: %s: expected a number, got '%s'", key, text), 0) end
    if not finite(v) then error(string.format("recipe: %s: expected a finite number, got '%s'", key, text), 0) end
    check_exact(key, text, v)
    return v
  elseif kind == "boolean" then
    local l = text:lower()
    if l == "true" or l == "1" or l == "yes" then return true end
    if l == "false" or l == "0" or l == "no" then return false end
    local extra = BOOLEAN_EXTRA[key]
    if extra then return extra(key, text) end
    error(string.format("recipe: %s: expected true or false, got '%s'", key, text), 0)
  elseif kind == "table" then
    if next(default) ~= nil and #default == 0 then
      error(string.format("recipe: %s is a group of settings; set its fields, e.g. %s.%s=...", key, key,
        (next(default))), 0)
    end
    -- a list default: comma-separated numbers
    local out = {}
    for item in text:gmatch("[^,]+") do
      local v = tonumber(item)
      if not v or not finite(v) then
        error(string.format("recipe: %s: expected comma-separated finite numbers, got '%s'", key, text), 0)
      end
      out[#out + 1] = v
    end
    return out
  end
  if text == "nil" or text == "none" then return nil end
  local v = tonumber(text)
  if v and not finite(v) then error(string.format("recipe: %s: expected a finite number, got '%s'", key, text), 0) end
  -- digits no number holds exactly stay text here (name=12345678901234567890)
  if v and not pcall(check_exact, key, text, v) then return text end
  return v or text
end

--- Resolve a configuration: a copy of `defaults` with the overrides from
-- `args` (an array of "key=value" strings, e.g. the script's `arg`; non-string
-- entries and negative indices are ignored) and from `overrides` (a table,
-- same keys). Raises on an unknown key or a value of the wrong type.
-- @return the resolved table
function recipe.resolve(defaults, args, overrides)
  local cfg = deep_copy(defaults)
  local function set(key, value, from_text)
    local node, last = cfg, nil
    local parts = {}
    for p in key:gmatch("[^.]+") do parts[#parts + 1] = p end
    local dnode = defaults
    for i = 1, #parts - 1 do
      dnode = type(dnode) == "table" and dnode[parts[i]] or nil
      node = node[parts[i]]
      if type(dnode) ~= "table" or type(node) ~= "table" then
        error(string.format("recipe: unknown key '%s'%s", key, suggest(key, defaults)), 0)
      end
    end
    last = parts[#parts]
    if dnode[last] == nil and not (type(dnode) == "table" and rawget(dnode, last) ~= nil) then
      error(string.format("recipe: unknown key '%s'%s", key, suggest(key, defaults)), 0)
    end
    if from_text then value = parse_value(key, value, dnode[last]) end
    node[last] = value
  end
  for k, v in pairs(overrides or {}) do set(k, v, false) end
  -- a key given again replaces the earlier value, as in Ultralytics'
  -- entrypoint (its overrides dict keeps the last, then checks it): only
  -- the last occurrence of a key is parsed and checked
  local last = {}
  for i, a in ipairs(args or {}) do
    local k = type(a) == "string" and a:match("^([%w_%.%-]+)=") or nil
    if k then last[k] = i end
  end
  for i, a in ipairs(args or {}) do
    if type(a) == "string" then
      local k, v = a:match("^([%w_%.%-]+)=(.*)$")
      if not k then error(string.format("recipe: key=value expected, got '%s' (argument %d)", a, i), 0) end
      if last[k] == i then set(k, v, true) end
    end
  end
  return cfg
end

-- Settings a resume may change from the command line; every other setting
-- comes from the checkpoint (Ultralytics check_resume keeps imgsz, batch,
-- device and close_mosaic from the overrides; lucid adds the settings that
-- only say where and how long to run: epochs extends a finished run).
recipe.RESUME_OVERRIDES = {
  imgsz = true, batch = true, device = true, ["augment.close_mosaic"] = true,
  epochs = true, workers = true, project = true, name = true, exist_ok = true, resume = true,
  quiet = true, save_period = true, val_period = true,
}

local function flatten(t, prefix, out)
  for k, v in pairs(t) do
    local name = prefix and (prefix .. "." .. k) or k
    if type(v) == "table" and #v == 0 and next(v) ~= nil then flatten(v, name, out) else out[name] = v end
  end
  return out
end

--- The configuration of a resumed run: when cfg.resume is set (true: the
-- run's weights/last.safetensors under project/name; a string: that file),
-- the settings saved in the checkpoint replace the defaults, and of the
-- command-line `args` only the keys of recipe.RESUME_OVERRIDES apply (the
-- others are listed in the returned note and ignored, as Ultralytics'
-- resume does). Without resume, cfg is returned unchanged. The saved
-- project and name are those of the folder the run wrote (the trainer saves
-- runs/try2's name as "try2"), so the resumed run continues in its original
-- run folder even when the file was copied elsewhere, as Ultralytics'
-- resume does (project= and name= choose another; the trainer prints the
-- folder).
-- load_checkpoint: checkpoint.load (or a function path -> {config = table}).
-- Errors: "resume: no checkpoint at <path> ..." when the file is missing; a
-- file that is not a lucid checkpoint, or whose config metadata is not
-- valid JSON, raises the checkpoint reader's error.
-- @return cfg, note (string or nil: what was restored and ignored)
function recipe.apply_resume(cfg, defaults, args, load_checkpoint)
  local r = cfg.resume
  if r == nil or r == false or r == "false" or r == "" then return cfg, nil end
  local path = (type(r) == "string" and r ~= "true") and r
    or ((cfg.project or "runs") .. "/" .. (cfg.name or "train") .. "/weights/last.safetensors")
  local f = io.open(path, "rb")
  if not f then
    error(string.format("resume: no checkpoint at %s (a run resumes from its weights/last.safetensors; "
      .. "check project= and name=, or start the run without resume=)", path), 0)
  end
  f:close()
  local ck = load_checkpoint(path)
  local saved = ck.config
  local done = ck.epochs_completed
  if ck.close then ck:close() end
  if type(saved) ~= "table" then return cfg, nil end
  -- saved settings that this recipe still has, then the allowed overrides
  local known = flatten(defaults, nil, {})
  local base = {}
  for k, v in pairs(flatten(saved, nil, {})) do
    if known[k] ~= nil or rawget(known, k) ~= nil then base[k] = v end
  end
  local allowed, ignored = {}, {}
  for _, a in ipairs(args or {}) do
    if type(a) == "string" then
      local k = a:match("^([%w_%.%-]+)=")
      if k and recipe.RESUME_OVERRIDES[k] then allowed[#allowed + 1] = a
      elseif k then ignored[#ignored + 1] = k end
    end
  end
  local out = recipe.resolve(defaults, allowed, base)
  out.resume = cfg.resume
  local note = string.format("Resuming %s%s with the settings saved in it", path,
    done and string.format(" (%d epoch%s completed)", done, done == 1 and "" or "s") or "")
  if #ignored > 0 then
    table.sort(ignored)
    note = note .. string.format(" (ignored on resume: %s; allowed: %s)", table.concat(ignored, ", "),
      "imgsz, batch, device, augment.close_mosaic, epochs, workers, save_period, val_period, project, name, exist_ok, quiet")
  end
  return out, note
end

--- Render the resolved configuration, sorted by key, one "key: value" per
-- line (nested tables flattened with dots).
function recipe.format(cfg)
  local lines = {}
  local function walk(t, prefix)
    local keys = {}
    for k in pairs(t) do keys[#keys + 1] = k end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    for _, k in ipairs(keys) do
      local v = t[k]
      local name = prefix and (prefix .. "." .. k) or tostring(k)
      if type(v) == "table" and #v == 0 and next(v) ~= nil then
        walk(v, name)
      elseif type(v) == "table" then
        local p = {}
        for i = 1, #v do p[i] = tostring(v[i]) end
        lines[#lines + 1] = string.format("  %-28s %s", name, "{" .. table.concat(p, ", ") .. "}")
      else
        lines[#lines + 1] = string.format("  %-28s %s", name, tostring(v))
      end
    end
  end
  walk(cfg)
  return table.concat(lines, "\n")
end

--- Print the resolved configuration (recipe.format) to out (io.stdout);
-- nothing when cfg.quiet is true (the trainer's progress is silent then too).
function recipe.print(cfg, out)
  if cfg.quiet == true then return end
  out = out or io.stdout
  out:write("configuration:\n", recipe.format(cfg), "\n")
end

--- Bounds of the engine's types, for the consumers' range checks
-- (Trainer.check_config, predict.check_options) so that a value past them
-- is refused naming its key instead of reaching a C binding: a count the
-- engine holds in a C int (batch, epochs, nbs, max_det, ...), a seed (a Lua
-- number holds integers exactly up to 2^53 - 1; lucid.Context's limit) and
-- a float the engine computes in f32 (loss gains, clip.max_norm, degrees).
recipe.INT_MAX = 2147483647
recipe.SEED_MAX = 2 ^ 53 - 1
recipe.F32_MAX = 3.4028234663852886e38

--- The smallest normal f32 (2^-126): a non-zero setting of smaller
-- magnitude is 0 or subnormal once the engine holds it in f32 (lr0=1e-50
-- would train with lr 0), so the consumers refuse it by key.
recipe.F32_MIN_NORMAL = 2 ^ -126

--- recipe.show(v) -> v as an error message prints it: a string quoted
-- ('x'), an integer in all its digits below 1e17 (9007199254740992, not
-- 9.007199254741e+15), another number in the fewest digits that read back
-- as the same number (0.01, 1e-50, 1e+20), anything else by tostring.
function recipe.show(v)
  if type(v) == "string" then return "'" .. v .. "'" end
  if type(v) ~= "number" or not finite(v) then return tostring(v) end
  if v == math.floor(v) and math.abs(v) < 1e17 then return string.format("%.0f", v) end
  for digits = 1, 17 do
    local s = string.format("%." .. digits .. "g", v)
    if tonumber(s) == v then return s end
  end
  return string.format("%.17g", v)
end

--- recipe.shell_quote(s) -> s quoted for a POSIX shell (spaces, quotes and
-- $ taken literally).
function recipe.shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

--- recipe.path_kind(p) -> "dir", "file", or nil and why p cannot be opened
-- (the system's words: "No such file or directory", "Permission denied").
function recipe.path_kind(p)
  local f, err = io.open(p, "rb")
  if not f then return nil, (tostring(err):gsub("^.*: ", "")) end
  local ok, _, code = f:read(1)
  f:close()
  if ok == nil and code == 21 then return "dir" end -- EISDIR
  return "file"
end

--- recipe.check_folder(path, key, who, [what]) -> the deepest part of path
-- that exists (path itself when it exists; "/" or "." when no part does):
-- the up-front check of a folder setting (out=, project=): every part of
-- path that exists must be a folder, else raise "<who>: <key> = '<path>':
-- exists and is not a folder (<what>)" (or "<prefix> exists and is not a
-- folder" when a parent is the file). Nothing is created; a part that does
-- not exist ends the check (recipe.make_folder creates it later and says why
-- when it cannot).
function recipe.check_folder(path, key, who, what)
  local function fail(why)
    error(string.format("%s: %s = '%s': %s%s", who, key, path, why, what and (" (" .. what .. ")") or ""), 0)
  end
  local parts = {}
  for part in path:gmatch("[^/]+") do parts[#parts + 1] = part end
  local abs = path:sub(1, 1) == "/"
  local deepest = abs and "/" or "."
  local cur = abs and "" or nil
  for i, part in ipairs(parts) do
    cur = cur and (cur .. "/" .. part) or part
    local kind = recipe.path_kind(cur)
    if kind == "file" then fail(i == #parts and "exists and is not a folder" or (cur .. " exists and is not a folder")) end
    if kind == nil then break end
    deepest = cur
  end
  return deepest
end

--- recipe.check_writable(path, key, who, [what]): recipe.check_folder, then
-- the deepest part of path that exists (the folder itself when it exists,
-- else the parent the missing folders would be made in) must take a new
-- file: a probe file ".lucid-write-probe-<n>" is created there and removed;
-- else raise "<who>: <key> = '<path>': cannot write in <dir> (<why>)
-- (<what>)".
function recipe.check_writable(path, key, who, what)
  local deepest = recipe.check_folder(path, key, who, what)
  local probe = string.format("%s/.lucid-write-probe-%d", deepest, os.time() % 100000)
  local f, err = io.open(probe, "wb")
  if not f then
    error(string.format("%s: %s = '%s': cannot write in %s (%s)%s", who, key, path, deepest,
      (tostring(err):gsub("^.*: ", "")), what and (" (" .. what .. ")") or ""), 0)
  end
  f:close()
  os.remove(probe)
end

--- recipe.mkdir(path) -> true, or nil and why (mkdir's reason, e.g. "No
-- such file or directory"): the folder and its parents (mkdir -p), nothing
-- printed.
function recipe.mkdir(path)
  local p = io.popen("LC_ALL=C mkdir -p -- " .. recipe.shell_quote(path) .. " 2>&1; echo \"__rc=$?\"")
  local out = p:read("*a")
  p:close()
  if tonumber(out:match("__rc=(%d+)%s*$")) == 0 then return true end
  local msg = out:gsub("__rc=%d+%s*$", ""):gsub("%s+$", "")
  local why = msg:match(".*: ([^\n]+)$") or msg
  return nil, why ~= "" and why or "mkdir failed"
end

--- recipe.make_folder(path, key, who): recipe.mkdir, raising "<who>:
-- <key> = '<path>': cannot create the folder (<why>)" when it fails.
function recipe.make_folder(path, key, who)
  local ok, why = recipe.mkdir(path)
  if not ok then error(string.format("%s: %s = '%s': cannot create the folder (%s)", who, key, path, why), 0) end
  return path
end

--- recipe.help_requested(args) -> true when one of the arguments (args[1],
-- args[2], ...; the script's arg table) is --help, -h or help.
function recipe.help_requested(args)
  for _, a in ipairs(args or {}) do
    if a == "--help" or a == "-h" or a == "help" then return true end
  end
  return false
end

--- recipe.program(args) -> the program that runs the script (the arg
-- table's lowest index: "luajit", "bin/lucid"), or "luajit".
function recipe.program(args)
  local lo
  for k in pairs(args or {}) do
    if type(k) == "number" and k < 0 and (not lo or k < lo) then lo = k end
  end
  return lo and args[lo] or "luajit"
end

--- recipe.usage(script, defaults, [descriptions], [summary], [program]) ->
-- the text a recipe prints for --help: "usage: <program> <script>
-- [key=value ...]", the summary, then every key (nested ones with dots,
-- sorted) with its default and, when descriptions[key] has one, its
-- one-line description. program defaults to luajit.
function recipe.usage(script, defaults, descriptions, summary, program)
  descriptions = descriptions or {}
  local rows = {}
  local function default_text(v)
    if v == "" then return "(none)" end
    if type(v) == "number" then return recipe.show(v) end
    if type(v) == "table" then
      local p = {}
      for i = 1, #v do p[i] = recipe.show(v[i]) end
      return "{" .. table.concat(p, ",") .. "}"
    end
    return tostring(v)
  end
  local function walk(t, prefix)
    for k, v in pairs(t) do
      local name = prefix and (prefix .. "." .. k) or tostring(k)
      if type(v) == "table" and next(v) ~= nil and #v == 0 then walk(v, name)
      else rows[#rows + 1] = { name, default_text(v), descriptions[name] } end
    end
  end
  walk(defaults)
  table.sort(rows, function(a, b) return a[1] < b[1] end)
  local kw, dw = 0, 0
  for _, r in ipairs(rows) do kw, dw = math.max(kw, #r[1]), math.max(dw, #r[2]) end
  kw, dw = math.min(kw, 28), math.min(dw, 24)
  local lines = { string.format("usage: %s %s [key=value ...]", program or "luajit", script) }
  if summary and summary ~= "" then lines[#lines + 1] = summary end
  lines[#lines + 1] = ""
  lines[#lines + 1] = "Settings (key=value; nested ones with dots; unknown keys are refused), with their defaults:"
  for _, r in ipairs(rows) do
    local line = string.format("  %-" .. kw .. "s  %-" .. dw .. "s  %s", r[1], r[2], r[3] or "")
    lines[#lines + 1] = (line:gsub("%s+$", ""))
  end
  return table.concat(lines, "\n") .. "\n"
end

--- The device names lucid.Context takes, as an error's "expected ...".
recipe.DEVICES = "cpu, cuda, cuda:N (N in 0..1024) or auto"

--- recipe.is_device(v) -> true when v is a device name lucid.Context
-- takes, in any case (as Ultralytics' select_device, which lower-cases it;
-- recipe.device_name gives the spelling lucid.Context takes): "cpu",
-- "auto", "cuda" or "cuda:N" with N in 0..1024 (the grammar of
-- lucid_device_parse, engine/core/context.c), else false (any other string
-- or type). Only the spelling is checked, not that the device exists
-- (making a context does that, and may take seconds on a GPU).
function recipe.is_device(v)
  if type(v) ~= "string" then return false end
  v = v:lower()
  if v == "cpu" or v == "auto" or v == "cuda" then return true end
  local n = v:match("^cuda:(%d+)$")
  return n ~= nil and tonumber(n) <= 1024
end

--- recipe.device_name(v) -> the device name as lucid.Context takes it
-- (lower case) for a string, else v unchanged (nil: the caller's default).
function recipe.device_name(v)
  if type(v) == "string" then return v:lower() end
  return v
end

--- The message of an error for a recipe user: tostring(err) without the
-- "path/file.lua:NN: " (chunk:line) location prefixes Lua puts in front of
-- a raised string (error(msg) at level 1 or 2, assert, a binding's error);
-- where an error was raised is for LUCID_DEBUG=1 (the traceback), not for
-- the person who typed key=value. The message text is kept as it is.
function recipe.message(err)
  local s = tostring(err)
  while true do
    local rest = s:match("^[^%s:]+:%d+: (.*)$") or s:match('^%[string "[^"]*"%]:%d+: (.*)$')
    if not rest then break end
    s = rest
  end
  return s
end

--- A note recipe.run adds when the run is interrupted (Ctrl-C, SIGTERM),
-- e.g. where the checkpoints are: recipe.interrupt_note = function() return
-- "..." end (a string or nil). Set by the recipe's main.
recipe.interrupt_note = nil

-- The errors that mean "stopped by a signal": LuaJIT's Ctrl-C error, and
-- the trainer's for SIGTERM (Trainer.stop_error): what the message calls the
-- signal, and the exit status a shell reports for it (128 + its number).
local INTERRUPTIONS = {
  ["interrupted!"] = { "Ctrl-C", 128 + 2 },
  ["interrupted! (SIGTERM)"] = { "SIGTERM", 128 + 15 },
}

--- recipe.interruption(err) -> label, status when err (an error value, its
-- location prefix ignored) says the run was stopped by a signal: "Ctrl-C",
-- 130 for LuaJIT's "interrupted!" (SIGINT); "SIGTERM", 143 for
-- "interrupted! (SIGTERM)" (lucid.trainer's clean stop); else nil.
function recipe.interruption(err)
  local hit = INTERRUPTIONS[recipe.message(err)]
  if hit then return hit[1], hit[2] end
  return nil
end

--- Run a recipe's main function: on an error (a bad setting, a missing
-- file, a failed fit) print "<name>: <message>" to stderr after flushing
-- stdout (so a piped configuration listing comes first) and exit with
-- status 1. The message is recipe.message(err): no internal file:line
-- location; LUCID_DEBUG=1 prints the Lua traceback instead. A stop by
-- signal (recipe.interruption: Ctrl-C's "interrupted!", the trainer's
-- "interrupted! (SIGTERM)"; the trainer has already waited for the
-- checkpoint writes it queued) prints "<name>: interrupted (Ctrl-C)" or
-- "<name>: interrupted (SIGTERM)" and the recipe's interrupt_note, and exits
-- with the status a shell reports for that signal: 130 (SIGINT), 143 (SIGTERM).
function recipe.run(name, main)
  local trace
  local ok, err = xpcall(main, function(e)
    if os.getenv("LUCID_DEBUG") == "1" then trace = debug.traceback(tostring(e), 2) end
    return e
  end)
  if not ok then
    io.stdout:flush()
    local msg = recipe.message(err)
    local label, status = recipe.interruption(err)
    if label then
      local note = recipe.interrupt_note
      if type(note) == "function" then
        local nok, n = pcall(note)
        note = nok and n or nil
      end
      io.stderr:write(name, ": interrupted (", label, ")", note and ("; " .. note) or "", "\n")
      if trace then io.stderr:write(trace, "\n") end
      os.exit(status)
    end
    io.stderr:write(name, ": ", trace or msg, "\n")
    os.exit(1)
  end
end

return recipe
