-- bn_unroll_gpu_spec.lua — LUCID_BN_UNROLL (cuda/nn_norm.cuh bn_unroll:
-- vectors per thread and round of the two-launch BatchNorm kernels, and of
-- the conv bias gradient's per-channel sum) changes registers and
-- occupancy, never bits: BatchNorm2d and the fused BatchNorm2d + SiLU,
-- forward and backward in training mode, and a conv's bias gradient give the
-- same value bytes (outputs, input gradients, parameter gradients, running
-- statistics) with 1, 2 and 4, bf16 and f32, for channels of 4 to 52 parts,
-- and with LUCID_BN_ONEPASS=0 also for one-part channels. The switch is read
-- once per process, so each value runs in a child process
-- (spec/support/bn_unroll_child.lua), with the cooperative and cluster
-- routes off (they keep 4 and would take the multi-part channels). #gpu
local lucid = require "lucid"

local gpu = lucid.cuda_available and lucid.cuda_available()
local describe_gpu = gpu and describe or pending

-- the child's output and exit status under LUCID_BN_UNROLL=u (and env)
local function run(u, env)
  local cmd = string.format("env LUCID_BN_COOP=0 LUCID_BN_CLUSTER=0 LUCID_FUSE_BN_SILU=1 LUCID_BN_UNROLL=%s %s "
    .. "luajit spec/support/bn_unroll_child.lua 2>&1; echo \"rc=$?\"", u, env or "")
  local f = assert(io.popen(cmd))
  local out = f:read("*a")
  f:close()
  local body, rc = out:match("^(.*)rc=(%d+)%s*$")
  return body or out, tonumber(rc)
end

describe_gpu("LUCID_BN_UNROLL #gpu", function()
  for _, env in ipairs({ "", "LUCID_BN_ONEPASS=0" }) do
    it("the BatchNorm kernels give the same bytes with 1, 2 and 4 vectors a round" ..
      (env ~= "" and " (" .. env .. ")" or ""), function()
      local ref, rc = run(4, env)
      assert.are.equal(0, rc, ref)
      local lines = select(2, ref:gsub("\n", "\n"))
      assert.are.equal(22, lines, ref) -- 2 dtypes x (5 shapes x (bn, bn+silu) + the conv bias)
      for _, u in ipairs({ 2, 1 }) do
        local out, rc2 = run(u, env)
        assert.are.equal(0, rc2, out)
        assert.are.equal(ref, out, "LUCID_BN_UNROLL=" .. u)
      end
    end)
  end
end)
