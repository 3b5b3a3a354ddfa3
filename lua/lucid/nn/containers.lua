--- lucid.nn.containers — Sequential and ModuleList (PyTorch semantics and
-- state-dict naming: children "0", "1", ...), and the gradient accumulator
-- used wherever one tensor feeds several consumers.
local util = require("lucid.nn.util")
local Module = require("lucid.nn.module")

local M = {}

-- The scope of persistent sums, set by Model:backward (nil outside it).
local scope = nil

--- Make `s` ({slots = {}, pos = 0}) the scope of M.accumulate and return
-- the previous one. Model:backward installs its own scope for the duration
-- of a backward pass (pos reset to 0 first).
function M.set_accumulate_scope(s)
  local prev = scope
  scope = s
  return prev
end

-- The next call position's row of persistent buffers in scope sc (by
-- shape and dtype), created on first use.
local function scope_row(sc)
  local pos = sc.pos + 1
  sc.pos = pos
  local row = sc.slots[pos]
  if row == nil then
    row = {}
    sc.slots[pos] = row
  end
  return row
end

--- Sum of two gradients, either of which may be nil (a missing gradient is
-- zero). When both are present the sum goes to a tensor of its own, so the
-- persistent grad_input buffers of the modules that produced a and b are
-- never written. Inside a scope (a model's backward pass) that tensor is
-- PERSISTENT: one buffer per (call position in the pass, shape, dtype),
-- allocated on first use and reused by every later pass, so a backward pass
-- allocates nothing in steady state and a recorded CUDA graph sees the same
-- addresses on every replay (docs/STEP.md). The values are those of
-- a:add(b) bit for bit (one launch: add with out = the buffer). Outside a scope a new
-- tensor is returned.
-- @param a Tensor|nil
-- @param b Tensor|nil
-- @return Tensor|nil
function M.accumulate(a, b)
  if a == nil then return b end
  if b == nil then return a end
  local sc = scope
  if sc == nil then return a:add(b) end
  local row = scope_row(sc)
  local key = table.concat(a:shape(), "x") .. a:dtype()
  local opts = row[key] -- {out = the buffer}, kept so that a pass allocates nothing
  if opts == nil then
    local buf = a:add(b)
    row[key] = { out = buf }
    return buf
  end
  return a:add(b, opts)
end

------------------------------------------------------------ fused sums
-- The blocks (C2f / C3k2, C3 / C3k, C2PSA, Attention, the heads' level sums,
-- Model:backward) can produce a sum of gradients (or the residual output of
-- their last inner block) inside a channel copy they issue anyway, or sum
-- three or four terms in one launch, instead of one add launch per pair
-- (lucid_nn_channel_copy_multi's sum pieces, lucid_nn_add_n). The values
-- are those of the unfused composition bit for bit: every sum is the same
-- left-to-right chain of a:add(b), rounded to the dtype after each addition
-- (engine/nn/nn.h lucid_chan_piece); where the composition summed a + (b +
-- c) the fused chain is (b + c) + a (IEEE addition is commutative: same
-- bits; only a NaN's payload could differ, on the CPU, where the compiler
-- already orders the operands of an addition as it likes).

--- Switch of the fused sums: false makes every block run its unfused
-- composition (Add modules, containers.accumulate, Concat / Split). Default
-- on, off when LUCID_FUSE_SUMS=0 in the environment. Read by the blocks at
-- each forward (a backward follows the route of its forward) and by
-- Model:backward, Detect:backward_level and Attention:backward at each
-- call. A recorded step does not watch it: change it before recording (or
-- call model:bump_version() after changing it).
M.fuse_sums = os.getenv("LUCID_FUSE_SUMS") ~= "0"

local C -- lucid.nn (the binding) with chan_sum / add_n / empty_like, or false
local function binding()
  if C == nil then
    local ok, lucid = pcall(require, "lucid")
    local nn = ok and type(lucid) == "table" and type(lucid.nn) == "table" and lucid.nn or nil
    C = nn and rawget(nn, "chan_sum") and rawget(nn, "add_n") and rawget(nn, "empty_like") and nn or false
  end
  return C
end

--- Whether the blocks fuse their sums now: M.fuse_sums on and the binding
-- present.
-- @return boolean
function M.fusing()
  return M.fuse_sums and binding() ~= false
end

-- A term of a sum: a tensor (all its channels) or a channel slice
-- {t, c0, nch} (M.slice: channels [c0, c0 + nch) of the contiguous tensor
-- t, 0-based c0), which no other code reads.
local SLICE = {}

--- Channels [c0, c0 + nch) (0-based c0) of the contiguous tensor t as a
-- term of M.sum / M.piece.
function M.slice(t, c0, nch) return setmetatable({ t, c0, nch }, SLICE) end

local function is_slice(x) return getmetatable(x) == SLICE end

--- Sources per chan_sum piece at most (the engine's LUCID_CHAN_SUM_MAX).
M.SUM_MAX = 4

--- The lucid.nn.chan_sum piece {dst, dst_c0, nch, src, c0, ...} that
-- writes the left-to-right sum of `terms` (tensors of nch channels, or
-- M.slice terms) into channels [dst_c0, dst_c0 + nch) of dst. More than
-- M.SUM_MAX terms: the first ones are summed first (M.sum, the same chain).
-- @param dst Tensor
-- @param dst_c0 integer (0-based)
-- @param nch integer
-- @param terms list of terms (1 or more)
-- @return table
function M.piece(dst, dst_c0, nch, terms)
  if #terms > M.SUM_MAX then
    local head = {}
    for i = 1, #terms - M.SUM_MAX + 1 do head[i] = terms[i] end
    local rest = { M.sum(head) }
    for i = #terms - M.SUM_MAX + 2, #terms do rest[#rest + 1] = terms[i] end
    terms = rest
  end
  local p = { dst, dst_c0, nch }
  for _, t in ipairs(terms) do
    if is_slice(t) then
      p[#p + 1], p[#p + 2] = t[1], t[2]
    else
      p[#p + 1], p[#p + 2] = t, 0
    end
  end
  return p
end

-- The buffer of a sum of terms: the shape of the first whole tensor among
-- them, else the first slice's tensor with nch channels. Inside a scope a
-- persistent buffer (one per call position, shape and dtype, as
-- M.accumulate), else a new tensor.
local function sum_buffer(terms)
  local like, nch
  for _, t in ipairs(terms) do
    if not is_slice(t) then like, nch = t, nil break end
  end
  if not like then like, nch = terms[1][1], terms[1][3] end
  local sc = scope
  if sc == nil then return C.empty_like(like, nch) end
  local row = scope_row(sc)
  local shape = like:shape()
  if nch then shape[2] = nch end
  local key = table.concat(shape, "x") .. like:dtype()
  local opts = row[key] -- {out = the buffer}, as M.accumulate keeps it
  if opts == nil then
    opts = { out = C.empty_like(like, nch) }
    row[key] = opts
  end
  return opts.out
end

--- The left-to-right sum ((t1 + t2) + t3) + ... of terms (tensors, or
-- M.slice terms), each addition rounded as a:add(b): t1 itself for one
-- whole tensor (no launch; nil for none, and a single non-tensor term, such
-- as a head's gradient table, is returned as it is), t1:add(t2) through
-- M.accumulate for two whole tensors (the unfused kernel), else one
-- launch (lucid.nn.add_n for up to M.SUM_MAX whole tensors, else
-- lucid.nn.chan_sum) into a buffer that follows M.accumulate's rule
-- (persistent inside a scope). Needs the binding (M.fusing()) for slices
-- and more than two terms.
-- @param terms list
-- @return Tensor|nil
function M.sum(terms)
  local n = #terms
  if n == 0 then return nil end
  if n == 1 and not is_slice(terms[1]) then return terms[1] end
  if n == 2 and not is_slice(terms[1]) and not is_slice(terms[2]) then
    return M.accumulate(terms[1], terms[2])
  end
  binding()
  local buf = sum_buffer(terms)
  local whole = n <= M.SUM_MAX
  for i = 1, n do whole = whole and not is_slice(terms[i]) end
  if whole then
    C.add_n(terms, buf)
  else
    local nch = is_slice(terms[1]) and terms[1][3] or terms[1]:shape()[2]
    C.chan_sum({ M.piece(buf, 0, nch, terms) })
  end
  return buf
end

--- lucid.nn.chan_sum(pieces) (the binding's one-launch channel copy with
-- sum pieces; M.piece builds a summing piece).
function M.chan_sum(pieces) return binding().chan_sum(pieces) end

-- Whether module m computes its output (gradient) as terms: its class
-- declares _terms (forward_terms / backward_terms paired with its forward
-- and backward) and m's forward and backward are those (no instance
-- override, no subclass that replaced one of them).
local function has_terms(m)
  local t = m._terms
  return t ~= nil and m.forward == t[1] and m.backward == t[2]
end

--- m's output as terms: m:forward_terms(x) when m computes it so (a
-- list whose left-to-right sum is the output, not materialised: m.output
-- is nil then), else {m:forward(x)}.
function M.forward_terms(m, x)
  if has_terms(m) then return m:forward_terms(x) end
  return { m:forward(x) }
end

--- m's input gradient as terms: m:backward_terms(x, gy) (m.grad_input is
-- nil then), else {m:backward(x, gy)}.
function M.backward_terms(m, x, gy)
  if has_terms(m) then return m:backward_terms(x, gy) end
  return { m:backward(x, gy) }
end

----------------------------------------------------------------- Sequential
local Sequential = util.class("Sequential", Module)
M.Sequential = Sequential

--- nn.Sequential(m1, m2, ...) or Sequential.new({m1, m2, ...}).
-- Children are named "0", "1", ... and run in order.
function Sequential.__init(self, ...)
  Module.__init(self)
  local list = { ... }
  if #list == 1 and getmetatable(list[1]) == nil and type(list[1]) == "table" then
    list = list[1]
  end
  for i, m in ipairs(list) do self:add(tostring(i - 1), m) end
end

Sequential._args = util.signature("nn.Sequential", { { "...", "any" } }, function(...)
  local n, first = select("#", ...), ...
  while n > 0 and select(n, ...) == nil do n = n - 1 end
  if n == 1 and type(first) == "table" and getmetatable(first) == nil then
    for i, m in ipairs(first) do
      if not (type(m) == "table" and m._modules) then
        return "#1", string.format("entry %d: expected an nn module, got %s", i, util.describe(m))
      end
    end
    return nil
  end
  for i = 1, n do
    local m = select(i, ...)
    if not (type(m) == "table" and m._modules) then
      return "#" .. i, "expected an nn module (or one list of modules), got " .. util.describe(m)
    end
  end
end)

--- Number of children.
function Sequential:len() return #self._modules end

--- Child i (1-based, Lua convention; its state-dict name is i-1).
function Sequential:get(i) return self._modules[i].module end

--- Append a module (named by its position).
function Sequential:append(m) return self:add(tostring(#self._modules), m) end

--- Runs the children in order; remembers each child's input.
-- @param x Tensor (or whatever the first child takes)
function Sequential:forward(x)
  local inputs = {}
  for i, e in ipairs(self._modules) do
    inputs[i] = x
    x = e.module:forward(x)
  end
  self._inputs = inputs
  self.output = x
  return x
end

--- Backward in reverse order; returns the gradient w.r.t. the input.
function Sequential:backward(x, gy)
  local inputs = self._inputs
  for i = #self._modules, 1, -1 do
    gy = self._modules[i].module:backward(inputs[i], gy)
  end
  self.grad_input = gy
  return gy
end

--- forward, the last child's output left as terms (M.forward_terms): a
-- list whose left-to-right sum is the output (self.output: nil, or the one
-- term).
function Sequential:forward_terms(x)
  local n = #self._modules
  if n == 0 then return { self:forward(x) } end
  local inputs = {}
  for i = 1, n - 1 do
    inputs[i] = x
    x = self._modules[i].module:forward(x)
  end
  inputs[n] = x
  local terms = M.forward_terms(self._modules[n].module, x)
  self._inputs = inputs
  self.output = #terms == 1 and terms[1] or nil
  return terms
end

--- backward, the first child's input gradient left as terms
-- (M.backward_terms; self.grad_input: nil, or the one term).
function Sequential:backward_terms(x, gy)
  local n = #self._modules
  if n == 0 then return { self:backward(x, gy) } end
  local inputs = self._inputs
  for i = n, 2, -1 do
    gy = self._modules[i].module:backward(inputs[i], gy)
  end
  local terms = M.backward_terms(self._modules[1].module, inputs[1], gy)
  self.grad_input = #terms == 1 and terms[1] or nil
  return terms
end
Sequential._terms = { Sequential.forward, Sequential.backward }

----------------------------------------------------------------- ModuleList
local ModuleList = util.class("ModuleList", Module)
M.ModuleList = ModuleList

--- nn.ModuleList({m1, m2, ...}): a named holder, no forward of its own.
function ModuleList.__init(self, list)
  Module.__init(self)
  for i, m in ipairs(list or {}) do self:add(tostring(i - 1), m) end
end

ModuleList._args = util.signature("nn.ModuleList", { { "list", "modules", opt = true } })

--- Child i (1-based).
function ModuleList:get(i) return self._modules[i].module end

--- Number of children.
function ModuleList:len() return #self._modules end

return M
