-- conv_wcols_spec.lua — the Conv2d column cache (engine/nn/nn.h
-- lucid_conv_wcols, DECISIONS 38): the filter gradient of a conv on the
-- im2col route multiplies the forward's columns instead of building them
-- again, and layer 0 (whose forward runs the small-channel kernels, which
-- build no columns) gets its columns built on a side lane during the
-- forward.
--
-- CPU part (make test): the Conv2d module's training forward passes the
-- cache to the engine, which the CPU table ignores: a forward, an
-- in-place write of the input, a second forward and a backward give the
-- gradients of a fresh module on the written input, bitwise (the module
-- plumbing of the cache changes nothing on the CPU).
-- GPU part (#gpu, make test-gpu): a YOLO11n-pose forward + backward (batch
-- 2, 128x128, the parameter-gradient lane on, as in a training step) in
-- bf16 with the cache off (lucid_cuda_nn_set_wcols(ctx, 1) through the
-- LuaJIT FFI: LUCID_WCOLS=0 for this context) and in modes 1, 2 and 3
-- (set_wcols 2, 3, 4): outputs and gradients the same bytes
-- (lucid.hash_tensor); im2col launches (lucid_cuda_conv_col_launch_count)
-- with the cache + the filter gradients that read cached columns
-- (lucid_cuda_conv_wcols_hit_count) = launches without it + the side
-- builds (lucid_cuda_conv_wcols_side_count), which are 1 per pass in mode 1
-- (layer 0), 3 in mode 2 (layer 0 and model.2's two small-channel
-- bottleneck convs) and 0 in mode 3; hits: every groups-1 spatial conv's
-- filter gradient but those of the small-channel forwards without a side
-- build (an input rewritten between forward and backward would show as a
-- missing hit). Recorded: the pass captured into a CUDA graph after an eager one
-- and replayed gives the cache-off bytes, with as many hits recorded as in
-- the eager pass.
local lucid = require "lucid"
local nn = require "lucid.nn"
local yolo11 = require "lucid.models.yolo11_pose"

describe("Conv2d column cache: the module on the CPU", function()
  it("forward, in-place write of x, forward, backward: a fresh module's gradients", function()
    lucid.manual_seed(7)
    local a, b = nn.Conv2d(8, 16, 3, 1, 1), nn.Conv2d(8, 16, 3, 1, 1)
    local sa, sb = nn.materialize(a), nn.materialize(b)
    b:parameters()[1]:data():copy_(a:parameters()[1]:data())
    local x = lucid.rand({ 2, 8, 12, 12 })
    sa:zero_grad()
    sb:zero_grad()
    a:forward(x)
    x:mul_(0.5) -- in place: the storage's version moves
    local ya = a:forward(x)
    local gy = lucid.rand(ya:shape())
    a:backward(x, gy)
    local yb = b:forward(x)
    b:backward(x, gy)
    assert.equal(lucid.hash_tensor(yb), lucid.hash_tensor(ya))
    assert.equal(lucid.hash_tensor(b:parameters()[1]:grad()), lucid.hash_tensor(a:parameters()[1]:grad()))
  end)
end)

-- the per-context switch and the counters, through the FFI
local function hooks()
  local lib, ffi = require("support.ffi_lib").lib_with("lucid_cuda_nn_set_wcols", {
    "int lucid_cuda_nn_set_wcols(void *ctx, int mode);"
      .. " unsigned long lucid_cuda_conv_wcols_hit_count(void);"
      .. " unsigned long lucid_cuda_conv_wcols_side_count(void);",
    "unsigned long lucid_cuda_conv_col_launch_count(void);",
  })
  if not lib then return nil end
  return {
    set = function(ctx, mode) return lib.lucid_cuda_nn_set_wcols(ffi.cast("void **", ctx)[0], mode) end,
    counts = function()
      return tonumber(lib.lucid_cuda_conv_col_launch_count()), tonumber(lib.lucid_cuda_conv_wcols_hit_count()),
        tonumber(lib.lucid_cuda_conv_wcols_side_count())
    end,
  }
end

