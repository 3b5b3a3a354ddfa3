--- lucid.nn.prim — Lua leaves over the C primitives of engine/nn.
--
-- Each leaf declares its parameters in Lua (so counts, names and shapes are
-- known before any memory exists) and creates its C module (lucid.CModule)
-- when the tree is materialised; forward/backward then delegate to it.
-- Activations are NCHW tensors; parameters are f32 (f64 for gradient checks).
local util = require("lucid.nn.util")
local Module = require("lucid.nn.module")

local P = {}
local sig = util.signature

-- A leaf whose forward/backward are those of its C module.
local Leaf = util.class("Leaf", Module)
P.Leaf = Leaf

function Leaf.__init(self) Module.__init(self) end
Leaf._args = sig("nn.Leaf", {})

--- Forward through the C module. x: tensor or list of tensors.
function Leaf:forward(x)
  local c = self._c
  if not c then error(getmetatable(self).__name .. ": not materialised (call lucid.nn.materialize)", 2) end
  self.output = c:forward(x)
  return self.output
end

--- Backward through the C module; returns the input gradient(s).
function Leaf:backward(x, gy)
  self.grad_input = self._c:backward(x, gy)
  return self.grad_input
end

--- Stop computing the input gradient (first layer of a network).
function Leaf:need_grad_input(flag)
  if self._c then self._c:need_grad_input(flag) end
  self._no_grad_input = not flag
end

----------------------------------------------------------------- Conv2d
local Conv2d = util.class("Conv2d", Leaf)
P.Conv2d = Conv2d

--- nn.Conv2d(c1, c2, k, s, p, g, d, bias).
-- @param c1 integer: input channels; c2: output channels; k: square kernel
-- @param s integer|nil stride (1); p integer|nil padding (nil: autopad
--   d*(k-1)/2); g integer|nil groups (1); d integer|nil dilation (1)
-- @param bias boolean|nil (false)
-- Parameters: weight [c2, c1/g, k, k], bias [c2]; PyTorch default init
-- U(+-1/sqrt(fan_in)), fan_in = c1/g*k*k.
function Conv2d.__init(self, c1, c2, k, s, p, g, d, bias)
  Leaf.__init(self)
  s, g, d = s or 1, g or 1, d or 1
  if p == nil then p = util.int(d * (k - 1) / 2) end
  self.c1, self.c2, self.k, self.s, self.p, self.g, self.d = c1, c2, k, s, p, g, d
  self.has_bias = bias and true or false
  local fan_in = (c1 / g) * k * k
  self:param("weight", { c2, c1 / g, k, k }, { init = { kind = "fan_in", fan_in = fan_in }, group = "decay" })
  if self.has_bias then
    self:param("bias", { c2 }, { init = { kind = "fan_in", fan_in = fan_in }, group = "bias" })
  end
end

--- Groups g (nil: 1) must divide both channel counts: nil, or the argument
-- name "g" and the message for util.signature's check (Conv2d, Conv).
function P.check_groups(c1, c2, g)
  g = g or 1
  if c1 % g ~= 0 or c2 % g ~= 0 then
    return "g", string.format("groups %d must divide c1 = %d and c2 = %d", g, c1, c2)
  end
end

Conv2d._args = sig("nn.Conv2d", {
  { "c1", "int", min = 1 }, { "c2", "int", min = 1 }, { "k", "int", min = 1 },
  { "s", "int", min = 1, opt = true }, { "p", "int", min = 0, opt = true },
  { "g", "int", min = 1, opt = true }, { "d", "int", min = 1, opt = true },
  { "bias", "boolean", opt = true },
}, function(c1, c2, k, s, p, g) return P.check_groups(c1, c2, g) end)

function Conv2d:_make(C, set, prefix, ctx)
  return C.conv2d(set, prefix, self.c1, self.c2, self.k, self.s, self.p, self.d, self.g, self.has_bias)
end

