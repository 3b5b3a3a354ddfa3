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
-- then the same for refs:restore() (skipped on a replay unless an eager
-- forward ran since the last one), and stats().contract_check_us over
-- `steps` recorded steps. Issue 8 target: under 5 us per step.
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

local function check()
  local why = step:_check(batch)
  if why then error("bench_contract: the contract check failed: " .. tostring(why)) end
end

local full0 = step.full_checks
local cmods, nparams = step.refs:counts()
print(string.format("contract check, YOLO11n-pose (%d C modules, %d parameter-set entries), CPU, fake recorder",
  cmods, nparams))
print(string.format("%-24s %10s %10s %8s", "", "median us", "p90 us", "n"))
timed(check, 1000) -- JIT warm-up
local rows = { { "check, hot", nil, N }, { "check, after 5 MB copy", 5, math.max(1, math.floor(N / 5)) },
  { "check, after 64 MB copy", 64, math.max(1, math.floor(N / 50)) } }
for _, r in ipairs(rows) do
  local med, p90 = timed(check, r[3], r[2])
  print(string.format("%-24s %10.3f %10.3f %8d", r[1], med, p90, r[3]))
end
local restore = function() step.refs:restore() end
for _, r in ipairs({ { "restore, hot", nil, math.floor(N / 10) }, { "restore, after 5 MB copy", 5, math.floor(N / 50) } }) do
  local med, p90 = timed(restore, r[3], r[2])
  print(string.format("%-24s %10.3f %10.3f %8d", r[1], med, p90, r[3]))
end
print(string.format("full checks during the timings: %d (expected 0)", step.full_checks - full0))
print(string.format("stats().contract_check_us over %d recorded steps: %.2f us/check (%d checks, JIT cold at first)",
  STEPS, stats.contract_check_us or 0 / 0, stats.contract_checks or 0))
step:release()
