--- lucid.nn.attention — Attention, PSABlock and C2PSA (Ultralytics 8.4.114,
-- reference/yolo_pose_reference.md 1.6) as compositions of primitives:
-- 1x1 convolutions, channel split, batched matmul, softmax, depthwise conv.
local util = require("lucid.nn.util")
local Module = require("lucid.nn.module")
local P = require("lucid.nn.prim")
local containers = require("lucid.nn.containers")
local Conv = require("lucid.nn.blocks").Conv

local acc = containers.accumulate
local A = {}
local sig = util.signature

--- Whether dim channels split into num_heads heads with key_dim >= 1:
-- nil, or the argument to blame (blame_heads; blame_ratio, when given, for
-- a key_dim of 0) and the message for util.signature's check.
function A.check_heads(dim, num_heads, attn_ratio, blame_heads, blame_ratio)
  if dim % num_heads ~= 0 then
    return blame_heads, string.format("num_heads = %d must divide the channels (%d)", num_heads, dim)
  end
  local key_dim = util.int(math.floor(dim / num_heads) * attn_ratio)
  if key_dim < 1 then
    return blame_ratio or blame_heads, string.format("key_dim = int(%d // %d * %s) = %d; expected >= 1",
      dim, num_heads, util.pyrepr(attn_ratio), key_dim)
  end
end

---------------------------------------------------------------- Attention
local Attention = util.class("Attention", Module)
A.Attention = Attention

--- Attention(dim, num_heads=8, attn_ratio=0.5). head_dim = dim//heads,
-- key_dim = int(head_dim*attn_ratio), scale = key_dim^-0.5. Children: qkv
-- Conv(dim, dim + 2*heads*key_dim, 1, act=false), proj Conv(dim, dim, 1,
-- act=false), pe Conv(dim, dim, 3, groups=dim, act=false). Per head the qkv
-- channels are [q(key_dim), k(key_dim), v(head_dim)].
function Attention.__init(self, dim, num_heads, attn_ratio)
  Module.__init(self)
  num_heads, attn_ratio = num_heads or 8, attn_ratio or 0.5
  self.dim, self.num_heads = dim, num_heads
  self.head_dim = math.floor(dim / num_heads)
  self.key_dim = util.int(self.head_dim * attn_ratio)
  self.scale = self.key_dim ^ -0.5
  local h = dim + self.key_dim * num_heads * 2
  self:add("qkv", Conv.new(dim, h, 1, 1, nil, 1, 1, false))
  self:add("proj", Conv.new(dim, dim, 1, 1, nil, 1, 1, false))
  self:add("pe", Conv.new(dim, dim, 3, 1, nil, dim, 1, false))
  self._split = self:helper(P.Split.new(3, { self.key_dim, self.key_dim, self.head_dim }))
  self._qk = self:helper(P.MatMul.new(true, false, self.scale))   -- (q^T k) * scale
  self._softmax = self:helper(P.Softmax.new())
  self._av = self:helper(P.MatMul.new(false, true, 1.0))          -- v attn^T
  self._sum = self:helper(P.Add.new())
end

Attention._args = sig("nn.Attention", {
  { "dim", "int", min = 1 }, { "num_heads", "int", min = 1, opt = true },
  { "attn_ratio", "number", gt = 0, opt = true },
}, function(dim, num_heads, attn_ratio)
  return A.check_heads(dim, num_heads or 8, attn_ratio or 0.5, "num_heads", "attn_ratio")
end)

--- x [B, dim, H, W] -> proj(v attn^T + pe(v)), attn = softmax((q^T k) scale)
-- over keys, N = H*W.
function Attention:forward(x)
  local shp = x:shape()
  local B, C, H, W = shp[1], shp[2], shp[3], shp[4]
  local N, nh = H * W, self.num_heads
  local qkv = self.qkv:forward(x)
  local qkv3 = qkv:view({ B * nh, 2 * self.key_dim + self.head_dim, N })
  local q, k, v = unpack(self._split:forward(qkv3))
  local s = self._qk:forward({ q, k })             -- [B*nh, N, N]
  local a = self._softmax:forward(s)
  local o = self._av:forward({ v, a })             -- [B*nh, head_dim, N]
  local o4 = o:view({ B, C, H, W })
  local v4 = v:view({ B, C, H, W })
  local pe = self.pe:forward(v4)
  local sum = self._sum:forward({ o4, pe })
  self._st = { qkv3 = qkv3, q = q, k = k, v = v, s = s, a = a, v4 = v4, sum = sum, shape = shp }
  self.output = self.proj:forward(sum)
  return self.output
end