function Conv2d:extra_repr()
  local s = string.format("%d, %d, kernel_size=(%d, %d), stride=(%d, %d)",
    self.c1, self.c2, self.k, self.k, self.s, self.s)
  if self.p ~= 0 then s = s .. string.format(", padding=(%d, %d)", self.p, self.p) end
  if self.d ~= 1 then s = s .. string.format(", dilation=(%d, %d)", self.d, self.d) end
  if self.g ~= 1 then s = s .. string.format(", groups=%d", self.g) end
  if not self.has_bias then s = s .. ", bias=False" end
  return s
end

------------------------------------------------------------ BatchNorm2d
local BatchNorm2d = util.class("BatchNorm2d", Leaf)
P.BatchNorm2d = BatchNorm2d

--- nn.BatchNorm2d(c, eps=1e-3, momentum=0.03) (Ultralytics values).
-- Parameters weight [c] (1), bias [c] (0); buffers running_mean [c] (0),
-- running_var [c] (1), num_batches_tracked [] (i64, 0).
function BatchNorm2d.__init(self, c, eps, momentum)
  Leaf.__init(self)
  self.c, self.eps, self.momentum = c, eps or 1e-3, momentum or 0.03
  self:param("weight", { c }, { init = { kind = "ones" }, group = "norm" })
  self:param("bias", { c }, { init = { kind = "zeros" }, group = "bias" })
  self:buffer("running_mean", { c }, { init = { kind = "zeros" } })
  self:buffer("running_var", { c }, { init = { kind = "ones" } })
  self:buffer("num_batches_tracked", {}, { dtype = "i64", init = { kind = "zeros" } })
end

BatchNorm2d._args = sig("nn.BatchNorm2d", {
  { "c", "int", min = 1 }, { "eps", "number", gt = 0, opt = true },
  { "momentum", "number", ge = 0, le = 1, opt = true },
})

function BatchNorm2d:_make(C, set, prefix, ctx)
  return C.batchnorm2d(set, prefix, self.c, self.eps, self.momentum)
end

function BatchNorm2d:extra_repr()
  return string.format("%d, eps=%s, momentum=%s, affine=True, track_running_stats=True",
    self.c, tostring(self.eps), tostring(self.momentum))
end

------------------------------------------------------------------- SiLU
local SiLU = util.class("SiLU", Leaf)
P.SiLU = SiLU
function SiLU.__init(self) Leaf.__init(self) end
SiLU._args = sig("nn.SiLU", {})
function SiLU:_make(C, set, prefix, ctx) return C.silu({ ctx = ctx }) end
function SiLU:extra_repr() return "inplace=True" end

------------------------------------------------ BatchNorm2d + SiLU fused
-- The Conv block's bn -> act pair as one engine call
-- (lucid_nn_batchnorm2d_silu_*: the BatchNorm2d kernels with the SiLU inside
-- the apply, grad-partial and dx passes; the pre-activation is never stored).
-- The pair keeps its two modules, names, parameters, buffers and printing;
-- only the calls change. In bf16/f16 the fused result differs from bn then
-- act by about one rounding (the separate route rounds the pre-activation
-- to the activation dtype, the fused one does not).

--- Fusion switch: false makes every pair take the separate calls. Default
-- on, off when LUCID_FUSE_BN_SILU=0 in the environment. A recorded step
-- does not watch it: change it before recording (or call
-- model:bump_version() after changing it).
P.fuse_bn_silu = os.getenv("LUCID_FUSE_BN_SILU") ~= "0"

local LEAF_FWD, LEAF_BWD = Leaf.forward, Leaf.backward
local fused_fwd, fused_bwd -- the binding's functions (false: absent), on first use

-- The binding's optional functions of these names, in order (false for a
-- name it lacks, or without the binding). rawget: lucid.nn raises on a name
-- it does not have.
local function optional_nn(...)
  local ok, lucid = pcall(require, "lucid")
  local C = ok and type(lucid) == "table" and type(lucid.nn) == "table" and lucid.nn or nil
  local out = {}
  for i, name in ipairs({ ... }) do out[i] = C and rawget(C, name) or false end
  return unpack(out, 1, select("#", ...))
