--- lucid.model — a network as an Ultralytics layer table: rows {from, n,
-- module, args}, scaled by parse_model's rules, executed in order as a DAG.
--
--   local Model = require("lucid.model")
--   local m = Model.new(cfg, {scale = "n", nc = 1, kpt_shape = {17, 3}})
--   local out = m:forward(x)               -- {boxes, scores, kpts, feats}
--   local gx = m:backward(x, {boxes = gb, scores = gs, kpts = gk})
--
-- Layer i (0-based, as in Ultralytics) takes the output of layer i-1
-- (from = -1), of layer j (from = j), or a list of them (Concat, Pose).
-- backward runs the layers in reverse and sums the gradients of an output
-- that feeds several layers. Parameters live in one flat ParamSet under the
-- reference names "model.<i>.<path>" (the Ultralytics state-dict names).
local util = require("lucid.nn.util")
local nn = require("lucid.nn")
local Module = require("lucid.nn.module")
local containers = require("lucid.nn.containers")
local serialize = require("lucid.model_io")

local acc = containers.accumulate
local C = nn.classes

local Model = util.class("Model", Module)

-- Modules whose first arg is c2 (scaled) and whose c1 comes from `from`.
local BASE = { Conv = true, DWConv = true, Bottleneck = true, C2f = true, C3 = true,
  C3k = true, C3k2 = true, SPPF = true, C2PSA = true }
-- Modules that take the repeat count as their third argument.
local REPEAT = { C2f = true, C3 = true, C3k2 = true, C2PSA = true }
-- Module paths as Ultralytics prints them in its summary.
local QUALNAME = {
  Conv = "ultralytics.nn.modules.conv.Conv", DWConv = "ultralytics.nn.modules.conv.DWConv",
  Concat = "ultralytics.nn.modules.conv.Concat", Upsample = "torch.nn.modules.upsampling.Upsample",
  Pose = "ultralytics.nn.modules.head.Pose", Detect = "ultralytics.nn.modules.head.Detect",
}

