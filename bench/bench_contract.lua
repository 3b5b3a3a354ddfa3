-- bench_contract.lua — host time of the recorded step's contract check
-- (lua/lucid/recorded_step.lua, RS:_check; docs/STEP.md "Contract") for a
-- real YOLO11n-pose model, on the CPU with the fake recorder of
-- spec/support/step_harness.lua (the check is host code: the same on a GPU
-- machine, where only the graphs differ).
--
--   luajit bench/bench_contract.lua [n=10000] [steps=8] [loop=0] [loop_mb=64]
--
-- Prints the median / p90 of single checks timed one by one (the clock call
-- is included: an upper bound; the first row is the clock calls alone), in
-- three cache states:
--   hot    : back to back (everything in L1/L2)
--   5 MB   : after a 5 MB memcpy (the staging copy of a batch-4 640 step)
--   64 MB  : after a 64 MB memcpy (nothing of the check left in any cache,
--            TLB included: what a fit's check sees, between a loader batch,
--            the step's host work and the next batch)
-- for the cheap path (every replay) as RS:run has it (inline, timed the
-- same way, interpreted) and through step:_check() (two calls more), and
-- for the first check after
-- validation's model:eval()/model:train() (the mode check of each epoch
-- boundary) and after a parameter frozen and unfrozen (a full check: the
-- entries field by field and the module tree walk), each of those two
-- timed after its change. Then refs:restore() (skipped on a replay unless
-- an eager forward ran since the last one), the same cheap path
-- interpreted (jit.off: in a fit the check runs once per step and is
-- mostly not compiled), and stats() over `steps` recorded steps. With
-- loop=N: N replays through step:run on the fake recorder (each one a real
-- CPU forward and backward at 32 px), each after loop_mb MB copied, a
-- model eval/train round trip every 36, and the step's own stats() (the
-- timings RS:run takes, as the Trainer prints them). Issue 8 target: under
-- 5 us per step on average, epoch boundaries included.
package.path = "spec/support/?.lua;" .. package.path
local lucid = require "lucid"
local H = require "step_harness"
local RS = require "lucid.recorded_step"

local args = {}
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^(%w+)=(.*)$")
  if k then args[k] = tonumber(v) end
end
local N = args.n or 10000
local STEPS = args.steps or 8
local B, S = 2, 64

local st = H.stack{ recorded = true, recorder = RS.fake_recorder(), trainer = {}, B = B, S = S, warmup = 1 }
local step = st.step
for i = 1, STEPS do step:run(H.batch(B, S, i), true) end
assert(step.graphs.fb and step.refs, "bench_contract: the step did not record")
local stats = step:stats()
local batch = H.batch(B, S, 99)
local clock = lucid.graph.clock

local function buffer(mb)
  local n = math.floor(mb * 1024 * 1024 / 4)
  return lucid.zeros({ n }, { device = "cpu" }), lucid.zeros({ n }, { device = "cpu" })
end
local big = { [5] = { buffer(5) }, [64] = { buffer(64) } }

-- median and p90 (us) of n single timings of f, each after `mb` MB copied
local function timed(f, n, mb)
  local ts = {}
  local src, dst = nil, nil
  if mb then src, dst = big[mb][1], big[mb][2] end
  for i = 1, n do
    if src then dst:copy_(src) end
    local t0 = clock()
    f()
    ts[i] = clock() - t0
  end
  table.sort(ts)
  return 1e6 * ts[math.max(1, math.floor(n / 2))], 1e6 * ts[math.max(1, math.floor(0.9 * n))]
end

-- a check that must pass and take the path `want` (nil: the cheap path)
local function checker(want)
  return function()
    local why, kind = step:_check(batch)
    if why or kind ~= want then
      error(string.format("bench_contract: the contract check gave %s (%s), expected the %s path", tostring(why),
        tostring(kind), want or "cheap"))
    end
  end
