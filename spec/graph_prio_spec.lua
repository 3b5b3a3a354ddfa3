-- graph_prio_spec.lua — kernel-node priorities of recorded graphs from
-- their critical-path slack (cuda/graph.cu graph_slack_priorities,
-- engine/train/graph_slack.c; LUCID_GRAPH_SLACK). #gpu: make test-gpu on
-- the GPU machine; `make test` lists these as skipped.
--
-- A child process (the switches are read once per process) records a graph
-- of a chain of 9 adds on the compute stream beside one add on branch lane 1
-- that joins before the last add, and prints LUCID_GRAPH_STATS's lines; the
-- second line gives the kernel nodes by the priority read back from them.
-- A captured graph with several roots gets a head at capture end
-- (cuda/graph.cu graph_add_head, LUCID_GRAPH_HEAD): one empty kernel that
-- both the chain and the branch hang from, so the graph has 11 kernel
-- nodes, one root, and a longest path of 10 (the head and the chain). A
-- graph with one root (CHAIN_ONLY=1: the chain alone) gets none.
local lucid = require "lucid"

local gpu = lucid.cuda_available and lucid.cuda_available()
  or (lucid.Context{ device = "auto" }:device():sub(1, 4) == "cuda")
local describe_gpu = gpu and describe or pending

local CHILD = [[
package.path = "./lua/?.lua;./lua/?/init.lua;" .. package.path
package.cpath = "./?.so;" .. package.cpath
local lucid = require "lucid"
local ctx = lucid.Context({ device = "cuda" })
local a = lucid.ones({ 4096 }, { ctx = ctx })
local b = lucid.ones({ 4096 }, { ctx = ctx })
local c = lucid.ones({ 4096 }, { ctx = ctx })
local chain_only = os.getenv("CHAIN_ONLY") == "1"
local function work()
  if not chain_only then
    assert(ctx:branch_fork(1), "branch lane 1 did not fork")
    b:add_(a) -- the side branch: reads a, writes b
    ctx:branch_return()
  end
  for _ = 1, 8 do c:add_(a) end -- the chain: writes c
  if not chain_only then ctx:branch_join(1) end
  c:add_(b)
end
work() -- eager: creates the lane outside the capture
lucid.graph.capture_begin(ctx)
work()
local g = lucid.graph.capture_end(ctx)
g:launch()
io.write(string.format("c[1] = %g\n", c:totable()[1]))
]]

-- Runs the child with the environment prefix env; returns its stdout and
-- stderr joined, and the exit status.
local function child(env)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(CHILD)
  f:close()
  local p = assert(io.popen(env .. " LUCID_GRAPH_STATS=1 luajit " .. path .. " 2>&1"))
  local out = p:read("*a")
  local ok, _, code = p:close()
  os.remove(path)
  return out, ok == true or code == 0
end

-- The priority counts of the "lucid graph priorities:" line, as
-- {greatest=, least=, count = {[prio] = n}, on = k, path = n}.
local function parse(out)
  local line = out:match("lucid graph priorities: ([^\n]*)")
  assert(line, "no priorities line in:\n" .. out)
  local g, l = line:match("range (%-?%d+)%.%.(%-?%d+);")
  local r = { greatest = tonumber(g), least = tonumber(l), count = {} }
  local mid = line:match(";(.-);")
  for p, n in mid:gmatch("(%-?%d+):(%d+)") do r.count[tonumber(p)] = tonumber(n) end
  local on, all = line:match("longest path at greatest (%d+)/(%d+)")
  r.on, r.path = tonumber(on), tonumber(all)
  return r
end

describe_gpu("recorded graph priorities #gpu", function()
  it("follow the slack: the chain at the greatest priority, the side branch lower", function()
    local out, ok = child("")
    assert.is_true(ok, out)
    -- the graph ran: the eager pass made b 2 and c 1 + 8 + 2 = 11; the
    -- replay b 3 and c 11 + 8 + 3 = 22
    assert.matches("c%[1%] = 22", out)
    local r = parse(out)
    assert.are.equal(11, (r.count[r.greatest] or 0) + (r.count[r.greatest + math.min(3, r.least - r.greatest)] or 0))
    assert.are.equal(10, r.path)
    assert.are.equal(10, r.on)
    if r.least > r.greatest then
      -- slack 7 (8 chain adds beside 1): level 3 of the doubling bands
      local want = r.greatest + math.min(3, r.least - r.greatest)
      assert.are.equal(10, r.count[r.greatest])
      assert.are.equal(1, r.count[want])
    end
  end)

  it("LUCID_GRAPH_SLACK=0 keeps the captured stream priorities", function()
    local out, ok = child("LUCID_GRAPH_SLACK=0")
    assert.is_true(ok, out)
    local r = parse(out)
    -- the compute stream and the branch lanes both have the greatest priority
    assert.are.equal(11, r.count[r.greatest])
    assert.are.equal(10, r.on)
  end)

  it("a graph of one root gets no head: 9 kernels, 1 root", function()
    local out, ok = child("CHAIN_ONLY=1")
    assert.is_true(ok, out)
    assert.matches("9 kernels, 0 memcpy, 0 memset, 0 other%), %d+ edges, 1 roots;", out)
    -- eager: c = 1 + 8 + 1 = 10; the replay: 10 + 8 + 1
    assert.matches("c%[1%] = 19", out)
  end)

  it("has one root with the head, two without it (LUCID_GRAPH_HEAD=0)", function()
    local out, ok = child("")
    assert.is_true(ok, out)
    assert.matches("11 kernels, 0 memcpy, 0 memset, 0 other%), %d+ edges, 1 roots;", out)
    assert.matches("c%[1%] = 22", out)
    out, ok = child("LUCID_GRAPH_HEAD=0")
    assert.is_true(ok, out)
    -- the chain's first add and the branch's add: no head above them
    assert.matches("10 kernels, 0 memcpy, 0 memset, 0 other%), %d+ edges, 2 roots;", out)
    assert.matches("c%[1%] = 22", out)
  end)
end)
