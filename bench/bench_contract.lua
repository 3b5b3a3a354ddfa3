-- bench_contract.lua — host time of the recorded step's contract check
-- (lua/lucid/recorded_step.lua, RS:_check; docs/STEP.md "Contract") for a
-- real YOLO11n-pose model, on the CPU with the fake recorder of
-- spec/support/step_harness.lua (the check is host code: the same on a GPU
-- machine, where only the graphs differ).
--
--   luajit bench/bench_contract.lua [n=10000] [steps=8]
--
-- Prints the median / p90 of single checks timed one by one (the clock call
-- is included: an upper bound), in three cache states:
--   hot    : back to back (everything in L1/L2)
--   5 MB   : after a 5 MB memcpy (the staging copy of a batch-4 640 step)
--   64 MB  : after a 64 MB memcpy (nothing of the check left in any cache)
-- for the cheap path (every replay), and for the first check after
-- validation's model:eval()/model:train() (the mode round trip of each
-- epoch boundary) and after a module's mode switched and back directly
-- (a full check: the engine's pass and the module tree walk), each of
-- those two timed after its switch. Then refs:restore() (skipped on a
-- replay unless an eager forward ran since the last one), the same cheap
-- path interpreted (jit.off: in a fit the check runs once per step and is
-- mostly not compiled), and stats() over `steps` recorded steps. Issue 8
-- target: under 5 us per step on average, epoch boundaries included.
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
local bn = model.layers[2].module.bn._c
local round_trip = function() model:eval(); model:train() end -- validation, each epoch
local direct = function() bn:eval(); bn:train() end           -- one module, switched and back

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
local rows = { { "check, hot", nil, N }, { "check, after 5 MB copy", 5, math.max(1, math.floor(N / 5)) },
  { "check, after 64 MB copy", 64, math.max(1, math.floor(N / 50)) } }
for _, r in ipairs(rows) do row(r[1], r[3], timed(check, r[3], r[2])) end
local nrt = math.max(1, math.floor(N / 50))
local mode_check, full_check = checker("mode"), checker("full")
timed_after(round_trip, mode_check, 20)
timed_after(direct, full_check, 20)
local n_mode, n_full = step.mode_checks, step.full_checks
for _, r in ipairs({ { "mode round trip, hot", nil }, { "mode round trip, after 5 MB copy", 5 },
  { "mode round trip, after 64 MB copy", 64 } }) do
  row(r[1], nrt, timed_after(round_trip, mode_check, nrt, r[2]))
end
for _, r in ipairs({ { "full check, hot", nil }, { "full check, after 5 MB copy", 5 },
  { "full check, after 64 MB copy", 64 } }) do
  row(r[1], nrt, timed_after(direct, full_check, nrt, r[2]))
end
local restore = function() step.refs:restore() end
for _, r in ipairs({ { "restore, hot", nil, math.floor(N / 10) }, { "restore, after 5 MB copy", 5, math.floor(N / 50) } }) do
  row(r[1], r[3], timed(restore, r[3], r[2]))
end
local jit_on = jit and jit.status()
if jit then jit.off(); jit.flush() end
for _, r in ipairs({ { "check interpreted, after 5 MB copy", 5, math.max(1, math.floor(N / 10)) },
  { "check interpreted, after 64 MB copy", 64, math.max(1, math.floor(N / 50)) } }) do
  row(r[1], r[3], timed(check, r[3], r[2]))
end
if jit and jit_on then jit.on() end
print(string.format("mode round trips timed: %d, full checks timed: %d (each as expected; the cheap-path rows took neither)",
  step.mode_checks - n_mode, step.full_checks - n_full))
print(string.format("stats() over %d recorded steps: cheap path %.2f us/check (%d checks, JIT cold at first), "
  .. "%.2f us per replay in all", STEPS, stats.contract_check_us or 0 / 0, stats.contract_checks or 0,
  stats.contract_us_per_replay or 0 / 0))
assert(step.mode_checks - mode0 >= nrt and step.full_checks - full0 >= nrt)
step:release()
