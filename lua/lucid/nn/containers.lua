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
  local pos = sc.pos + 1
  sc.pos = pos
  local row = sc.slots[pos]
  if row == nil then
    row = {}
    sc.slots[pos] = row
  end
  local key = table.concat(a:shape(), "x") .. a:dtype()
  local opts = row[key] -- {out = the buffer}, kept so that a pass allocates nothing
  if opts == nil then
    local buf = a:add(b)
    row[key] = { out = buf }
    return buf
  end
  return a:add(b, opts)
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
