-- dy_terms_sim.lua — the GPU's choice of the BatchNorm backward that reads
-- its gradient as a sum of terms, simulated on the CPU, for the specs and
-- bench/count_sums.lua: which gradient descriptions the GPU would take
-- (lucid.nn.batchnorm2d_backward_terms; engine/nn/nn.h
-- lucid_nn_batchnorm2d_backward_terms) and so which copy / sum launches a
-- training step would not issue, counted without a GPU.
--
-- M.install(opts) stands in for lucid.nn.batchnorm2d_backward_terms and
-- lucid.nn.batchnorm2d_terms_fit (the Lua library looks them up on each
-- call): a call is "taken" when the CUDA slot would take it by its shape
-- rule — a training BatchNorm whose channels are ONE part of the
-- reduction partition (cuda/nn_norm.cuh bn_geom_of: N planes of S
-- elements, at most 8192 elements a part), f32/bf16/f16 — with S scaled by
-- opts.scale (so a small CPU image stands for the image size whose
-- geometry is counted: (640 / 64)^2 = 100 makes a 64 px run take the calls
-- of a 640 px one); the sources are assumed 16-byte aligned, as on the GPU.
-- A taken call materialises the description exactly as the engine defines
-- it (lucid.nn.chan_sum into a new tensor; opts.chan_sum and
-- opts.empty_like: uncounted ones) and runs the plain backward on it, so the values are the engine's
-- by definition; only the launches a GPU would not issue are not counted.
-- Returns remove() (restores the binding's functions) and stats {taken =,
-- declined =}.
local lucid = require "lucid"

local M = {}

--- Parts per channel of the BatchNorm partition for N planes of S
-- elements (cuda/nn_norm.cuh bn_geom_of).
function M.parts(N, S)
  local PART = 8192
  if S >= PART then
    local p0 = math.ceil(S / PART)
    local chunk = math.ceil(math.ceil(S / p0) / 8) * 8
    return N * math.ceil(S / chunk)
  end
  local pp = math.min(math.floor(PART / S), N)
  return math.ceil(N / pp)
end

local DTYPES = { f32 = true, bf16 = true, f16 = true }

function M.install(opts)
  opts = opts or {}
  local scale = opts.scale or 1
  local C = lucid.nn
  local real_bwd, real_fit = rawget(C, "batchnorm2d_backward_terms"), rawget(C, "batchnorm2d_terms_fit")
  local chan_sum = opts.chan_sum or rawget(C, "chan_sum")
  local empty_like = opts.empty_like or rawget(C, "empty_like")
  local stats = { taken = 0, declined = 0 }
  local function fits(bn_c, x)
    local sh = x:shape()
    return bn_c.training and DTYPES[x:dtype()] ~= nil and M.parts(sh[1], sh[3] * sh[4] * scale) == 1
  end
  rawset(C, "batchnorm2d_terms_fit", function(bn_c, x) return fits(bn_c, x) end)
  rawset(C, "batchnorm2d_backward_terms", function(bn_c, act_c, x, pieces)
    if not fits(bn_c, x) then
      stats.declined = stats.declined + 1
      return false
    end
    local dy = empty_like(x)
    local cp = {}
    for i, p in ipairs(pieces) do
      local q = { dy, p[1], p[2] }
      for k = 3, #p do q[#q + 1] = p[k] end
      cp[i] = q
    end
    chan_sum(cp)
    local gx
    if act_c then
      gx = C.batchnorm2d_silu_backward(bn_c, act_c, x, dy)
    else
      gx = bn_c:backward(x, dy)
    end
    stats.taken = stats.taken + 1
    return true, gx
  end)
  local function remove()
    rawset(C, "batchnorm2d_backward_terms", real_bwd)
    rawset(C, "batchnorm2d_terms_fit", real_fit)
  end
  return remove, stats
end

return M
