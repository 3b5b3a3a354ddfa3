--- lucid.nn.module — the base class of every Lua module (primitive wrappers,
-- containers and composite blocks).
--
-- A module owns an ordered list of named children and, for leaves, an
-- ordered list of declared parameters and buffers. Declarations carry the
-- name, shape, dtype, trainability and initialiser; the storage arrives when
-- the model is materialised (lucid.nn.params), which binds every declaration
-- to a view of the model's flat parameter/gradient buffers. Reference names
-- are the dotted paths of PyTorch's state_dict ("cv1.conv.weight").
--
-- Protocol (Torch7 nn): forward(x) returns the output (persistent per
-- module); backward(x, gy) returns the gradient w.r.t. x and accumulates into
-- the parameter gradients. A module whose output feeds several consumers
-- receives the summed gradient from its caller. Inside a fused parent pass
-- (lucid.nn.containers.fuse_sums, DECISIONS 33) the last inner block of a
-- C2f / C3k2 / C3 / C2PSA hands its parent unsummed terms instead, and its
-- own output / grad_input stay nil (LUCID_FUSE_SUMS=0 keeps them).
local util = require("lucid.nn.util")

local Module = util.class("Module")

-- Edits of a module tree that a recorded step must see (docs/STEP.md,
-- "Contract"): a child or helper added, and an instance override of
-- forward/backward (a new raw key of a module, caught by __newindex, which
-- every class derived from Module inherits through util.class). Each moves
-- Module.edits.n, which a recorded step compares on its slow path (the
-- module tree is then walked again), and the contract epoch of lucid.graph,
-- which sends the next check of every recording there. Assigning a key
-- that already exists raw (an override present before, a child slot of
-- _modules, _c) goes unseen here: a recording made with an instance
-- override takes the full check at every replay instead.
Module.edits = { n = 0 }

local bump_epoch -- lucid.graph.bump_epoch, looked up on first use (lucid.so loads this file)
local function edited()
  Module.edits.n = Module.edits.n + 1
  if bump_epoch == nil then
    local ok, lucid = pcall(require, "lucid")
    local G = ok and type(lucid) == "table" and lucid.graph or nil
    if not (G and G.bump_epoch) then return end
    bump_epoch = G.bump_epoch
  end
  bump_epoch()
end

function Module.__newindex(t, k, v)
  if k == "forward" or k == "backward" then edited() end
  rawset(t, k, v)
end

--- Initialise the common fields. Subclasses call Module.__init(self).
function Module.__init(self)
  self._modules = {}     -- ordered { {name=, module=}, ... }
  self._decls = {}       -- ordered { {name=, shape=, kind=, ...}, ... }
  self._hidden = {}      -- helper primitives (no state, not printed)
  self.training = true
end

