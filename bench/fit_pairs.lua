--[[
bench/fit_pairs.lua — the complete fit of the main job, measured in
alternating fresh-process pairs of two arms (issue 9). `make bench-fit`
runs it with its defaults; `make bench` runs one pair when a GPU is present.

  luajit bench/fit_pairs.lua                         # A = record=false, B = record=true
  luajit bench/fit_pairs.lua pairs=5 budget_s=0 write=docs/BENCH.md
  luajit bench/fit_pairs.lua armA="record=false batch=16" armB="record=true batch=16"
  luajit bench/fit_pairs.lua screen=true             # batch 16, imgsz 320, imgsz 1280
  luajit bench/fit_pairs.lua screen=s320,s1280       # some of them
  luajit bench/fit_pairs.lua pairs=1 device=cpu epochs=1 imgsz=64 batch=8 armA=workers=2 armB=workers=1

Each fit is a fresh process, `luajit bench/fit_once.lua <common> <arm>`
(see that file for what it measures and hashes), run in the order
A B A B ...; the driver stamps the whole process around each child. It
prints per-fit lines as it goes, then a markdown table: per arm the median
and [min, max] of complete fit s, whole process s, steady train step ms,
host time of the recorded step's contract check in µs per replay (recorded
routes: step:stats().contract_us_per_replay, every check of the fit, cheap,
mode round trip and full, divided by the replays), peak allocated /
reserved MiB; then whether the value-byte hashes (final
model, optimizer state, EMA, every step's losses, validation metrics) are
identical across ALL fits of both arms, listing the ones that differ.

Knobs (driver only; every other key=value goes to both arms' fits and is a
key of recipes/pose_nano.lua):
  pairs=5        A/B pairs to run
  budget_s=540   stop starting pairs (or screen configurations) once the
                 elapsed time plus the duration of the last pair would pass
                 this many seconds (0: no limit). Why: the default table must
                 fit in one 10-minute call on the GPU machine; with today's
                 fits (eager ~75 s, recorded ~57 s, docs/PERF.md) a pair takes
                 ~140 s, so 3 pairs run (~7 min) and the table says that it
                 stopped at the budget; once fits are fast the same call runs
                 all 5 pairs.
  armA="record=false"  armB="record=true"   each a space-separated list of
                 key=value settings of that arm
  screen=false   true (= b16,s320,s1280) or a comma list of b16 (batch=16),
                 s320 (imgsz=320), s1280 (imgsz=1280): one pair each, labelled
                 as a screen, not a claim
  write=         also write the table into this markdown file (e.g.
                 docs/BENCH.md) with the machine, versions, date and the exact
                 command; the section of this mode (pairs, or screen with
                 the same list of configurations) is replaced, the rest of
                 the file kept
  json=          also write every fit's JSON line (with whole_s) to this file
  keep=false     keep each fit's run folder (build/bench/fit/<fit>)
  luajit=        the interpreter of the children (default: this one)

Exit status: 0 when every fit ran (hash mismatches are reported, not
failures), 1 when a child failed (its stderr tail is printed), 2 on a bad
argument. Without a GPU and with device=auto it prints a skip line, exit 0.
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

local knobs = { pairs = 5, budget_s = 540, armA = "record=false", armB = "record=true", screen = "false",
  write = "", json = "", keep = false, luajit = "" }

-- split the arguments: driver knobs vs settings of the fits
local driver_args, common = {}, {}
for _, a in ipairs(arg) do
  local k = a:match("^([%w_%.%-]+)=")
  if k and knobs[k] ~= nil then driver_args[#driver_args + 1] = a else common[#common + 1] = a end
end
local function die(msg, code)
  io.stderr:write("fit_pairs: ", msg, "\n")
  os.exit(code or 2)
end
local ok, opt = pcall(recipe.resolve, knobs, driver_args)
if not ok then die(opt) end
if type(opt.pairs) ~= "number" or opt.pairs < 1 or opt.pairs ~= math.floor(opt.pairs) then
  die("pairs: expected a positive integer, got " .. tostring(opt.pairs))
end

local function words(s)
  local t = {}
  for w in tostring(s):gmatch("%S+") do t[#t + 1] = w end
  return t
end
local function concat(...)
  local out = {}
  for _, l in ipairs({ ... }) do for _, x in ipairs(l) do out[#out + 1] = x end end
  return out
end
local function shq(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local function sh_out(cmd)
  local p = io.popen("(" .. cmd .. ") 2>/dev/null")
  if not p then return "" end
  local s = p:read("*a") or ""
  p:close()
  return (s:gsub("%s+$", ""))
end

-- every configuration must resolve before anything runs (typos fail fast)
local armA, armB = words(opt.armA), words(opt.armB)
local SCREEN = {
  { id = "b16", label = "batch 16", args = { "batch=16" } },
  { id = "s320", label = "imgsz 320", args = { "imgsz=320" } },
  { id = "s1280", label = "imgsz 1280", args = { "imgsz=1280" } },
}
local screen = {}
if opt.screen == true or opt.screen == "true" then
  screen = SCREEN
elseif opt.screen ~= false and opt.screen ~= "false" and opt.screen ~= "" then
  for id in tostring(opt.screen):gmatch("[^,]+") do
    local found
    for _, s in ipairs(SCREEN) do if s.id == id then found = s end end
    if not found then die("screen: unknown configuration '" .. id .. "' (expected true or a list of b16, s320, s1280)") end
    screen[#screen + 1] = found
  end
end
for _, extra in ipairs(#screen > 0 and screen or { { args = {} } }) do
  for _, arm in ipairs({ armA, armB }) do
    local rok, err = pcall(recipe.resolve, defaults, concat(common, extra.args, arm))
    if not rok then die(err) end
  end
end
local resolved = recipe.resolve(defaults, common) -- the settings both arms share

local luajit = opt.luajit ~= "" and opt.luajit or arg[-1] or "luajit"
local here = (arg[0]:match("^(.*)/[^/]*$") or ".")
local once = here .. "/fit_once.lua"
local workdir = "build/bench/fit"

-- no GPU and device auto: the default job would take hours on the CPU
if resolved.device == "auto" then
  local dev = sh_out(shq(luajit) .. " -e " .. shq('io.write(require("lucid").Context{device="auto"}:device())'))
  if dev:sub(1, 4) ~= "cuda" then
    print("skip fit_pairs: no CUDA device (pass device=cpu and a small size to run it on the CPU)")
    os.exit(0)
  end
end

os.execute("mkdir -p " .. shq(workdir))
local json_out
if opt.json ~= "" then json_out = assert(io.open(opt.json, "w")) end

-- one fit in a fresh process
local function run_fit(tag, args)
  local dir = workdir .. "/" .. tag
  os.execute("rm -rf " .. shq(dir))
  local all = concat(args, { "project=" .. workdir, "name=" .. tag, "exist_ok=true" })
  local q = {}
  for i, a in ipairs(all) do q[i] = shq(a) end
  local outf, errf = workdir .. "/" .. tag .. ".json", workdir .. "/" .. tag .. ".stderr"
  local cmd = string.format("exec %s %s %s > %s 2> %s", shq(luajit), shq(once), table.concat(q, " "), shq(outf), shq(errf))
  local t0 = lucid.wall_time()
  local r1, _, r3 = os.execute(cmd)
  local whole = lucid.wall_time() - t0
  local status_ok = (r1 == 0) or (r1 == true and r3 == 0)
  local f = io.open(outf, "r")
  local text = f and f:read("*a") or ""
  if f then f:close() end
  local line
  for l in text:gmatch("[^\n]+") do if l:sub(1, 1) == "{" then line = l end end
  if not status_ok or not line then
    local ef = io.open(errf, "r")
    local err = ef and ef:read("*a") or ""
    if ef then ef:close() end
    io.stderr:write(string.format("fit_pairs: fit %s failed (%s)\n  command: %s\n%s\n", tag,
      status_ok and "no JSON line" or "exit status " .. tostring(r3 or r1), cmd, err:sub(-3000)))
    os.exit(1)
  end
  local res = cjson.decode(line)
  res.whole_s = whole
  res.tag = tag
  -- host time of the recorded step's contract check, per replay (recorded routes only)
  res.contract_us = type(res.step) == "table" and (res.step.replays or 0) > 0 and res.step.contract_us_per_replay or nil
  if json_out then
    json_out:write(cjson.encode(res), "\n")
    json_out:flush()
  end
  if not opt.keep then os.execute("rm -rf " .. shq(dir)) end
  local step = res.steady_step_ms
  print(string.format("%-8s fit %8.2f s  process %8.2f s  step %s ms  contract %s us  peak alloc %.0f MiB  reserved %.0f MiB  route %s  %d steps",
    tag, res.fit_s, res.whole_s, type(step) == "number" and string.format("%.3f", step) or "-",
    res.contract_us and string.format("%.2f", res.contract_us) or "-",
    res.peak_allocated_mib, res.peak_reserved_mib, res.route, res.steps))
  io.stdout:flush()
  return res
end

-- statistics and formatting ------------------------------------------------
local function values(fits, key)
  local v = {}
  for _, f in ipairs(fits) do
    local x = f[key]
    if type(x) == "number" then v[#v + 1] = x end
  end
  table.sort(v)
  return v
end
local function median(v)
  local n = #v
  if n == 0 then return nil end
  if n % 2 == 1 then return v[(n + 1) / 2] end
  return (v[n / 2] + v[n / 2 + 1]) / 2
end
local function cell(fits, key, fmt)
  local v = values(fits, key)
  if #v == 0 then return "–" end
  local m = string.format(fmt, median(v))
  if #v == 1 then return m end
  return string.format("%s [" .. fmt .. ", " .. fmt .. "]", m, v[1], v[#v])
end
local HASH_KEYS = { "model", "optimizer", "ema", "losses", "metrics" }
-- "identical ..." or the list of differing hashes with the fits that gave them
local function hash_line(fits, what)
  local diffs = {}
  for _, k in ipairs(HASH_KEYS) do
    local order, by = {}, {}
    for _, f in ipairs(fits) do
      local h = f.hashes and f.hashes[k] or "?"
      if not by[h] then by[h] = {}; order[#order + 1] = h end
      by[h][#by[h] + 1] = f.tag
    end
    if #order > 1 then
      local p = {}
      for i, h in ipairs(order) do p[i] = string.format("`%s` (%s)", h, table.concat(by[h], " ")) end
      diffs[#diffs + 1] = string.format("%s: %s", k, table.concat(p, ", "))
    end
  end
  if #diffs == 0 then
    local p = {}
    for i, k in ipairs(HASH_KEYS) do p[i] = string.format("%s `%s`", k, fits[1].hashes[k]) end
    return string.format("**Hashes: identical across all %d fits of %s** (%s).", #fits, what, table.concat(p, ", "))
  end
  return string.format("**Hashes: DIFFER across the %d fits of %s** — %s.", #fits, what, table.concat(diffs, "; "))
end

local COLS = "| complete fit, s | whole process, s | steady train step, ms | contract check, µs/step | peak allocated, MiB | peak reserved, MiB |"
local COLS_ALIGN = "| ---: | ---: | ---: | ---: | ---: | ---: |"
local function metric_cells(fits)
  return string.format("| %s | %s | %s | %s | %s | %s |", cell(fits, "fit_s", "%.2f"), cell(fits, "whole_s", "%.2f"),
    cell(fits, "steady_step_ms", "%.3f"), cell(fits, "contract_us", "%.2f"), cell(fits, "peak_allocated_mib", "%.0f"),
    cell(fits, "peak_reserved_mib", "%.0f"))
end
local function routes(fits)
  local seen, out = {}, {}
  for _, f in ipairs(fits) do
    if not seen[f.route] then seen[f.route] = true; out[#out + 1] = f.route end
  end
  return table.concat(out, "/")
end
local function code(list) return #list > 0 and ("`" .. table.concat(list, " ") .. "`") or "(defaults)" end

local function fits_table(fits)
  local L = { "| fit | route | steps | " .. COLS:sub(3), "| --- | --- | ---: " .. COLS_ALIGN }
  for _, f in ipairs(fits) do
    L[#L + 1] = string.format("| %s | %s | %d %s", f.tag, f.route, f.steps, metric_cells({ f }))
  end
  return table.concat(L, "\n")
end

-- the runs ------------------------------------------------------------------
local t_start = lucid.wall_time()
local budget = tonumber(opt.budget_s) or 0
local function over_budget(last_pair_s)
  return budget > 0 and (lucid.wall_time() - t_start) + last_pair_s > budget
end
-- the shared settings in words (before the arms' overrides; device and
-- precision as the first fit resolved them)
local function setting(first)
  local r = resolved
  local dev = first and first.device or r.device
  return string.format("%s%s pose, batch %d, %d px, %d epochs, %s on %s, %d loader workers, image cache %s, "
    .. "HSV %s, mosaic %s, close_mosaic %d, dataset %s", r.model, r.scale, r.batch, r.imgsz, r.epochs,
    first and first.precision or r.precision, dev, r.workers, r.cache and "on" or "off",
    (r.device_hsv and dev:sub(1, 4) == "cuda") and "on the device" or "in the loader threads",
    tostring(r.augment.mosaic), r.augment.close_mosaic, r.data)
end
local md, mode, first_fit = {}, nil, nil

if #screen == 0 then
  -- its own section of write= per pair of arms (the default pair: "pairs")
  mode = (opt.armA == "record=false" and opt.armB == "record=true") and "pairs"
    or ("pairs:" .. opt.armA .. "|" .. opt.armB)
  local fa, fb, all = {}, {}, {}
  local stopped
  for i = 1, opt.pairs do
    local tp = lucid.wall_time()
    local a = run_fit("A" .. i, concat(common, armA))
    fa[#fa + 1], all[#all + 1] = a, a
    local b = run_fit("B" .. i, concat(common, armB))
    fb[#fb + 1], all[#all + 1] = b, b
    if i < opt.pairs and over_budget(lucid.wall_time() - tp) then
      stopped = string.format("stopped after %d of %d pairs: the next pair would pass the time budget of %d s (budget_s)",
        i, opt.pairs, budget)
      break
    end
  end
  md[#md + 1] = string.format("### Complete fit — %d alternating fresh-process pair%s (A B A B ...)", #fa, #fa == 1 and "" or "s")
  md[#md + 1] = ""
  md[#md + 1] = string.format("Settings of both arms: %s (command-line overrides: %s). Cells: median [min, max] over the fits of the arm.",
    setting(all[1]), code(common))
  if stopped then md[#md + 1] = "" md[#md + 1] = "Note: " .. stopped .. "." end
  md[#md + 1] = ""
  md[#md + 1] = "| arm | settings | route | fits " .. COLS
  md[#md + 1] = "| --- | --- | --- | ---: " .. COLS_ALIGN
  md[#md + 1] = string.format("| A | %s | %s | %d %s", code(armA), routes(fa), #fa, metric_cells(fa))
  md[#md + 1] = string.format("| B | %s | %s | %d %s", code(armB), routes(fb), #fb, metric_cells(fb))
  md[#md + 1] = ""
  md[#md + 1] = (hash_line(all, "both arms"))
  md[#md + 1] = ""
  md[#md + 1] = "Every fit, in the order run:"
  md[#md + 1] = ""
  md[#md + 1] = fits_table(all)
else
  local ids = {}
  for i, sc in ipairs(screen) do ids[i] = sc.id end
  mode = "screen:" .. table.concat(ids, ",") -- its own section of write=, per list of configurations
  md[#md + 1] = "### Scaling screen (one pair each; a screen, not a claim)"
  md[#md + 1] = ""
  local head = #md + 1
  md[head] = ""
  md[#md + 1] = ""
  md[#md + 1] = "| configuration | arm | route | steps " .. COLS
  md[#md + 1] = "| --- | --- | --- | ---: " .. COLS_ALIGN
  local hash_lines = {}
  for n, s in ipairs(screen) do
    local tp = lucid.wall_time()
    local a = run_fit(s.id .. "-A", concat(common, s.args, armA))
    first_fit = first_fit or a
    local b = run_fit(s.id .. "-B", concat(common, s.args, armB))
    md[#md + 1] = string.format("| %s | A | %s | %d %s", s.label, a.route, a.steps, metric_cells({ a }))
    md[#md + 1] = string.format("| %s | B | %s | %d %s", s.label, b.route, b.steps, metric_cells({ b }))
    hash_lines[#hash_lines + 1] = "- " .. hash_line({ a, b }, s.label)
    if n < #screen and over_budget(lucid.wall_time() - tp) then
      local rest = {}
      for k = n + 1, #screen do rest[#rest + 1] = screen[k].id end
      hash_lines[#hash_lines + 1] = string.format("- Not run: %s (the next pair would pass the time budget of %d s; "
        .. "run them with screen=%s).", table.concat(rest, ", "), budget, table.concat(rest, ","))
      break
    end
  end
  md[#md + 1] = ""
  for _, l in ipairs(hash_lines) do md[#md + 1] = l end
  md[head] = string.format("Settings of every fit: %s (command-line overrides: %s), then the configuration's "
    .. "override, then the arm's: A = %s, B = %s. One fit per cell.", setting(first_fit), code(common), code(armA), code(armB))
end
if json_out then json_out:close() end

local table_md = table.concat(md, "\n") .. "\n"
print("")
io.write(table_md)
print(string.format("\n(%d s in all)", math.floor(lucid.wall_time() - t_start + 0.5)))

-- docs/BENCH.md ---------------------------------------------------------------
if opt.write ~= "" then
  local gpu = sh_out("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1")
  local cuda_driver = sh_out("nvidia-smi | grep -o 'CUDA Version: [0-9.]*' | head -1")
  local nvcc = sh_out("$( (command -v nvcc || ls /usr/local/cuda/bin/nvcc) 2>/dev/null | head -1) --version | grep -o 'release [0-9.]*'")
  local cpu = sh_out("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'")
  local ncpu = sh_out("nproc")
  local commit = sh_out("git rev-parse --short HEAD")
  local dirty = sh_out("git status --porcelain --untracked-files=no | head -1") ~= ""
  local cmdl = { "luajit", arg[0] }
  for _, a in ipairs(arg) do cmdl[#cmdl + 1] = a:match("^[%w_%.%-=,/:]+$") and a or shq(a) end
  local header = table.concat({
    string.format("- Machine: %s%s; CPU %s (%s cores)", gpu ~= "" and ("GPU " .. gpu:gsub(", ", ", driver ")) or "no GPU",
      cuda_driver ~= "" and (" (" .. cuda_driver .. ")") or "", cpu ~= "" and cpu or "?", ncpu ~= "" and ncpu or "?"),
    string.format("- Versions: lucid %s, CUDA toolkit %s, git commit %s%s", lucid.version or "?",
      nvcc ~= "" and nvcc:gsub("release ", "") or "none", commit ~= "" and commit or "?",
      dirty and " (with uncommitted changes)" or ""),
    string.format("- Date: %s", os.date("!%Y-%m-%d %H:%M UTC")),
    string.format("- Command: `%s`", table.concat(cmdl, " ")),
  }, "\n")
  local begin_mark, end_mark = "<!-- fit_pairs:" .. mode .. " -->", "<!-- /fit_pairs:" .. mode .. " -->"
  local section = begin_mark .. "\n" .. table_md:gsub("^(### [^\n]*\n)", "%1\n" .. header:gsub("%%", "%%%%") .. "\n", 1)
    .. end_mark .. "\n"
  local f = io.open(opt.write, "r")
  local old = f and f:read("*a") or nil
  if f then f:close() end
  local new
  if not old or old == "" then
    new = "# Benchmarks\n\nMeasured by the committed drivers under bench/; each section below is replaced by the\n"
      .. "latest run of its command (`write=" .. opt.write .. "`). See docs/PERF.md for the history.\n\n" .. section
  else
    local s, e = old:find(begin_mark, 1, true)
    local s2, e2 = old:find(end_mark, 1, true)
    if s and s2 and s2 > s then
      new = old:sub(1, s - 1) .. section .. old:sub(e2 + 1):gsub("^\n", "")
    else
      new = old:match("^(.-)%s*$") .. "\n\n" .. section
    end
  end
  local tmp = opt.write .. ".tmp"
  local w = assert(io.open(tmp, "w"))
  w:write(new)
  w:close()
  assert(os.rename(tmp, opt.write))
  print("written to " .. opt.write)
end
os.exit(0)