end

local function fused_binding()
  fused_fwd, fused_bwd = optional_nn("batchnorm2d_silu_forward", "batchnorm2d_silu_backward")
end

--- Whether bn then act may run fused: P.fuse_bn_silu on, bn exactly a
-- BatchNorm2d and act exactly a SiLU (not subclasses), both materialised,
-- both with the Leaf forward/backward (no instance or class override, e.g.
-- Model:replace_forward), and the fused functions present in the binding.
-- Checked on every forward of the pair; anything else takes the separate
-- calls.
-- @return boolean
function P.bn_silu_fusable(bn, act)
  if not P.fuse_bn_silu then return false end
  if getmetatable(bn) ~= BatchNorm2d or getmetatable(act) ~= SiLU then return false end
  if not (bn._c and act._c) then return false end
  if bn.forward ~= LEAF_FWD or bn.backward ~= LEAF_BWD or act.forward ~= LEAF_FWD
    or act.backward ~= LEAF_BWD then
    return false
  end
  if fused_fwd == nil then fused_binding() end
  return fused_fwd ~= false and fused_bwd ~= false
end

--- a = act(bn(x)) in one call (check P.bn_silu_fusable first). a is act's
-- persistent output (also act.output); bn updates its statistics and
-- running stats as bn:forward would; bn.output is nil (not computed).
function P.bn_silu_forward(bn, act, x)
  local y = fused_fwd(bn._c, act._c, x)
  bn.output, act.output = nil, y
  return y
end

--- Backward of P.bn_silu_forward with the same x: returns the gradient
-- w.r.t. x (bn.grad_input) and accumulates into bn's trainable weight and
-- bias gradients; act.grad_input is nil (not computed).
function P.bn_silu_backward(bn, act, x, gy)
  local gx = fused_bwd(bn._c, act._c, x, gy)
  bn.grad_input, act.grad_input = gx, nil
  return gx
end

------------------------------------ BatchNorm backward reading dy as terms
-- The Conv block's BatchNorm (fused with SiLU, or alone before an
-- Identity) can take its incoming gradient as a gradient description
-- (lucid.nn.containers.desc: pieces of sums of tensors / channel slices)
-- and read the sum where it needs it (lucid.nn.batchnorm2d_backward_terms;
-- engine/nn/nn.h lucid_nn_batchnorm2d_backward_terms): on the GPU the
-- one-pass kernel of one-part channels, the bits of the plain call on the
-- materialised sum. The engine decides per call and may decline (the CPU,
-- eval, multi-part channels, LUCID_BN_DY_TERMS=0): the caller then
-- materialises the description (containers.materialize) and takes the
-- plain call.

local NN -- lucid.nn (the binding), or false without it; on first use

-- The binding's function of this name, or false. Looked up on each call
-- (a rawget), so a spec may stand in for it (spec/bn_dy_terms_spec.lua).
local function nn_fn(name)
  if NN == nil then
    local ok, lucid = pcall(require, "lucid")
    NN = ok and type(lucid) == "table" and type(lucid.nn) == "table" and lucid.nn or false
  end
  return NN and rawget(NN, name) or false
end

-- bn's backward (act: the fused pair's) with dy the description d: taken,
-- gx (see P.bn_silu_backward_terms).
local function bn_terms(bn, act, x, d)
  local terms_bwd = nn_fn("batchnorm2d_backward_terms")
  if not terms_bwd or d.value ~= nil then return false end
  local containers = require("lucid.nn.containers")
  local taken, gx = terms_bwd(bn._c, act and act._c or nil, x, containers.engine_pieces(d))
  if not taken then return false end
  bn.grad_input = gx
  if act then act.grad_input = nil end
  return true, gx
end

