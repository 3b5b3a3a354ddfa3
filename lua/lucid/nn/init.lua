--- lucid.nn — the Lua module library: primitives over engine/nn, containers,
-- the YOLO blocks and heads, and materialisation of a module tree into one
-- flat parameter set.
--
--   local nn = require("lucid.nn")
--   local m = nn.C3k2(32, 64, 1, false, 0.25)
--   nn.materialize(m, {dtype = "f64"})      -- parameters now exist
--   local y = m:forward(x); local gx = m:backward(x, gy)
local util = require("lucid.nn.util")
local Module = require("lucid.nn.module")
local prim = require("lucid.nn.prim")
local containers = require("lucid.nn.containers")
local blocks = require("lucid.nn.blocks")
local attention = require("lucid.nn.attention")
local head = require("lucid.nn.head")

local nn = {}

nn.Module = Module
nn.util = util
nn.accumulate = containers.accumulate
-- branch lanes (run, queue, ctx_for): lua/lucid/nn/lanes.lua
nn.lanes = require("lucid.nn.lanes")

-- Constructors: nn.Conv(...) == blocks.Conv.new(...), and the classes as
-- nn.classes.Conv (for isinstance-style checks).
nn.classes = {}
local function export(tbl)
  for name, cls in pairs(tbl) do
    if type(cls) == "table" and cls.new then
      nn.classes[name] = cls
      nn[name] = cls.new
    end
  end
end
export(prim)
export({ Sequential = containers.Sequential, ModuleList = containers.ModuleList })
export(blocks)
export(attention)
export(head)

--- The C binding table (lucid.nn of lucid.so), loaded on first use.
-- @return table
function nn.binding()
  local ok, lucid = pcall(require, "lucid")
  -- rawget: the binding's lucid.nn raises on a name it does not have
  if not ok or type(lucid) ~= "table" or type(lucid.nn) ~= "table" or not rawget(lucid.nn, "ParamSet") then
    error("lucid.nn: the C binding (lucid.so with lucid.nn) is not available", 2)
  end
  return lucid.nn, lucid
end

--- Materialise a module tree: create its C modules, declaring every
-- parameter/buffer in one new ParamSet under its dotted name (prefix +
-- path), allocate the flat buffers on opts.device with dtype opts.dtype,
-- run the init rules, then the _post_init hooks (bias init). Checks that
-- the C declarations equal the Lua ones (name, shape) and raises naming the
-- first difference.
-- @param module Module
-- @param opts table|nil: ctx (Context), device ("cpu"), dtype ("f32" |
--   "f64"), prefix (""), alias (a materialised lucid.ParamSet: the new set's
--   entries become views of its flat buffers instead of new ones,
--   set:alias; no init rule and no _post_init runs; device and dtype must
--   then be absent); another key is an error
-- @return lucid.ParamSet
function nn.materialize(module, opts)
  if not (type(module) == "table" and getmetatable(module) and type(module._modules) == "table") then
    error("nn.materialize: bad argument module: expected an nn module, got " .. util.describe(module), 2)
  end
  opts = util.check_options("nn.materialize", opts, { "ctx", "device", "dtype", "prefix", "alias" })
  if opts.alias ~= nil and (opts.device ~= nil or opts.dtype ~= nil) then
    error("nn.materialize: opts.alias takes the source set's device and dtype: give neither", 2)
  end
  if opts.alias ~= nil and not (type(opts.alias) == "userdata" and type(opts.alias.alias) == "function") then
    error("nn.materialize: opts.alias: expected a lucid.ParamSet, got " .. util.describe(opts.alias), 2)
  end
  if opts.prefix ~= nil and type(opts.prefix) ~= "string" then
    error("nn.materialize: opts.prefix: expected a string, got " .. util.describe(opts.prefix), 2)
  end
  local C = nn.binding()
  if module._set then error("materialize: module tree is already materialised", 2) end
  local set = C.ParamSet({ ctx = opts.ctx })
  module:_create(C, set, opts.prefix or "", opts.ctx)
  if opts.alias ~= nil then
    set:alias(opts.alias)
  else
    set:materialize({ device = opts.device, dtype = opts.dtype, ctx = opts.ctx })
  end
  local decls = module:state_decls(opts.prefix)
  if #decls ~= set:count() then
    error(string.format("materialize: %d Lua declarations but %d in the C set", #decls, set:count()))
  end
  for i, d in ipairs(decls) do
    local p = set:get(i)
    if p.name ~= d.name or util.shape_str(p.shape) ~= util.shape_str(d.decl.shape) then
      error(string.format("materialize: entry %d is %s %s in C but %s %s in Lua", i, p.name,
        util.shape_str(p.shape), d.name, util.shape_str(d.decl.shape)))
    end
  end
  if opts.alias == nil then module:apply(function(m) m:_post_init() end) end -- (an alias: src's values)
  module._set = set
  return set
end

return nn
