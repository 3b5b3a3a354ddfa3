--- lucid.nn.blocks — the convolutional YOLO blocks as Lua compositions of
-- the C primitives: Conv, DWConv, Bottleneck, C2f, C3, C3k, C3k2, SPPF.
-- Structure, child names and defaults follow Ultralytics 8.4.114
-- (reference/yolo_pose_reference.md 1.6). Inputs/outputs are NCHW tensors.
local util = require("lucid.nn.util")
local Module = require("lucid.nn.module")
local P = require("lucid.nn.prim")
local containers = require("lucid.nn.containers")

local acc = containers.accumulate
local B = {}
local sig = util.signature

-- Argument entries shared by the block signatures.
local function int(name, min, opt) return { name, "int", min = min, opt = opt } end
local function bool(name) return { name, "boolean", opt = true } end
local E = { "e", "number", gt = 0, opt = true }

--- Hidden channels int(c * e) of a block (c: the argument named cname):
-- nil, nil, h when h >= min, else the argument to blame (e when given, else
-- cname) and the message for util.signature's check.
function B.check_hidden(c, e, min, what, cname)
  local h = util.int(c * (e or 0.5))
  if h < min then
    return e == nil and cname or "e", string.format("%s = int(%s * e) = int(%d * %s) = %d; expected >= %d",
      what, cname, c, util.pyrepr(e or 0.5), h, min)
  end
  return nil, nil, h
end

--- Groups g (nil: 1) must divide every channel count given as (what, c)
-- pairs: nil, or "g" and the message for util.signature's check.
function B.check_groups_of(g, ...)
  g = g or 1
  for i = 1, select("#", ...), 2 do
    local what, c = select(i, ...)
    if c % g ~= 0 then return "g", string.format("groups %d must divide %s = %d", g, what, c) end
  end
end

--------------------------------------------------------------------- Conv
local Conv = util.class("Conv", Module)
B.Conv = Conv

--- Conv(c1, c2, k=1, s=1, p=autopad, g=1, d=1, act=true): Conv2d without
-- bias, BatchNorm2d (eps 1e-3, momentum 0.03), SiLU (act=false: Identity).
-- Children: conv, bn, act.
function Conv.__init(self, c1, c2, k, s, p, g, d, act)
  Module.__init(self)
  k, s, g, d = k or 1, s or 1, g or 1, d or 1
  self.c1, self.c2 = c1, c2
  self:add("conv", P.Conv2d.new(c1, c2, k, s, p, g, d, false))
  self:add("bn", P.BatchNorm2d.new(c2))
  if act == false then self:add("act", P.Identity.new())
  else self:add("act", P.SiLU.new()) end
end

Conv._args = sig("nn.Conv", {
  int("c1", 1), int("c2", 1), int("k", 1, true), int("s", 1, true), int("p", 0, true),
  int("g", 1, true), int("d", 1, true), bool("act"),
}, function(c1, c2, k, s, p, g) return P.check_groups(c1, c2, g) end)

--- y = act(bn(conv(x))). x [N, c1, H, W] -> [N, c2, H', W'].
-- bn and act run as one fused BatchNorm2d+SiLU call when
-- P.bn_silu_fusable(bn, act) (plain BatchNorm2d and SiLU, nothing replaced),
-- else as two calls; the backward follows the route of the last forward.
function Conv:forward(x)
  local a = self.conv:forward(x)
  self._a = a
  if P.bn_silu_fusable(self.bn, self.act) then
    self._fused, self._b = true, nil
    self.output = P.bn_silu_forward(self.bn, self.act, a)
  else
    self._fused = false
    self._b = self.bn:forward(a)
    self.output = self.act:forward(self._b)
  end
  return self.output
end