--- P.bn_silu_backward(bn, act, x, dy) with dy given as the gradient
-- description d (after a fused forward): true and the gradient w.r.t. x
-- (bn.grad_input; parameter gradients accumulated as the plain call) when
-- the engine took it; false (nothing done) otherwise, or when d was
-- materialised already: materialise d and call P.bn_silu_backward.
-- @return boolean, Tensor|nil
function P.bn_silu_backward_terms(bn, act, x, d) return bn_terms(bn, act, x, d) end

--- bn:backward(x, dy) (after bn's own forward) with dy the description d;
-- as P.bn_silu_backward_terms. Only for bn exactly a materialised
-- BatchNorm2d with the Leaf backward (P.bn_terms_plain).
-- @return boolean, Tensor|nil
function P.bn_backward_terms(bn, x, d) return bn_terms(bn, nil, x, d) end

--- Whether the separate pair bn then act may read a description through
-- P.bn_backward_terms: bn exactly a materialised BatchNorm2d with the Leaf
-- backward, act exactly an Identity with Identity's backward (its
-- backward passes gy through, so bn's backward is the pair's).
-- @return boolean
function P.bn_terms_plain(bn, act)
  return getmetatable(bn) == BatchNorm2d and bn._c ~= nil and bn.backward == LEAF_BWD
    and getmetatable(act) == P.Identity and act.backward == P.Identity.backward
end

--- Whether the engine would take bn's backward with a description now for
-- input x (lucid.nn.batchnorm2d_terms_fit: the GPU's one-pass route, bn
-- training with its input gradient, LUCID_BN_DY_TERMS on; sources assumed
-- aligned). False without the binding or for an unmaterialised bn.
-- @return boolean
function P.bn_terms_fit(bn, x)
  local terms_fit = nn_fn("batchnorm2d_terms_fit")
  if not terms_fit or not bn._c then return false end
  return terms_fit(bn._c, x)
end

------------------------------ conv backward-data columns from the BatchNorm
-- In the Conv block (conv -> bn -> act) bn's backward produces the conv's
-- grad_output. On the GPU, when the conv's backward-data takes the im2col
-- route with a 3x3 kernel, stride 1, padding 1 (Cout*9 and H*W multiples
-- of 8) and bn's backward is one kernel (N*H*W <= 8192), that kernel also
-- writes the im2col columns of the gradient it produces, straight into the
-- conv's scratch, and the conv's backward-data skips its im2col: one kernel
-- less on the backward's critical path, the same bits (engine/nn/nn.h
-- lucid_conv_dcols). Off unless LUCID_BN_EMIT_COLS=1: measured slower on
-- the H200 (one block per channel writes the columns; session 11). The
-- engine decides per call (anything else, the CPU, or the switch not "1":
-- the plain calls); the
-- sequence is P.conv_dcols_reserve, then P.bn_backward_dcols or
-- P.bn_silu_backward_dcols, then conv:backward, with nothing in between.

local dcols_reserve, dcols_bn -- the binding's functions (false: absent), on first use

local function dcols_binding()
  dcols_reserve, dcols_bn = optional_nn("conv2d_dcols_reserve", "batchnorm2d_backward_dcols")
end

--- Whether the modules allow the columns: conv exactly a materialised
-- Conv2d with the Leaf backward (no override) of the one shape the engine
-- takes (3x3, stride 1, padding 1, dilation 1, groups 1, c2 a multiple of
-- 8: a shortcut, the engine checks again), and bn (nil for the fused pair,
-- whose route Conv:forward chose) exactly a materialised BatchNorm2d with
-- the Leaf backward.
-- @return boolean
function P.conv_dcols_allowed(conv, bn)
  if getmetatable(conv) ~= Conv2d or not conv._c or conv.backward ~= LEAF_BWD then return false end
  if conv.k ~= 3 or conv.s ~= 1 or conv.p ~= 1 or conv.d ~= 1 or conv.g ~= 1 or conv.c2 % 8 ~= 0 then
    return false
  end
  if bn ~= nil and (getmetatable(bn) ~= BatchNorm2d or not bn._c or bn.backward ~= LEAF_BWD) then
    return false
  end
  return true
