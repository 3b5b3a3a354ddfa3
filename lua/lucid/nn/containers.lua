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

-- a:add(b) into row's persistent buffer of a's shape and dtype (row: a
-- scope row, or nil outside a scope: a new tensor).
local function accumulate_row(row, a, b)
  if row == nil then return a:add(b) end
  local key = table.concat(a:shape(), "x") .. a:dtype()
  local opts = row[key] -- {out = the buffer}, kept so that a pass allocates nothing
  if opts == nil then
    local buf = a:add(b)
    row[key] = { out = buf }
    return buf
  end
  return a:add(b, opts)
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
  return accumulate_row(sc and scope_row(sc), a, b)
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
-- them, else the first slice's tensor with nch channels. In a scope row (a
-- call position of a scope) a persistent buffer (one per row, shape and
-- dtype, as M.accumulate), else (row nil) a new tensor.
local function sum_buffer(terms, row)
  local like, nch
  for _, t in ipairs(terms) do
    if not is_slice(t) then like, nch = t, nil break end
  end
  if not like then like, nch = terms[1][1], terms[1][3] end
  if row == nil then return C.empty_like(like, nch) end
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

-- M.sum of n >= 2 terms (or one slice) with its buffer from scope row
-- `row` (nil: new tensors), or written into `out` when given (a caller's
-- own persistent buffer).
local function sum_in(terms, row, out)
  local n = #terms
  if n == 2 and not is_slice(terms[1]) and not is_slice(terms[2]) then
    if out then return terms[1]:add(terms[2], { out = out }) end
    return accumulate_row(row, terms[1], terms[2])
  end
  binding()
  local buf = out or sum_buffer(terms, row)
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
  local sc = scope
  return sum_in(terms, sc and scope_row(sc), nil)
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
  if M.is_desc(gy) and not M.takes_desc(m) then gy = M.materialize(gy) end
  if has_terms(m) then return m:backward_terms(x, gy) end
  return { m:backward(x, gy) }
end

