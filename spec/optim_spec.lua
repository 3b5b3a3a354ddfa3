-- lucid.optim / lucid.EMA / lucid.amp from Lua (issue 6, Lua side):
-- optimizer steps against independent float64 arithmetic (several steps,
-- with state), Ultralytics parameter groups and the build rules (YOLO11n-pose
-- counts), schedule values, EMA including BN buffers, clipping, loss
-- scaling, misuse errors.
local lucid = require("lucid")
local S = lucid.optim.schedule

-- ---------------------------------------------------------------- helpers

local function flatten(t, out)
  out = out or {}
  if type(t) == "number" then out[#out + 1] = t; return out end
  for i = 1, #t do flatten(t[i], out) end
  return out
end

local function values(p) return flatten(p:data():totable()) end
local function grads(p) return flatten(p:grad():totable()) end

-- Set the tensor of a param (data or grad) from a flat list.
local function set_flat(t, list)
  local shape = t:shape()
  local src = lucid.tensor(list):view(#shape > 0 and shape or { 1 })
  if #shape == 0 then src = src:view({}) end
  t:copy_(src)
end

local function close(actual, expected, rtol, what)
  assert.equal(#expected, #actual, what .. ": length")
  for i = 1, #expected do
    local a, e = actual[i], expected[i]
    local tol = rtol * math.max(1, math.abs(e))
    if not (math.abs(a - e) <= tol) then
      error(string.format("%s[%d]: got %.9g, expected %.9g (tol %.3g)", what, i, a, e, tol), 2)
    end
  end
end

-- A small parameter set: w [2,3] (weight, decay), bn.weight [3] (norm),
-- b [3] (bias), bn.running_mean [3] (buffer).
local function small_set(extra)
  local s = lucid.nn.ParamSet()
  s:declare("w", "param", { 2, 3 }, { group = "decay" })
  s:declare("bn.weight", "param", { 3 }, { group = "norm" })
  s:declare("b", "param", { 3 }, { group = "bias" })
  s:declare("bn.running_mean", "buffer", { 3 })
  if extra then extra(s) end
  s:materialize()
  local init = { w = { 0.5, -0.25, 1.5, -2.0, 0.75, 0.125 }, ["bn.weight"] = { 1.0, 0.9, 1.1 },
    b = { 0.1, -0.2, 0.05 }, ["bn.running_mean"] = { 0.0, 0.5, -0.5 } }
  for name, v in pairs(init) do set_flat(s:find(name):data(), v) end
  return s
end

local GRADS = {
  { w = { 0.3, -0.1, 0.2, 0.05, -0.4, 0.6 }, ["bn.weight"] = { 0.01, -0.02, 0.03 }, b = { -0.5, 0.25, 0.1 } },
  { w = { -0.2, 0.15, 0.1, -0.3, 0.2, -0.1 }, ["bn.weight"] = { -0.04, 0.02, 0.0 }, b = { 0.3, -0.1, 0.2 } },
  { w = { 0.05, 0.05, -0.05, 0.4, 0.0, 0.1 }, ["bn.weight"] = { 0.02, 0.01, -0.01 }, b = { -0.1, 0.0, 0.4 } },
}
local NAMES = { "w", "bn.weight", "b" }
local KIND = { w = 1, ["bn.weight"] = 2, b = 3 } -- group index (weight, bn, bias)

local function load_grads(s, step)
  for _, n in ipairs(NAMES) do set_flat(s:find(n):grad(), GRADS[step][n]) end
end

local function ref_state(s)
  local r = {}
  for _, n in ipairs(NAMES) do
    r[n] = { p = values(s:find(n)), buf = {}, buf2 = {} }
    for i = 1, #r[n].p do r[n].buf[i] = 0; r[n].buf2[i] = 0 end
  end
  return r
end

-- Newton–Schulz 5 in float64 (reference §6), rows <= cols.
local function ns5(u, rows, cols)
  local norm = 0
  for i = 1, #u do norm = norm + u[i] * u[i] end
  norm = math.sqrt(norm) + 1e-7
  local X = {}
  for i = 1, #u do X[i] = u[i] / norm end
  local a, b, c = 3.4445, -4.7750, 2.0315
  local function at(M, r, cc, n) return M[(r - 1) * n + cc] end
  for _ = 1, 5 do
    local A = {}
    for i = 1, rows do for j = 1, rows do
      local s = 0
      for k = 1, cols do s = s + at(X, i, k, cols) * at(X, j, k, cols) end
      A[(i - 1) * rows + j] = s
    end end
    local B = {}
    for i = 1, rows do for j = 1, rows do
      local s = 0
      for k = 1, rows do s = s + at(A, i, k, rows) * at(A, k, j, rows) end
      B[(i - 1) * rows + j] = b * at(A, i, j, rows) + c * s
    end end
    local Y = {}
    for i = 1, rows do for j = 1, cols do
      local s = 0
      for k = 1, rows do s = s + at(B, i, k, rows) * at(X, k, j, cols) end
      Y[(i - 1) * cols + j] = a * at(X, i, j, cols) + s
    end end
    X = Y
  end
  return X
end

-- ------------------------------------------------------------ optimizers

describe("lucid.optim optimizers vs float64 references", function()
  it("SGD (Nesterov, L2 decay on the weight group) over 3 steps, lr changed through param_groups", function()
    local s = small_set()
    local opt = lucid.optim.SGD({ params = s, lr = 0.1, momentum = 0.9, nesterov = true, weight_decay = 0.01 })
    local r = ref_state(s)
    for step = 1, 3 do
      if step == 3 then for _, g in ipairs(opt.param_groups) do g.lr = 0.05 end end
      load_grads(s, step)
      opt:step()
      local lr = step == 3 and 0.05 or 0.1
      for _, n in ipairs(NAMES) do
        local st, wd = r[n], (n == "w") and 0.01 or 0
        for i = 1, #st.p do
          local d = GRADS[step][n][i] + wd * st.p[i]
          st.buf[i] = 0.9 * st.buf[i] + d
          st.p[i] = st.p[i] - lr * (d + 0.9 * st.buf[i])
        end
        close(values(s:find(n)), st.p, 1e-5, "SGD step " .. step .. " " .. n)
      end
    end
    assert.equal(3, opt.block:state().step)
    close(flatten(opt:state_tensors().momentum_buffer:narrow(1, 1, 6):totable()), r.w.buf, 1e-5, "momentum_buffer")
  end)

  it("AdamW (decoupled decay, bias correction) over 3 steps", function()
    local s = small_set()
    local opt = lucid.optim.AdamW({ params = s, lr = 0.01, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0.05 })
    assert.same({ 0.9, 0.999 }, { opt.param_groups[1].betas[1], opt.param_groups[1].betas[2] })
    assert.is_nil(opt.param_groups[1].momentum)
    local r = ref_state(s)
    for step = 1, 3 do
      load_grads(s, step)
      opt:step()
      for _, n in ipairs(NAMES) do
        local st, wd = r[n], (n == "w") and 0.05 or 0
        for i = 1, #st.p do
          local g = GRADS[step][n][i]
          st.p[i] = st.p[i] * (1 - 0.01 * wd)
          st.buf[i] = 0.9 * st.buf[i] + 0.1 * g
          st.buf2[i] = 0.999 * st.buf2[i] + 0.001 * g * g
          local den = math.sqrt(st.buf2[i]) / math.sqrt(1 - 0.999 ^ step) + 1e-8
          st.p[i] = st.p[i] - 0.01 / (1 - 0.9 ^ step) * st.buf[i] / den
        end
        close(values(s:find(n)), st.p, 2e-5, "AdamW step " .. step .. " " .. n)
      end
    end
  end)

  it("MuSGD (Muon on 2-D weights + Nesterov SGD; head cv3 at lr x 3) over 3 steps", function()
    local s = small_set(function(set)
      set:declare("cv3.weight", "param", { 2, 3 }, { group = "decay" })
    end)
    set_flat(s:find("cv3.weight"):data(), { 0.2, 0.1, -0.3, 0.4, -0.1, 0.25 })
    local opt = lucid.optim.MuSGD({ params = s, lr = 0.02, momentum = 0.9, weight_decay = 0.01 })
    opt.block.ns_bf16 = 0 -- f32 Newton–Schulz, comparable with float64
    assert.equal(6, #opt.param_groups)
    assert.equal("muon_head", opt.param_groups[4].name)
    assert.equal(1, opt.param_groups[4].params)
    assert.near(0.06, opt.param_groups[4].lr, 1e-12)
    local names = { "w", "bn.weight", "b", "cv3.weight" }
    local r = ref_state(s)
    r["cv3.weight"] = { p = values(s:find("cv3.weight")), buf = { 0, 0, 0, 0, 0, 0 }, buf2 = { 0, 0, 0, 0, 0, 0 } }
    for step = 1, 3 do
      load_grads(s, step)
      set_flat(s:find("cv3.weight"):grad(), GRADS[step].w)
      opt:step()
      for _, n in ipairs(names) do
        local st = r[n]
        local g = n == "cv3.weight" and GRADS[step].w or GRADS[step][n]
        if n == "w" or n == "cv3.weight" then
          local lr = n == "w" and 0.02 or 0.06
          local u = {}
          for i = 1, 6 do
            st.buf[i] = 0.9 * st.buf[i] + 0.1 * g[i]
            u[i] = 0.9 * st.buf[i] + 0.1 * g[i]
          end
          local O = ns5(u, 2, 3)
          for i = 1, 6 do
            st.p[i] = st.p[i] - lr * 0.2 * O[i]
            local d = g[i] + 0.01 * st.p[i]
            st.buf2[i] = 0.9 * st.buf2[i] + d
            st.p[i] = st.p[i] - lr * 1.0 * (d + 0.9 * st.buf2[i])
          end
          close(values(s:find(n)), st.p, 2e-4, "MuSGD step " .. step .. " " .. n)
        else
          for i = 1, #st.p do
            st.buf[i] = 0.9 * st.buf[i] + g[i]
            st.p[i] = st.p[i] - 0.02 * (g[i] + 0.9 * st.buf[i])
          end
          close(values(s:find(n)), st.p, 1e-5, "MuSGD step " .. step .. " " .. n)
        end
      end
    end
  end)

  it("leaves frozen parameters untouched and refuses a stale layout", function()
    local s = small_set()
    local opt = lucid.optim.SGD({ params = s, lr = 0.1 })
    load_grads(s, 1)
    local before = values(s:find("b"))
    s:find("b").trainable = false
    assert.has_error(function() opt:step() end, "optimizer: parameter 'b' was frozen after the optimizer was built; build a new one")
    local opt2 = lucid.optim.SGD({ params = s, lr = 0.1 })
    opt2:step()
    assert.same(before, values(s:find("b")))
    assert.equal(0, opt2.param_groups[3].trainable)
  end)

  it("zero_grad, state_tensors, state_views and staged hyperparameters", function()
    local s = small_set()
    local opt = lucid.optim.AdamW({ params = s })
    load_grads(s, 1)
    opt:zero_grad()
    assert.same({ 0, 0, 0, 0, 0, 0 }, grads(s:find("w")))
    local st = opt:state_tensors()
    assert.is_not_nil(st.exp_avg)
    assert.is_not_nil(st.exp_avg_sq)
    local views = opt:state_views()
    assert.equal(6, #views)
    assert.equal("w.exp_avg", views[1].name)
    assert.same({ 2, 3 }, views[1].tensor:shape())
    opt.param_groups[1].lr = 0.125
    assert.equal(0.125, opt.param_groups[1].lr)
    assert.not_equal(0.125, opt.block:read().inputs.lr[1]) -- not uploaded yet
    opt:upload()
    assert.equal(0.125, opt.block:read().inputs.lr[1])
    assert.equal(0.125, opt.block:read().inputs.lr[4]) -- head slot mirrors
  end)
end)

-- ------------------------------------------------------ groups and build

describe("lucid.optim.build (Ultralytics build_optimizer)", function()
  local yolo11 = require("lucid.models.yolo11_pose")
  local m
  setup(function()
    lucid.manual_seed(0)
    m = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 } })
  end)

  it("YOLO11n-pose AdamW groups: 87 bn, 97 weight (decay), 96 bias, as the reference log", function()
    local opt, info = lucid.optim.build({ model = m, name = "AdamW", lr0 = 0.002, momentum = 0.9, decay = 0.0005 })
    assert.equal("AdamW(lr=0.002, momentum=0.9) with parameter groups 87 weight(decay=0.0), "
      .. "97 weight(decay=0.0005), 96 bias(decay=0.0)", info.log)
    local g = opt.param_groups
    assert.same({ "weight", "bn", "bias" }, { g[1].name, g[2].name, g[3].name })
    assert.same({ 97, 87, 96 }, { g[1].params, g[2].params, g[3].params })
    assert.equal(96, g[1].trainable) -- the DFL projection is frozen
    assert.same({ 0.0005, 0, 0 }, { g[1].weight_decay, g[2].weight_decay, g[3].weight_decay })
    assert.equal(2874462, g[1].numel + g[2].numel + g[3].numel)
  end)

  it("auto: AdamW lr round(0.002*5/(4+nc), 6) for <= 10000 iterations, MuSGD(0.01, 0.9) above", function()
    local opt, info = lucid.optim.build({ model = m, name = "auto", iterations = 30, lr0 = 0.01, momentum = 0.937 })
    assert.equal("AdamW", opt.name)
    assert.equal(0.002, info.lr)
    assert.equal(0.9, info.momentum)
    assert.equal(0, info.warmup_bias_lr)
    local o2, i2 = lucid.optim.build({ model = m, name = "auto", iterations = 88500, nc = 80 })
    assert.equal("MuSGD", o2.name)
    assert.equal(0.01, i2.lr)
    assert.is_true(o2.nesterov)
    local _, i3 = lucid.optim.build({ model = m, name = "auto", iterations = 30, nc = 80 })
    assert.equal(0.000119, i3.lr)
  end)

  it("MuSGD: every group split, head (last layer cv3) groups at lr x 3", function()
    local opt = lucid.optim.build({ model = m, name = "MuSGD", lr0 = 0.01, momentum = 0.9, decay = 0.0005 })
    local g = opt.param_groups
    assert.equal(6, #g)
    local total, head = 0, 0
    for i = 1, 6 do
      total = total + g[i].params
      if g[i].head then
        head = head + g[i].params
        assert.near(0.03, g[i].lr, 1e-12)
        assert.near(0.03, g[i].initial_lr, 1e-12)
      end
    end
    assert.equal(280, total)
    -- cv3 of the Pose head: 3 levels x (DWConv, Conv, DWConv, Conv: weight +
    -- bn) + Conv2d(weight, bias) = 3 x 14 = 42
    assert.equal(42, head)
  end)

  it("rejects unknown optimizers and options by name", function()
    assert.has_error(function() lucid.optim.build({ model = m, name = "Lion" }) end)
    local ok, err = pcall(lucid.optim.build, { model = m, name = "Lion" })
    assert.is_false(ok)
    assert.truthy(err:find("(name): unknown optimizer 'Lion'", 1, true))
  end)
end)

-- ------------------------------------------------------------- schedules

describe("lucid.optim.schedule (reference §3.2-§3.4)", function()
  it("accumulate and scaled weight decay", function()
    assert.equal(4, S.accumulate(64, 16))
    assert.equal(21, S.accumulate(64, 3))
    assert.equal(16, S.accumulate(64, 4))
    assert.equal(1, S.accumulate(64, 128))   -- round(0.5) = 0 -> 1
    assert.near(0.0005, S.weight_decay(0.0005, 16, 4, 64), 1e-15)
    assert.near(0.0005, S.weight_decay(0.0005, 4, 16, 64), 1e-15)
  end)

  it("warmup iterations, interpolation and warmup values", function()
    assert.equal(105, S.warmup_iters(3.0, 10, 35))
    assert.equal(35, S.warmup_iters(3.0, 2, 35))
    assert.equal(0, S.warmup_iters(3.0, 1, 35))
    assert.near(0.055, S.warmup_lr(4, 8, true, 0.1, 0.01, 1.0), 1e-15)
    assert.near(0.005, S.warmup_lr(4, 8, false, 0.1, 0.01, 1.0), 1e-15)
    assert.near(0.8685, S.warmup_momentum(4, 8, 0.8, 0.937), 1e-15)
    assert.equal(7, S.warmup_accumulate(7, 8, 64, 8))
    assert.equal(4, S.warmup_accumulate(4, 8, 64, 8)) -- 4.5 rounds to even
    assert.is_true(S.in_warmup(8, 8))
    assert.is_false(S.in_warmup(9, 8))
    assert.equal(2.5, S.interp(5, 0, 10, 0, 5))
    assert.equal(5, S.interp(12, 0, 10, 0, 5))
  end)

  it("lr factors lf (linear and cosine)", function()
    assert.equal(1, S.lf("linear", 0, 100, 0.01))
    assert.near(0.505, S.lf("linear", 50, 100, 0.01), 1e-15)
    assert.near(0.01, S.lf("linear", 100, 100, 0.01), 1e-15)
    assert.near(0.505, S.lf("cos", 50, 100, 0.01), 1e-12)
    assert.near(0.01, S.lf(true, 100, 100, 0.01), 1e-12)
  end)

  it("auto optimizer rule", function()
    local name, lr, mom = S.auto_optimizer(137, 4, 64, 10, 1)
    assert.same({ "AdamW", 0.002, 0.9 }, { name, lr, mom })
    name, lr = S.auto_optimizer(56599, 16, 64, 100, 1)
    assert.same({ "MuSGD", 0.01 }, { name, lr })
  end)

  it("opt:warmup and opt:set_lr_factor drive the groups", function()
    local s = small_set()
    local opt = lucid.optim.SGD({ params = s, lr = 0.01, momentum = 0.937 })
    opt:warmup(4, 8, 1.0, { warmup_bias_lr = 0.1, warmup_momentum = 0.8, momentum = 0.937 })
    local g = opt.param_groups
    assert.near(0.005, g[1].lr, 1e-15)
    assert.near(0.055, g[3].lr, 1e-15)
    assert.near(0.8685, g[2].momentum, 1e-15)
    opt:set_lr_factor(0.5)
    assert.near(0.005, g[1].lr, 1e-15)
    assert.near(0.005, g[3].lr, 1e-15)
  end)
end)

-- ------------------------------------------------------------------- EMA

describe("lucid.EMA", function()
  it("follows d = decay*(1-exp(-u/tau)) over parameters and BN buffers", function()
    local s = small_set()
    local ema = lucid.EMA({ model = s, decay = 0.9999, tau = 2 })
    local names = { "w", "bn.weight", "b", "bn.running_mean" }
    local ref = {}
    for _, n in ipairs(names) do ref[n] = values(s:find(n)) end
    for u = 1, 3 do
      for _, n in ipairs(names) do
        local v = values(s:find(n))
        for i = 1, #v do v[i] = v[i] + 0.25 * u * ((i % 3) - 1) end
        set_flat(s:find(n):data(), v)
      end
      ema:update()
      local d = 0.9999 * (1 - math.exp(-u / 2))
      for _, n in ipairs(names) do
        local p = values(s:find(n))
        for i = 1, #p do ref[n][i] = ref[n][i] * d + (1 - d) * p[i] end
        close(flatten(ema:tensor(n):totable()), ref[n], 1e-6, "EMA update " .. u .. " " .. n)
      end
    end
    assert.equal(3, ema.updates)
    assert.is_nil(ema:tensor("nope"))
  end)

  it("swap exchanges model and EMA bitwise; copy_to copies", function()
    local s = small_set()
    local ema = lucid.EMA({ model = s, tau = 1 })
    set_flat(s:find("w"):data(), { 1, 2, 3, 4, 5, 6 })
    set_flat(s:find("bn.running_mean"):data(), { 7, 8, 9 })
    ema:update()
    local mw, ew = values(s:find("w")), flatten(ema:tensor("w"):totable())
    local mb, eb = values(s:find("bn.running_mean")), flatten(ema:tensor("bn.running_mean"):totable())
    ema:swap(s)
    assert.same(ew, values(s:find("w")))
    assert.same(eb, values(s:find("bn.running_mean")))
    assert.same(mw, flatten(ema:tensor("w"):totable()))
    ema:swap(s)
    assert.same(mw, values(s:find("w")))
    assert.same(mb, values(s:find("bn.running_mean")))
    ema:copy_to(s)
    assert.same(ew, values(s:find("w")))
  end)

  it("ema.updates is settable (resume) and shares the optimizer's block", function()
    local s = small_set()
    local opt = lucid.optim.SGD({ params = s })
    local ema = lucid.EMA({ model = s, block = opt })
    ema.updates = 41
    assert.equal(41, opt.block:state().ema_updates)
    ema:update()
    assert.equal(42, ema.updates)
  end)
end)

-- ----------------------------------------------------- clipping, scaling

describe("clipping and loss scaling from Lua", function()
  it("clip_grad_norm returns nothing; last_norm reads the pre-clip norm; coef applied", function()
    local s = small_set()
    local all = {}
    for step = 1, 1 do load_grads(s, step) end
    for _, n in ipairs(NAMES) do for _, g in ipairs(GRADS[1][n]) do all[#all + 1] = g end end
    local sq = 0
    for _, g in ipairs(all) do sq = sq + g * g end
    local norm = math.sqrt(sq)
    assert.equal(0, select("#", lucid.optim.clip_grad_norm(s, 0.5)))
    assert.near(norm, lucid.optim.last_norm(s), 1e-6)
    local coef = 0.5 / (norm + 1e-6)
    local exp = {}
    for i, g in ipairs(GRADS[1].w) do exp[i] = g * coef end
    close(grads(s:find("w")), exp, 1e-6, "clipped w")
  end)

  it("huge (1e20) and NaN gradients: non-finite norms are counted, as torch behaves", function()
    local s = small_set()
    local opt = lucid.optim.SGD({ params = s })
    load_grads(s, 1)
    set_flat(s:find("b"):grad(), { 1e20, 0, 0 })
    lucid.optim.clip_grad_norm(opt, 10)
    assert.equal(math.huge, opt:last_norm())
    assert.same({ 0, 0, 0, 0, 0, 0 }, grads(s:find("w"))) -- coef 0
    assert.equal(1, opt.block:state().nonfinite_norms)
    set_flat(s:find("b"):grad(), { 0 / 0, 0, 0 })
    lucid.optim.grad_norm(opt)
    local n = opt:last_norm()
    assert.is_true(n ~= n)
  end)

  it("clip_grad_value clamps", function()
    local s = small_set()
    load_grads(s, 1)
    lucid.optim.clip_grad_value(s, 0.1)
    assert.same({ -0.1, 0.1, 0.1 }, (function()
      local g = grads(s:find("b"))
      for i = 1, 3 do g[i] = math.floor(g[i] * 1e6 + 0.5) / 1e6 end
      return g
    end)())
  end)

  it("GradScaler: overflow skips the step and halves the scale; growth after the interval", function()
    local s = small_set()
    local opt = lucid.optim.SGD({ params = s, lr = 0.1 })
    local scaler = lucid.amp.GradScaler({ init_scale = 1024, growth_interval = 2, optimizer = opt })
    local loss = lucid.tensor({ 2.0 })
    scaler:scale(loss)
    assert.equal(2048, loss:totable()[1])
    local before = values(s:find("w"))
    load_grads(s, 1)
    set_flat(s:find("b"):grad(), { 1 / 0, 0, 0 })
    scaler:step(opt)
    scaler:update()
    assert.same(before, values(s:find("w")))
    assert.equal(512, scaler:get_scale())
    assert.equal(1, scaler:state().skipped_steps)
    for _ = 1, 2 do
      load_grads(s, 1)
      for _, n in ipairs(NAMES) do s:find(n):grad():mul_(512) end
      scaler:step(opt)
      scaler:update()
    end
    assert.equal(1024, scaler:get_scale())
    assert.equal(2, opt.block:state().step)
  end)
end)

-- ------------------------------------------------------------ fused step

describe("opt:step_fused (one engine call: unscale, clips, update, scaler update, EMA)", function()
  -- per step: the clipping policy and an injected gradient value
  local PLAN = {
    { clip = { max_norm = 0.5 } },                             -- coef < 1
    { clip = { max_norm = 10.0, value = 0.05 } },
    { clip = { max_norm = 1.0 }, inject = 1 / 0 },             -- overflow: skipped, scale halved
    { clip = { value = 0.1 } },
    { clip = {} },
    { clip = { max_norm = 1.0 }, inject = 1e20 },              -- huge but finite after unscale
  }

  local function stack(kind, own_ema_block)
    local s = small_set()
    local opt = lucid.optim[kind]({ params = s, lr = 0.05 })
    local scaler = lucid.amp.GradScaler({ init_scale = 1024, growth_interval = 2, optimizer = opt })
    local ema = lucid.EMA({ model = s, tau = 3, block = (not own_ema_block) and opt or nil })
    return { s = s, opt = opt, scaler = scaler, ema = ema }
  end

  -- the separate calls (the route the trainer took before the fused call)
  local function separate(st, c)
    st.scaler:unscale_(st.opt)
    if c.max_norm then lucid.optim.clip_grad_norm(st.opt, c.max_norm) end
    if c.value then lucid.optim.clip_grad_value(st.opt, c.value) end
    st.scaler:step(st.opt)
    st.scaler:update()
    st.ema:update()
  end

  local function fused(st, c)
    st.opt:step_fused{ scaler = st.scaler, max_norm = c.max_norm, clip_value = c.value, ema = st.ema }
  end

  -- the gradients of step k (scaled by the loss scale, as a backward would
  -- leave them) and new BN statistics (a forward in train mode)
  local function prepare(st, k)
    local p = PLAN[k]
    load_grads(st.s, (k - 1) % 3 + 1)
    for _, n in ipairs(NAMES) do st.s:find(n):grad():mul_(1024) end
    if p.inject then set_flat(st.s:find("b"):grad(), { p.inject, 0, 0 }) end
    set_flat(st.s:find("bn.running_mean"):data(), { 0.1 * k, -0.2 * k, 0.3 + k })
  end

  local FIELDS = { "step", "skipped_steps", "loss_scale", "growth_tracker", "found_inf", "nonfinite_norms",
    "grad_norm", "clip_coef", "ema_updates", "ema_d", "ema_1md" }

  local function same(a, b, what, skip)
    local function check(x, y, name)
      assert.are.equal(lucid.hash_tensor(x), lucid.hash_tensor(y), what .. ": " .. name)
    end
    check(a.s:flat_params(), b.s:flat_params(), "params")
    check(a.s:flat_grads(), b.s:flat_grads(), "grads")
    for k, t in pairs(a.opt:state_tensors()) do check(t, b.opt:state_tensors()[k], "state " .. k) end
    check(a.ema:flat(), b.ema:flat(), "EMA of the parameters")
    check(a.ema:flat("buffers"), b.ema:flat("buffers"), "EMA of the BN buffers")
    local sa, sb = a.opt.block:state(), b.opt.block:state()
    for _, f in ipairs(FIELDS) do
      if not (skip and skip[f]) then assert.are.equal(tostring(sa[f]), tostring(sb[f]), what .. ": block " .. f) end
    end
  end

  for _, kind in ipairs({ "SGD", "AdamW", "MuSGD" }) do
    it(kind .. ": bitwise equal to the separate calls over 6 steps (overflow, huge and clipped gradients); "
      .. "fused and separate EMA updates mix; an unscale_ before it is not repeated", function()
      local A, B, C = stack(kind), stack(kind), stack(kind)
      local D = stack(kind, true) -- EMA on its own block: updated after the step, same values
      for k = 1, #PLAN do
        for _, st in ipairs({ A, B, C, D }) do prepare(st, k) end
        local c = PLAN[k].clip
        separate(A, c)
        fused(B, c)
        if k % 2 == 1 then
          separate(C, c)
        else
          C.scaler:unscale_(C.opt) -- as before a user clip.fn
          fused(C, c)
        end
        fused(D, c)
        same(A, B, kind .. " step " .. k .. " fused")
        same(A, C, kind .. " step " .. k .. " mixed")
        same(A, D, kind .. " step " .. k .. " EMA on its own block", { ema_updates = true, ema_d = true, ema_1md = true })
        assert.are.equal(k, D.ema.updates)
      end
      local st = B.opt.block:state()
      assert.are.equal(1, st.skipped_steps)
      assert.are.equal(#PLAN - 1, st.step)
      assert.are.equal(#PLAN, st.ema_updates)
      assert.are.equal(1, st.nonfinite_norms)     -- the overflow step's norm
      assert.is_true(B.opt:last_norm() > 1e16)   -- pre-clip norm of the last step
      assert.are.equal(2048, B.scaler:get_scale()) -- x2 (steps 1-2), x0.5 (3), x2 (4-5)
    end)
  end

  it("zero_grad = true zeroes the gradients; no options is a plain update", function()
    local A, B = stack("SGD"), stack("SGD")
    for _, st in ipairs({ A, B }) do
      load_grads(st.s, 1)
      st.scaler = nil
    end
    A.opt:step()
    B.opt:step_fused()
    assert.are.equal(lucid.hash_tensor(A.s:flat_params()), lucid.hash_tensor(B.s:flat_params()))
    assert.are.equal(lucid.hash_tensor(A.s:flat_grads()), lucid.hash_tensor(B.s:flat_grads()))
    B.opt:step_fused{ max_norm = 1.0, zero_grad = true }
    for _, n in ipairs(NAMES) do
      for _, g in ipairs(grads(B.s:find(n))) do assert.equal(0, g) end
    end
  end)

  it("refuses unknown options and wrong types by name", function()
    local st = stack("SGD")
    local function err_of(o)
      local ok, e = pcall(st.opt.step_fused, st.opt, o)
      assert.is_false(ok)
      return tostring(e)
    end
    assert.truthy(err_of({ bogus = 1 }):find("unknown option 'bogus'", 1, true))
    assert.truthy(err_of({ max_norm = "a" }):find("lucid.Optimizer:step_fused: bad argument #1 (max_norm): "
      .. "expected a number, got string", 1, true))
    assert.truthy(err_of({ clip_value = {} }):find("(clip_value): expected a number", 1, true))
    assert.truthy(err_of({ ema = 5 }):find("(ema): expected lucid.EMA", 1, true))
    assert.truthy(err_of({ scaler = st.opt }):find("(scaler): expected lucid.GradScaler", 1, true))
    assert.truthy(err_of({ zero_grad = 1 }):find("(zero_grad): expected a boolean", 1, true))
    assert.truthy(err_of(5):find("(opts): expected a table", 1, true))
    local other = lucid.optim.SGD({ params = small_set() })
    local ok, e = pcall(other.step_fused, other, { scaler = st.scaler })
    assert.is_false(ok)
    assert.truthy(tostring(e):find("another parameter block", 1, true))
  end)
end)

-- ----------------------------------------------------------------- misuse

describe("misuse errors name the argument", function()
  local s = small_set()
  local function err_of(f, ...)
    local ok, e = pcall(f, ...)
    assert.is_false(ok)
    return tostring(e)
  end

  it("constructors", function()
    assert.truthy(err_of(lucid.optim.SGD, {}):find("(params): expected a model", 1, true))
    assert.truthy(err_of(lucid.optim.SGD, { params = s, lr = "x" }):find("(lr): expected a number, got string", 1, true))
    assert.truthy(err_of(lucid.optim.SGD, { params = s, lrr = 1 }):find("unknown option 'lrr'", 1, true))
    assert.truthy(err_of(lucid.optim.SGD, { params = 3 }):find("(params): expected a model or lucid.ParamSet, got number", 1, true))
    assert.truthy(err_of(lucid.optim.AdamW, { params = s, betas = { 0.9 } }):find("betas", 1, true))
    assert.truthy(err_of(lucid.EMA, { model = s, decay = 2 }):find("(decay): expected a number in", 1, true))
    local f64 = lucid.nn.ParamSet()
    f64:declare("w", "param", { 2 })
    f64:materialize({ dtype = "f64" })
    assert.truthy(err_of(lucid.optim.SGD, { params = f64 }):find("f32", 1, true))
  end)

  it("calls", function()
    local opt = lucid.optim.SGD({ params = s })
    assert.truthy(err_of(lucid.optim.clip_grad_norm, s, "a"):find("(max_norm): expected a number", 1, true))
    assert.truthy(err_of(lucid.optim.clip_grad_norm, {}, 1):find("model_or_opt", 1, true))
    assert.truthy(err_of(function() opt.param_groups[1].foo = 1 end):find("'foo' is not settable", 1, true))
    assert.truthy(err_of(function() opt.param_groups[1].betas = { 1, 2 } end):find("lucid.ParamGroup: setting 'betas': only AdamW", 1, true))
    assert.truthy(err_of(function() opt.block.nope = 1 end):find("'nope' is not settable", 1, true))
    local sc = lucid.amp.GradScaler()
    assert.equal(65536, sc:get_scale()) -- unbound: the initial scale
    assert.truthy(err_of(sc.state, sc):find("not bound to an optimizer", 1, true))
    assert.truthy(err_of(lucid.amp.GradScaler, 5):find("(opts): expected a table", 1, true))
    assert.truthy(err_of(sc.unscale_, sc, 5):find("(optimizer): expected lucid.Optimizer", 1, true))
  end)
end)
