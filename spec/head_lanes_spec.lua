-- head_lanes_spec.lua — the pose head's lane protocol with one lane a branch
-- and level (LUCID_HEAD_LANES=level, lucid.nn.head H.LEVEL_LANES), on the
-- CPU through a fake context that records every fork, join, mark and wait
-- (the real lanes need a GPU: spec/step_gpu_spec.lua and the fit hashes of
-- the A/B runs cover them there). Checks: the same outputs and gradients as
-- without lanes; in the forward each level's three chains fork lanes
-- b + 3*(level - 1), the concatenation on lane b joins its branch's other
-- level lanes first, and every lane forked is joined on the caller's stream
-- before forward returns; in the backward each branch's split runs on its
-- level-1 lane, each level on its own lane after a join on the split, marked
-- in slot `level`, backward_level(i) waits for (lane of level i, slot i) of
-- every branch, and backward_finish joins every lane forked. The
-- one-lane-a-branch protocol is unchanged (lanes 1..3 only).
package.path = "spec/support/?.lua;" .. package.path
local lucid = require("lucid")
local nn = require("lucid.nn")
local head_mod = require("lucid.nn.head")
local lanes = require("lucid.nn.lanes")

-- A context stand-in: forks always "succeed" (the work itself runs on the
-- CPU as usual); log holds {op, lane, slot, depth} entries, depth = the
-- number of forks open when the call was made.
local function fake_ctx()
  local f = { log = {}, open = {} }
  local function add(op, lane, slot) f.log[#f.log + 1] = { op = op, lane = lane, slot = slot, depth = #f.open } end
  function f.branch_fork(_, lane) add("fork", lane); f.open[#f.open + 1] = lane; return true end
  function f.branch_return(_) add("return", f.open[#f.open]); f.open[#f.open] = nil end
  function f.branch_join(_, lane) add("join", lane) end
  function f.branch_mark(_, lane, slot) add("mark", lane, slot) end
  function f.branch_wait(_, lane, slot) add("wait", lane, slot) end
  return f
end

local function pose(seed)
  local ctx = lucid.Context{ device = "cpu", seed = seed }
  local h = nn.Pose(1, { 17, 3 }, 16, { 16, 32, 64 })
  nn.materialize(h, { ctx = ctx })
  local x = { lucid.randn({ 2, 16, 8, 8 }, { ctx = ctx }), lucid.randn({ 2, 32, 4, 4 }, { ctx = ctx }),
    lucid.randn({ 2, 64, 2, 2 }, { ctx = ctx }) }
  return h, x, ctx
end

-- forward (levels queued first, as Model:forward does) and backward; returns
-- the outputs, input gradients and parameter gradients (clones)
local function pass(h, x, ctx)
  h:forward_begin()
  for i = 1, 3 do h:forward_level(i, x[i]) end
  local out = h:forward(x)
  local gy = {}
  for _, k in ipairs({ "boxes", "scores", "kpts" }) do
    gy[k] = lucid.randn(out[k]:shape(), { ctx = ctx })
  end
  for _, p in ipairs(h:parameters()) do p:grad():zero_() end
  local gx = h:backward(x, gy)
  local r = {}
  for _, k in ipairs({ "boxes", "scores", "kpts" }) do r[#r + 1] = out[k]:clone() end
  for i = 1, 3 do r[#r + 1] = gx[i]:clone() end
  for _, p in ipairs(h:parameters()) do r[#r + 1] = p:grad():clone() end
  return r
end

local function same(a, b)
  assert.are.equal(#a, #b)
  for i = 1, #a do
    assert.are.equal(lucid.hash_tensor(a[i]), lucid.hash_tensor(b[i]), "tensor " .. i)
  end
end

-- entries of log matching op (and lane), in order
local function ops(log, op, lane)
  local r = {}
  for _, e in ipairs(log) do
    if e.op == op and (lane == nil or e.lane == lane) then r[#r + 1] = e end
  end
  return r
end

describe("pose head lanes (fake context)", function()
  local saved_ctx_for, saved_level
  before_each(function() saved_ctx_for, saved_level = lanes.ctx_for, head_mod.LEVEL_LANES end)
  after_each(function() lanes.ctx_for, head_mod.LEVEL_LANES = saved_ctx_for, saved_level end)

  local function run(level)
    local h, x, ctx = pose(5)
    local f = fake_ctx()
    head_mod.LEVEL_LANES = level
    lanes.ctx_for = function() return f end
    local r = pass(h, x, ctx)
    return r, f.log, f
  end

  it("one lane a branch and level: same bits as without lanes, every lane joined", function()
    local plain = pass(pose(5))
    local r, log, f = run(true)
    same(plain, r)
    assert.are.equal(0, #f.open)
    -- forward: forward_level(i) forks lanes 3(i-1)+1 .. 3(i-1)+3, then the
    -- concatenations fork 1..3; backward: per branch the level-1 lane
    -- (split) then levels 3, 2, 1
    local forks = {}
    for _, e in ipairs(ops(log, "fork")) do forks[#forks + 1] = e.lane end
    assert.are.same({ 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3,
      1, 7, 4, 1, 2, 8, 5, 2, 3, 9, 6, 3 }, forks)
    -- every fork at depth 0 (no nesting), every return after its fork
    for _, e in ipairs(ops(log, "fork")) do assert.are.equal(0, e.depth) end
    -- the concatenation of branch b joins lanes b+3 and b+6 inside lane b's fork
    for b = 1, 3 do
      local inside = {}
      for _, e in ipairs(log) do
        if e.op == "join" and e.depth == 1 and (e.lane == b + 3 or e.lane == b + 6) then inside[#inside + 1] = e.lane end
      end
      assert.is_true(#inside >= 2, "branch " .. b .. " joins its level lanes before the concatenation")
    end
    -- backward: each level lane but the first joins the split lane inside its fork, and marks slot = level
    for j = 1, 3 do
      for i = 1, 3 do
        local li = j + 3 * (i - 1)
        local marks = ops(log, "mark", li)
        assert.are.equal(1, #marks, "lane " .. li .. " marks once")
        assert.are.equal(i, marks[1].slot)
        assert.are.equal(1, marks[1].depth)
        local waits = ops(log, "wait", li)
        assert.are.equal(1, #waits, "backward_level waits for lane " .. li)
        assert.are.equal(i, waits[1].slot)
        assert.are.equal(0, waits[1].depth)
      end
    end
    -- the last joins (backward_finish) cover the nine lanes on the caller's stream
    local last = {}
    for k = #log, 1, -1 do
      local e = log[k]
      if e.op ~= "join" or e.depth ~= 0 then break end
      last[e.lane] = true
    end
    for l = 1, 9 do assert.is_true(last[l] == true, "backward_finish joins lane " .. l) end
  end)

  it("one lane a branch (the default): lanes 1..3 only, same bits", function()
    local plain = pass(pose(5))
    local r, log = run(false)
    same(plain, r)
    for _, e in ipairs(log) do
      if e.lane then assert.is_true(e.lane >= 1 and e.lane <= 3, e.op .. " of lane " .. e.lane) end
    end
  end)
end)