------------------------------------------------------ gradient descriptions
-- The Conv block's BatchNorm backward can read its incoming gradient as a
-- sum of terms where it needs it (lucid.nn.batchnorm2d_backward_terms;
-- engine/nn/nn.h lucid_nn_batchnorm2d_backward_terms: on the GPU, the
-- one-pass kernel of a channel of one part), so a block that would write a
-- gradient sum (or copy a slice of a concatenation's gradient) only to
-- hand it to a Conv hands over a *gradient description* instead: pieces
-- {c0, nch, term1, term2, ...} tiling the gradient's channels [0, C) in
-- order, each the left-to-right sum of its terms (tensors of nch channels,
-- or M.slice terms): the vocabulary of M.piece / lucid.nn.chan_sum minus
-- the destination. Its value is bitwise what M.piece / M.sum would have
-- written into a buffer, and when the engine does not take it (the CPU,
-- multi-part channels, eval, the separate SiLU, ...) M.materialize writes
-- exactly that, into the buffer the producer would have used (the
-- producer's persistent buffer, or the accumulation scope's buffer of the
-- call position where the description was made): the launches and the
-- bits of before, in ONE place. A module receives descriptions only when
-- its class declares it takes them (Class._desc = Class.backward, paired
-- with backward_terms when it has _terms) and its backward is that
-- function (M.takes_desc: no instance override, no subclass that replaced
-- it); everything else receives M.materialize(d) (M.backward,
-- M.backward_terms). A description is consumed in the pass that made it.

--- Switch of the gradient descriptions: false makes the producers sum /
-- copy as before (the launches of DECISIONS 33). Default on, off when
-- LUCID_BN_DY_TERMS=0 in the environment (read once, when this module is
-- loaded; the engine reads the same variable once too). Read by the
-- producers at each backward; a recorded step does not watch it: change it
-- before recording (or call model:bump_version()).
M.dy_terms = os.getenv("LUCID_BN_DY_TERMS") ~= "0"

local DESC = {}

--- Whether the producers hand out descriptions now: M.dy_terms, the fused
-- sums on (M.fusing()) and the binding's batchnorm2d_backward_terms.
-- @return boolean
function M.describing()
  return M.dy_terms and M.fusing() and rawget(C, "batchnorm2d_backward_terms") ~= nil
end

--- Whether x is a gradient description.
function M.is_desc(x) return getmetatable(x) == DESC end

--- Whether x is a M.slice term.
M.is_slice = is_slice

--- A gradient description (see above) of `pieces`, each {c0, nch, term1,
-- ...} (0-based c0; the pieces tile [0, C) in order, C the sum of their
-- nch; 1 or more terms each). out: nil (materialised into the accumulation
-- scope's persistent buffer of the call position reserved now, as M.sum
-- would have taken it; a new tensor outside a scope) or a function
-- returning the buffer to write (a helper module's persistent buffer, as
-- the producer would have written). One piece of one whole tensor is that
-- tensor itself (no description).
-- @return description|Tensor
function M.desc(pieces, out)
  if #pieces == 1 and #pieces[1] == 3 and not is_slice(pieces[1][3]) then return pieces[1][3] end
  local d = { pieces = {}, out = out }
  local first = pieces[1][3]
  d.like = is_slice(first) and first[1] or first
  for i, p in ipairs(pieces) do
    local terms = {}
    for k = 3, #p do terms[k - 2] = p[k] end
    d.pieces[i] = { c0 = p[1], nch = p[2], terms = terms }
  end
  if out == nil and scope ~= nil then d.row = scope_row(scope) end
  return setmetatable(d, DESC)
end

--- The gradient of a Split(2) helper's input as a description (the C2f /
-- C3k2 / C2PSA backwards): channels [0, c) the slice [0, c) of gcat, channels
-- [c, 2c) the left-to-right sum of `terms` (the second chunk's gradient
-- terms); materialised, when it must be, into `split`'s own grad_input
-- buffer of the shape of `like` (the chunked tensor), as the unfused
-- backward writes it.
-- @param split Module the Split helper (its _c holds the buffer)
-- @param like Tensor the tensor the Split chunked ([N, 2c, H, W])
-- @param gcat Tensor the concatenation's gradient
-- @param c integer channels per chunk
-- @param terms list the second chunk's gradient terms (1 or more)
-- @return description|Tensor
function M.split_desc(split, like, gcat, c, terms)
  local p = { c, c }
  for k, t in ipairs(terms) do p[k + 2] = t end
  return M.desc({ { 0, c, M.slice(gcat, 0, c) }, p },
    function() return split._c:ensure_buffer("grad_input", 1, like) end)
end

