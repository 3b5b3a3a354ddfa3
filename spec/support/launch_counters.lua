--- spec/support/launch_counters.lua — call counters of the copy / sum / add
-- launches a training step issues on the CPU engine: Tensor:add
-- (map_contig_kernel on the GPU), the Concat / Split / Add C modules
-- (chan_copy_multi, add_fwd / add_bwd), the fused primitives of the nn
-- binding (lucid.nn.chan_sum: chan_copy_multi / chan_sum_multi; add_n: one
-- launch), and lucid.nn.empty_like (sum buffers allocated).
-- install() -> counts, reset, remove, saved: counts[key] (add, chan_copy,
-- add_n, alloc, add_fwd, add_bwd) counts the calls since the last reset();
-- remove() puts every wrapped function back; saved holds the binding's own
-- chan_sum / add_n / empty_like, uncounted.
local lucid = require "lucid"
local nn = require "lucid.nn"

local M = {}

function M.install()
  local counts = {}
  local function bump(k) counts[k] = (counts[k] or 0) + 1 end
  local T = lucid.Tensor
  local add0 = T.add
  T.add = function(...) bump("add") return add0(...) end
  local c = nn.binding()
  local saved = {}
  for name, key in pairs({ chan_sum = "chan_copy", add_n = "add_n", empty_like = "alloc" }) do
    saved[name] = rawget(c, name)
    rawset(c, name, function(...) bump(key) return saved[name](...) end)
  end
  -- the CModule method table: the upvalue of its __index closure
  local probe = nn.Add()
  nn.materialize(probe)
  local _, methods = debug.getupvalue(getmetatable(probe._c).__index, 1)
  local fwd, bwd, kind = methods.forward, methods.backward, methods.kind
  local COPY = { Concat = true, Split = true }
  methods.forward = function(m, ...)
    local k = kind(m)
    if COPY[k] then bump("chan_copy") elseif k == "Add" then bump("add_fwd") end
    return fwd(m, ...)
  end
  methods.backward = function(m, ...)
    local k = kind(m)
    if COPY[k] then bump("chan_copy") elseif k == "Add" then bump("add_bwd") end
    return bwd(m, ...)
  end
  local function reset() for k in pairs(counts) do counts[k] = nil end end
  local function remove()
    T.add = add0
    for name, f in pairs(saved) do rawset(c, name, f) end
    methods.forward, methods.backward = fwd, bwd
  end
  return counts, reset, remove, saved
end

return M