--- Gradient through act, bn, conv; accumulates into their parameters.
-- gy: a tensor, or a gradient description (containers.desc: pieces of
-- sums of tensors and channel slices) that bn's backward reads itself
-- when the engine takes it (P.bn_silu_backward_terms after a fused
-- forward, P.bn_backward_terms before an Identity act; the GPU's one-pass
-- BatchNorm of one-part channels), else materialised first
-- (containers.materialize: the sum the producer would have written, same
-- bits). On the GPU bn's backward may also write the im2col columns of
-- conv's backward-data (P.conv_dcols_reserve: reserved right before it,
-- read by conv:backward right after; the same bits either way; not with a
-- description the engine took).
function Conv:backward(x, gy)
  local g
  local conv = self.conv
  if containers.is_desc(gy) then
    local taken
    if self._fused then
      taken, g = P.bn_silu_backward_terms(self.bn, self.act, self._a, gy)
    elseif P.bn_terms_plain(self.bn, self.act) then
      taken, g = P.bn_backward_terms(self.bn, self._a, gy)
    end
    if taken then
      self.grad_input = conv:backward(x, g)
      return self.grad_input
    end
    gy = containers.materialize(gy)
  end
  if self._fused then
    if P.conv_dcols_reserve(conv, nil, x) then
      g = P.bn_silu_backward_dcols(self.bn, self.act, self._a, gy, conv)
    else
      g = P.bn_silu_backward(self.bn, self.act, self._a, gy)
    end
  else
    g = self.act:backward(self._b, gy)
    if P.conv_dcols_reserve(conv, self.bn, x) then
      g = P.bn_backward_dcols(self.bn, self._a, g, conv)
    else
      g = self.bn:backward(self._a, g)
    end
  end
  self.grad_input = conv:backward(x, g)
  return self.grad_input
end

Conv._desc = Conv.backward

--- Whether this block's BatchNorm would read a gradient description now
-- (the route of its last forward: fused with SiLU, or alone before an
-- Identity; and the engine's answer for its input, P.bn_terms_fit).
-- @return boolean
function Conv:reads_terms()
  if not (self._fused or P.bn_terms_plain(self.bn, self.act)) or self._a == nil then return false end
  return P.bn_terms_fit(self.bn, self._a)
end

------------------------------------------------------------------- DWConv
local DWConv = util.class("DWConv", Conv)
B.DWConv = DWConv

--- DWConv(c1, c2, k=1, s=1, d=1, act=true): Conv with groups gcd(c1, c2).
function DWConv.__init(self, c1, c2, k, s, d, act)
  Conv.__init(self, c1, c2, k, s, nil, util.gcd(c1, c2), d, act)
end
DWConv._args = sig("nn.DWConv", {
  int("c1", 1), int("c2", 1), int("k", 1, true), int("s", 1, true), int("d", 1, true), bool("act"),
})

--------------------------------------------------------------- Bottleneck
local Bottleneck = util.class("Bottleneck", Module)
B.Bottleneck = Bottleneck

--- Bottleneck(c1, c2, shortcut=true, g=1, k={3,3}, e=0.5): cv1 Conv(c1, c_,
-- k[1]), cv2 Conv(c_, c2, k[2], groups g), c_ = int(c2*e); residual add when
-- shortcut and c1 == c2.
function Bottleneck.__init(self, c1, c2, shortcut, g, k, e)
  Module.__init(self)
  if shortcut == nil then shortcut = true end
  k, e = k or { 3, 3 }, e or 0.5
  local c_ = util.int(c2 * e)
  self:add("cv1", Conv.new(c1, c_, k[1], 1))
  self:add("cv2", Conv.new(c_, c2, k[2], 1, nil, g or 1))
  self.add_ = shortcut and c1 == c2
  if self.add_ then self._sum = self:helper(P.Add.new()) end
end

Bottleneck._args = sig("nn.Bottleneck", {
  int("c1", 1), int("c2", 1), bool("shortcut"), int("g", 1, true),
  { "k", "ints", n = 2, min = 1, opt = true, what = "kernels of cv1 and cv2" }, E,
}, function(c1, c2, shortcut, g, k, e)
  local name, msg, h = B.check_hidden(c2, e, 1, "hidden channels c_", "c2")
  if name then return name, msg end
  return B.check_groups_of(g, "the hidden channels c_", h, "c2", c2)
end)

--- y = x + cv2(cv1(x)) (or without the residual).
function Bottleneck:forward(x)
  local h = self.cv2:forward(self.cv1:forward(x))
  self.output = self.add_ and self._sum:forward({ x, h }) or h
  return self.output
end

--- gx = gy (residual) + cv1'(cv2'(gy)). gy may be a gradient
-- description (containers.desc): cv2 reads it, and the residual takes its
-- one term (a channel slice; a description of several terms is
-- materialised first, containers.residual).
function Bottleneck:backward(x, gy)
  local t = gy
  if self.add_ then gy, t = containers.residual(gy) end
  local g = containers.backward(self.cv2, self.cv1.output, gy)
  g = self.cv1:backward(x, g)
  if self.add_ then
    self.grad_input = containers.is_slice(t) and containers.sum({ g, t }) or acc(g, t)
  else
    self.grad_input = g
  end
  return self.grad_input
