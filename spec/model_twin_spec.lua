-- model_twin_spec.lua — model:twin(ctx) (lua/lucid/model.lua; the
-- parameter set's alias, engine/nn/params.c lucid_param_set_alias): a second
-- YOLO11n-pose on another context with its own module state and the first
-- model's parameters, buffers and gradients (docs/PIPELINE.md, step 1). On
-- the CPU: the same values, the same flat buffers, each model's own
-- activations, backwards of both accumulating in order into the shared
-- gradients (bitwise what one model gives running both steps), forwards of
-- both updating the shared BatchNorm running statistics in order, and the
-- errors of a mismatched alias.
package.path = "spec/support/?.lua;" .. package.path
local lucid = require "lucid"
local H = require "step_harness"
local Model = require "lucid.model"

local S = 64

local function same(a, b) return lucid.hash_tensor(a) == lucid.hash_tensor(b) end

describe("model:twin", function()
  it("shares the parameters, buffers and gradients, not the activations; bitwise what one model gives", function()
    local c1 = lucid.Context{ device = "cpu", seed = 7 }
    local m = H.model(c1)
    local init = os.tmpname() .. ".safetensors"
    m:save(init)
    local c2 = lucid.Context{ device = "cpu", seed = 9 }
    local t = m:twin(c2)
    assert.are.equal(m.params:count(), t.params:count())
    assert.is_true(same(m.params:flat_params(), t.params:flat_params()))
    -- one storage: a write through the first is read through the twin
    local p1, p2 = m.params:get(1), t.params:get(1)
    assert.are.equal(p1.name, p2.name)
    local before = lucid.hash_tensor(p2:data())
    p1:data():mul_(1) -- a no-op write keeps the values
    assert.are.equal(before, lucid.hash_tensor(p2:data()))
    p1:data():mul_(2) -- exact, and undone exactly below
    assert.are_not.equal(before, lucid.hash_tensor(p2:data()))
    p1:data():mul_(0.5)
    assert.are.equal(before, lucid.hash_tensor(p2:data()))

    -- two steps: batch 1 through m, batch 2 through the twin
    local x1 = lucid.rand({ 2, 3, S, S }, { ctx = c1 })
    local x2 = lucid.rand({ 2, 3, S, S }, { ctx = c2 })
    m:zero_grad()
    local o1 = m:forward(x1)
    local o1_boxes = o1.boxes:clone()
    local gy1 = { boxes = o1.boxes:clone():fill_(0.01), scores = o1.scores:clone():fill_(-0.02),
      kpts = o1.kpts:clone():fill_(0.03) }
    m:backward(x1, gy1)
    local o2 = t:forward(x2)
    -- the first model's activations are untouched by the twin's forward
    assert.is_true(same(o1_boxes, m.output.boxes), "the twin wrote the first model's output")
    local gy2 = { boxes = o2.boxes:clone():fill_(-0.01), scores = o2.scores:clone():fill_(0.02),
      kpts = o2.kpts:clone():fill_(0.01) }
    t:backward(x2, gy2)

    -- reference: one model (same initial state) running both steps
    local c3 = lucid.Context{ device = "cpu", seed = 7 }
    local r = H.model(c3)
    r:load(init)
    r:zero_grad()
    local x1r, x2r = x1:to("cpu"), x2:to("cpu")
    r:forward(x1r)
    r:backward(x1r, gy1)
    local o2r = r:forward(x2r)
    assert.is_true(same(o2.boxes, o2r.boxes), "the twin's output differs from one model's")
    r:backward(x2r, gy2)
    assert.is_true(same(m.params:flat_grads(), r.params:flat_grads()), "accumulated gradients differ")
    assert.is_true(same(t.params:flat_grads(), r.params:flat_grads()))
    -- the BatchNorm running statistics were updated by both forwards, in order
    for i = 1, m.params:count() do
      local p = m.params:get(i)
      if p.kind == "buffer" then
        assert.is_true(same(p:data(), r.params:get(i):data()), p.name .. " differs")
      end
    end
    os.remove(init)
  end)

  it("outlives its source: the flat buffers stay while the twin lives", function()
    local c1 = lucid.Context{ device = "cpu", seed = 7 }
    local m = H.model(c1)
    local c2 = lucid.Context{ device = "cpu", seed = 9 }
    local t = m:twin(c2)
    local h = lucid.hash_tensor(t.params:flat_params())
    m, c1 = nil, nil
    for _ = 1, 6 do collectgarbage("collect") end
    local x = lucid.rand({ 1, 3, S, S }, { ctx = c2 })
    local out = t:forward(x)
    t:backward(x, { boxes = out.boxes:clone():fill_(0.01), scores = out.scores:clone():fill_(0.01),
      kpts = out.kpts:clone():fill_(0.01) })
    assert.are.equal(h, lucid.hash_tensor(t.params:flat_params()))
    assert.has_error(function() t.params:reset() end)
  end)

  it("copies every module's mode; an alias of another table or with a device is refused", function()
    local c1 = lucid.Context{ device = "cpu", seed = 7 }
    local m = H.model(c1)
    m:eval()
    local t = m:twin(c1)
    assert.is_false(t.training)
    -- a frozen BatchNorm inside a training model stays frozen in the twin
    m:train()
    m.layers[2].module:eval()
    local t2 = m:twin(c1)
    assert.is_true(t2.training)
    assert.is_false(t2.layers[2].module.training)
    assert.is_false(t2.layers[2].module.bn.training)
    assert.is_true(t2.layers[3].module.training)
    assert.has_error(function() require("lucid.nn").materialize(require("lucid.nn").Conv(3, 4, 1), { alias = m }) end,
      "nn.materialize: opts.alias: expected a lucid.ParamSet, got " .. require("lucid.nn.util").describe(m))
    local other = require("lucid.models.yolo11_pose"){ scale = "s", nc = 1, kpt_shape = { H.K, 3 }, ctx = c1,
      materialize = false }
    assert.has_error(function() other:materialize({ alias = m }) end)
    local ok, err = pcall(function() other:materialize({ alias = m }) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("differs from the source's", 1, true) or tostring(err):find("entries, the source has", 1, true), err)
    local same_cfg = require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { H.K, 3 }, ctx = c1,
      materialize = false }
    assert.has_error(function() same_cfg:materialize({ alias = m, device = "cpu" }) end,
      "nn.materialize: opts.alias takes the source set's device and dtype: give neither")
    assert.has_error(function() same_cfg:materialize({ alias = "m" }) end)
    assert.has_error(function() Model.twin({}) end)
  end)
end)