--- The left-to-right sum of terms as a description (one piece over the
-- terms' channels) when M.describing(), else M.sum(terms). One whole tensor
-- is returned as it is.
-- @param terms list (1 or more)
function M.sum_desc(terms)
  if not M.describing() or (#terms == 1 and not is_slice(terms[1])) then return M.sum(terms) end
  local nch = is_slice(terms[1]) and terms[1][3] or terms[1]:shape()[2]
  local p = { 0, nch }
  for i, t in ipairs(terms) do p[i + 2] = t end
  return M.desc({ p })
end

-- The piece's terms with at most M.SUM_MAX left: the first ones summed
-- first (M.sum, as M.piece does), kept in the piece so that the engine
-- and a later materialisation share that sum.
local function short_terms(p)
  local terms = p.terms
  if #terms <= M.SUM_MAX then return terms end
  local head = {}
  for i = 1, #terms - M.SUM_MAX + 1 do head[i] = terms[i] end
  local rest = { M.sum(head) }
  for i = #terms - M.SUM_MAX + 2, #terms do rest[#rest + 1] = terms[i] end
  p.terms = rest
  return rest
end

--- The value of x: x itself when it is not a description; else d's tensor,
-- written on the first call (later calls return it): one piece, the
-- M.sum of its terms (Tensor:add for two whole tensors, lucid.nn.add_n for
-- up to M.SUM_MAX, else lucid.nn.chan_sum), several pieces, one
-- lucid.nn.chan_sum of M.piece's; into d's buffer (see M.desc).
-- @return Tensor
function M.materialize(d)
  if not M.is_desc(d) then return d end
  if d.value ~= nil then return d.value end
  binding()
  local v
  local pcs = d.pieces
  if #pcs == 1 and pcs[1].c0 == 0 then
    v = sum_in(pcs[1].terms, d.row, d.out and d.out() or nil)
  else
    local buf = d.out and d.out() or nil
    if buf == nil then
      local C1 = 0
      for _, p in ipairs(pcs) do C1 = C1 + p.nch end
      buf = sum_buffer({ M.slice(d.like, 0, C1) }, d.row)
    end
    local cp = {}
    for i, p in ipairs(pcs) do cp[i] = M.piece(buf, p.c0, p.nch, p.terms) end
    C.chan_sum(cp)
    v = buf
  end
  d.value = v
  return v
end

--- d's pieces in the binding's form {c0, nch, src, src_c0 [, add,
-- add_c0]...} (lucid.nn.batchnorm2d_backward_terms), at most M.SUM_MAX
-- sources each (more: the first ones summed first, short_terms).
-- @return table
function M.engine_pieces(d)
  local out = {}
  for i, p in ipairs(d.pieces) do
    local e = { p.c0, p.nch }
    for _, t in ipairs(short_terms(p)) do
      if is_slice(t) then
        e[#e + 1], e[#e + 2] = t[1], t[2]
      else
        e[#e + 1], e[#e + 2] = t, 0
      end
    end
    out[i] = e
  end
  return out
end

--- d's one term (a tensor or a M.slice) when d is one piece of one term,
-- else nil; x itself when it is not a description.
function M.single_term(d)
  if not M.is_desc(d) then return d end
  local p = d.pieces
  if #p == 1 and #p[1].terms == 1 then return p[1].terms[1] end
  return nil
end

--- For a block that uses its gradient gy as a term of a later sum (a
-- residual): gy and its term. A tensor is both; a description of one term
-- stays a description (for the consumer) and gives that term; any other
-- description is materialised and its tensor is both.
-- @return gy, term
function M.residual(gy)
  if not M.is_desc(gy) then return gy, gy end
  local t = M.single_term(gy)
  if t ~= nil and gy.value == nil then return gy, t end
  local v = M.materialize(gy)
  return v, v
end

--- Whether module m takes gradient descriptions: its class declares
-- _desc (the backward that accepts them) and m's backward is that one.
function M.takes_desc(m)
  local f = m._desc
  return f ~= nil and m.backward == f
end

--- m:backward(x, gy), gy materialised first unless m takes descriptions.
function M.backward(m, x, gy)
  if M.is_desc(gy) and not M.takes_desc(m) then gy = M.materialize(gy) end
  return m:backward(x, gy)
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

--- Backward in reverse order; returns the gradient w.r.t. the input. gy
-- may be a gradient description (M.desc): the last child receives it when
-- it takes them, else its value (M.backward).
function Sequential:backward(x, gy)
  local inputs = self._inputs
  for i = #self._modules, 1, -1 do
    gy = M.backward(self._modules[i].module, inputs[i], gy)
  end
  self.grad_input = M.materialize(gy)
  return self.grad_input
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
    gy = M.backward(self._modules[i].module, inputs[i], gy)
  end
  local terms = M.backward_terms(self._modules[1].module, inputs[1], gy)
  self.grad_input = #terms == 1 and terms[1] or nil
  return terms
end
Sequential._terms = { Sequential.forward, Sequential.backward }
Sequential._desc = Sequential.backward

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