--- Reverse of forward; v receives the gradients of the attention product
-- and of the positional conv pe. Fused (containers.fusing()): that sum is
-- written by the split-gradient launch itself (one launch less, same bits).
function Attention:backward(x, gy)
  local st = self._st
  local shp = st.shape
  local B, H, W = shp[1], shp[3], shp[4]
  local N, nh = H * W, self.num_heads
  local gsum = self.proj:backward(st.sum, gy)
  local gv_pe = self.pe:backward(st.v4, gsum)
  local go = gsum:view({ B * nh, self.head_dim, N })
  local gva = self._av:backward({ st.v, st.a }, go)
  local gs = self._softmax:backward(st.s, gva[2])
  local gqk = self._qk:backward({ st.q, st.k }, gs)
  local gqkv3
  if containers.fusing() then
    -- the Split helper's own gradient buffer: {gq, gk, gva[1] + gv_pe}
    local kd, hd = self.key_dim, self.head_dim
    gqkv3 = self._split._c:ensure_buffer("grad_input", 1, st.qkv3)
    containers.chan_sum({
      { gqkv3, 0, kd, gqk[1], 0 }, { gqkv3, kd, kd, gqk[2], 0 },
      { gqkv3, 2 * kd, hd, gva[1], 0, gv_pe:view({ B * nh, hd, N }), 0 },
    })
    self._split.grad_input = gqkv3
  else
    local gv = acc(gva[1], gv_pe:view({ B * nh, self.head_dim, N }))
    gqkv3 = self._split:backward(st.qkv3, { gqk[1], gqk[2], gv })
  end
  self.grad_input = self.qkv:backward(x, gqkv3:view(self.qkv.output:shape()))
  return self.grad_input
end

----------------------------------------------------------------- PSABlock
local PSABlock = util.class("PSABlock", Module)
A.PSABlock = PSABlock

--- PSABlock(c, attn_ratio=0.5, num_heads=4, shortcut=true): x += attn(x);
-- x += ffn(x), ffn = Sequential(Conv(c, 2c, 1), Conv(2c, c, 1, act=false)).
function PSABlock.__init(self, c, attn_ratio, num_heads, shortcut)
  Module.__init(self)
  if shortcut == nil then shortcut = true end
  self:add("attn", Attention.new(c, num_heads or 4, attn_ratio or 0.5))
  self:add("ffn", containers.Sequential.new({
    Conv.new(c, c * 2, 1), Conv.new(c * 2, c, 1, 1, nil, 1, 1, false) }))
  self.add_ = shortcut
  if shortcut then
    self._sum1 = self:helper(P.Add.new())
    self._sum2 = self:helper(P.Add.new())
  end
end

PSABlock._args = sig("nn.PSABlock", {
  { "c", "int", min = 1 }, { "attn_ratio", "number", gt = 0, opt = true },
  { "num_heads", "int", min = 1, opt = true }, { "shortcut", "boolean", opt = true },
}, function(c, attn_ratio, num_heads)
  return A.check_heads(c, num_heads or 4, attn_ratio or 0.5, "num_heads", "attn_ratio")
end)

--- y = x1 + ffn(x1), x1 = x + attn(x) (without the sums when shortcut=false).
function PSABlock:forward(x)
  local a = self.attn:forward(x)
  local x1 = self.add_ and self._sum1:forward({ x, a }) or a
  local f = self.ffn:forward(x1)
  self._x1 = x1
  self.output = self.add_ and self._sum2:forward({ x1, f }) or f
  return self.output
end

