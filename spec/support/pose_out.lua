--- spec/support/pose_out.lua — hashing and gradients of the pose head's
-- outputs for the bitwise-equality specs.
--   KEYS                the head outputs compared: boxes, scores, kpts
--                       (feats left out)
--   hash(v, h)          lucid.hash_* of a tensor, a list of tensors or a
--                       head output table (keys in KEYS order), continuing h
--   grad_like(y, o, s)  a normal gradient shaped like y (tensor or head
--                       table), drawn after lucid.manual_seed(s), moved to o
--   snapshot(set)       a copy of every parameter and buffer of the ParamSet
--                       set; returns restore(), which copies them back
--   passes(m, x, o, set, gys, seed, check)
--                       two forward + backward passes of m on x, set (m's
--                       ParamSet) zeroed before each; gys[pass] the output
--                       gradient, grad_like(y, o, seed + pass) the first
--                       time, then reused; check(gx), when given, sees each
--                       input gradient. Returns the hashes of each pass's
--                       output, input gradient and parameter gradients,
--                       then of every parameter and buffer of set.
local lucid = require "lucid"

local M = { KEYS = { "boxes", "scores", "kpts" } }
local KEYS = M.KEYS

function M.hash(v, h)
  if v == nil then return lucid.hash_string("nil", h) end
  if lucid.is_tensor(v) then return lucid.hash_tensor(v, h) end
  if v[1] ~= nil then
    for _, t in ipairs(v) do h = M.hash(t, h) end
    return h
  end
  for _, k in ipairs(KEYS) do
    if v[k] ~= nil then h = lucid.hash_tensor(v[k], lucid.hash_string(k, h)) end
  end
  return h
end

function M.grad_like(y, o, seed)
  lucid.manual_seed(seed)
  if lucid.is_tensor(y) then return lucid.randn(y:shape()):to(o) end
  local g = {}
  for _, k in ipairs(KEYS) do
    if y[k] then g[k] = lucid.randn(y[k]:shape()):to(o) end
  end
  return g
end

function M.snapshot(set)
  local entries, start = set:list(), {}
  for i, e in ipairs(entries) do start[i] = e:data():clone() end
  return function()
    for i, e in ipairs(entries) do e:data():copy_(start[i]) end
  end
end

function M.passes(m, x, o, set, gys, seed, check)
  local h = {}
  for pass = 1, 2 do
    set:zero_grad()
    local y = m:forward(x)
    gys[pass] = gys[pass] or M.grad_like(y, o, seed + pass)
    local gx = m:backward(x, gys[pass])
    if check then check(gx) end
    h[#h + 1] = M.hash(y)
    h[#h + 1] = M.hash(gx)
    h[#h + 1] = M.hash(set:flat_grads())
  end
  local hs
  for _, e in ipairs(set:list()) do hs = lucid.hash_tensor(e:data(), hs) end
  h[#h + 1] = hs
  return h
end

return M