end

--- Reserve conv's next backward-data columns for the BatchNorm backward
-- that produces its grad_output (x: conv's forward input), when
-- P.conv_dcols_allowed(conv, bn). Returns true when the engine reserved
-- them: the caller then runs P.bn_backward_dcols / P.bn_silu_backward_dcols
-- with conv, and then conv:backward, nothing else in between; false: the
-- plain calls.
-- @return boolean
function P.conv_dcols_reserve(conv, bn, x)
  if dcols_reserve == nil then dcols_binding() end
  if not (dcols_reserve and dcols_bn) or not P.conv_dcols_allowed(conv, bn) then return false end
  return dcols_reserve(conv._c, x)
end

--- bn:backward(x, gy) writing conv's reserved columns (after
-- P.conv_dcols_reserve(conv, bn, ...) returned true): the same gradient and
-- parameter-gradient accumulation; bn.grad_input is set.
function P.bn_backward_dcols(bn, x, gy, conv)
  local gx = dcols_bn(bn._c, nil, x, gy, conv._c)
  bn.grad_input = gx
  return gx
end

--- P.bn_silu_backward(bn, act, x, gy) writing conv's reserved columns
-- (after P.conv_dcols_reserve(conv, nil, ...) returned true).
function P.bn_silu_backward_dcols(bn, act, x, gy, conv)
  local gx = dcols_bn(bn._c, act._c, x, gy, conv._c)
  bn.grad_input, act.grad_input = gx, nil
  return gx
end

--------------------------------------------------------------- Identity
local Identity = util.class("Identity", Module)
P.Identity = Identity
function Identity.__init(self) Module.__init(self) end
Identity._args = sig("nn.Identity", {})
--- Returns x unchanged.
function Identity:forward(x) return x end
--- Returns gy unchanged.
function Identity:backward(x, gy) return gy end

-------------------------------------------------------------- MaxPool2d
local MaxPool2d = util.class("MaxPool2d", Leaf)
P.MaxPool2d = MaxPool2d
--- nn.MaxPool2d(k, s, p): window k, stride s (default k), padding p (0).
function MaxPool2d.__init(self, k, s, p)
  Leaf.__init(self)
  self.k, self.s, self.p = k, s or k, p or 0
end
MaxPool2d._args = sig("nn.MaxPool2d", {
  { "k", "int", min = 1 }, { "s", "int", min = 1, opt = true }, { "p", "int", min = 0, opt = true },
}, function(k, s, p)
  if p and 2 * p > k then return "p", string.format("padding %d must be at most k/2 (k = %d)", p, k) end
end)
function MaxPool2d:_make(C, set, prefix, ctx) return C.maxpool2d(self.k, self.s, self.p, { ctx = ctx }) end
function MaxPool2d:extra_repr()
  return string.format("kernel_size=%d, stride=%d, padding=%d, dilation=1, ceil_mode=False",
    self.k, self.s, self.p)
end

--------------------------------------------------------------- Upsample
local Upsample = util.class("Upsample", Leaf)
P.Upsample = Upsample
--- nn.Upsample(None, scale, "nearest"): integer nearest upsampling.
function Upsample.__init(self, scale)
  Leaf.__init(self)
  self.scale = scale or 2
end
Upsample._args = sig("nn.Upsample", { { "scale", "int", min = 1, opt = true } })
function Upsample:_make(C, set, prefix, ctx) return C.upsample(self.scale, { ctx = ctx }) end
function Upsample:extra_repr()
  return string.format("scale_factor=%.1f, mode='nearest'", self.scale)
end

------------------------------------------------------- helper primitives
-- Stateless helpers used inside composite blocks (registered with
-- Module:helper, never printed).