end
local check = checker(nil)
local model = st.model
local p0 = model.params:find("model.0.conv.weight")
local round_trip = function() model:eval(); model:train() end -- validation, each epoch
local direct = function() p0.trainable = false; p0.trainable = true end -- the set's version moves twice
-- the cheap path exactly as RS:run has it (inline, between the two clock
-- calls, interpreted: RS:run is never compiled), one function per cache
-- state
local function inline_timer(mb)
  local src, dst = nil, nil
  if mb then src, dst = big[mb][1], big[mb][2] end
  local f = assert(loadstring([[
    local step, clock, src, dst, n = ...
    local ts = {}
    for i = 1, n do
      if src then dst:copy_(src) end
      local clip = step.clip
      local t0 = clock()
      local g = step.guard
      if g[1]() or clip ~= g[2] or not g[3] or clip.max_norm ~= g[4] or clip.value ~= g[5] or clip.fn ~= g[6]
        or (clip.capture_gradient_norm and true or false) ~= g[7] then
        error("bench_contract: the cheap path did not answer")
      end
      ts[i] = clock() - t0
    end
    table.sort(ts)
    return 1e6 * ts[math.max(1, math.floor(n / 2))], 1e6 * ts[math.max(1, math.floor(0.9 * n))]
  ]], "=inline_" .. tostring(mb or "hot")))
  if jit then jit.off(f) end
  return f, src, dst
end
local function empty_timer(mb)
  local src, dst = nil, nil
  if mb then src, dst = big[mb][1], big[mb][2] end
  return function(n)
    local ts = {}
    for i = 1, n do
      if src then dst:copy_(src) end
      local t0 = clock()
      ts[i] = clock() - t0
    end
    table.sort(ts)
    return 1e6 * ts[math.max(1, math.floor(n / 2))], 1e6 * ts[math.max(1, math.floor(0.9 * n))]
  end
end

-- median and p90 of n checks `f`, each right after `pre` (untimed), then
-- `mb` MB copied
local function timed_after(pre, f, n, mb)
  local ts = {}
  local src, dst = nil, nil
  if mb then src, dst = big[mb][1], big[mb][2] end
  for i = 1, n do
    pre()
    if src then dst:copy_(src) end
    local t0 = clock()
    f()
    ts[i] = clock() - t0
  end
  table.sort(ts)
  return 1e6 * ts[math.max(1, math.floor(n / 2))], 1e6 * ts[math.max(1, math.floor(0.9 * n))]
end

local full0, mode0 = step.full_checks, step.mode_checks
local cmods, nparams = step.refs:counts()
print(string.format("contract check, YOLO11n-pose (%d C modules, %d parameter-set entries), CPU, fake recorder",
  cmods, nparams))
print(string.format("%-40s %10s %10s %8s", "", "median us", "p90 us", "n"))
local function row(name, n, med, p90) print(string.format("%-40s %10.3f %10.3f %8d", name, med, p90, n)) end
timed(check, 1000) -- JIT warm-up
local counts = { hot = N, [5] = math.max(1, math.floor(N / 5)), [64] = math.max(1, math.floor(N / 50)) }
for _, r in ipairs({ { "clock calls alone (the floor), hot", nil }, { "clock calls alone, after 5 MB copy", 5 },
  { "clock calls alone, after 64 MB copy", 64 } }) do
  local c = counts[r[2] or "hot"]
  row(r[1], c, empty_timer(r[2])(c))
end
for _, r in ipairs({ { "cheap path as in RS:run, hot", nil }, { "cheap path as in RS:run, after 5 MB copy", 5 },
  { "cheap path as in RS:run, after 64 MB copy", 64 } }) do
  local c = counts[r[2] or "hot"]
  local f, src, dst = inline_timer(r[2])
  f(step, clock, src, dst, math.min(c, 100)) -- warm-up
  row(r[1], c, f(step, clock, src, dst, c))
end
local rows = { { "check (step:_check), hot", nil, N }, { "check (step:_check), after 5 MB copy", 5, counts[5] },
  { "check (step:_check), after 64 MB copy", 64, counts[64] } }
