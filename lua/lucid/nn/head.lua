--- lucid.nn.head — DFL, Detect and Pose heads (Ultralytics 8.4.114,
-- reference/yolo_pose_reference.md 1.7).
--
-- Training output of Detect: a table {boxes [B, 4*reg_max, A], scores
-- [B, nc, A], feats = the input list}; Pose adds kpts [B, nk, A]. A is the
-- number of anchors, sum of H_i*W_i over the levels (8400 at 640).
local util = require("lucid.nn.util")
local Module = require("lucid.nn.module")
local P = require("lucid.nn.prim")
local containers = require("lucid.nn.containers")
local blocks = require("lucid.nn.blocks")
local lanes = require("lucid.nn.lanes")
local MARK_SLOTS = 4 -- LUCID_BRANCH_MARKS (engine/lucid.h)

local Conv, DWConv = blocks.Conv, blocks.DWConv
local Sequential, ModuleList = containers.Sequential, containers.ModuleList
local acc = containers.accumulate
local H = {}
local sig = util.signature

---------------------------------------------------------------------- DFL
local DFL = util.class("DFL", P.Leaf)
H.DFL = DFL

--- DFL(c1=16): the fixed projection conv (weight 0..c1-1, shape [1, c1, 1,
-- 1], frozen). forward(x [B, 4*c1, A]) -> [B, 4, A]: per side, the
-- expectation of the softmax over the c1 bins.
function DFL.__init(self, c1)
  P.Leaf.__init(self)
  self.c1 = c1 or 16
  self:param("conv.weight", { 1, self.c1, 1, 1 }, { trainable = false, init = { kind = "arange" } })
end
DFL._args = sig("nn.DFL", { { "c1", "int", min = 1, opt = true } })
function DFL:_make(C, set, prefix, ctx) return C.dfl(set, prefix, self.c1) end
function DFL:repr()
  return "DFL(\n  (conv): Conv2d(" .. self.c1 .. ", 1, kernel_size=(1, 1), stride=(1, 1), bias=False)\n)"
end

------------------------------------------------------------------- Detect
local Detect = util.class("Detect", Module)
H.Detect = Detect

-- Constructor part shared with Pose.
local function detect_init(self, nc, reg_max, ch, legacy)
  Module.__init(self)
  nc = nc or 80
  self.nc, self.nl, self.reg_max = nc, #ch, reg_max or 16
  self.no = nc + self.reg_max * 4
  self.legacy = legacy and true or false
  self.stride = { 8, 16, 32 }
  local c2 = math.max(16, math.floor(ch[1] / 4), self.reg_max * 4)
  local c3 = math.max(ch[1], math.min(nc, 100))
  local box, cls = {}, {}
  for i, x in ipairs(ch) do
    box[i] = Sequential.new({ Conv.new(x, c2, 3), Conv.new(c2, c2, 3), P.Conv2d.new(c2, 4 * self.reg_max, 1, 1, 0, 1, 1, true) })
    if self.legacy then
      cls[i] = Sequential.new({ Conv.new(x, c3, 3), Conv.new(c3, c3, 3), P.Conv2d.new(c3, nc, 1, 1, 0, 1, 1, true) })
    else
      cls[i] = Sequential.new({
        Sequential.new({ DWConv.new(x, x, 3), Conv.new(x, c3, 1) }),
        Sequential.new({ DWConv.new(c3, c3, 3), Conv.new(c3, c3, 1) }),
        P.Conv2d.new(c3, nc, 1, 1, 0, 1, 1, true),
      })
    end
  end
  self:add("cv2", ModuleList.new(box))
  self:add("cv3", ModuleList.new(cls))
  if self.reg_max > 1 then self:add("dfl", DFL.new(self.reg_max)) end
  -- one concatenation along the anchor axis per output ([B*C, HW_i] views)
  self._cat = {}
end

-- Branch names in output order, with the ModuleList and channel count.
local function branches(self)
  local b = { { "boxes", self.cv2, 4 * self.reg_max }, { "scores", self.cv3, self.nc } }
  if self.cv4 then b[3] = { "kpts", self.cv4, self.nk } end
  return b
end

-- (a one-level head has nothing to concatenate: no module, the level's
-- flat view is the output)
local function make_cats(self)
  if self.nl < 2 then return end
  for _, br in ipairs(branches(self)) do
    self._cat[br[1]] = self:helper(P.Concat.new(self.nl))
  end
end

-- Argument entries of the heads (ch: one entry per level, strides 8, 16, 32).
local NC = { "nc", "int", min = 1, opt = true }
local REG_MAX = { "reg_max", "int", min = 1, opt = true }
local CH = { "ch", "ints", lo = 1, hi = 3, min = 1, what = "input channels per level, strides 8, 16, 32" }
local LEGACY = { "legacy", "boolean", opt = true }

