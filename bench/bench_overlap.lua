--[[
bench/bench_overlap.lua — how much faster recorded training steps go when
two of them run on the GPU at the same time (the question behind
pipelining step k+1's forward with step k's backward, docs/PERF.md).

  luajit bench/bench_overlap.lua [steps=60] [imgsz=640] [batch=4] [device=cuda|cpu]

(device=cpu: a dry run of the script's logic, nothing worth timing.)

Builds K = 1, then K = 2 independent stacks (YOLO11n-pose, bf16, SGD, the
recorded step `lucid.Step`), each on its own context (its own compute
stream, lanes, scratch and buffers), warms them up and records their FB
graphs, then times `steps` training steps (no optimizer step: accumulation)
per stack with the host issuing the stacks' steps in turn, so that with
K = 2 the two stacks' replays run side by side. Synthetic batches
(spec/support/step_harness.lua H.batch), the same two alternated.

Prints one line per K: ms per step (wall time of all steps of all stacks,
stream-fenced before and after, divided by their number), and the ratio.
Then a last line: stack 2's model forward alone, captured as a graph on its
context, timed alone, and beside stack 1's steps (one forward per step):
what a forward costs when it runs under a whole recorded step.
A CUDA device is required (exits 0 with a line saying so otherwise).
]]
package.path = "spec/support/?.lua;" .. package.path
local lucid = require "lucid"
local H = require "step_harness"

local o = { steps = 60, imgsz = 640, batch = 4, device = "cuda" }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^(%w+)=(%w+)$")
  if not k or o[k] == nil then error("bench_overlap: unknown argument '" .. a .. "' (steps=, imgsz=, batch=, device=)") end
  o[k] = tonumber(v) or v
end
if o.device == "cuda" and not (lucid.cuda_available and lucid.cuda_available()) then
  print("bench_overlap: no CUDA device, nothing measured")
  return
end

local S, B = o.imgsz, o.batch
local batches = { H.batch(B, S, 1, B, 16), H.batch(B, S, 2, B, 16) }

local function stack()
  local ctx = lucid.Context{ device = o.device, seed = 7 }
  local st = H.stack{ ctx = ctx, recorded = true, precision = "bf16", B = B, S = S, G = 16, warmup = 2,
    trainer = {} }
  for i = 1, 4 do st.step:run(batches[i % 2 + 1], false) end -- 2 warm-ups, the recording, a replay
  ctx:synchronize()
  return st
end

local stacks = {}
-- ms per call of fn(i), i = 1..steps, every stack's stream fenced before
-- and after (a collection first)
local function timed(fn)
  for _, st in ipairs(stacks) do st.ctx:synchronize() end
  collectgarbage("collect")
  local t0 = lucid.wall_time()
  for i = 1, o.steps do fn(i) end
  for _, st in ipairs(stacks) do st.ctx:synchronize() end
  return (lucid.wall_time() - t0) * 1000 / o.steps
end

local res = {}
for K = 1, 2 do
  while #stacks < K do stacks[#stacks + 1] = stack() end
  res[K] = timed(function(i)
    for k = 1, K do stacks[k].step:run(batches[i % 2 + 1], false) end
  end) / K
  local s = stacks[1].step:stats()
  print(string.format("K=%d stacks: %.3f ms per step over %d steps each (stack 1's replays so far: %d, route %s)", K,
    res[K], o.steps, s.replays, s.route))
end
print(string.format("bench_overlap: %d px batch %d: one stack %.3f ms/step, two side by side %.3f ms/step (%.2fx)",
  S, B, res[1], res[2], res[1] / res[2]))

-- A forward alone beside the steps: stack 2's model forward (training
-- mode) captured as a graph on its own context, one launch per step of
-- stack 1. What extra forward work costs when it runs under a whole
-- recorded step (the question of overlapping step k+1's forward with step
-- k's backward): the period against stack 1 alone and the forward alone.
if o.device ~= "cuda" then return end -- graphs need CUDA (the dry run stops here)
local st2 = stacks[2]
local x2 = lucid.rand({ B, 3, S, S }, { ctx = st2.ctx, dtype = "bf16" })
st2.model:train()
st2.model:forward(x2) -- allocates every buffer before the capture
st2.ctx:synchronize()
lucid.graph.capture_begin(st2.ctx)
local okc, errc = pcall(function() st2.model:forward(x2) end)
if not okc then
  pcall(lucid.graph.capture_discard, st2.ctx)
  error(errc, 0)
end
local fwd = lucid.graph.capture_end(st2.ctx)
local f_alone = timed(function() fwd:launch() end)
local one = timed(function(i) stacks[1].step:run(batches[i % 2 + 1], false) end)
local with_f = timed(function(i)
  stacks[1].step:run(batches[i % 2 + 1], false)
  fwd:launch()
end)
print(string.format("bench_overlap: forward graph alone %.3f ms; a step alone %.3f ms; a step with a forward beside it "
  .. "%.3f ms (the forward's cost under the step %.3f ms, %.0f%% of its time alone)", f_alone, one, with_f,
  with_f - one, 100 * (with_f - one) / f_alone))
fwd:free()