-- Replace the symbolic args of a row ("nc", "kpt_shape", "None").
local function resolve(args, nc, kpt)
  local out = { n = #args }
  for i = 1, #args do
    local a = args[i]
    if a == "nc" then a = nc elseif a == "kpt_shape" then a = kpt elseif a == "None" then a = nil end
    out[i] = a
  end
  return out
end

-- Python-like text of an args list for the summary table.
local function args_str(args)
  local p = {}
  for i = 1, args.n or #args do
    local a = args[i]
    if type(a) == "table" then
      local q = {}
      for j = 1, #a do q[j] = util.pyrepr(a[j]) end
      p[i] = "[" .. table.concat(q, ", ") .. "]"
    else
      p[i] = util.pyrepr(a)
    end
  end
  return "[" .. table.concat(p, ", ") .. "]"
end

-- Build one layer module from its resolved constructor args.
local function instantiate(name, a)
  if name == "Upsample" then return C.Upsample.new(a[2]) end
  local cls = C[name]
  if not cls then error("model: unknown module '" .. tostring(name) .. "'", 3) end
  return cls.new(unpack(a, 1, a.n))
end

--- Parse a layer table into layers (parse_model). Returns the layer list
-- and the head's kind. Each layer: {i, f, n, type, args, module, c2, stride}.
local function parse(cfg, opts)
  local nc = opts.nc or cfg.nc
  local kpt = opts.kpt_shape or cfg.kpt_shape
  local scale = opts.scale or "n"
  local sc = type(scale) == "table" and scale or cfg.scales[scale]
  if not sc then error("model: unknown scale '" .. tostring(scale) .. "'", 3) end
  local depth, width, max_channels = sc[1], sc[2], sc[3]
  local ch = { [-1] = opts.ch or 3 }   -- out channels by layer index (-1: input)
  local stride = { [-1] = 1 }           -- spatial stride by layer index
  local rows = {}
  for _, r in ipairs(cfg.backbone) do rows[#rows + 1] = r end
  for _, r in ipairs(cfg.head) do rows[#rows + 1] = r end
  local legacy = true
  local layers = {}
  for idx, row in ipairs(rows) do
    local i = idx - 1
    local f, n, name = row[1], row[2], row[3]
    local function src(j) return j == -1 and i - 1 or j end
    local args = resolve(row[4], nc, kpt)
    local display
    n = util.scale_depth(n, depth)
    local n_ = n
    local c2, s
    if BASE[name] then
      local c1 = ch[src(f)]
      c2 = args[1]
      if c2 ~= nc then c2 = util.scale_channels(c2, width, max_channels) end
      local a = { c1, c2, n = args.n + 1 }
      for k = 2, args.n do a[k + 1] = args[k] end
      args = a
      if REPEAT[name] then
        table.insert(args, 3, n)
        args.n = args.n + 1
        n = 1
      end
      if name == "C3k2" then
        legacy = false
        if scale == "m" or scale == "l" or scale == "x" then args[4] = true; args.n = math.max(args.n, 4) end
      end
      s = stride[src(f)] * ((name == "Conv" or name == "DWConv") and (args[4] or 1) or 1)
    elseif name == "Concat" then
      c2, s = 0, stride[src(f[1])]
      for _, j in ipairs(f) do
        c2 = c2 + ch[src(j)]
        if stride[src(j)] ~= s then error(string.format("model: layer %d concatenates strides %d and %d", i, s, stride[src(j)]), 3) end
      end
      display = args
      args = { #f, args[1], n = 2 } -- Concat.new(ninputs, dim)
    elseif name == "Pose" or name == "Detect" then
      local chs = {}
      for k, j in ipairs(f) do chs[k] = ch[src(j)] end
      if name == "Pose" then args = { nc, kpt, 16, chs, legacy, n = 5 }
      else args = { nc, 16, chs, legacy, n = 4 } end
      c2 = nil
    elseif name == "Upsample" then
      c2 = ch[src(f)]
      s = stride[src(f)] / args[2]
    else
      error("model: unknown module '" .. tostring(name) .. "' in layer " .. i, 3)
    end
    -- a block refusing its (scaled) arguments names the layer, raised at
    -- the user's call (level 4: parse, __init, new, the caller)
    local ok, module = pcall(function()
      if n == 1 then return instantiate(name, args) end
      local list = {}
      for k = 1, n do list[k] = instantiate(name, args) end
      return containers.Sequential.new(list)
    end)
    if not ok then
      error(string.format("model: layer %d (%s): %s", i, name, (tostring(module):gsub("^[^:]*:%d+: ", ""))), 4)
    end
    if name == "Pose" or name == "Detect" then
      module.stride = {}
      for k, j in ipairs(f) do module.stride[k] = stride[src(j)] end
    end
    local layer = { i = i, f = f, n = n_, type = name, args = args, module = module, c2 = c2,
      stride = s, display_args = display or args }
    layer.np = module:num_params()
    layers[#layers + 1] = layer
    ch[i], stride[i] = c2, s
  end
  return layers
end

--- Model.new(cfg, opts): build the network of a layer table.
-- @param cfg table: {nc, kpt_shape, scales, backbone, head} (see
--   lucid.models.yolo11_pose.config)
-- @param opts table|nil: scale ("n", or a {depth, width, max_channels}
--   triple), nc, kpt_shape, ch (3), materialize
--   (default true: needs the C binding), device ("cpu"), dtype ("f32" or
--   "f64"), ctx, input_grad (false: layer 0 skips the image gradient)
-- @return Model; raises on an unknown module/scale or inconsistent table
-- The options a model accepts (a typo is an error, not a silent default).
local MODEL_OPTS = { scale = true, nc = true, kpt_shape = true, ch = true, materialize = true, device = true,
  dtype = true, ctx = true, input_grad = true }

-- Types and ranges of the options (raised at the user's call, level 5:
-- bad, check_opts, __init, new, the caller).
local function check_opts(cfg, opts)
  local function bad(fmt, ...) error("model: " .. string.format(fmt, ...), 5) end
  if opts.nc ~= nil and (type(opts.nc) ~= "number" or opts.nc ~= math.floor(opts.nc) or opts.nc < 1) then
    bad("nc: expected an integer >= 1 (the number of classes), got %s", tostring(opts.nc))
  end
  local k = opts.kpt_shape
  if k ~= nil and (type(k) ~= "table" or #k ~= 2 or type(k[1]) ~= "number" or k[1] < 1 or k[1] ~= math.floor(k[1])
      or (k[2] ~= 2 and k[2] ~= 3)) then
    bad("kpt_shape: expected {K, 2} or {K, 3} (K keypoints >= 1; x, y[, visibility]), got %s",
      type(k) == "table" and "{" .. table.concat((function() local t = {} for i, v in ipairs(k) do t[i] = tostring(v) end return t end)(), ", ") .. "}"
        or tostring(k))
  end
  local sc = opts.scale
  local triple = type(sc) == "table" and #sc == 3 and type(sc[1]) == "number" and type(sc[2]) == "number"
    and type(sc[3]) == "number"
  if sc ~= nil and not triple and (type(sc) ~= "string" or not (cfg.scales or {})[sc]) then
    local names = {}
    for n in pairs(cfg.scales or {}) do names[#names + 1] = n end
    table.sort(names)
    bad("scale: expected one of %s or a {depth, width, max_channels} triple, got %s", table.concat(names, ", "),
      tostring(sc))
  end
  if opts.ch ~= nil and (type(opts.ch) ~= "number" or opts.ch < 1 or opts.ch ~= math.floor(opts.ch)) then
    bad("ch: expected an integer >= 1 (input channels), got %s", tostring(opts.ch))
  end
end

function Model.__init(self, cfg, opts)
  if opts ~= nil and type(opts) ~= "table" then
    error(string.format("model: expected an options table (e.g. {scale = \"n\", nc = 1, kpt_shape = {17, 3}}), got %s",
      type(opts)), 3)
  end
  check_opts(cfg, opts or {})
  for k in pairs(opts or {}) do
    if not MODEL_OPTS[k] then
      error(string.format("model: unknown option '%s' (expected one of scale, nc, kpt_shape, ch, materialize, "
        .. "device, dtype, ctx, input_grad)", tostring(k)), 3)
    end
  end
  Module.__init(self)
  opts = opts or {}
  self.cfg = cfg
  self.yaml_name = cfg.name
  self.scale = opts.scale or "n"
  self.nc = opts.nc or cfg.nc
  self.kpt_shape = opts.kpt_shape or cfg.kpt_shape
  self.ch_in = opts.ch or 3
  self.layers = parse(cfg, opts)
  local seq = containers.Sequential.new()
  for _, L in ipairs(self.layers) do seq:add(tostring(L.i), L.module) end
  self:add("model", seq)
  local last = self.layers[#self.layers]
  self.head = last.module
  self.stride = last.module.stride
  self.class_name = (last.type == "Pose") and "PoseModel" or "DetectionModel"
  self.input_grad = opts.input_grad and true or false
  if opts.materialize ~= false then self:materialize({ device = opts.device, dtype = opts.dtype, ctx = opts.ctx }) end
  self._opts = { scale = opts.scale, nc = opts.nc, kpt_shape = opts.kpt_shape, ch = opts.ch,
    input_grad = opts.input_grad }
end

--- Allocate the flat parameter/gradient buffers and create the C modules
-- (done by Model.new unless opts.materialize == false).
-- @param opts table|nil: device, dtype, ctx, alias (a materialised Model
--   built from the same table and options: this model's parameters,
--   buffers and gradients become views of its flat buffers, nn.materialize's
--   alias; device and dtype then absent); another key is an error
-- @return lucid.ParamSet
function Model:materialize(opts)
  opts = util.check_options("model:materialize", opts, { "device", "dtype", "ctx", "alias" })
  local src = opts.alias
  if src ~= nil and not (type(src) == "table" and getmetatable(src) == Model and src.params) then
    error("model:materialize: opts.alias: expected a materialised lucid.model, got " .. util.describe(src), 2)
  end
  local set = nn.materialize(self, { device = opts.device, dtype = opts.dtype, ctx = opts.ctx,
    alias = src and src.params or nil })
  self.params = set
  if not self.input_grad then self.layers[1].module.conv:need_grad_input(false) end
  return set
end

--- A twin of this model on ctx (a context of the same device, or this
-- model's own): the same layer table and options, new module state (outputs,
-- saved statistics, weight shadows, column caches) and the SAME parameters,
-- buffers and gradients (views of this model's flat buffers: a write to
-- one is seen by the other; backwards of both accumulate into the same
-- gradients; forwards of both in training mode update the same BatchNorm
-- running statistics). Every module's mode (train / eval, a frozen input
-- gradient) is copied from this model's now; later changes of either
-- model's modes or trainable flags are not followed (each parameter set
-- keeps its own entries: make a new twin after one). Never give both to
-- one optimizer / EMA each: they would update the same values twice. For
-- two training steps in flight at once (docs/PIPELINE.md). Errors: the
-- options' or the alias's (nn.materialize, lucid_param_set_alias).
-- @param ctx Context|nil: the twin's context (nil: the default one, as for
--   Model.new without ctx)
-- @return Model
function Model:twin(ctx)
  if not self.params then error("model:twin: the model is not materialised", 2) end
  local o = {}
  for k, v in pairs(self._opts or {}) do o[k] = v end
  o.ctx, o.materialize = ctx, false
  local t = Model.new(self.cfg, o)
  t:materialize({ ctx = ctx, alias = self })
  -- every module's mode (train / eval, a frozen input gradient) as this
  -- model's, module by module (the two trees have the same shape)
  local function copy_modes(a, b)
    b.training = a.training
    if b._c then b._c:train(a.training) end
    if a._no_grad_input ~= nil and b.need_grad_input then b:need_grad_input(not a._no_grad_input) end
    for i, e in ipairs(a._modules) do copy_modes(e.module, b._modules[i].module) end
    for i, h in ipairs(a._hidden) do copy_modes(h, b._hidden[i]) end
  end
  copy_modes(self, t)
  return t
end

function Model:repr()
  local s = Module.repr(self)
  return (s:gsub("^Model", self.class_name))
end

--- Run the layers in order. x: [B, ch, H, W], H and W multiples of the
-- head's largest stride (32 for the YOLO pose models; error otherwise,
-- naming the size). Returns the head's output ({boxes, scores, kpts, feats}
-- for Pose).
local head_levels
-- The head's inputs by producing layer: {[layer index] = head input slot}
-- when the last layer is a head that can be run level by level
-- (nn.Detect / nn.Pose: forward_level, backward_start, ...) and takes a
-- list of distinct earlier layers; else false (cached). Also false while
-- the head's forward or backward is not Detect's own (an override, e.g.
-- replace_forward, must be called as it is).
local Detect = require("lucid.nn.head").Detect
head_levels = function(self)
  local head = self.head
  if head.forward ~= Detect.forward or head.backward ~= Detect.backward then return false end
  local hl = self._head_levels
  if hl ~= nil then return hl end
  hl = false
  local last = self.layers[#self.layers]
  if last.module == self.head and type(last.f) == "table" and self.head.forward_level
    and self.head.backward_start then
    hl = {}
    for k, j in ipairs(last.f) do
      j = (j == -1) and last.i - 1 or j
      if hl[j] then hl = false break end
      hl[j] = k
    end
  end
  self._head_levels = hl
  return hl
end

-- The C modules of this model's Conv2d leaves that can take a cuBLAS route
-- (groups 1: the 1x1 GEMM for 1x1, stride 1, padding 0, dilation 1; the
-- im2col GEMM for a spatial kernel), cached per parameter set and contract
-- version (a tree edit bumps the latter).
local function wcast_modules(self)
  local cache = self._wcast
  local ver = self._contract_version or 0
  if cache and cache.set == self.params and cache.version == ver then return cache.list, cache.cast end
  local list = {}
  self:apply(function(m)
    if getmetatable(m).__name == "Conv2d" and m._c and m.g == 1
      and (m.k > 1 or (m.k == 1 and m.s == 1 and m.p == 0 and m.d == 1)) then
      list[#list + 1] = m._c
    end
  end)
  self._wcast = { set = self.params, version = ver, list = list, cast = nn.binding().conv_cast_weights }
  return list, self._wcast.cast
end

-- Before a forward on the GPU in bf16/f16: the GEMM-routed conv weights rounded to
-- the activation dtype in one launch (lucid.nn.conv_cast_weights), so no
-- conv casts its weight in the forward or the backward-data
-- (LUCID_WCAST_ONCE=0: nothing is queued).
local WCAST_DTYPES = { bf16 = true, f16 = true }
local function cast_weights(self, x)
  if type(x) == "table" or not self.params or not WCAST_DTYPES[x:dtype()] or x:device() == "cpu" then return end
  local list, cast = wcast_modules(self)
  if #list > 0 then cast(list, x:dtype()) end
end

--- model:cast_weights(x): round the weights of the Conv2d layers that take
-- a cuBLAS route to x's dtype into their shadows (lucid.nn.conv_cast_weights:
-- one launch, for the shadows that are not fresh: weights written since
-- their last cast, compared by storage version, or every shadow after a
-- CUDA graph launch or capture made them stale), as Model:forward does
-- first. x: a lucid.Tensor
-- (its dtype and device decide; f32, CPU and table inputs: nothing to do).
-- The recorded step calls it before each replay of an FB graph that kept
-- the shadows (lua/lucid/recorded_step.lua, engine/train/graph.h).
function Model:cast_weights(x)
  cast_weights(self, x)
end

--- Forward through the layers. x: the input image batch, a lucid.Tensor
-- [B, 3, H, W] (H and W multiples of the largest stride), or the table a
-- custom first layer takes. Returns the head's output ({boxes, scores,
-- kpts, feats} for a pose model).
function Model:forward(x)
  -- a forward that fails midway leaves nothing for backward to use
  self.output, self._forward_input = nil, nil
  if type(x) ~= "table" and util.describe(x) ~= "lucid.Tensor" then
    error("model:forward: bad argument #1 (x): expected a lucid.Tensor [B, 3, H, W], got " .. util.describe(x), 2)
  end
  local st = self.stride
  local smax = type(st) == "table" and st[#st] or nil
  if smax and type(x) ~= "table" then
    local sh = x:shape()
    if #sh == 4 and (sh[3] % smax ~= 0 or sh[4] % smax ~= 0) then
      error(string.format("model: input %dx%d: height and width must be multiples of %d (the largest stride); "
        .. "letterbox or resize the image first", sh[3], sh[4], smax), 2)
    end
  end
  cast_weights(self, x)
  local outs = {}
  local prev = x
  local head = self.head
  local early = head_levels(self)
  if early then head:forward_begin() end
  for _, L in ipairs(self.layers) do
    local inp
    if type(L.f) == "number" then
      inp = (L.f == -1) and prev or outs[L.f]
    else
      inp = {}
      for k, j in ipairs(L.f) do inp[k] = (j == -1) and prev or outs[j] end
    end
    L.input = inp
    prev = L.module:forward(inp)
    outs[L.i] = prev
    -- a head input exists: its level starts now (on the branch lanes)
    local lvl = early and early[L.i]
    if lvl then head:forward_level(lvl, prev) end
  end
  self.output, self._forward_input = prev, x
  return prev
end

-- Fused sums (containers.fusing()): the gradient of a layer's output is
-- kept as the list of its terms in arrival order (the head's branch
-- gradients of that level first, then one per consumer) and summed where
-- the layer's backward takes it, in one launch for three or more
-- (containers.sum: the chain acc(acc(acc(box, cls), kpt), gin) had, same
-- bits); unfused, each term is added as it arrives (containers.accumulate).
-- With gradient descriptions (containers.describing(), LUCID_BN_DY_TERMS)
-- a layer whose module takes them (containers.takes_desc: Conv, the C2f /
-- C3 / SPPF / C2PSA blocks, whose first consumer of the gradient is a
-- Conv) receives the list as a description instead of its sum (its
-- BatchNorm reads the sum, or it is materialised at the same scope
-- position: the same bits); any other module receives the sum.
local function backward_pass(self, x, gy)
  local grads = {}
  local fused = containers.fusing()
  local describing = fused and containers.describing()
  local function add(j, g)
    if not fused then
      grads[j] = acc(grads[j], g)
    elseif g ~= nil then
      local l = grads[j]
      if l == nil then
        l = {}
        grads[j] = l
      end
      l[#l + 1] = g
    end
  end
  -- the gradient of layer j's output for module m (nil: the model's input)
  local function get(j, m)
    local g = grads[j]
    grads[j] = nil
    if fused and g ~= nil then
      if describing and m ~= nil and containers.takes_desc(m) then
        g = containers.sum_desc(g)
      else
        g = containers.sum(g)
      end
    end
    return g
  end
  local n = #self.layers
  local last = self.layers[n]
  -- The head's backward is queued first (backward_start); the gradient of
  -- each of its inputs is taken (backward_level) only where the pass first
  -- needs it, so the layers below the deepest level start while the head's
  -- branches still run the shallower ones. pending[j]: the head input slots
  -- k fed by layer j.
  local head, pending = self.head, nil
  local start = n
  if head_levels(self) then
    head:backward_start(last.input, gy)
    pending = {}
    for k, j in ipairs(last.f) do
      j = (j == -1) and last.i - 1 or j
      pending[j] = pending[j] or {}
      pending[j][#pending[j] + 1] = k
    end
    start = n - 1
  else
    add(last.i, gy)
  end
  -- the level's branch terms go in unsummed when they come first (always,
  -- as take(j) runs before any other gradient of j arrives), else as
  -- their sum (acc(grads[j], level) summed the level first)
  local by_terms = fused and head and head.backward_level_terms ~= nil
    and head.backward_level == Detect.backward_level
  local function take(j)
    local ks = pending and pending[j]
    if not ks then return end
    pending[j] = nil
    for _, k in ipairs(ks) do
      if by_terms and grads[j] == nil then
        for _, t in ipairs(head:backward_level_terms(k)) do add(j, t) end
      else
        add(j, head:backward_level(k))
      end
    end
  end
  for idx = start, 1, -1 do
    local L = self.layers[idx]
    take(L.i)
    local g = get(L.i, L.module)
    if g ~= nil then
      local gin = L.module:backward(L.input, g)
      if type(L.f) == "number" then
        local j = (L.f == -1) and L.i - 1 or L.f
        take(j)
        add(j, gin)
      else
        for k, j in ipairs(L.f) do
          j = (j == -1) and L.i - 1 or j
          take(j)
          add(j, gin[k])
        end
      end
    end
  end
  if pending then
    take(-1) -- a head fed by the model input itself
    head:backward_finish()
  end
  self.grad_input = get(-1)
  return self.grad_input
end

local function shape_or_type(v)
  if type(v) == "userdata" and util.describe(v) == "lucid.Tensor" then
    return "a lucid.Tensor of shape " .. util.shape_str(v:shape())
  end
  return util.describe(v)
end

-- The checks of Model:backward (raised at its caller: level 3 = the caller
-- of Model:backward).
local function check_backward(self, x, gy)
  if self.output == nil then
    error("model:backward: forward must run first (there is no forward pass to differentiate): call "
      .. "m:forward(x), then m:backward(x, gy)", 3)
  end
  local x0 = self._forward_input
  if not rawequal(x, x0) then
    -- another handle of the same shape (x:cuda() twice, a fresh view) is
    -- taken as the forward's input; anything else is a different input
    local ok = type(x) == "userdata" and type(x0) == "userdata" and util.describe(x) == "lucid.Tensor"
      and util.describe(x0) == "lucid.Tensor" and util.shape_str(x:shape()) == util.shape_str(x0:shape())
    if not ok then
      error(string.format("model:backward: bad argument #1 (x): expected the input of the last forward (%s), "
        .. "got %s; backward differentiates the last forward: run m:forward(x) on this input first",
        shape_or_type(x0), shape_or_type(x)), 3)
    end
  end
  util.check_output_grad("model:backward", self.output, gy, 2, 3)
end

--- Backward through the DAG in reverse, differentiating the last forward.
-- @param x the input given to the last m:forward (or another tensor of its
--   shape, taken as that input; a different shape is an error)
-- @param gy table: the head output's gradient {boxes=, scores=, kpts=}; a
--   missing key is a zero gradient, each present one must have the shape
--   of the forward output's entry (a tensor of its shape when the model
--   ends in a plain layer). Errors name the key and both shapes; backward
--   before any forward is an error too.
-- Parameter gradients accumulate into the flat gradient buffer (call
-- zero_grad between steps).
-- @return the gradient w.r.t. x when opts.input_grad was set, else nil.
function Model:backward(x, gy)
  check_backward(self, x, gy)
  -- sums of gradients go to persistent buffers of this model (one per call
  -- position and shape, containers.accumulate), so that a backward pass
  -- allocates nothing in steady state (recorded steps, docs/STEP.md)
  local sc = self._acc_scope
  if not sc then
    sc = { slots = {}, pos = 0 }
    self._acc_scope = sc
  end
  sc.pos = 0
  local prev = containers.set_accumulate_scope(sc)
  local ok, res = pcall(backward_pass, self, x, gy)
  containers.set_accumulate_scope(prev)
  if not ok then error(res, 0) end
  return res
end

-- Move the contract epoch of lucid.graph (docs/STEP.md, "Contract"): every
-- change of this model's contract version does, so a recorded step's cheap
-- path reads that counter only after the epoch moved. A no-op without the
-- C binding.
local function move_epoch()
  local ok, lucid = pcall(require, "lucid")
  local G = ok and type(lucid) == "table" and lucid.graph or nil
  if G and G.bump_epoch then G.bump_epoch() end
end

--- The contract version of the model: a counter that recorded steps
-- compare before every replay (docs/STEP.md); replace_forward() and
-- bump_version() bump it (and the contract epoch of lucid.graph), and a
-- recording that sees it move retires.
function Model:contract_version() return self._contract_version or 0 end

--- The mode version: bumped by train()/eval() when the mode changes (what
-- a recording's slow path names: "model mode train -> eval"). The modes
-- themselves are counted exactly by the engine (a switch to eval and back
-- for validation keeps the recording: docs/STEP.md, "Contract").
function Model:mode_version() return self._mode_version or 0 end

--- Mark a change a recorded step cannot see through its other counters (a
-- Lua-level hook, a changed scalar attribute of a Lua block, ...).
-- @param reason string|nil: kept for the retirement message
function Model:bump_version(reason)
  self._contract_version = (self._contract_version or 0) + 1
  self._contract_reason = reason or "model changed (bump_version)"
  move_epoch()
end

--- Switch train/eval mode (Module:train) and bump the mode version when
-- the mode changes. mode: a boolean, or nil for true (torch's
-- train(mode=True)); any other value ("x", 0) is an error naming it.
-- The recorded steps of this model need no check of the modes for it
-- (every C module's mode is counted exactly by the engine: a round trip
-- leaves the count at zero, a mode left changed is seen by the next
-- check's cheap path); a switch at the root, validation's eval() and
-- train() at each epoch boundary, is where each recording compares the
-- class forward/backward functions it ran (a replaced one retires it, as
-- bump_version does), O(classes) next to this O(modules) switch.
function Model:train(mode)
  if mode == nil then
    mode = true
  elseif type(mode) ~= "boolean" then
    error("model:train: bad argument #1 (mode): expected a boolean (or nothing for true), got "
      .. util.describe(mode), 2)
  end
  local changed = self.training ~= mode
  Module.train(self, mode)
  if changed then
    self._mode_version = (self._mode_version or 0) + 1
    local recs = self._recordings
    if recs then
      for rec in pairs(recs) do
        local why = rec:mode_switched()
        if why then self:bump_version(why) end
      end
    end
  end
  return self
end

function Model:eval() return self:train(false) end

--- Replace the forward (and optionally backward) function of one module of
-- this model (an instance override), bumping the contract version.
function Model:replace_forward(module, forward, backward)
  module.forward = forward
  if backward then module.backward = backward end
  self:bump_version("forward of a " .. tostring(getmetatable(module).__name) .. " replaced")
end

--- Release every recorded step that captured this model (called when the
-- model is copied: the copy must never run through another model's
-- graphs). Returns how many were released.
function Model:release_recordings()
  local n = 0
  for rec in pairs(self._recordings or {}) do
    rec:release_recording("model copied")
    n = n + 1
  end
  return n
end

--- Zero the flat gradient buffer (one fill).
function Model:zero_grad() self.params:zero_grad() end

--- Every parameter and buffer (lucid.Param) in state-dict order.
function Model:state() return self.params:list() end

--- Parameter of a reference name ("model.0.conv.weight"), or nil.
function Model:param(name) return self.params:find(name) end

--- Text of the Ultralytics parse_model summary: one row per layer with
-- from, n, params, module and arguments, then the totals.
function Model:summary()
  local lines = { string.format("%3s%20s%3s%10s  %-45s%-30s", "", "from", "n", "params", "module", "arguments") }
  for _, L in ipairs(self.layers) do
    local f = type(L.f) == "table" and ("[" .. table.concat(L.f, ", ") .. "]") or tostring(L.f)
    lines[#lines + 1] = string.format("%3d%20s%3d%10d  %-45s%-30s", L.i, f, L.n, L.np,
      QUALNAME[L.type] or ("ultralytics.nn.modules.block." .. L.type), args_str(L.display_args))
  end
  -- leaf modules as PyTorch counts them: Conv's SiLU is one shared
  -- instance (Conv.default_act), so all of them count once
  local nmod, silu = 0, 0
  self:apply(function(m)
    if #m._modules == 0 then
      if getmetatable(m).__name == "SiLU" then silu = 1 else nmod = nmod + 1 end
    end
  end)
  nmod = nmod + silu
  lines[#lines + 1] = string.format("%s summary: %d layers, %d parameters, %d gradients",
    self.yaml_name or "model", nmod, self:num_params(), self:num_params(true))
  return table.concat(lines, "\n")
end

--- Output shapes of every layer for an input [B, ch, H, W], computed from
-- the layer table without running anything. Returns a list indexed by
-- layer position (1-based): {B, C, H, W}, or for the head {boxes=, scores=,
-- kpts=} shapes.
function Model:infer_shapes(B, H, W)
  local shapes = { [-1] = { B, self.ch_in, H, W } }
  local out = {}
  for idx, L in ipairs(self.layers) do
    local function src(j) return j == -1 and L.i - 1 or j end
    local s
    if L.type == "Concat" then
      local a = shapes[src(L.f[1])]
      s = { B, L.c2, a[3], a[4] }
    elseif L.type == "Pose" or L.type == "Detect" then
      local A = 0
      for _, j in ipairs(L.f) do local t = shapes[src(j)]; A = A + t[3] * t[4] end
      local head = L.module
      s = { boxes = { B, 4 * head.reg_max, A }, scores = { B, head.nc, A } }
      if head.nk then s.kpts = { B, head.nk, A } end
    else
      local a = shapes[src(L.f)]
      local h, w = a[3], a[4]
      if L.type == "Conv" or L.type == "DWConv" then
        local c = L.module.conv
        h = math.floor((h + 2 * c.p - c.d * (c.k - 1) - 1) / c.s) + 1
        w = math.floor((w + 2 * c.p - c.d * (c.k - 1) - 1) / c.s) + 1
      elseif L.type == "Upsample" then
        h, w = h * L.module.scale, w * L.module.scale
      end
      s = { B, L.c2, h, w }
    end
    shapes[L.i] = s
    out[idx] = s
  end
  return out
end

Model.save = serialize.save
Model.load = serialize.load

return Model
