-- bn_unroll_gpu_spec.lua — LUCID_BN_UNROLL (cuda/nn_norm.cuh bn_unroll:
-- vectors per thread and round of the two-launch BatchNorm kernels) changes
-- registers and occupancy, never bits: BatchNorm2d and the fused
-- BatchNorm2d + SiLU, forward and backward in training mode, give the same
-- value bytes (output, input gradient, weight / bias gradients, running
-- statistics) with 1, 2 and 4, for channels of 1 to 52 parts and the scalar
-- route, bf16 and f32. The switch is read once per process, so each value
-- runs in a child process (spec/support/bn_unroll_child.lua). #gpu
local lucid = require "lucid"

local gpu = lucid.cuda_available and lucid.cuda_available()
local describe_gpu = gpu and describe or pending

local function run(u)
  local cmd = string.format("LUCID_BN_UNROLL=%s luajit spec/support/bn_unroll_child.lua 2>&1", u)
  local f = assert(io.popen(cmd))
  local out = f:read("*a")
  local ok, _, code = f:close()
  return out, ok == true or code == 0
end

describe_gpu("LUCID_BN_UNROLL #gpu", function()
  it("the BatchNorm kernels give the same bytes with 1, 2 and 4 vectors a round", function()
    local ref, ok = run(4)
    assert.is_true(ok, ref)
    local lines = select(2, ref:gsub("\n", "\n"))
    assert.are.equal(20, lines, ref) -- 2 dtypes x 5 shapes x (bn, bn+silu)
    for _, u in ipairs({ 2, 1 }) do
      local out, ok2 = run(u)
      assert.is_true(ok2, out)
      assert.are.equal(ref, out, "LUCID_BN_UNROLL=" .. u)
    end
  end)
end)