-- gy + gf for the first residual: acc(gy, gf), or with gy's term a
-- channel slice (a gradient description's, containers.residual) the same
-- rounded sum in one lucid.nn.chan_sum (containers.sum).
local function residual_sum(t, gf)
  if containers.is_slice(t) then return containers.sum({ t, gf }) end
  return acc(t, gf)
end

--- Reverse of forward with the residual gradients added. gy may be a
-- gradient description (containers.desc): ffn's last Conv reads it, the
-- residual takes its one term (containers.residual).
function PSABlock:backward(x, gy)
  local t = gy
  if self.add_ then gy, t = containers.residual(gy) end
  local gf = containers.backward(self.ffn, self._x1, gy)
  local g1 = self.add_ and residual_sum(t, gf) or gf
  local ga = self.attn:backward(x, g1)
  self.grad_input = self.add_ and acc(g1, ga) or ga
  return self.grad_input
end

--- forward with the second residual sum left to the caller
-- (containers.forward_terms): {x1, f} (output = x1 + f, self.output nil)
-- with the shortcut, else {f}.
function PSABlock:forward_terms(x)
  if not self.add_ then return { self:forward(x) } end
  local a = self.attn:forward(x)
  local x1 = self._sum1:forward({ x, a })
  local f = self.ffn:forward(x1)
  self._x1 = x1
  self.output = nil
  return { x1, f }
end

--- backward with the last residual sum left to the caller: {g1, ga}
-- (grad_input = g1 + ga, self.grad_input nil) with the shortcut, else {ga}.
function PSABlock:backward_terms(x, gy)
  if not self.add_ then return { self:backward(x, gy) } end
  local t
  gy, t = containers.residual(gy)
  local gf = containers.backward(self.ffn, self._x1, gy)
  local g1 = residual_sum(t, gf)
  local ga = self.attn:backward(x, g1)
  self.grad_input = nil
  return { g1, ga }
end
PSABlock._terms = { PSABlock.forward, PSABlock.backward }
PSABlock._desc = PSABlock.backward

-------------------------------------------------------------------- C2PSA
local C2PSA = util.class("C2PSA", Module)
A.C2PSA = C2PSA

--- C2PSA(c1, c2, n=1, e=0.5), c1 == c2: cv1 Conv(c1, 2c, 1) split into (a,
-- b), b through n PSABlock(c, 0.5, c//64), cv2 Conv(2c, c1, 1) on cat(a, b);
-- c = int(c1*e).
function C2PSA.__init(self, c1, c2, n, e)
  Module.__init(self)
  local c = util.int(c1 * (e or 0.5))
  self.c = c
  self:add("cv1", Conv.new(c1, 2 * c, 1, 1))
  self:add("cv2", Conv.new(2 * c, c1, 1))
  local list = {}
  for i = 1, n or 1 do list[i] = PSABlock.new(c, 0.5, math.floor(c / 64)) end
  self:add("m", containers.Sequential.new(list))
  self._split = self:helper(P.Split.new(2, { c, c }))
  self._cat = self:helper(P.Concat.new(2))
end

C2PSA._args = sig("nn.C2PSA", {
  { "c1", "int", min = 1 }, { "c2", "int", min = 1 }, { "n", "int", min = 1, opt = true },
  { "e", "number", gt = 0, opt = true },
}, function(c1, c2, n, e)
  if c1 ~= c2 then return "c2", string.format("expected c2 == c1 (%d), got %d", c1, c2) end
  local c = util.int(c1 * (e or 0.5))
  local blame = e == nil and "c1" or "e"
  if c < 64 then
    return blame, string.format("hidden channels c = int(c1 * e) = int(%d * %s) = %d; expected >= 64 "
      .. "(num_heads = c // 64)", c1, util.pyrepr(e or 0.5), c)
  end
  return A.check_heads(c, math.floor(c / 64), 0.5, blame)
end)

--- y = cv2(cat(a, m(b))), (a, b) = split(cv1(x)). Fused
-- (containers.fusing()): m's output is left as terms (the last PSABlock's
-- residual) and the concatenation writes their sum (one launch instead of
-- the Add and the Concat, same bits).
function C2PSA:forward(x)
  local y = self.cv1:forward(x)
  local parts = self._split:forward(y)
  self._parts = parts
  local fused = containers.fusing()
  self._fused = fused
  if fused then
    local c = self.c
    local b = containers.forward_terms(self.m, parts[2])
    local cat = self._cat._c:ensure_buffer("output", 1, y, 2 * c)
    containers.chan_sum({ { cat, 0, c, parts[1], 0 }, containers.piece(cat, c, c, b) })
    self._cat.output = cat
    self._cat_in = { parts[1], b[1] } -- b[1]: b's shape (see C3:forward)
    self._cat_out = cat
  else
    local b = self.m:forward(parts[2])
    self._cat_in = { parts[1], b }
    self._cat_out = self._cat:forward(self._cat_in)
  end
  self.output = self.cv2:forward(self._cat_out)
  return self.output
end

--- Reverse of forward. Fused (after a fused forward): only the second
-- piece of the concatenation gradient is copied out, and m's gradient is
-- left as terms summed inside the split-gradient launch (same bits). With
-- gradient descriptions (containers.describing(), LUCID_BN_DY_TERMS) that
-- piece and the split gradient go on as descriptions (materialised into
-- the same helper buffers by a consumer that does not read them). gy may
-- be a description: cv2 reads it.
function C2PSA:backward(x, gy)
  local gcat = containers.backward(self.cv2, self._cat_out, gy)
  local gsplit
  if self._fused and containers.describing() then
    local c, cat, split, cv1out = self.c, self._cat, self._split, self.cv1.output
    local g2 = containers.desc({ { 0, c, containers.slice(gcat, c, c) } },
      function() return cat._c:ensure_buffer("grad_input", 2, gcat, c) end)
    local gb = containers.backward_terms(self.m, self._parts[2], g2)
    local d = containers.split_desc(split, cv1out, gcat, c, gb)
    self.grad_input = containers.backward(self.cv1, x, d)
    split.grad_input = d.value
    return self.grad_input
  end
  if self._fused then
    local c = self.c
    local g2 = self._cat._c:ensure_buffer("grad_input", 2, gcat, c)
    containers.chan_sum({ { g2, 0, c, gcat, c } })
    local gb = containers.backward_terms(self.m, self._parts[2], g2)
    gsplit = self._split._c:ensure_buffer("grad_input", 1, self.cv1.output)
    containers.chan_sum({ { gsplit, 0, c, gcat, 0 }, containers.piece(gsplit, c, c, gb) })
    self._split.grad_input = gsplit
  else
    local gs = self._cat:backward(self._cat_in, gcat)
    local gb = self.m:backward(self._parts[2], gs[2])
    gsplit = self._split:backward(self.cv1.output, { gs[1], gb })
  end
  self.grad_input = self.cv1:backward(x, gsplit)
  return self.grad_input
end
C2PSA._desc = C2PSA.backward

return A