for _, r in ipairs(rows) do row(r[1], r[3], timed(check, r[3], r[2])) end
local nrt = math.max(1, math.floor(N / 50))
local mode_check, full_check = checker("mode"), checker("full")
timed_after(round_trip, mode_check, 20)
timed_after(direct, full_check, 20)
local n_mode, n_full = step.mode_checks, step.full_checks
for _, r in ipairs({ { "mode check (eval/train), hot", nil }, { "mode check, after 5 MB copy", 5 },
  { "mode check, after 64 MB copy", 64 } }) do
  row(r[1], nrt, timed_after(round_trip, mode_check, nrt, r[2]))
end
for _, r in ipairs({ { "full check (frozen, unfrozen), hot", nil }, { "full check, after 5 MB copy", 5 },
  { "full check, after 64 MB copy", 64 } }) do
  row(r[1], nrt, timed_after(direct, full_check, nrt, r[2]))
end
local restore = function() step.refs:restore() end
for _, r in ipairs({ { "restore, hot", nil, math.floor(N / 10) }, { "restore, after 5 MB copy", 5, math.floor(N / 50) } }) do
  row(r[1], r[3], timed(restore, r[3], r[2]))
end
local jit_on = jit and jit.status()
if jit then jit.off(); jit.flush() end
for _, r in ipairs({ { "check (step:_check) interpreted, 5 MB copy", 5, math.max(1, math.floor(N / 10)) },
  { "check (step:_check) interpreted, 64 MB copy", 64, math.max(1, math.floor(N / 50)) } }) do
  row(r[1], r[3], timed(check, r[3], r[2]))
end
if jit and jit_on then jit.on() end
print(string.format("mode checks timed: %d, full checks timed: %d (each as expected; the cheap-path rows took neither)",
  step.mode_checks - n_mode, step.full_checks - n_full))
print(string.format("stats() over %d recorded steps: cheap path %.2f us/check (%d checks, JIT cold at first), "
  .. "%.2f us per replay in all", STEPS, stats.contract_check_us or 0 / 0, stats.contract_checks or 0,
  stats.contract_us_per_replay or 0 / 0))
assert(step.mode_checks - mode0 >= nrt and step.full_checks - full0 >= nrt)

-- loop=N: the replay loop of a fit (see the file comment)
if (args.loop or 0) > 0 then
  local LOOP, MB, EPOCH = args.loop, args.loop_mb or 64, 36
  local S2 = 32
  local st2 = H.stack{ recorded = true, recorder = RS.fake_recorder(), trainer = {}, B = B, S = S2, warmup = 1 }
  local s2 = st2.step
  local bs = {}
  for i = 1, 4 do bs[i] = H.batch(B, S2, i) end
  for i = 1, 4 do s2:run(bs[i], true) end
  assert(s2.graphs.fb, "bench_contract: the loop's step did not record")
  -- fresh counters: the first checks carry the JIT's compilation
  s2.check_s, s2.checks, s2.mode_check_s, s2.mode_checks, s2.full_check_s, s2.full_checks = 0, 0, 0, 0, 0, 0
  local src, dst
  if MB > 0 then
    local n = math.floor(MB * 1024 * 1024 / 4)
    src, dst = lucid.zeros({ n }, { device = "cpu" }), lucid.zeros({ n }, { device = "cpu" })
  end
  for i = 1, LOOP do
    if i % EPOCH == 0 then st2.model:eval(); st2.model:train() end
    if src then dst:copy_(src) end
    s2:run(bs[i % 4 + 1], true)
  end
  local ls = s2:stats()
  print(string.format("replay loop, %d replays (%d MB copied before each, eval/train every %d): contract %.2f us "
    .. "per replay; cheap path %.2f us (%d); mode checks %s us (%d); full checks %s us (%d); retirements %d", LOOP,
    MB, EPOCH, ls.contract_us_per_replay or 0 / 0, ls.contract_check_us or 0 / 0, ls.contract_checks,
    ls.mode_check_us and string.format("%.1f", ls.mode_check_us) or "-", ls.mode_checks,
    ls.full_check_us and string.format("%.1f", ls.full_check_us) or "-", ls.full_checks, ls.retirements))
  s2:release()
end
step:release()
