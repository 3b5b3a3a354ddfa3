-- lucid.checkpoint: one atomic safetensors file with model, EMA, optimizer
-- state, parameter-block state and run metadata; validation on load;
-- kill-and-resume equals the uninterrupted run bitwise (CPU); truncated or
-- corrupt files give clear errors and never replace a good file.
local lucid = require("lucid")
local checkpoint = require("lucid.checkpoint")

local files = require "support.files"
local read_all, write_all, tmpdir, listdir, flatten = files.read, files.write, files.tmpdir, files.listdir, files.flatten

local run = require "support.ckpt_run"
local small_run = run.small_run
local function save_state(r, extra) return run.state(r, { imgsz = 64, name = "t" }, extra) end

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

  it("lucid.io.remove_stale_temps removes only the temporary files of that checkpoint name", function()
    local d = tmpdir()
    local keep = { "last.safetensors", ".last.safetensors.tmp", ".last.safetensors.tmp.abc", ".best.safetensors.tmp.Ab12Cd",
      ".last.safetensors.tmp.Ab12Cd.x", "x.last.safetensors.tmp.Ab12Cd" }
    local gone = { ".last.safetensors.tmp.Ab12Cd", ".last.safetensors.tmp.zzzzzz" }
    for _, f in ipairs(keep) do write_all(d .. "/" .. f, "k") end
    for _, f in ipairs(gone) do write_all(d .. "/" .. f, "g") end
    assert.are.equal(2, lucid.io.remove_stale_temps(d .. "/last.safetensors"))
    for _, f in ipairs(keep) do assert.is_not_nil(io.open(d .. "/" .. f, "rb"), f) end
    for _, f in ipairs(gone) do assert.is_nil(io.open(d .. "/" .. f, "rb"), f) end
    assert.are.equal(0, lucid.io.remove_stale_temps(d .. "/nosuch/last.safetensors")) -- no folder: nothing
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("a folder given as a checkpoint is named as a folder (was: out of memory reading 2^63 bytes)", function()
    local d = tmpdir()
    local ok, err = pcall(checkpoint.load, d)
    assert.is_false(ok)
    assert.truthy(tostring(err):find(d .. ": is a directory, not a safetensors file", 1, true), tostring(err))
    os.execute("rm -rf '" .. d .. "'")
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

-- The header of a safetensors file: its JSON (decoded) and the file offset
-- of the data section.
local cjson = require("cjson")
local function header_of(bytes)
  local n = 0
  for i = 8, 1, -1 do n = n * 256 + bytes:byte(i) end
  return cjson.decode(bytes:sub(9, 8 + n)), 8 + n
end

-- The file with its header text replaced by edit(json text) (padded to 8
-- bytes; a text edit, so the rest of the header stays byte for byte).
local function rewrite_header(bytes, edit)
  local _, off = header_of(bytes)
  local js = edit((bytes:sub(9, off):gsub(" +$", "")))
  js = js .. string.rep(" ", (8 - #js % 8) % 8)
  local len, n = {}, #js
  for i = 1, 8 do len[i] = string.char(n % 256); n = math.floor(n / 256) end
  return table.concat(len) .. js .. bytes:sub(off + 1)
end

-- The JSON text without the member "key":"<value matching vpat>" (the
-- comma on either side goes with it; metadata keys come in any order).
local function drop_member(js, key, vpat)
  local m = '"' .. key .. '":"' .. vpat .. '"'
  local out, n = js:gsub("," .. m, "", 1)
  if n == 0 then out, n = js:gsub(m .. ",", "", 1) end
  if n == 0 then out, n = js:gsub(m, "", 1) end
  assert(n == 1, "no member " .. key)
  return out
end

-- bytes with the byte at 0-based file offset k xor-ed with 0x01
local function flip(bytes, k)
  return bytes:sub(1, k) .. string.char(bit.bxor(bytes:byte(k + 1), 1)) .. bytes:sub(k + 2)
end

describe("checkpoint data checksums", function()
  local dir
  setup(function() dir = tmpdir() end)
  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)

  it("a saved checkpoint carries CRC-32s of its data and loads verified", function()
    local r = small_run()
    local path = dir .. "/ok.safetensors"
    checkpoint.save(path, save_state(r))
    local hdr = header_of(read_all(path))
    assert.matches("^%x%x%x%x%x%x%x%x$", hdr.__metadata__.data_crc32)
    local n = 0
    for _ in hdr.__metadata__.data_crc32_tensors:gmatch("%x+") do n = n + 1 end
    local ck = checkpoint.load(path)
    assert.equal(#ck.names, n) -- one per tensor
    assert.is_true(ck.checksummed)
    ck:close()
  end)

  it("one flipped bit in a tensor is a clear error naming the file, the tensor and its bytes", function()
    local r = small_run()
    local good = dir .. "/good.safetensors"
    checkpoint.save(good, save_state(r))
    local bytes = read_all(good)
    local hdr, off = header_of(bytes)
    local range = hdr["optimizer.0.conv.weight.exp_avg"].data_offsets
    local bad = dir .. "/flipped.safetensors"
    write_all(bad, flip(bytes, off + range[1] + 5))
    local ok, err = pcall(checkpoint.load, bad)
    assert.is_false(ok)
    assert.truthy(err:find("lucid format error: " .. bad .. ": checksum mismatch: tensor "
      .. "'optimizer.0.conv.weight.exp_avg' (bytes [" .. range[1] .. ", " .. range[2] .. ") of the data section, "
      .. "file offsets [" .. (off + range[1]) .. ", " .. (off + range[2]) .. "))", 1, true), err)
    -- resume refuses it before touching the targets
    local r2 = small_run(7)
    local before = flatten(r2.set:find("0.conv.weight"):data():totable())
    ok, err = pcall(checkpoint.resume, bad, { model = r2.set, optimizer = r2.opt, ema = r2.ema })
    assert.is_false(ok)
    assert.truthy(err:find("checksum mismatch", 1, true))
    assert.same(before, flatten(r2.set:find("0.conv.weight"):data():totable()))
    -- the good file is untouched and still loads
    assert.equal(bytes, read_all(good))
    checkpoint.load(good):close()
  end)

  it("a file without checksums (as PyTorch's safetensors writes it) loads unverified", function()
    local r = small_run()
    local path = dir .. "/c.safetensors"
    checkpoint.save(path, save_state(r))
    local plain = dir .. "/plain.safetensors"
    write_all(plain, rewrite_header(read_all(path), function(js)
      return drop_member(drop_member(drop_member(js, "data_crc32", "%x*"), "data_crc32_tensors", "[%x ]*"),
        "header_crc32", "%x*")
    end))
    local f = lucid.io.safetensors_open(plain)
    assert.is_false(f:checksummed())
    assert.is_nil(f:metadata().data_crc32)
    f:close()
    local ck = checkpoint.resume(plain, { model = small_run(9).set })
    assert.is_false(ck.checksummed)
    assert.equal(2, ck.epoch)
  end)

  it("a changed metadata value is caught by header_crc32 (a flipped best_fitness digit loaded before)", function()
    local r = small_run()
    local path = dir .. "/h.safetensors"
    checkpoint.save(path, save_state(r, { best_fitness = 0.000214 }))
    local bytes = read_all(path)
    local md = header_of(bytes).__metadata__
    assert.truthy(md.header_crc32 and #md.header_crc32 == 8)
    local at = bytes:find('"best_fitness":"', 1, true)
    assert.truthy(at)
    at = at + #'"best_fitness":"' -- the first digit of the value
    local d = bytes:sub(at, at)
    local edited = bytes:sub(1, at - 1) .. (d == "9" and "8" or "9") .. bytes:sub(at + 1)
    local bad = dir .. "/h_bad.safetensors"
    write_all(bad, edited)
    local ok, err = pcall(checkpoint.load, bad)
    assert.is_false(ok)
    assert.truthy(err:find(bad .. ": checksum mismatch: the header (file offsets [0, ", 1, true), err)
    checkpoint.load(path):close() -- the original still loads
  end)

  it("the checksum keys are reserved", function()
    local r = small_run()
    local ok, err = pcall(checkpoint.save, dir .. "/x.safetensors", save_state(r, { metadata = { data_crc32 = "0" } }))
    assert.is_false(ok)
    assert.truthy(err:find("metadata key 'data_crc32' is reserved", 1, true))
  end)
end)

describe("checkpoint epoch numbering", function()
  local dir
  setup(function() dir = tmpdir() end)
  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)

  it("epoch is the last completed epoch 0-based; epochs_completed and epochs say it 1-based", function()
    local r = small_run()
    local path = dir .. "/e.safetensors"
    -- the epoch the log shows as "3/10" is completed
    checkpoint.save(path, save_state(r, { epoch = 2, epochs = 10 }))
    local md = header_of(read_all(path)).__metadata__
    assert.equal("2", md.epoch)
    assert.equal("3", md.epochs_completed)
    assert.equal("10", md.epochs)
    local ck = checkpoint.load(path)
    assert.equal(2, ck.epoch)
    assert.equal(3, ck.epochs_completed)
    assert.equal(10, ck.epochs)
    ck:close()
    -- no epoch given: none completed (a resume starts at the first)
    checkpoint.save(path, { model = r.set })
    ck = checkpoint.load(path)
    assert.equal(-1, ck.epoch)
    assert.equal(0, ck.epochs_completed)
    assert.is_nil(ck.epochs)
    ck:close()
    local ok, err = pcall(checkpoint.save, path, { model = r.set, epoch = -2 })
    assert.is_false(ok)
    assert.truthy(err:find("state.epoch: expected the last completed epoch (0-based) or -1", 1, true))
  end)

  it("files written before epochs_completed derive it; inconsistent metadata is refused", function()
    local r = small_run()
    local path = dir .. "/o.safetensors"
    checkpoint.save(path, save_state(r, { epoch = 4 }))
    local bytes = read_all(path)
    local old = dir .. "/old.safetensors"
    -- (older files carry no header_crc32 either: an edited header with one is refused as corrupt)
    write_all(old, rewrite_header(bytes, function(js)
      return drop_member(drop_member(js, "epochs_completed", "%d+"), "header_crc32", "%x+")
    end))
    local ck = checkpoint.load(old)
    assert.equal(4, ck.epoch)
    assert.equal(5, ck.epochs_completed)
    ck:close()
    local bad = dir .. "/bad.safetensors"
    write_all(bad, rewrite_header(bytes, function(js)
      return drop_member((js:gsub('"epochs_completed":"5"', '"epochs_completed":"4"')), "header_crc32", "%x+")
    end))
    local ok, err = pcall(checkpoint.load, bad)
    assert.is_false(ok)
    assert.truthy(err:find("metadata epochs_completed = 4 but epoch = 4 (the last completed epoch, 0-based) says 5",
      1, true), err)
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
