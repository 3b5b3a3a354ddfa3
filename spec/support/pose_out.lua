--- spec/support/pose_out.lua — hashing and gradients of the pose head's
-- outputs for the bitwise-equality specs.
--   KEYS                the head outputs compared: boxes, scores, kpts
--                       (feats left out)
--   hash(v, h)          lucid.hash_* of a tensor, a list of tensors or a
--                       head output table (keys in KEYS order), continuing h
--   grad_like(y, o, s)  a normal gradient shaped like y (tensor or head
--                       table), drawn after lucid.manual_seed(s), moved to o
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

return M
