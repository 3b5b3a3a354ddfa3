-- bn_unroll_child.lua — the child process of spec/bn_unroll_gpu_spec.lua:
-- BatchNorm2d (+ SiLU, fused) forward and backward in training mode on CUDA
-- for shapes of 1, 4, 16 and 52 parts per channel and an odd one (the
-- scalar route), bf16 and f32, the plain and the fused module pair; prints
-- one line per case: the FNV-1a hashes (lucid.hash_tensor) of the output,
-- the input gradient, the weight and bias gradients and the running
-- statistics. The parent runs it under several LUCID_BN_UNROLL values.
local lucid = require "lucid"
local nn = require "lucid.nn"
local P = require "lucid.nn.prim"

local ctx = lucid.Context{ device = "cuda", seed = 11 }
local shapes = { { 4, 16, 320, 320 }, { 4, 64, 160, 160 }, { 4, 32, 80, 80 }, { 4, 8, 40, 40 }, { 2, 5, 100, 37 } }
for _, dt in ipairs({ "bf16", "f32" }) do
  for _, sh in ipairs(shapes) do
    for _, fused in ipairs({ false, true }) do
      local bn, act = nn.BatchNorm2d(sh[2]), nn.SiLU()
      nn.materialize(bn, { ctx = ctx, dtype = "f32" })
      nn.materialize(act, { ctx = ctx, dtype = "f32" })
      local w, b = bn:parameters()[1]:data(), bn:parameters()[2]:data()
      w:copy_(lucid.rand(w:shape(), { ctx = ctx }):add(0.5))
      b:copy_(lucid.rand(b:shape(), { ctx = ctx }):sub(0.5))
      local x = lucid.randn(sh, { ctx = ctx, dtype = dt }):mul(1.5):add(0.25)
      local gy = lucid.randn(sh, { ctx = ctx, dtype = dt })
      local y, gx
      assert(P.bn_silu_fusable(bn, act), "the pair must be fusable")
      if fused then
        y = P.bn_silu_forward(bn, act, x):clone()
        gx = P.bn_silu_backward(bn, act, x, gy):clone()
      else
        y = bn:forward(x):clone()
        gx = bn:backward(x, gy):clone()
      end
      local h = { lucid.hash_tensor(y), lucid.hash_tensor(gx) }
      for _, p in ipairs(bn:parameters()) do h[#h + 1] = lucid.hash_tensor(p:grad()) end
      for _, p in ipairs(bn:buffers()) do h[#h + 1] = lucid.hash_tensor(p:data()) end
      print(string.format("%s %s %s %s", dt, table.concat(sh, "x"), fused and "bn+silu" or "bn", table.concat(h, " ")))
    end
  end
end
