-- bn_unroll_child.lua — the child process of spec/bn_unroll_gpu_spec.lua:
-- BatchNorm2d (plain and fused with SiLU) forward and backward in training
-- mode on CUDA, bf16 and f32, for channels of 52, 16 and 4 parts (the
-- two-launch route; 1-part channels too when the parent sets
-- LUCID_BN_ONEPASS=0) and of one part, plus the bias gradient of a 1x1
-- Conv2d with bias (the per-channel sum, bn_grad_partial without x). One
-- line per case: the FNV-1a hashes (lucid.hash_tensor) of every result (the
-- output, the input gradient, the parameter gradients, the running
-- statistics). The parent runs it under several LUCID_BN_UNROLL values.
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
      assert(P.bn_silu_fusable(bn, act), "the pair must be fusable (LUCID_FUSE_BN_SILU=0 set?)")
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
  -- the conv bias gradient: the per-channel sum of dy over 4x64x80x80 (4 parts)
  local conv = P.Conv2d.new(16, 64, 1, 1, 0, 1, 1, true)
  nn.materialize(conv, { ctx = ctx, dtype = "f32" })
  local x = lucid.randn({ 4, 16, 80, 80 }, { ctx = ctx, dtype = dt })
  local gy = lucid.randn({ 4, 64, 80, 80 }, { ctx = ctx, dtype = dt })
  conv:forward(x)
  conv:backward(x, gy)
  local h = {}
  for _, p in ipairs(conv:parameters()) do h[#h + 1] = lucid.hash_tensor(p:grad()) end
  print(string.format("%s conv1x1+bias 4x16x80x80 %s", dt, table.concat(h, " ")))
end
