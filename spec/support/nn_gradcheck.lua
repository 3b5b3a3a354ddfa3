--- Finite-difference gradient checks for Lua module compositions (float64,
-- CPU). The scalar probed is L = sum(y * r) for a fixed random r (r has the
-- structure of the output: a tensor, or a table of tensors by key), so
-- backward(x, r) must give dL/dx and dL/dparams.
local lucid = require("lucid")

local G = {}

--- sum(y * r) over a tensor or over the keys of r when r is a table.
function G.dot(y, r)
  if lucid.is_tensor(r) then return y:mul(r):sum():item() end
  local s = 0
  for k, rk in pairs(r) do s = s + y[k]:mul(rk):sum():item() end
  return s
end

--- Random tensor(s) shaped like y (f64).
function G.like(y)
  if lucid.is_tensor(y) then return lucid.randn(y:shape(), { dtype = "f64" }) end
  local r = {}
  for k, v in pairs(y) do if lucid.is_tensor(v) and k ~= "feats" then r[k] = G.like(v) end end
  return r
end

-- n indices spread over 1..numel (deterministic, distinct when possible).
local function pick(numel, n)
  local idx, seen = {}, {}
  if numel <= n then
    for i = 1, numel do idx[i] = i end
    return idx
  end
  local step = numel / n
  for k = 0, n - 1 do
    local i = math.floor(k * step + (k * 7919) % math.max(1, math.floor(step))) + 1
    if i > numel then i = numel end
    if not seen[i] then seen[i] = true; idx[#idx + 1] = i end
  end
  return idx
end

--- Compare analytic and numeric gradients.
-- @param spec table:
--   forward  function() -> y (runs the module on its current inputs)
--   backward function(r) runs the backward with output gradient r
--   zero     function() zeroes the parameter gradients (optional)
--   targets  list of {name=, value=Tensor (perturbed in place),
--            grad=function() -> Tensor (read after backward)}
--   n        elements probed per target (default 8), eps (1e-6)
-- @return worst relative error, and a report string naming the worst entry
function G.check(spec)
  local eps, n = spec.eps or 1e-6, spec.n or 8
  if spec.zero then spec.zero() end
  local y = spec.forward()
  local r = spec.r or G.like(y)
  spec.backward(r)
  local worst, where = 0, "none"
  for _, t in ipairs(spec.targets) do
    local g = t.grad():contiguous():view({ -1 })
    local v = t.value:view({ -1 })
    for _, i in ipairs(pick(v:numel(), n)) do
      local a = g[i]
      local old = v[i]
      v[i] = old + eps
      local lp = G.dot(spec.forward(), r)
      v[i] = old - eps
      local lm = G.dot(spec.forward(), r)
      v[i] = old
      local num = (lp - lm) / (2 * eps)
      local err = math.abs(a - num) / math.max(1, math.abs(a), math.abs(num))
      if err > worst then
        worst = err
        where = string.format("%s[%d]: analytic %.10g numeric %.10g", t.name, i, a, num)
      end
    end
  end
  return worst, where
end

--- Targets for a module: its input x and every trainable parameter (or the
-- first `max_params` of them).
function G.targets(module, x, gx_fn, max_params)
  local list = {}
  if x then list[1] = { name = "input", value = x, grad = gx_fn } end
  local ps = module:parameters()
  for i, p in ipairs(ps) do
    if max_params and #list > max_params then break end
    if p.trainable then
      list[#list + 1] = { name = p.name, value = p:data(), grad = function() return p:grad() end }
    end
  end
  return list
end

return G