--- Register a stateless helper primitive (a Split, Add, extra MaxPool, ...)
-- that is materialised and switched with this module but is neither printed
-- nor named. Returns the helper.
function Module:helper(module)
  self._hidden[#self._hidden + 1] = module
  edited()
  return module
end

--- Register a child module under `name` (also reachable as self[name] when
-- the name is not numeric). Returns the child.
-- @param name string: the state-dict path component ("cv1", "0", "m")
-- @param module Module
function Module:add(name, module)
  assert(type(name) == "string", "module name must be a string")
  assert(type(module) == "table" and module._modules, "add: not a module: " .. name)
  self._modules[#self._modules + 1] = { name = name, module = module }
  if not name:match("^%d+$") then self[name] = module end
  edited()
  return module
end

--- Declare a parameter (kind "param") on this module.
-- @param name string: e.g. "weight"
-- @param shape table of integers
-- @param opts table|nil: trainable (default true), init (table
--   {kind="uniform", lo=, hi=} | {kind="const", value=} | {kind="arange"}),
--   group ("weight" | "bn" | "bias"; the optimizer's default grouping)
function Module:param(name, shape, opts)
  opts = opts or {}
  local d = {
    name = name, shape = shape, kind = "param", dtype = "f32",
    trainable = opts.trainable ~= false, init = opts.init, group = opts.group,
  }
  self._decls[#self._decls + 1] = d
  return d
end

--- Declare a buffer (kind "buffer": saved and loaded, never trained).
-- @param name string: e.g. "running_mean"
-- @param shape table of integers ({} for a scalar)
-- @param opts table|nil: dtype ("f32" default, "i64" for counters), init
function Module:buffer(name, shape, opts)
  opts = opts or {}
  local d = {
    name = name, shape = shape, kind = "buffer", dtype = opts.dtype or "f32",
    trainable = false, init = opts.init,
  }
  self._decls[#self._decls + 1] = d
  return d
end

--- Iterate children: for name, module in m:children() do ... end
function Module:children()
  local i = 0
  return function()
    i = i + 1
    local e = self._modules[i]
    if e then return e.name, e.module end
  end
end

--- Child by state-dict name ("0", "cv1"), or nil.
function Module:child(name)
  for _, e in ipairs(self._modules) do
    if e.name == name then return e.module end
  end
  return nil
end

--- All modules, depth first in registration order, with dotted names.
-- @param prefix string|nil
-- @return list of {name=, module=} (this module first, with name prefix or "")
function Module:named_modules(prefix, out)
  out = out or {}
  prefix = prefix or ""
  out[#out + 1] = { name = prefix, module = self }
  for _, e in ipairs(self._modules) do
    local p = prefix == "" and e.name or (prefix .. "." .. e.name)
    e.module:named_modules(p, out)
  end
  return out
end

--- Declarations in PyTorch state_dict order (per module: its parameters,
-- then its buffers, then its children), with full names.
-- @param prefix string|nil
-- @return list of {name=, decl=, module=}
function Module:state_decls(prefix, out)
  out = out or {}
  prefix = prefix or ""
  local function full(n) return prefix == "" and n or (prefix .. "." .. n) end
  for _, kind in ipairs({ "param", "buffer" }) do
    for _, d in ipairs(self._decls) do
      if d.kind == kind then
        out[#out + 1] = { name = full(d.name), decl = d, module = self }
      end
    end
  end
  for _, e in ipairs(self._modules) do
    e.module:state_decls(full(e.name), out)
  end
  return out
end

--- Number of parameter elements (buffers excluded).
-- @param trainable_only boolean|nil: count only trainable ones
-- @return integer
function Module:num_params(trainable_only)
  local n = 0
  for _, e in ipairs(self:state_decls()) do
    local d = e.decl
    if d.kind == "param" and (not trainable_only or d.trainable) then
      n = n + util.numel(d.shape)
    end
  end
  return n
end

--- Switch train/eval mode recursively (BatchNorm uses batch statistics in
-- train mode, running statistics in eval mode).
-- @param mode boolean|nil (default true; as torch's train(mode=True), any
--   other value — a string, 0 — is an error, not "true")
-- @return self
function Module:train(mode)
  if mode == nil then
    mode = true
  elseif type(mode) ~= "boolean" then
    error(string.format("nn.%s:train: bad argument #1 (mode): expected a boolean (or nothing for true), got %s",
      tostring(getmetatable(self).__name), util.describe(mode)), 2)
  end
  self.training = mode
  if self._c then self._c:train(mode) end
  for _, e in ipairs(self._modules) do e.module:train(mode) end
  for _, h in ipairs(self._hidden) do h:train(mode) end
  return self
end

--- Same as train(false).
function Module:eval() return self:train(false) end

--- The string after the class name inside parentheses (PyTorch
-- extra_repr). Subclasses override.
function Module:extra_repr() return "" end

--- PyTorch-style nested representation.
function Module:repr()
  local name = getmetatable(self).__name
  local extra = self:extra_repr()
  if #self._modules == 0 then return name .. "(" .. extra .. ")" end
  local lines = {}
  if extra ~= "" then lines[#lines + 1] = "  " .. extra end
  for _, e in ipairs(self._modules) do
    lines[#lines + 1] = "  (" .. e.name .. "): " .. util.addindent(e.module:repr(), 2)
  end
  return name .. "(\n" .. table.concat(lines, "\n") .. "\n)"
end

--- Forward pass; subclasses implement. x: tensor (or list for multi-input
-- modules). Returns the output.
function Module:forward(x)
  error(getmetatable(self).__name .. ":forward is not implemented", 2)
end

--- Backward pass; subclasses implement. Returns the gradient w.r.t. x (a
-- list for multi-input modules) and accumulates parameter gradients.
function Module:backward(x, gy)
  error(getmetatable(self).__name .. ":backward is not implemented", 2)
end

--- Create the C modules of this tree (leaves implement _make(C, set,
-- prefix, ctx) and return a lucid.CModule); called by lucid.nn.materialize.
-- @param C table: the lucid.nn binding table
-- @param set lucid.ParamSet: receives the declarations
-- @param prefix string: this module's dotted name
-- @param ctx Context|nil
function Module:_create(C, set, prefix, ctx)
  if self._make then
    self._c = self:_make(C, set, prefix, ctx)
    if not self.training then self._c:train(false) end
  end
  local function join(n) return prefix == "" and n or (prefix .. "." .. n) end
  for _, e in ipairs(self._modules) do e.module:_create(C, set, join(e.name), ctx) end
  for i, h in ipairs(self._hidden) do h:_create(C, set, join("_helper" .. i), ctx) end
end

--- Hook run once after the parameter set is materialised, in tree order
-- (pre-order): blocks override it to set special initial values (Detect's
-- bias init). The default does nothing.
function Module:_post_init() end

--- Parameters of this module tree (lucid.Param userdata) in state-dict
-- order; requires a materialised tree.
-- @param kind string|nil: "param" (default) or "buffer"
-- @return list of lucid.Param
function Module:parameters(kind, out)
  out = out or {}
  if self._c then
    local list = (kind == "buffer") and self._c:buffers() or self._c:parameters()
    for _, p in ipairs(list) do out[#out + 1] = p end
  elseif #self._decls > 0 then
    error("parameters(): module is not materialised (call lucid.nn.materialize)", 2)
  end
  for _, e in ipairs(self._modules) do e.module:parameters(kind, out) end
  return out
end

--- Buffers (BN running statistics, counters) in state-dict order.
function Module:buffers() return self:parameters("buffer") end

--- Call a function on every module of the tree (pre-order).
function Module:apply(fn)
  fn(self)
  for _, e in ipairs(self._modules) do e.module:apply(fn) end
  return self
end

return Module
