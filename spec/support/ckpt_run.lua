-- Shared by the checkpoint specs (spec/checkpoint_spec.lua,
-- spec/checkpoint_async_spec.lua): a small conv model with BN buffers, an
-- AdamW optimizer and an EMA, one step taken, and a checkpoint state of it.
local lucid = require("lucid")
local nn = require("lucid.nn")
local M = {}

--- M.small_run(seed, width, out) -> {model, set, opt, ema}: Conv(3, width,
-- 3, 2) then Conv(width, out, 1, 1) (width 4, out 2 by default), seeded
-- (seed 3), one forward/backward on a 2x3x8x8 input, one AdamW step (lr
-- 0.01) and one EMA update.
function M.small_run(seed, width, out)
  lucid.manual_seed(seed or 3)
  local model = nn.Sequential({ nn.Conv(3, width or 4, 3, 2), nn.Conv(width or 4, out or 2, 1, 1) })
  local set = nn.materialize(model)
  local opt = lucid.optim.AdamW({ params = set, lr = 0.01 })
  local ema = lucid.EMA({ model = set, block = opt })
  local x = lucid.randn({ 2, 3, 8, 8 })
  local y = model:forward(x)
  model:backward(x, y)
  opt:step()
  ema:update()
  return { model = model, set = set, opt = opt, ema = ema }
end

--- M.state(r, config, extra) -> a checkpoint.save state of run r (epoch 2,
-- iteration 17, last_opt_step 16, best_fitness 0.125, the given config);
-- the keys of extra replace those.
function M.state(r, config, extra)
  local st = { model = r.set, optimizer = r.opt, ema = r.ema, epoch = 2, iteration = 17,
    last_opt_step = 16, data = { seed = 5, epoch = 2 }, config = config, best_fitness = 0.125 }
  for k, v in pairs(extra or {}) do st[k] = v end
  return st
end

return M