local Concat = util.class("Concat", Leaf)
P.Concat = Concat
--- nn.Concat(n, dim=1): concatenation of n inputs along channels.
-- Unlike Ultralytics' Concat(dimension), whose one argument is the
-- dimension and which takes any number of inputs, lucid's first argument
-- is the NUMBER OF INPUTS (its C module is built for exactly n); the
-- dimension is the optional second argument and only 1 (channels, NCHW)
-- is supported. nn.Concat(1) (an Ultralytics habit, or a one-input
-- "concatenation") is refused at construction.
-- @param n integer 2..32: the number of inputs forward takes
-- @param dim integer|nil: 1 (the default; anything else is an error)
-- forward({x1, ..., xn}) -> [B, sum of C_i, H, W]; a list of another
-- length is an error naming n. backward gives the n input gradients.
function Concat.__init(self, n, dim)
  Leaf.__init(self)
  self.n, self.d = n, dim or 1
end
Concat._args = sig("nn.Concat", {
  { "n", "int", min = 2, max = 32, what = "the number of inputs; unlike Ultralytics' Concat(dimension), the "
    .. "dimension is the second argument: nn.Concat(n, 1)" },
  { "dim", "int", min = 1, opt = true },
}, function(n, dim)
  if dim and dim ~= 1 then return "dim", "only dim 1 (channels) is supported, got " .. dim end
end)
function Concat:_make(C, set, prefix, ctx) return C.concat(self.n, { ctx = ctx }) end

--- forward({x1, ..., xn}): the list must hold exactly the n inputs the
-- module was built for.
function Concat:forward(x)
  if type(x) ~= "table" or getmetatable(x) ~= nil or #x ~= self.n then
    error(string.format("nn.Concat:forward: bad argument #1 (x): expected a list of %d tensors (this nn.Concat(%d) "
      .. "concatenates %d inputs), got %s", self.n, self.n, self.n,
      (type(x) == "table" and getmetatable(x) == nil) and "a list of " .. #x or util.describe(x)), 2)
  end
  return Leaf.forward(self, x)
end

local Split = util.class("Split", Leaf)
P.Split = Split
--- Split along channels into pieces of `sizes` channels (nil: n equal
-- chunks, torch.chunk). forward(x) -> {y1..yn}.
function Split.__init(self, n, sizes)
  Leaf.__init(self)
  self.n, self.sizes = n, sizes
end
Split._args = sig("nn.Split", {
  { "n", "int", min = 1, max = 32 }, { "sizes", "ints", lo = 1, hi = 32, min = 1, opt = true },
}, function(n, sizes)
  if sizes and #sizes ~= n then
    return "sizes", string.format("expected %d entries (one per piece), got %d", n, #sizes)
  end
end)
function Split:_make(C, set, prefix, ctx) return C.split(self.n, self.sizes, { ctx = ctx }) end

local Add = util.class("Add", Leaf)
P.Add = Add
--- y = a + b: forward({a, b}); backward gives {gy, gy}.
function Add.__init(self) Leaf.__init(self) end
Add._args = sig("nn.Add", {})
function Add:_make(C, set, prefix, ctx) return C.add({ ctx = ctx }) end

local Softmax = util.class("Softmax", Leaf)
P.Softmax = Softmax
--- Softmax over the last dim.
function Softmax.__init(self) Leaf.__init(self) end
Softmax._args = sig("nn.Softmax", {})
function Softmax:_make(C, set, prefix, ctx) return C.softmax({ ctx = ctx }) end

local MatMul = util.class("MatMul", Leaf)
P.MatMul = MatMul
--- y = alpha * op(a) @ op(b) over batched [.., M, K] x [.., K, N].
function MatMul.__init(self, trans_a, trans_b, alpha)
  Leaf.__init(self)
  self.ta, self.tb, self.alpha = trans_a and true or false, trans_b and true or false, alpha or 1
end
MatMul._args = sig("nn.MatMul", {
  { "trans_a", "boolean", opt = true }, { "trans_b", "boolean", opt = true }, { "alpha", "number", opt = true },
})
function MatMul:_make(C, set, prefix, ctx) return C.matmul(self.ta, self.tb, self.alpha, { ctx = ctx }) end

return P