end

--- forward with the residual sum left to the caller (containers.
-- forward_terms): {x, h} (output = x + h, self.output nil) with the
-- residual, else {forward(x)}. A block that writes the sum inside a copy it
-- issues anyway (C2f's concatenation) saves the Add launch.
function Bottleneck:forward_terms(x)
  if not self.add_ then return { self:forward(x) } end
  local h = self.cv2:forward(self.cv1:forward(x))
  self.output = nil
  return { x, h }
end

--- backward with the residual sum left to the caller: {g, gy} (grad_input
-- = g + gy, self.grad_input nil) with the residual, else {g}.
function Bottleneck:backward_terms(x, gy)
  local t = gy
  if self.add_ then gy, t = containers.residual(gy) end
  local g = containers.backward(self.cv2, self.cv1.output, gy)
  g = self.cv1:backward(x, g)
  self.grad_input = nil
  if self.add_ then return { g, t } end
  self.grad_input = g
  return { g }
end
Bottleneck._terms = { Bottleneck.forward, Bottleneck.backward }
Bottleneck._desc = Bottleneck.backward

---------------------------------------------------------------------- C2f
local C2f = util.class("C2f", Module)
B.C2f = C2f

-- Shared constructor part of C2f and C3k2: cv1, cv2 and the helpers; the
-- caller adds m (a ModuleList of n inner blocks).
local function c2f_layout(self, c1, c2, n, e)
  Module.__init(self)
  self.c = util.int(c2 * (e or 0.5))
  self.n = n
  self:add("cv1", Conv.new(c1, 2 * self.c, 1, 1))
  self:add("cv2", Conv.new((2 + n) * self.c, c2, 1))
  self._split = self:helper(P.Split.new(2))
  self._cat = self:helper(P.Concat.new(2 + n))
end

--- C2f(c1, c2, n=1, shortcut=false, g=1, e=0.5): cv1 Conv(c1, 2c, 1), split
-- in two chunks, n Bottleneck(c, c, shortcut, g, {3,3}, 1.0) chained on the
-- last chunk, cv2 Conv((2+n)c, c2, 1) on the concatenation; c = int(c2*e).
function C2f.__init(self, c1, c2, n, shortcut, g, e)
  n = n or 1
  c2f_layout(self, c1, c2, n, e)
  local list = {}
  for i = 1, n do list[i] = Bottleneck.new(self.c, self.c, shortcut or false, g, { 3, 3 }, 1.0) end
  self:add("m", containers.ModuleList.new(list))
end

C2f._args = sig("nn.C2f", {
  int("c1", 1), int("c2", 1), int("n", 1, true), bool("shortcut"), int("g", 1, true), E,
}, function(c1, c2, n, shortcut, g, e)
  local name, msg, c = B.check_hidden(c2, e, 1, "hidden channels c", "c2")
  if name then return name, msg end
  return B.check_groups_of(g, "the hidden channels c", c)
end)

--- y = cv2(cat(y0, y1, m1(y1), m2(m1(y1)), ...)), (y0, y1) = chunk(cv1(x)).
-- Fused (containers.fusing(), the default): the last inner block's output
-- is not materialised when it is a sum (a Bottleneck's residual): the
-- concatenation writes that sum itself, and takes (y0, y1) straight from
-- cv1's output; one launch instead of the Add and the Concat (same bits).
function C2f:forward(x)
  local y = self.cv1:forward(x)
  local parts = self._split:forward(y)
  local outs = { parts[1], parts[2] }
  local t = parts[2]
  local fused = containers.fusing()
  self._fused = fused
  for i = 1, fused and self.n - 1 or self.n do
    t = self.m:get(i):forward(t)
    outs[#outs + 1] = t
  end
  self._outs = outs
  if fused then
    local c, n = self.c, self.n
    local last = containers.forward_terms(self.m:get(n), t)
    -- the Concat helper's own output buffer, written by one launch
    local cat = self._cat._c:ensure_buffer("output", 1, y, (2 + n) * c)
    local pieces = { { cat, 0, 2 * c, y, 0 } }
    for i = 3, n + 1 do pieces[#pieces + 1] = { cat, (i - 1) * c, c, outs[i], 0 } end
    pieces[#pieces + 1] = containers.piece(cat, (n + 1) * c, c, last)
    containers.chan_sum(pieces)
    self._cat.output = cat
    self._cat_out = cat
  else
    self._cat_out = self._cat:forward(outs)
  end
  self.output = self.cv2:forward(self._cat_out)
  return self.output
end

--- Reverse of forward; the chunk y1 and every inner output receive the sum
-- of their concatenation gradient and their consumer's gradient. Fused
-- (after a fused forward): only the last piece of the concatenation
-- gradient is copied out (the inner block's gradient input); each inner
-- block's gradient is left as terms (containers.backward_terms) and summed
-- with its slice of the concatenation gradient in one launch, the first
-- one inside the launch that writes the split gradient: 2 + (n - 1)
-- launches instead of 2 + 2n (same bits).
function C2f:backward(x, gy)
  if self._fused then return self:_backward_fused(x, gy) end
  local outs = self._outs
  local gcat = containers.backward(self.cv2, self._cat_out, gy)
  local gs = self._cat:backward(outs, gcat)
  local g = gs[#gs]
  for i = self.n, 1, -1 do
    local gin = self.m:get(i):backward(outs[i + 1], g)
    g = acc(gs[i + 1], gin)
  end
  local gsplit = self._split:backward(self.cv1.output, { gs[1], g })
  self.grad_input = self.cv1:backward(x, gsplit)
  return self.grad_input
end

-- The fused backward (see backward): gs[k] = channels [(k-1)c, kc) of
-- gcat; acc(gs[i+1], gin_i) = gin_i + gs[i+1], i.e. the inner block's terms
-- followed by its slice. With gradient descriptions (containers.
-- describing(), LUCID_BN_DY_TERMS): the last piece of gcat, the inner
-- blocks' sums and the split gradient are handed over as descriptions
-- (their buffers: the same helper buffers and scope positions), so a
-- Conv whose BatchNorm reads them (the GPU's one-pass kernel) needs no
-- copy or sum launch before it; anything else materialises them (the
-- launches and bits above).
function C2f:_backward_fused(x, gy)
  local outs, c, n = self._outs, self.c, self.n
  local gcat = containers.backward(self.cv2, self._cat_out, gy)
  local describing = containers.describing()
  local cat, split = self._cat, self._split
  -- gs[n+2] into the Concat helper's own gradient buffer
  local g
  if describing then
    g = containers.desc({ { 0, c, containers.slice(gcat, (n + 1) * c, c) } },
      function() return cat._c:ensure_buffer("grad_input", n + 2, gcat, c) end)
  else
    g = cat._c:ensure_buffer("grad_input", n + 2, gcat, c)
    containers.chan_sum({ { g, 0, c, gcat, (n + 1) * c } })
  end
  local terms
  for i = n, 1, -1 do
    terms = containers.backward_terms(self.m:get(i), outs[i + 1], g)
    terms[#terms + 1] = containers.slice(gcat, i * c, c)
    if i > 1 then g = containers.sum_desc(terms) end
  end
  -- {gs[1], g} into the Split helper's own gradient buffer
  local cv1out = self.cv1.output
  if describing then
    local d = containers.split_desc(split, cv1out, gcat, c, terms)
    self.grad_input = containers.backward(self.cv1, x, d)
    split.grad_input = d.value
    return self.grad_input
  end
  local gsplit = split._c:ensure_buffer("grad_input", 1, cv1out)
  containers.chan_sum({ { gsplit, 0, c, gcat, 0 }, containers.piece(gsplit, c, c, terms) })
  split.grad_input = gsplit
  self.grad_input = self.cv1:backward(x, gsplit)
  return self.grad_input
end
C2f._desc = C2f.backward

function C2f:extra_repr() return "" end

----------------------------------------------------------------------- C3
local C3 = util.class("C3", Module)
B.C3 = C3

-- Shared constructor part of C3 and C3k (the caller adds m).
local function c3_layout(self, c1, c2, e)
  Module.__init(self)
  local c_ = util.int(c2 * (e or 0.5))
  self.c_ = c_
  self:add("cv1", Conv.new(c1, c_, 1, 1))
  self:add("cv2", Conv.new(c1, c_, 1, 1))
  self:add("cv3", Conv.new(2 * c_, c2, 1))
  self._cat = self:helper(P.Concat.new(2))
  return c_
end

--- C3(c1, c2, n=1, shortcut=true, g=1, e=0.5): cv3(cat(m(cv1 x), cv2 x)),
-- m = n Bottleneck(c_, c_, shortcut, g, {1,3}, 1.0), c_ = int(c2*e).
function C3.__init(self, c1, c2, n, shortcut, g, e)
  local c_ = c3_layout(self, c1, c2, e)
  if shortcut == nil then shortcut = true end
  local list = {}
  for i = 1, n or 1 do list[i] = Bottleneck.new(c_, c_, shortcut, g, { 1, 3 }, 1.0) end
  self:add("m", containers.Sequential.new(list))
end

C3._args = sig("nn.C3", {
  int("c1", 1), int("c2", 1), int("n", 1, true), bool("shortcut"), int("g", 1, true), E,
}, function(c1, c2, n, shortcut, g, e)
  local name, msg, c_ = B.check_hidden(c2, e, 1, "hidden channels c_", "c2")
  if name then return name, msg end
  return B.check_groups_of(g, "the hidden channels c_", c_)
end)

--- y = cv3(cat(m(cv1(x)), cv2(x))). Fused (containers.fusing()): m's
-- output is left as terms (the last Bottleneck's residual) and the
-- concatenation writes their sum: one launch instead of the Add and the
-- Concat (same bits).
function C3:forward(x)
  if containers.fusing() then
    local a = containers.forward_terms(self.m, self.cv1:forward(x))
    local b = self.cv2:forward(x)
    local c_ = self.c_
    local cat = self._cat._c:ensure_buffer("output", 1, b, 2 * c_)
    containers.chan_sum({ containers.piece(cat, 0, c_, a), { cat, c_, c_, b, 0 } })
    self._cat.output = cat
    -- the Concat backward reads only the shapes of its inputs: a's first
    -- term stands for a (same shape)
    self._cat_in = { a[1], b }
    self._cat_out = cat
  else
    local a = self.m:forward(self.cv1:forward(x))
    local b = self.cv2:forward(x)
    self._cat_in = { a, b }
    self._cat_out = self._cat:forward(self._cat_in)
  end
  self.output = self.cv3:forward(self._cat_out)
  return self.output
end

-- The two pieces of the concatenation's gradient gcat: the Concat
-- helper's backward (one launch), or, with gradient descriptions
-- (containers.describing()) when cv2's BatchNorm reads them now
-- (Conv:reads_terms: m's first Conv sees the same batch and plane size),
-- one description per piece, a slice of gcat each (materialised into the
-- helper's own gradient buffers by a consumer that does not read it).
local function c3_cat_grads(self, gcat)
  local cv2 = self.cv2
  if containers.describing() and containers.takes_desc(cv2) and cv2.reads_terms and cv2:reads_terms() then
    local c_, cat = self.c_, self._cat
    return {
      containers.desc({ { 0, c_, containers.slice(gcat, 0, c_) } },
        function() return cat._c:ensure_buffer("grad_input", 1, gcat, c_) end),
      containers.desc({ { 0, c_, containers.slice(gcat, c_, c_) } },
        function() return cat._c:ensure_buffer("grad_input", 2, gcat, c_) end),
    }
  end
  return self._cat:backward(self._cat_in, gcat)
end

--- gx = cv1'(m'(ga)) + cv2'(gb). gy may be a gradient description
-- (containers.desc): cv3 reads it.
function C3:backward(x, gy)
  local gcat = containers.backward(self.cv3, self._cat_out, gy)
  local gs = c3_cat_grads(self, gcat)
  local g1 = self.cv1:backward(x, containers.backward(self.m, self.cv1.output, gs[1]))
  local g2 = containers.backward(self.cv2, x, gs[2])
  self.grad_input = acc(g1, g2)
  return self.grad_input
end

--- forward as terms (containers.forward_terms): {forward(x)}, the output
-- being cv3's.
function C3:forward_terms(x) return { self:forward(x) } end

--- backward with the final sum left to the caller (containers.
-- backward_terms): {g1, g2}, grad_input = g1 + g2 (self.grad_input nil);
-- a C3k2 sums them inside its split-gradient launch.
function C3:backward_terms(x, gy)
  local gcat = containers.backward(self.cv3, self._cat_out, gy)
  local gs = c3_cat_grads(self, gcat)
  local g1 = self.cv1:backward(x, containers.backward(self.m, self.cv1.output, gs[1]))
  local g2 = containers.backward(self.cv2, x, gs[2])
  self.grad_input = nil
  return { g1, g2 }
end
C3._terms = { C3.forward, C3.backward }
C3._desc = C3.backward

---------------------------------------------------------------------- C3k
local C3k = util.class("C3k", C3)
B.C3k = C3k

--- C3k(c1, c2, n=1, shortcut=true, g=1, e=0.5, k=3): a C3 whose inner
-- blocks are Bottleneck(c_, c_, shortcut, g, {k,k}, 1.0).
function C3k.__init(self, c1, c2, n, shortcut, g, e, k)
  local c_ = c3_layout(self, c1, c2, e)
  if shortcut == nil then shortcut = true end
  k = k or 3
  local list = {}
  for i = 1, n or 1 do list[i] = Bottleneck.new(c_, c_, shortcut, g, { k, k }, 1.0) end
  self:add("m", containers.Sequential.new(list))
end
C3k._args = sig("nn.C3k", {
  int("c1", 1), int("c2", 1), int("n", 1, true), bool("shortcut"), int("g", 1, true), E, int("k", 1, true),
}, C3._args.check)

--------------------------------------------------------------------- C3k2
local C3k2 = util.class("C3k2", C2f)
B.C3k2 = C3k2

--- C3k2(c1, c2, n=1, c3k=false, e=0.5, attn=false, g=1, shortcut=true): the
-- C2f layout with inner blocks C3k(c, c, 2, shortcut, g) when c3k, else
-- Bottleneck(c, c, shortcut, g) (k {3,3}, e 0.5); with attn each inner block
-- is Sequential(Bottleneck(c, c, shortcut, g), PSABlock(c, 0.5, max(c//64, 1))).
function C3k2.__init(self, c1, c2, n, c3k, e, attn, g, shortcut)
  n = n or 1
  if shortcut == nil then shortcut = true end
  c2f_layout(self, c1, c2, n, e)
  local c = self.c
  local list = {}
  for i = 1, n do
    if attn then
      local PSABlock = require("lucid.nn.attention").PSABlock
      list[i] = containers.Sequential.new({
        Bottleneck.new(c, c, shortcut, g),
        PSABlock.new(c, 0.5, math.max(math.floor(c / 64), 1)),
      })
    elseif c3k then
      list[i] = C3k.new(c, c, 2, shortcut, g)
    else
      list[i] = Bottleneck.new(c, c, shortcut, g)
    end
  end
  self:add("m", containers.ModuleList.new(list))
end

C3k2._args = sig("nn.C3k2", {
  int("c1", 1), int("c2", 1), int("n", 1, true), bool("c3k"), E, bool("attn"), int("g", 1, true),
  bool("shortcut"),
}, function(c1, c2, n, c3k, e, attn, g)
  -- the inner blocks (Bottleneck or C3k with e = 0.5) halve c again
  local name, msg, c = B.check_hidden(c2, e, 2, "hidden channels c", "c2")
  if name then return name, msg end
  local h = math.floor(c / 2)
  if c3k and not attn then return B.check_groups_of(g, "the inner hidden channels c // 2", h) end
  name, msg = B.check_groups_of(g, "the inner hidden channels c // 2", h, "the hidden channels c", c)
  if name or not attn then return name, msg end
  return require("lucid.nn.attention").check_heads(c, math.max(math.floor(c / 64), 1), 0.5, e == nil and "c2" or "e")
end)

--------------------------------------------------------------------- SPPF
local SPPF = util.class("SPPF", Module)
B.SPPF = SPPF

--- SPPF(c1, c2, k=5, n=3, shortcut=false): cv1 Conv(c1, c1//2, 1, act=false)
-- (BN, no SiLU, as in 8.4), n successive MaxPool2d(k, 1, k//2), cv2
-- Conv((n+1)*c_, c2, 1) on cat(y0..yn); residual when shortcut and c1 == c2.
function SPPF.__init(self, c1, c2, k, n, shortcut)
  Module.__init(self)
  k, n = k or 5, n or 3
  local c_ = math.floor(c1 / 2)
  self.n = n
  self:add("cv1", Conv.new(c1, c_, 1, 1, nil, 1, 1, false))
  self:add("cv2", Conv.new(c_ * (n + 1), c2, 1, 1))
  self:add("m", P.MaxPool2d.new(k, 1, math.floor(k / 2)))
  -- the one pooling module is applied n times; persistent outputs need one
  -- primitive per application
  self._pools = { self.m }
  for i = 2, n do self._pools[i] = self:helper(P.MaxPool2d.new(k, 1, math.floor(k / 2))) end
  self._cat = self:helper(P.Concat.new(n + 1))
  self.add_ = shortcut and c1 == c2 or false
  if self.add_ then self._sum = self:helper(P.Add.new()) end
end

SPPF._args = sig("nn.SPPF", {
  int("c1", 2), int("c2", 1), { "k", "odd", min = 1, opt = true }, int("n", 1, true), bool("shortcut"),
})

--- y = cv2(cat(y0, m(y0), m(m(y0)), ...)) (+ x), y0 = cv1(x).
function SPPF:forward(x)
  local ys = { self.cv1:forward(x) }
  for i = 1, self.n do ys[i + 1] = self._pools[i]:forward(ys[i]) end
  self._ys = ys
  self._cat_out = self._cat:forward(ys)
  local y = self.cv2:forward(self._cat_out)
  self.output = self.add_ and self._sum:forward({ y, x }) or y
  return self.output
end

--- Gradient through the pooling chain (each pool output also feeds the
-- concatenation) and cv1.
-- gy may be a gradient description (containers.desc): cv2 reads it
-- (materialised first for the residual). With descriptions
-- (containers.describing()) the last sum, gs[1] + the first pool's
-- gradient, goes to cv1 as one (cv1's BatchNorm before its Identity reads
-- it on the GPU's one-pass route, else it is materialised: the same add).
function SPPF:backward(x, gy)
  local ys = self._ys
  if self.add_ then gy = containers.materialize(gy) end
  local gcat = containers.backward(self.cv2, self._cat_out, gy)
  local gs = self._cat:backward(ys, gcat)
  local g = gs[self.n + 1]
  for i = self.n, 1, -1 do
    local gp = self._pools[i]:backward(ys[i], g)
    if i == 1 and containers.describing() then g = containers.sum_desc({ gs[i], gp }) else g = acc(gs[i], gp) end
  end
  local gx = containers.backward(self.cv1, x, g)
  self.grad_input = self.add_ and acc(gx, gy) or gx
  return self.grad_input
end
SPPF._desc = SPPF.backward

return B
