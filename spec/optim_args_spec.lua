-- optim_args_spec.lua — every numeric hyperparameter of the optimizers, the
-- EMA, the GradScaler, the clips, the parameter block and the schedule
-- helpers must be finite and in range: an Inf or NaN is a named argument
-- error, never a run whose parameters silently turn into NaN (the tryout:
-- AdamW{weight_decay = 1/0} and SGD{lr = 1/0} were accepted). Values staged
-- in f32 on the device must also fit in f32 (1e300 would become Inf there).
local lucid = require("lucid")
local nn = require("lucid.nn")

local inf, nan = 1 / 0, 0 / 0

local err_of = require("support.errors").err_of

local function has(e, s) assert.is_truthy(e:find(s, 1, true), e) end

describe("hyperparameters must be finite and in range", function()
  local set
  before_each(function() set = nn.materialize(nn.Sequential({ nn.Conv(3, 4, 3, 2) })) end)

  it("optimizer constructors: lr, weight_decay, eps, momentum, betas, MuSGD scales", function()
    has(err_of(lucid.optim.AdamW, { params = set, weight_decay = inf }),
      "lucid.optim.AdamW: bad argument #1 (weight_decay): expected a finite number >= 0")
    has(err_of(lucid.optim.SGD, { params = set, lr = inf }), "lucid.optim.SGD: bad argument #1 (lr): expected a "
      .. "finite number >= 0 (within the f32 range), got inf")
    has(err_of(lucid.optim.SGD, { params = set, lr = nan }), "(lr): expected a finite number >= 0")
    has(err_of(lucid.optim.SGD, { params = set, lr = 1e300 }), "got 1e+300")
    has(err_of(lucid.optim.SGD, { params = set, lr = -0.1 }), "(lr): expected a finite number >= 0")
    has(err_of(lucid.optim.SGD, { params = set, momentum = nan }), "(momentum): expected a number in [0, 1]")
    has(err_of(lucid.optim.AdamW, { params = set, eps = inf }), "(eps): expected a finite number >= 0")
    has(err_of(lucid.optim.AdamW, { params = set, momentum = 1 }), "(momentum): expected a number in [0, 1), got 1")
    has(err_of(lucid.optim.AdamW, { params = set, betas = { 0.9, nan } }), "(betas): expected values in [0, 1)")
    has(err_of(lucid.optim.AdamW, { params = set, betas = { inf, 0.999 } }), "(betas): expected values in [0, 1)")
    for _, k in ipairs({ "muon", "sgd", "head_lr_scale", "weight_decay", "lr" }) do
      has(err_of(lucid.optim.MuSGD, { params = set, [k] = inf }), "lucid.optim.MuSGD: bad argument #1 (" .. k .. ")")
    end
    has(err_of(lucid.optim.build, { model = set, lr0 = inf }), "(lr0): expected a finite number")
    has(err_of(lucid.optim.build, { model = set, decay = nan }), "(decay): expected a finite number")
    has(err_of(lucid.optim.build, { model = set, iterations = inf }), "(iterations): expected a finite number")
    has(err_of(lucid.optim.build, { model = set, nc = 0 }), "(nc): expected an integer >= 1")
    has(err_of(lucid.optim.build, { model = set, nc = inf }), "(nc): expected an integer >= 1")
    -- negative control: the reference defaults and ordinary values build
    lucid.optim.SGD({ params = set, lr = 0.01, momentum = 0.937, weight_decay = 5e-4 })
    lucid.optim.AdamW({ params = set, lr = 0.001, betas = { 0.9, 0.999 }, eps = 0, weight_decay = 0 })
    lucid.optim.MuSGD({ params = set })
    lucid.optim.build({ model = set, name = "auto", nc = 1, iterations = 20000 })
  end)

  it("optimizer methods and group fields", function()
    local opt = lucid.optim.SGD({ params = set })
    has(err_of(opt.set_lr_factor, opt, inf), "lucid.Optimizer:set_lr_factor: bad argument #1 (lf)")
    has(err_of(opt.warmup, opt, 1, 10, nan), "(lf): expected a finite number >= 0")
    has(err_of(opt.warmup, opt, 1, -1, 1), "(nw): expected an integer >= 0")
    has(err_of(opt.warmup, opt, 1, 10, 1, { warmup_bias_lr = inf }), "(warmup_bias_lr): expected a finite number")
    has(err_of(opt.warmup, opt, 1, 10, 1, { warmup_momentum = 1.5 }), "(warmup_momentum): expected a number in [0, 1]")
    has(err_of(opt.step_fused, opt, { max_norm = inf }), "(max_norm): expected a finite number >= 0")
    has(err_of(opt.step_fused, opt, { clip_value = nan }), "(clip_value): expected a finite number >= 0")
    local g = opt.param_groups[1]
    has(err_of(function() g.lr = inf end), "setting 'lr': expected a finite number >= 0")
    has(err_of(function() g.weight_decay = nan end), "setting 'weight_decay': expected a finite number >= 0")
    has(err_of(function() g.initial_lr = -1 end), "setting 'initial_lr': expected a finite number >= 0")
    has(err_of(function() g.momentum = 2 end), "setting 'momentum': expected a number in [0, 1], got 2")
    local a = lucid.optim.AdamW({ params = set })
    local ga = a.param_groups[1]
    has(err_of(function() ga.betas = { 0.9, inf } end), "setting 'betas': expected values in [0, 1)")
    -- negative control
    opt:set_lr_factor(0.5)
    opt:warmup(1, 10, 1, { warmup_bias_lr = 0.1, warmup_momentum = 0.8, momentum = 0.937 })
    g.lr, g.momentum, g.weight_decay = 0.02, 0.9, 1e-4
    ga.betas = { 0.8, 0.99 }
    assert.near(0.02, g.lr, 1e-9)
    opt:step_fused({ max_norm = 10, clip_value = 0 })
  end)

  it("clips, EMA and GradScaler", function()
    has(err_of(lucid.optim.clip_grad_norm, set, inf), "lucid.optim.clip_grad_norm: bad argument #2 (max_norm)")
    has(err_of(lucid.optim.clip_grad_value, set, -1),
      "(clip_value): expected a finite number >= 0 (within the f32 range), got -1")
    has(err_of(lucid.EMA, { model = set, decay = nan }), "lucid.EMA: bad argument #1 (decay): expected a number in [0, 1]")
    has(err_of(lucid.EMA, { model = set, tau = inf }), "(tau): expected a finite number > 0, got inf")
    has(err_of(lucid.EMA, { model = set, tau = 0 }), "(tau): expected a finite number > 0, got 0")
    local ema = lucid.EMA({ model = set })
    has(err_of(function() ema.decay = inf end), "setting 'decay': expected a number in [0, 1]")
    has(err_of(function() ema.tau = nan end), "setting 'tau': expected a finite number > 0")
    has(err_of(lucid.amp.GradScaler, { init_scale = inf }), "(init_scale): expected a finite number > 0")
    has(err_of(lucid.amp.GradScaler, { growth_factor = inf }), "(growth_factor): expected a finite number >= 1")
    has(err_of(lucid.amp.GradScaler, { backoff_factor = 0 }), "(backoff_factor): expected a number in (0, 1]")
    has(err_of(lucid.amp.GradScaler, { growth_interval = inf }), "(growth_interval): expected a number in [1, ")
    -- negative control
    lucid.optim.clip_grad_norm(set, 10)
    lucid.optim.clip_grad_value(set, 0.5)
    ema.decay, ema.tau = 0.999, 100
    lucid.amp.GradScaler({ init_scale = 1024, growth_factor = 2, backoff_factor = 0.5, growth_interval = 10,
      enabled = false })
  end)

  it("parameter block fields and state", function()
    local pb = lucid.optim.ParamBlock()
    has(err_of(function() pb.eps = inf end), "lucid.ParamBlock: setting 'eps': expected a finite number >= 0")
    has(err_of(function() pb.beta2 = 1 end), "setting 'beta2': expected a number in [0, 1), got 1")
    has(err_of(function() pb.ema_tau = 0 end), "setting 'ema_tau': expected a finite number > 0")
    has(err_of(function() pb.clip_max_norm = nan end), "setting 'clip_max_norm': expected a finite number >= 0")
    has(err_of(function() pb.growth_interval = 0 end), "setting 'growth_interval': expected an integer in [1, ")
    has(err_of(function() pb.nesterov = 2 end), "setting 'nesterov': expected an integer in [0, 1], got 2")
    has(err_of(pb.set_state, pb, { loss_scale = inf }), "bad argument #1 (state.loss_scale): expected a finite number")
    has(err_of(pb.set_state, pb, { step = -1 }), "(state.step): expected an integer >= 0, got -1")
    has(err_of(pb.set_state, pb, { found_inf = 2 }), "(state.found_inf): expected an integer in [0, 1], got 2")
    has(err_of(pb.set_state, pb, { step = "x" }), "(state.step): expected a number, got string")
    -- negative control (a non-finite last norm is a record, accepted)
    pb.eps, pb.beta2, pb.nesterov, pb.growth_interval = 1e-7, 0.99, false, 100
    pb:set_state({ loss_scale = 1024, step = 3, found_inf = 1, grad_norm = nan })
    assert.equal(3, pb:state().step)
  end)

  it("schedule helpers", function()
    local S = lucid.optim.schedule
    has(err_of(S.lf, "linear", 1, 0, 0.01), "lucid.optim.schedule.lf: bad argument #3 (epochs): expected an integer in [1, ")
    has(err_of(S.lf, "cos", inf, 10, 0.01), "(epoch): expected a finite number >= 0")
    has(err_of(S.lf, "cos", 1, 10, nan), "(lrf): expected a finite number >= 0")
    has(err_of(S.weight_decay, inf, 16, 1, 64), "(weight_decay): expected a finite number >= 0")
    has(err_of(S.weight_decay, 5e-4, 16, 1, 0), "(nbs): expected an integer in [1, ")
    has(err_of(S.accumulate, 64, 0), "(batch): expected an integer in [1, ")
    has(err_of(S.warmup_iters, inf, 10, 100), "(warmup_epochs): expected a finite number >= 0")
    has(err_of(S.interp, nan, 0, 1, 0, 1), "(x): expected a finite number")
    has(err_of(S.interp, 0.5, 1, 0, 0, 1), "(x1): expected a finite number >= 1")
    has(err_of(S.warmup_lr, 1, 10, true, inf, 0.01, 1), "(warmup_bias_lr): expected a finite number >= 0")
    has(err_of(S.warmup_momentum, 1, 10, 0.8, inf), "(momentum): expected a number in [0, 1]")
    has(err_of(S.auto_optimizer, 1000, 16, 64, 10, 0), "(nc): expected an integer in [1, ")
    -- negative control: the reference values
    assert.equal(4, S.accumulate(64, 16))
    assert.near(0.901, S.lf("linear", 1, 10, 0.01), 1e-12)
    assert.near(1.0, S.interp(0.5, 0, 1, 0, 2), 1e-12)
    assert.near(0.0005, S.weight_decay(5e-4, 16, 4, 64), 1e-12)
  end)
end)