local describe_gpu = lucid.cuda_available() and describe or pending
describe_gpu("Conv2d column cache on the GPU #gpu", function()
  local H, ctx
  setup(function()
    H = assert(hooks(), "the cuda test hooks are not reachable through the FFI")
    ctx = lucid.Context({ device = "cuda", seed = 13 })
  end)

  it("YOLO11n-pose bf16: the same bytes with the cache off and in every mode, eager and recorded", function()
    local m = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 }, device = "cuda", ctx = ctx })
    local o = { device = "cuda", dtype = "bf16", ctx = ctx }
    local x = lucid.rand({ 2, 3, 128, 128 }):to(o)
    local gy -- made in the first (eager) pass: nothing is allocated while recording
    local y
    local function pass()
      m:zero_grad()
      y = m:forward(x)
      if not gy then
        gy = {}
        for _, k in ipairs({ "boxes", "scores", "kpts" }) do gy[k] = lucid.ones(y[k]:shape(), o) * 0.01 end
      end
      ctx:grad_lane(true)
      local ok, err = pcall(m.backward, m, x, gy)
      ctx:grad_lane(false)
      if not ok then error(err, 0) end
    end
    local function digest()
      ctx:synchronize()
      local h = {}
      for _, k in ipairs({ "boxes", "scores", "kpts" }) do h[k] = lucid.hash_tensor(y[k]) end
      h.grads = lucid.hash_tensor(m.params:flat_grads())
      return h
    end
    local function counted()
      local c0, h0, s0 = H.counts()
      pass()
      local h = digest()
      local c1, h1, s1 = H.counts()
      return h, c1 - c0, h1 - h0, s1 - s0
    end
    -- the filter gradients on the im2col route: every groups-1 conv with a
    -- spatial kernel (at 128x128 every such plane is a multiple of 8)
    local nspatial = 0
    m:apply(function(c)
      if getmetatable(c).__name == "Conv2d" and c._c and c.k > 1 and c.g == 1 then nspatial = nspatial + 1 end
    end)
    H.set(ctx, 1)
    pass() -- warm-up (plans, scratch)
    local ref, col_off, hit_off, side_off = counted()
    assert.equal(0, hit_off)
    assert.equal(0, side_off)
    -- {set_wcols, side builds, hits}: the three small-channel forwards
    -- (layer 0, model.2's two bottleneck convs) build no columns unless a
    -- side build does; every other filter gradient reads the forward's
    for _, arm in ipairs({ { 2, 1, nspatial - 2 }, { 3, 3, nspatial }, { 4, 0, nspatial - 3 } }) do
      H.set(ctx, arm[1])
      pass() -- the caches' buffers
      -- x unchanged would keep an earlier mode's side-built columns of layer 0
      -- fresh (the same storage and version: valid bytes, counted as a hit);
      -- a version bump makes each arm count its own builds only
      x:mul_(1)
      local got, col, hit, side = counted()
      local what = ("mode %d: %d im2col, %d hits, %d side (off: %d im2col; %d spatial convs)"):format(arm[1] - 1,
        col, hit, side, col_off, nspatial)
      assert.same(ref, got, what)
      assert.equal(arm[2], side, what)
      assert.equal(arm[3], hit, what)
      assert.equal(col_off + side, col + hit, what)
    end
    -- recorded (mode 1, the default): the cache-off bytes
    H.set(ctx, 2)
    pass()
    local _, _, hit_eager = counted()
    local _, h0 = H.counts()
    lucid.graph.capture_begin(ctx)
    local ok, err = pcall(pass)
    if not ok then
      pcall(lucid.graph.capture_discard, ctx)
      error(err, 0)
    end
    local g = lucid.graph.capture_end(ctx)
    local _, h1 = H.counts()
    assert.equal(hit_eager, h1 - h0, "hits recorded")
    for _, k in ipairs({ "boxes", "scores", "kpts" }) do y[k]:fill_(0) end
    m:zero_grad()
    g:launch()
    assert.same(ref, digest())
    g:launch()
    assert.same(ref, digest())
    g:free()
    H.set(ctx, 0)
  end)
end)