--- Detect(nc=80, reg_max=16, ch={...}, legacy=false). Children: cv2 (box:
-- Conv(x,c2,3), Conv(c2,c2,3), Conv2d(c2, 4*reg_max, 1)), cv3 (cls;
-- YOLO11 depthwise or v8 legacy), dfl. c2 = max(16, ch1//4, 4*reg_max), c3
-- = max(ch1, min(nc, 100)).
function Detect.__init(self, nc, reg_max, ch, legacy)
  detect_init(self, nc, reg_max, ch, legacy)
  make_cats(self)
end

Detect._args = sig("nn.Detect", { NC, REG_MAX, CH, LEGACY })

--- Remember the context of the tree (nn.materialize): the branches run
-- on its branch lanes (lucid.nn.lanes) when the inputs are on a GPU.
function Detect:_create(C, set, prefix, ctx)
  rawset(self, "_lane_ctx", ctx)
  Module._create(self, C, set, prefix, ctx)
end

-- Forward of branch br at level i on input xi: the chain's output, flat
-- ([B*c, H*W] view) into st.flat[name][i], its size into st.hw[i].
local function chain_forward(self, st, br, i, xi)
  local name, list, c = br[1], br[2], br[3]
  local y = list:get(i):forward(xi)
  local s = y:shape()
  st.hw[i] = { s[3], s[4] }
  local flat = st.flat[name]
  if not flat then
    flat = {}
    st.flat[name] = flat
  end
  flat[i] = y:view({ s[1] * c, s[3] * s[4] })
end

--- Start of a forward pass (Model:forward calls it first): forgets the
-- levels queued by forward_level for an earlier pass.
function Detect:forward_begin()
  self._pre = nil
end

--- Queue level i now, on input xi (the feature map the next forward will
-- get as x[i]): on a GPU the three branch chains of that level start on the
-- branch lanes while the caller goes on computing the other levels' inputs
-- (Model:forward calls it as soon as a head input exists). Without branch
-- lanes (CPU) it does nothing and forward computes the level. The work is
-- joined by forward.
function Detect:forward_level(i, xi)
  local ctx = lanes.ctx_for(self._lane_ctx, xi)
  if not ctx then return end
  local pre = self._pre
  if not pre then
    pre = { flat = {}, hw = {}, done = {}, lanes = {}, ctx = ctx }
    self._pre = pre
  end
  local brs = branches(self)
  local forked = lanes.queue(ctx, #brs, function(j) chain_forward(self, pre, brs[j], i, xi) end)
  for _, b in ipairs(forked) do pre.lanes[b] = true end
  pre.done[i] = xi
end

--- x: list of nl feature maps [B, ch_i, H_i, W_i]. Returns {boxes, scores,
-- (kpts), feats = x}. On a GPU the box / class / keypoint branches run
-- concurrently, one per branch lane (lucid.nn.lanes: same bits as in
-- sequence); levels already queued by forward_level on the same tensor are
-- not run again.
function Detect:forward(x)
  local Bn = x[1]:shape()[1]
  local pre = self._pre
  self._pre = nil
  local done = pre and pre.done or {}
  local st = pre or { flat = {}, hw = {} }
  st.done = nil
  local out = { feats = x }
  local brs = branches(self)
  lanes.run(lanes.ctx_for(self._lane_ctx, x[1]), #brs, function(j)
    local br = brs[j]
    for i = 1, self.nl do
      if not rawequal(done[i], x[i]) then chain_forward(self, st, br, i, x[i]) end
    end
    local name, c = br[1], br[3]
    local flat = st.flat[name]
    local cat = self.nl < 2 and flat[1] or self._cat[name]:forward(flat)
    out[name] = cat:view({ Bn, c, cat:shape()[2] })
  end)
  -- the lanes the early levels used (run joined those it forked itself)
  if pre then
    for b = 1, 3 do
      if pre.lanes[b] then pre.ctx:branch_join(b) end
    end
  end
  st.B = Bn
  self._st = st
  self.output = out
  return out
end

--- First half of backward: checks gy (as backward) and queues every
-- branch's backward, level nl first, on the branch lanes (on a GPU),
-- marking each level's end (ctx:branch_mark(b, level)). Then
-- backward_level(i) gives level i's input gradient once it is needed, and
-- backward_finish() joins. Model:backward uses these so that the network
-- below the head starts on the deepest level while the branches still
-- run the others.
function Detect:backward_start(x, gy)
  local st = self._st
  local who = "nn." .. getmetatable(self).__name .. ":backward"
  if not st or not self.output then
    error(who .. ": forward must run first (there is no forward pass to differentiate)", 3)
  end
  util.check_output_grad(who, self.output, gy, 2, 3)
  local brs = branches(self)
  -- one mark slot per level: a head of more levels than slots runs in order
  local ctx = self.nl <= MARK_SLOTS and lanes.ctx_for(self._lane_ctx, x[1]) or nil
  local rows = {}
  local forked = lanes.queue(ctx, #brs, function(j)
    local name, list, c = brs[j][1], brs[j][2], brs[j][3]
    local g = gy[name]
    if g == nil then return end
    local g2 = g:view({ st.B * c, g:shape()[3] })
    local gs = self.nl < 2 and { g2 } or self._cat[name]:backward(st.flat[name], g2)
    local row = {}
    for i = self.nl, 1, -1 do
      local hw = st.hw[i]
      row[i] = list:get(i):backward(x[i], gs[i]:view({ st.B, c, hw[1], hw[2] }))
      if ctx then ctx:branch_mark(j, i) end
    end
    rows[j] = row
  end)
  self._bq = { rows = rows, ctx = ctx, n = #brs, forked = forked }
end

--- Level i's input gradient after backward_start: the current stream first
-- waits for that level of every branch, then the branch gradients are
-- summed in branch order (boxes, scores, kpts). nil when no branch had a
-- gradient. Fused (containers.fusing()): the three are summed in one
-- launch (containers.sum: the same chain ((boxes + scores) + kpts), same
-- bits).
function Detect:backward_level(i)
  if containers.fusing() then return containers.sum(self:backward_level_terms(i)) end
  local q = self._bq
  local g
  for j = 1, q.n do
    local row = q.rows[j]
    if row then
      if q.ctx then q.ctx:branch_wait(j, i) end
      g = acc(g, row[i])
    end
  end
  return g
end

--- Level i's branch gradients after backward_start, unsummed: the current
-- stream first waits for that level of every branch; the list in branch
-- order (boxes, scores, kpts; branches without a gradient left out), whose
-- left-to-right sum is backward_level(i). Model:backward sums them with the
-- level's other gradient terms in one launch.
function Detect:backward_level_terms(i)
  local q = self._bq
  local terms = {}
  for j = 1, q.n do
    local row = q.rows[j]
    if row then
      if q.ctx then q.ctx:branch_wait(j, i) end
      if row[i] ~= nil then terms[#terms + 1] = row[i] end
    end
  end
  return terms
end

--- End of a backward pass begun by backward_start: joins the branch
-- lanes (their BatchNorm parameter gradients are complete after it).
function Detect:backward_finish()
  local q = self._bq
  if q and q.forked then
    for _, b in ipairs(q.forked) do q.ctx:branch_join(b) end
  end
  self._bq = nil
end

--- gy: {boxes=, scores=, kpts=} (a missing entry is a zero gradient),
-- each present entry of the shape of the last forward's output (checked:
-- a named error otherwise, as for running backward before any forward).
-- Returns the list of input gradients (nil for a level with none). The
-- branches run on the branch lanes as in forward (backward_start,
-- backward_level, backward_finish).
function Detect:backward(x, gy)
  self:backward_start(x, gy)
  local gx = {}
  for i = 1, self.nl do gx[i] = self:backward_level(i) end
  self:backward_finish()
  self.grad_input = gx
  return gx
end

--- Ultralytics bias_init: box output bias 2.0; class output bias
-- ln(5 / nc / (640 / stride)^2). Needs a materialised tree.
function Detect:_post_init()
  for i = 1, self.nl do
    local box = self.cv2:get(i)
    local cls = self.cv3:get(i)
    local s = self.stride[i]
    box:get(box:len()):parameters()[2]:data():fill_(2.0)
    cls:get(cls:len()):parameters()[2]:data():fill_(math.log(5 / self.nc / (640 / s) ^ 2))
  end
end

--------------------------------------------------------------------- Pose
local Pose = util.class("Pose", Detect)
H.Pose = Pose

--- Pose(nc=80, kpt_shape={17,3}, reg_max=16, ch={...}, legacy=false): a
-- Detect plus cv4 (keypoints): Conv(x,c4,3), Conv(c4,c4,3), Conv2d(c4, nk,
-- 1), c4 = max(ch1//4, nk), nk = kpt_shape[1]*kpt_shape[2].
function Pose.__init(self, nc, kpt_shape, reg_max, ch, legacy)
  detect_init(self, nc, reg_max, ch, legacy)
  self.kpt_shape = kpt_shape or { 17, 3 }
  self.nk = self.kpt_shape[1] * self.kpt_shape[2]
  local c4 = math.max(math.floor(ch[1] / 4), self.nk)
  local kp = {}
  for i, x in ipairs(ch) do
    kp[i] = Sequential.new({ Conv.new(x, c4, 3), Conv.new(c4, c4, 3), P.Conv2d.new(c4, self.nk, 1, 1, 0, 1, 1, true) })
  end
  self:add("cv4", ModuleList.new(kp))
  make_cats(self)
end
Pose._args = sig("nn.Pose", { NC, { "kpt_shape", "kpt_shape", opt = true }, REG_MAX, CH, LEGACY })

return H
