-- options_spec.lua — options tables and fixed argument sets refuse what
-- they do not know (a typo is an error naming the function, never a silent
-- default): the Lua library (nn.materialize, model:materialize, model:load,
-- predict.load_weights, checkpoint.load, ckpt:restore, trainer:fit,
-- trainer:add_callback) and the binding (ParamSet, set:declare,
-- set:materialize, io.safetensors_open, the methods of lucid.Optimizer,
-- lucid.EMA and lucid.GradScaler, opt:warmup's options).
local lucid = require("lucid")
local nn = require("lucid.nn")

-- the message of a non-tail call's error, checked to be raised at this file
local function err(f)
  local ok, e = pcall(f)
  assert.is_false(ok, "expected an error")
  e = tostring(e)
  assert.matches("^spec/options_spec%.lua:%d+: ", e)
  return (e:gsub("^[^:]*:%d+: ", ""))
end

describe("options tables refuse unknown keys", function()
  local model, set, path

  before_each(function()
    model = nn.Sequential({ nn.Conv(3, 4, 3, 2), nn.Conv(4, 2, 1) })
    set = nn.materialize(model)
    path = os.tmpname()
    model.params = set
    model.load = require("lucid.model_io").load -- what lucid.model's Model has
    require("lucid.model_io").save(model, path)
  end)

  after_each(function() os.remove(path) end)

  it("nn.materialize: unknown keys, a non-table and a non-module", function()
    local m = nn.Conv(3, 4, 1)
    assert.equal("nn.materialize: opts: unknown option 'typo' (expected one of ctx, device, dtype, prefix, alias)",
      err(function() local s = nn.materialize(m, { typo = 1 }); return s end))
    assert.equal("nn.materialize: opts: expected a table, got string 'f64'",
      err(function() local s = nn.materialize(m, "f64"); return s end))
    assert.equal("nn.materialize: bad argument module: expected an nn module, got 5",
      err(function() local s = nn.materialize(5); return s end))
    -- negative control: the known keys work, and the failed calls left m unmaterialised
    assert.equal("f64", nn.materialize(m, { dtype = "f64", prefix = "x" }):list()[1]:data():dtype())
  end)

  it("model:materialize, model:load and predict.load_weights", function()
    local build = require("lucid.models.yolo11_pose")
    local m = build({ scale = { 0.25, 0.125, 1024 }, nc = 1, materialize = false })
    assert.equal("model:materialize: opts: unknown option 'dtpye' (expected one of device, dtype, ctx, alias)",
      err(function() local s = m:materialize({ dtpye = "f64" }); return s end))
    local io_ = require("lucid.model_io")
    assert.equal("model:load: opts: unknown option 'strickt' (expected strict)",
      err(function() local r = io_.load(model, path, { strickt = false }); return r end))
    assert.equal("model:load: path: expected a string, got 5",
      err(function() local r = io_.load(model, 5); return r end))
    local predict = require("lucid.predict")
    assert.equal("predict.load_weights: opts: unknown option 'emma' (expected one of ema, partial)",
      err(function() local r = predict.load_weights(model, path, { emma = false }); return r end))
    -- negative controls
    assert.equal(#set:list(), io_.load(model, path, { strict = true }).loaded)
    assert.equal(#set:list(), predict.load_weights(model, path, { ema = false }).loaded)
    assert.is_truthy(m:materialize({ dtype = "f32" }))
  end)

  it("checkpoint.load and ckpt:restore", function()
    local checkpoint = require("lucid.checkpoint")
    local ck_path = os.tmpname()
    checkpoint.save(ck_path, { model = set, epoch = 0, iteration = 1, last_opt_step = 1 })
    assert.equal("checkpoint.load: opts: unknown option 'cxt' (expected ctx)",
      err(function() local c = checkpoint.load(ck_path, { cxt = 1 }); return c end))
    local ck = checkpoint.load(ck_path)
    assert.equal("ckpt:restore: targets: unknown option 'optimiser' (expected one of model, ema, optimizer, "
      .. "scaler, block, rng, ctx)", err(function() local r = ck:restore({ model = set, optimiser = 1 }); return r end))
    assert.is_truthy(ck:restore({ model = set, rng = false })) -- negative control
    ck:close()
    os.remove(ck_path)
  end)

  it("trainer:fit and trainer:add_callback", function()
    local Trainer = require("lucid.trainer")
    local project = os.tmpname()
    local tr = Trainer.new(require("spec.support.fit_cfg").cfg(project, {}))
    assert.equal("trainer:fit: opts: unknown option 'resum' (expected resume)",
      err(function() local r = tr:fit(model, { resum = true }); return r end))
    assert.equal("trainer:add_callback: opts: unknown option 'persist' (expected persistent)",
      err(function() local r = tr:add_callback("on_fit_end", function() end, { persist = true }); return r end))
    tr:add_callback("on_fit_end", function() end, { persistent = true }) -- negative control
    assert.is_false(tr.fitting or false)
    -- workers = 0 (batches made in the training thread) is a valid setting, -1 is not
    local c = require("spec.support.fit_cfg").cfg(project, { workers = 0 })
    Trainer.check_config(c)
    c.workers = -1
    local ok, e = pcall(Trainer.check_config, c)
    assert.is_false(ok)
    assert.equal("trainer: workers = -1: expected an integer >= 0", e)
    os.remove(project)
  end)

  it("the binding's options tables", function()
    assert.equal("lucid.nn.ParamSet: bad argument #1 (opts): unknown option 'cxt' (expected one of ctx)",
      err(function() local s = lucid.nn.ParamSet({ cxt = 1 }); return s end))
    local s = lucid.nn.ParamSet()
    assert.equal("lucid.ParamSet:declare: bad argument #4 (opts): unknown option 'trainabel' "
      .. "(expected one of dtype, trainable, group, init)",
      err(function() local p = s:declare("w", "param", { 2 }, { trainabel = false }); return p end))
    s:declare("w", "param", { 2 }, { trainable = false })
    assert.equal("lucid.ParamSet:materialize: bad argument #1 (opts): unknown option 'devise' "
      .. "(expected one of device, dtype, ctx)",
      err(function() local r = s:materialize({ devise = "cpu" }); return r end))
    assert.equal("lucid.ParamSet:materialize: bad argument #1 (opts): expected a table, got string",
      err(function() local r = s:materialize("cpu"); return r end))
    assert.is_truthy(s:materialize({ device = "cpu" }))
    assert.equal("lucid.io.safetensors_open: bad argument #2 (opts): unknown option 'ctxx' (expected one of ctx)",
      err(function() local f = lucid.io.safetensors_open(path, { ctxx = 1 }); return f end))
    lucid.io.safetensors_open(path, {}):close()
  end)
end)

describe("fixed argument sets refuse extra arguments", function()
  local set, opt, ema, scaler

  before_each(function()
    local m = nn.Sequential({ nn.Conv(3, 4, 3, 2) })
    set = nn.materialize(m)
    opt = lucid.optim.SGD({ params = set, lr = 0.01 })
    ema = lucid.EMA({ model = set, block = opt })
    scaler = lucid.amp.GradScaler({ enabled = false })
  end)

  it("opt:step('x') and the other optimizer, EMA and scaler methods", function()
    assert.equal("lucid.Optimizer:step: bad argument #1: expected no arguments, got 1 (extra: string 'x')",
      err(function() local r = opt:step("x"); return r end))
    assert.equal("lucid.Optimizer:zero_grad: bad argument #1: expected no arguments, got 1 (extra: boolean)",
      err(function() local r = opt:zero_grad(true); return r end))
    assert.equal("lucid.Optimizer:set_lr_factor: bad argument #2: expected at most 1 argument, got 2 (extra: 3)",
      err(function() local r = opt:set_lr_factor(0.5, 3); return r end))
    assert.equal("lucid.Optimizer:warmup: bad argument #4 (opts): unknown option 'warmup_bias' "
      .. "(expected one of warmup_bias_lr, warmup_momentum, momentum)",
      err(function() local r = opt:warmup(1, 10, 1, { warmup_bias = 0.1 }); return r end))
    assert.equal("lucid.EMA:update: bad argument #1: expected no arguments, got 1 (extra: lucid.Optimizer)",
      err(function() local r = ema:update(opt); return r end))
    assert.equal("lucid.EMA:flat: bad argument #2: expected at most 1 argument, got 2 (extra: string 'x')",
      err(function() local r = ema:flat("params", "x"); return r end))
    assert.equal("lucid.GradScaler:update: bad argument #1: expected no arguments, got 1 (extra: 1)",
      err(function() local r = scaler:update(1); return r end))
    assert.equal("lucid.GradScaler:step: bad argument #2: expected at most 1 argument, got 2 (extra: 2)",
      err(function() local r = scaler:step(opt, 2); return r end))
    -- negative controls: the calls as documented (a trailing nil is an absent argument)
    opt:zero_grad()
    opt:step()
    opt:step(nil)
    opt:set_lr_factor(0.5)
    opt:warmup(1, 10, 1, { warmup_bias_lr = 0.1 })
    ema:update()
    assert.is_truthy(ema:flat("params"))
    scaler:step(opt)
    scaler:update()
    assert.equal(1.0, scaler:get_scale())
  end)
end)
