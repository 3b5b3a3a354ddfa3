-- lucid.checkpoint: one atomic safetensors file with model, EMA, optimizer
-- state, parameter-block state and run metadata; validation on load;
-- kill-and-resume equals the uninterrupted run bitwise (CPU); truncated or
-- corrupt files give clear errors and never replace a good file.
local lucid = require("lucid")
local nn = require("lucid.nn")
local checkpoint = require("lucid.checkpoint")

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  assert(os.execute("mkdir -p '" .. d .. "'"))
  return d
end

local function read_all(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function write_all(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

local function listdir(d)
  local p = io.popen("ls -A '" .. d .. "'")
  local names = {}
  for line in p:lines() do names[#names + 1] = line end
  p:close()
  return names
end

local function flatten(t, out)
  out = out or {}
  if type(t) == "number" then out[#out + 1] = t; return out end
  for i = 1, #t do flatten(t[i], out) end
  return out
end

-- A small conv model with BN buffers, one optimizer step taken.
local function small_run(seed, width)
  lucid.manual_seed(seed or 3)
  local model = nn.Sequential({ nn.Conv(3, width or 4, 3, 2), nn.Conv(width or 4, 2, 1, 1) })
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

local function save_state(r, extra)
  local st = { model = r.set, optimizer = r.opt, ema = r.ema, epoch = 2, iteration = 17,
    last_opt_step = 16, data = { seed = 5, epoch = 2 }, config = { imgsz = 64, name = "t" },
    best_fitness = 0.125 }
  for k, v in pairs(extra or {}) do st[k] = v end
  return st
end

describe("checkpoint.save / checkpoint.load", function()
  local dir
  setup(function() dir = tmpdir() end)
  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)

  it("round-trips tensors and metadata", function()
    local r = small_run()
    local path = dir .. "/a.safetensors"
    local s0, o0 = lucid.rng_state()
    checkpoint.save(path, save_state(r))
    local ck = checkpoint.load(path)
    assert.equal(2, ck.epoch)
    assert.equal(17, ck.iteration)
    assert.equal(16, ck.last_opt_step)
    assert.equal(0.125, ck.best_fitness)
    assert.same({ seed = s0, offset = o0 }, ck.rng)
    assert.same({ seed = 5, epoch = 2 }, ck.data)
    assert.same({ imgsz = 64, name = "t" }, ck.config)
    assert.equal('{"imgsz":64,"name":"t"}', ck.config_json)
    assert.equal(lucid.version, ck.lucid_version)
    assert.truthy(ck.date:match("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%dZ$"))
    assert.equal("AdamW", ck.optimizer.name)
    assert.equal(1, ck.param_block.step)
    assert.equal(1, ck.ema.updates)
    -- model entries under the reference names, i64 counters included
    local p = r.set:find("0.conv.weight")
    assert.same(flatten(p:data():totable()), flatten(ck:tensor("0.conv.weight"):totable()))
    assert.equal("i64", ck:info("0.bn.num_batches_tracked").dtype)
    assert.is_not_nil(ck:info("ema.0.bn.running_var"))
    assert.is_not_nil(ck:info("optimizer.0.conv.weight.exp_avg_sq"))
    assert.is_nil(ck:info("ema.0.bn.num_batches_tracked"))
    ck:close()
  end)

  it("restores model, EMA, optimizer state, block state and RNG into a fresh run", function()
    local r = small_run()
    local path = dir .. "/b.safetensors"
    checkpoint.save(path, save_state(r))
    local s0, o0 = lucid.rng_state()
    local r2 = small_run(99) -- different init and one different step
    lucid.manual_seed(42)
    local ck = checkpoint.resume(path, { model = r2.set, optimizer = r2.opt, ema = r2.ema })
    assert.equal(17, ck.iteration)
    for _, e in ipairs(r.set:list()) do
      assert.same(flatten(e:data():totable()), flatten(r2.set:find(e.name):data():totable()), e.name)
    end
    assert.same(flatten(r.ema:flat():totable()), flatten(r2.ema:flat():totable()))
    assert.same(flatten(r.opt:state_tensors().exp_avg:totable()), flatten(r2.opt:state_tensors().exp_avg:totable()))
    assert.equal(1, r2.opt.block:state().step)
    assert.equal(1, r2.ema.updates)
    local s1, o1 = lucid.rng_state()
    assert.same({ s0, o0 }, { s1, o1 })
  end)

  it("validates every tensor before restoring anything (errors name the file and the tensor)", function()
    local r = small_run()
    local path = dir .. "/c.safetensors"
    checkpoint.save(path, save_state(r))
    local other = small_run(4, 6) -- width 6: different shapes
    local before = flatten(other.set:find("0.conv.weight"):data():totable())
    local ok, err = pcall(checkpoint.resume, path, { model = other.set, optimizer = other.opt, ema = other.ema })
    assert.is_false(ok)
    assert.truthy(err:find(path, 1, true))
    assert.truthy(err:find("tensor '0.conv.weight': shape [4, 3, 3, 3] in the file, [6, 3, 3, 3] in the model", 1, true))
    assert.truthy(err:find("nothing was restored", 1, true))
    assert.same(before, flatten(other.set:find("0.conv.weight"):data():totable()))
    -- wrong optimizer kind
    local r3 = small_run()
    local sgd = lucid.optim.SGD({ params = r3.set })
    ok, err = pcall(checkpoint.resume, path, { model = r3.set, optimizer = sgd })
    assert.is_false(ok)
    assert.truthy(err:find("optimizer is AdamW in the file, SGD in the run", 1, true))
  end)

  it("a truncated or corrupt file is a clear error; a non-checkpoint is refused", function()
    local r = small_run()
    local good = dir .. "/good.safetensors"
    checkpoint.save(good, save_state(r))
    local bytes = read_all(good)
    local trunc = dir .. "/trunc.safetensors"
    write_all(trunc, bytes:sub(1, math.floor(#bytes / 2)))
    local ok, err = pcall(checkpoint.load, trunc)
    assert.is_false(ok)
    assert.truthy(err:find("trunc.safetensors", 1, true))
    assert.truthy(err:find("lucid format", 1, true))
    local bad = dir .. "/bad.safetensors"
    write_all(bad, bytes:sub(1, 8) .. "#" .. bytes:sub(10))
    ok, err = pcall(checkpoint.load, bad)
    assert.is_false(ok)
    assert.truthy(err:find("bad.safetensors", 1, true))
    local plain = dir .. "/plain.safetensors"
    lucid.io.safetensors_save(plain, { { "x", lucid.zeros({ 2 }) } })
    ok, err = pcall(checkpoint.load, plain)
    assert.is_false(ok)
    assert.truthy(err:find("not a lucid checkpoint", 1, true))
    assert.equal(bytes, read_all(good))
  end)

  it("a failed save never replaces the good file and leaves no temporary file", function()
    local r = small_run()
    local d = tmpdir()
    local path = d .. "/last.safetensors"
    checkpoint.save(path, save_state(r))
    local bytes = read_all(path)
    r.opt:step()
    for _, stage in ipairs({ "open", "write", "fsync", "rename" }) do
      lucid._test.atomic_fail(stage)
      local ok, err = pcall(checkpoint.save, path, save_state(r, { iteration = 99 }))
      lucid._test.atomic_fail(nil)
      assert.is_false(ok, stage)
      assert.truthy(tostring(err):find("lucid io", 1, true), stage)
      assert.equal(bytes, read_all(path), stage)
      assert.same({ "last.safetensors" }, listdir(d), stage)
    end
    assert.equal(17, checkpoint.load(path).iteration)
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("rejects bad state fields by name", function()
    local r = small_run()
    local ok, err = pcall(checkpoint.save, dir .. "/x.safetensors", { model = r.set, epoch = 1.5 })
    assert.is_false(ok)
    assert.truthy(err:find("state.epoch: expected an integer", 1, true))
    ok, err = pcall(checkpoint.save, dir .. "/x.safetensors", { model = 3 })
    assert.truthy(err:find("state.model", 1, true))
    ok, err = pcall(checkpoint.save, dir .. "/x.safetensors", { model = r.set, config = "{not json" })
    assert.truthy(err:find("state.config: not valid JSON", 1, true))
  end)
end)

describe("kill-and-resume equals the uninterrupted run (bitwise, CPU)", function()
  local dir
  setup(function() dir = tmpdir() end)
  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)

  local function run(mode, optname, out, ckpt, N, k)
    local cmd = string.format("luajit spec/fixtures/ckpt_train.lua %s %s '%s' '%s' %d %d 2>&1; echo \"rc=$?\"",
      mode, optname, out, ckpt, N, k)
    local p = io.popen(cmd)
    local text = p:read("*a")
    p:close()
    return tonumber(text:match("rc=(%d+)%s*$")), text
  end

  for _, optname in ipairs({ "SGD", "AdamW", "MuSGD" }) do
    it(optname .. ": 12 iterations, checkpoint at 5, killed at 7, resumed", function()
      local full, res, ck = dir .. "/full_" .. optname, dir .. "/res_" .. optname, dir .. "/ck_" .. optname
      local rc, out = run("full", optname, full, ck, 12, 5)
      assert.equal(0, rc, out)
      rc, out = run("kill", optname, dir .. "/never", ck, 12, 5)
      assert.equal(3, rc, out)
      assert.is_nil(io.open(dir .. "/never"))
      rc, out = run("resume", optname, res, ck, 12, 5)
      assert.equal(0, rc, out)
      assert.is_true(read_all(full) == read_all(res), "resumed run differs from the uninterrupted run")
      -- negative control: without the generator state the run diverges
      rc, out = run("resume-norng", optname, res .. "_norng", ck, 12, 5)
      assert.equal(0, rc, out)
      assert.is_false(read_all(full) == read_all(res .. "_norng"))
    end)
  end
end)
