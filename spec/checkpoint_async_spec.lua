-- Background checkpoint writes (checkpoint.save with {async = true}; the
-- writer of engine/io/st_queue.h): the same bytes as a synchronous save;
-- one snapshot written to last and best as two identical, independent
-- files; loads, the next save and checkpoint.wait wait for pending writes;
-- a failed write surfaces there naming the file and is never lost; the
-- exit path waits; a SIGKILL during a write leaves the previous checkpoint;
-- a fit whose write fails raises.
local lucid = require("lucid")
local checkpoint = require("lucid.checkpoint")
local data = require("lucid.data")

local files = require "support.files"
local read_all, tmpdir, listdir, flatten = files.read, files.tmpdir, files.listdir, files.flatten

local run = require "support.ckpt_run"
local function small_run(seed) return run.small_run(seed, 8, 4) end
local function state(r, extra) return run.state(r, { imgsz = 64 }, extra) end

-- the metadata "date" has a one-second resolution: save both within one
local function same_second_pair(save_a, save_b, pa, pb)
  for _ = 1, 5 do
    save_a()
    save_b()
    local da = checkpoint.load(pa).date
    local db = checkpoint.load(pb).date
    if da == db then return true end
  end
  return false
end

describe("checkpoint.save {async = true}", function()
  local dir
  setup(function() dir = tmpdir() end)
  teardown(function()
    lucid._test.atomic_fail(nil)
    lucid._test.atomic_stall(nil)
    pcall(checkpoint.wait)
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("writes the same bytes as a synchronous save", function()
    local r = small_run()
    local a, b = dir .. "/sync.safetensors", dir .. "/async.safetensors"
    assert.is_true(same_second_pair(function() checkpoint.save(a, state(r)) end, function()
      checkpoint.save(b, state(r), { async = true })
      checkpoint.wait()
    end, a, b))
    assert.are.equal(0, checkpoint.pending())
    assert.is_true(read_all(a) == read_all(b), "async and sync files differ")
    local ck = checkpoint.load(b)
    assert.are.equal(17, ck.iteration)
    assert.is_true(ck.checksummed)
    ck:close()
  end)

  it("snapshots at the call: training on does not change what is written", function()
    local r = small_run()
    local path = dir .. "/snap.safetensors"
    local before = r.set:find("0.conv.weight"):data():clone()
    lucid._test.atomic_stall("write", 0.3) -- the write starts after the change below
    checkpoint.save(path, state(r), { async = true })
    r.set:find("0.conv.weight"):data():fill_(7)
    checkpoint.wait()
    lucid._test.atomic_stall(nil)
    local ck = checkpoint.load(path)
    assert.are.same(flatten(before:totable()), flatten(ck:tensor("0.conv.weight"):totable()))
    ck:close()
  end)

  it("load waits for a pending write of the same path; other paths do not wait", function()
    local r = small_run()
    local path = dir .. "/pending.safetensors"
    checkpoint.save(path, state(r))
    lucid._test.atomic_stall("fsync", 0.4)
    checkpoint.save(path, state(r, { iteration = 99 }), { async = true })
    assert.are.equal(1, checkpoint.pending())
    checkpoint.wait(dir .. "/unrelated.safetensors") -- nothing pending there: returns at once
    assert.are.equal(1, checkpoint.pending())
    local ck = checkpoint.load(dir .. "/./pending.safetensors") -- same file, other spelling
    assert.are.equal(0, checkpoint.pending())
    assert.are.equal(99, ck.iteration)
    ck:close()
    lucid._test.atomic_stall(nil)
  end)

  it("last and best from one snapshot: byte-identical, independent files", function()
    local r = small_run()
    local last, best = dir .. "/last.safetensors", dir .. "/best.safetensors"
    checkpoint.save({ last, best }, state(r, { iteration = 5 }), { async = true })
    checkpoint.wait()
    local b0 = read_all(best)
    assert.is_true(read_all(last) == b0, "last and best differ")
    -- separate inodes (not hard links): a later save of last, or an
    -- in-place rewrite of it by another tool, leaves best as it was
    local function inode(p)
      local h = io.popen("stat -c %i '" .. p .. "'")
      local s = h:read("*l")
      h:close()
      return s
    end
    assert.are_not.equal(inode(last), inode(best))
    r.opt:step()
    checkpoint.save(last, state(r, { iteration = 6 }), { async = true })
    checkpoint.wait()
    assert.are.equal(6, checkpoint.load(last).iteration)
    assert.is_true(read_all(best) == b0, "best changed with last")
    local f = assert(io.open(last, "r+b")) -- in place, as `cp x last` would
    f:write("garbage")
    f:close()
    assert.is_true(read_all(best) == b0, "best changed with an in-place write to last")
    assert.are.equal(5, checkpoint.load(best).iteration)
  end)

  it("a write into a missing directory fails at the next wait, naming the file, once", function()
    local r = small_run()
    local bad = dir .. "/missing/last.safetensors"
    checkpoint.save(bad, state(r), { async = true }) -- the snapshot succeeds
    local ok, err = pcall(checkpoint.wait)
    assert.is_false(ok)
    err = tostring(err)
    assert.truthy(err:find("lucid io error: background write of " .. bad .. " failed", 1, true), err)
    assert.truthy(err:find("No such file or directory", 1, true), err)
    assert.has_no.errors(function() checkpoint.wait() end) -- reported once
  end)

  it("a full disk (ENOSPC) surfaces at the next save; the previous file is intact", function()
    local r = small_run()
    local d = tmpdir()
    local path = d .. "/last.safetensors"
    checkpoint.save(path, state(r))
    local good = read_all(path)
    lucid._test.atomic_fail("write", "ENOSPC")
    checkpoint.save(path, state(r, { iteration = 40 }), { async = true })
    -- the hook may only change while no write is in flight
    local ok0 = pcall(checkpoint.wait, path)
    lucid._test.atomic_fail(nil)
    assert.is_false(ok0)
    -- the same failure again, now met by the next save
    lucid._test.atomic_fail("write", "ENOSPC")
    checkpoint.save(path, state(r, { iteration = 41 }), { async = true })
    local t = 0
    while checkpoint.pending() > 0 and t < 200 do os.execute("sleep 0.01"); t = t + 1 end
    lucid._test.atomic_fail(nil)
    local ok, err = pcall(checkpoint.save, path, state(r, { iteration = 42 }), { async = true })
    assert.is_false(ok)
    err = tostring(err)
    assert.truthy(err:find("background write of " .. path .. " failed", 1, true), err)
    assert.truthy(err:find("No space left on device", 1, true), err)
    assert.truthy(err:find("the previous file is unchanged", 1, true), err)
    assert.is_true(read_all(path) == good)
    assert.same({ "last.safetensors" }, listdir(d)) -- no temporary file left
    -- the raising save wrote nothing; the next one works
    checkpoint.save(path, state(r, { iteration = 43 }))
    assert.are.equal(43, checkpoint.load(path).iteration)
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("a failed first write of a path says that no file was written there (not 'the previous file')", function()
    local r = small_run()
    local d = tmpdir()
    local path = d .. "/first.safetensors"
    lucid._test.atomic_fail("write", "ENOSPC")
    local ok, err = pcall(checkpoint.save, path, state(r))
    lucid._test.atomic_fail(nil)
    assert.is_false(ok)
    err = tostring(err)
    assert.truthy(err:find("No space left on device (no file was written at that path)", 1, true), err)
    assert.is_nil(err:find("previous file", 1, true), err)
    assert.same({}, listdir(d)) -- no temporary file left, no target
    -- negative control: with a file in place the message says it is unchanged
    checkpoint.save(path, state(r))
    lucid._test.atomic_fail("write", "ENOSPC")
    ok, err = pcall(checkpoint.save, path, state(r, { iteration = 7 }))
    lucid._test.atomic_fail(nil)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("(the previous file is unchanged)", 1, true), tostring(err))
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("a failed write of a path is raised by a load of that path", function()
    local r = small_run()
    local path = dir .. "/loadfail.safetensors"
    checkpoint.save(path, state(r, { iteration = 1 }))
    lucid._test.atomic_fail("rename")
    checkpoint.save(path, state(r, { iteration = 2 }), { async = true })
    local t = 0
    while checkpoint.pending() > 0 and t < 200 do os.execute("sleep 0.01"); t = t + 1 end
    lucid._test.atomic_fail(nil)
    local ok, err = pcall(checkpoint.load, path)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("background write of " .. path .. " failed", 1, true), tostring(err))
    assert.are.equal(1, checkpoint.load(path).iteration) -- then the old file loads
  end)

  it("a job stops at its first failed path; the later paths keep their contents", function()
    local r = small_run()
    local best = dir .. "/stop_best.safetensors"
    checkpoint.save(best, state(r, { iteration = 3 }))
    local bad = dir .. "/missing/last.safetensors"
    checkpoint.save({ bad, best }, state(r, { iteration = 4 }), { async = true })
    local ok, err = pcall(checkpoint.wait)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("not written either (any previous file there is unchanged): " .. best, 1, true),
      tostring(err))
    assert.are.equal(3, checkpoint.load(best).iteration)
  end)

  it("rejects bad paths and options by name", function()
    local r = small_run()
    local ok, err = pcall(checkpoint.save, { dir .. "/a", 3 }, state(r))
    assert.is_false(ok)
    assert.truthy(err:find("checkpoint.save: path[2]: expected a string, got number", 1, true), err)
    ok, err = pcall(checkpoint.save, dir .. "/a", state(r), { async = "yes" })
    assert.truthy(err:find("opts.async: expected a boolean", 1, true), err)
  end)
end)

describe("exit and kill with a background write in flight (separate processes)", function()
  local dir
  setup(function() dir = tmpdir() end)
  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)

  it("a file-size limit (ulimit -f) fails the write with a message, not the process (SIGXFSZ ignored)", function()
    local target = dir .. "/fsize.safetensors"
    local script = "local lucid = require 'lucid'; "
      .. "local ok, err = pcall(lucid.io.safetensors_save, '" .. target .. "', { { 'w', lucid.zeros({ 4194304 }) } }); "
      .. "print(ok, err)"
    local p = io.popen("sh -c \"ulimit -f 2000; luajit -e \\\"" .. script .. "\\\"\" 2>&1; echo \"rc=$?\"")
    local text = p:read("*a")
    p:close()
    assert.truthy(text:find("rc=0", 1, true), text) -- not killed by SIGXFSZ (rc 153)
    -- a synchronous save: "write of", not "background write of"
    assert.truthy(text:find("lucid io error: write of " .. target .. " failed", 1, true), text)
    assert.truthy(text:find("File too large", 1, true), text)
    assert.is_nil(io.open(target, "rb")) -- nothing half-written under the name
    local left = io.popen("ls -a '" .. dir .. "' | grep -c fsize"):read("*l")
    assert.are.equal("0", left) -- and no temporary file left beside it
  end)

  it("entries given as a map are refused, naming the key (it wrote an empty file)", function()
    local ok, err = pcall(lucid.io.safetensors_save, dir .. "/map.safetensors", { w = lucid.zeros({ 2 }) })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("(entries): expected an array of {name, tensor}, got the key 'w'", 1, true),
      tostring(err))
    assert.is_nil(io.open(dir .. "/map.safetensors", "rb"))
  end)

  local function run(mode, out, ckpt)
    local cmd = string.format("luajit spec/fixtures/ckpt_train.lua %s AdamW '%s' '%s' 12 5 2>&1; echo \"rc=$?\"",
      mode, out, ckpt)
    local p = io.popen(cmd)
    local text = p:read("*a")
    p:close()
    return tonumber(text:match("rc=(%d+)%s*$")), text
  end

  it("os.exit right after an async save waits for it; resume equals the uninterrupted run", function()
    local full, res, ck = dir .. "/full", dir .. "/res_exit", dir .. "/ck_exit"
    local rc, out = run("full", full, dir .. "/unused")
    assert.equal(0, rc, out)
    rc, out = run("exit-async", dir .. "/never", ck)
    assert.equal(3, rc, out)
    assert.are.equal(5, checkpoint.load(ck).iteration)
    rc, out = run("resume", res, ck)
    assert.equal(0, rc, out)
    assert.is_true(read_all(full) == read_all(res), "resumed run differs from the uninterrupted run")
  end)

  it("SIGKILL during an async write leaves the previous checkpoint; resume equals the uninterrupted run", function()
    local full, res, ck = dir .. "/full2", dir .. "/res_kill", dir .. "/ck_kill"
    local rc, out = run("full", full, dir .. "/unused")
    assert.equal(0, rc, out)
    rc, out = run("kill-async", dir .. "/never", ck)
    assert.equal(137, rc, out) -- killed by SIGKILL (128 + 9)
    -- the killed write's complete temporary file is there, not renamed
    local temps = 0
    for _, n in ipairs(listdir(dir)) do if n:find("^%.ck_kill%.tmp%.") then temps = temps + 1 end end
    assert.are.equal(1, temps)
    assert.are.equal(5, checkpoint.load(ck).iteration)
    rc, out = run("resume", res, ck)
    assert.equal(0, rc, out)
    assert.is_true(read_all(full) == read_all(res), "resumed run differs from the uninterrupted run")
  end)
end)

local have_data = data.find_dataset("coco-pose-mini") ~= nil
local describe_data = have_data and describe or pending

describe_data("Trainer with background checkpoint writes (CPU, imgsz 64)", function()
  local tmp = os.tmpname()
  os.remove(tmp)
  teardown(function()
    lucid._test.atomic_fail(nil)
    os.execute("rm -rf '" .. tmp .. "'")
  end)
  local fit_cfg = require "support.fit_cfg"
  local Trainer = require "lucid.trainer"

  it("a write that fails in the background fails the fit, naming the file; the previous checkpoint stays", function()
    -- (no val_batch0_pred.png / JSON: they go through the atomic writer too)
    local tr = Trainer.new(fit_cfg.cfg(tmp, { name = "wfail", epochs = 2, val_outputs = false }))
    tr:add_callback("on_epoch_end", function(_, ev)
      if ev.epoch == 0 then
        checkpoint.wait() -- epoch 1's files on disk; the hook changes with nothing in flight
        lucid._test.atomic_fail("fsync", "ENOSPC")
      end
    end)
    local ok, err = pcall(tr.fit, tr, fit_cfg.build(tr))
    lucid._test.atomic_fail(nil)
    assert.is_false(ok)
    local last = tmp .. "/wfail/weights/last.safetensors"
    assert.truthy(tostring(err):find("background write of " .. last .. " failed", 1, true), tostring(err))
    assert.truthy(tostring(err):find("No space left on device", 1, true), tostring(err))
    assert.are.equal(0, checkpoint.pending())
    local ck = checkpoint.load(last)
    assert.are.same({ 0, 1 }, { ck.epoch, ck.epochs_completed }) -- epoch 1's checkpoint
    ck:close()
  end)

  it("best is written before last: a kill between the two leaves the previous last, never a last whose best_fitness no file holds", function()
    local calls, save = {}, checkpoint.save
    checkpoint.save = function(paths, ...)
      calls[#calls + 1] = type(paths) == "table" and paths or { paths }
      return save(paths, ...)
    end
    local ok, err = pcall(function()
      local tr = Trainer.new(fit_cfg.cfg(tmp, { name = "order", epochs = 2, val_outputs = false }))
      tr:fit(fit_cfg.build(tr))
    end)
    checkpoint.save = save
    assert.is_true(ok, tostring(err))
    local pairs_seen = 0
    for _, p in ipairs(calls) do
      if #p == 2 then
        pairs_seen = pairs_seen + 1
        assert.truthy(p[1]:find("/best%.safetensors$"), p[1])
        assert.truthy(p[2]:find("/last%.safetensors$"), p[2])
      end
    end
    assert.is_true(pairs_seen >= 1, "no epoch wrote best and last together (the first epoch is always a best)")
  end)

  it("a fit removes the temporary checkpoint files an interrupted run left in its weights folder", function()
    os.execute("mkdir -p '" .. tmp .. "/stale/weights'")
    local t1, t2 = tmp .. "/stale/weights/.last.safetensors.tmp.Xy12Ab", tmp .. "/stale/weights/.best.safetensors.tmp.Q9w8e7"
    for _, f in ipairs({ t1, t2 }) do local h = assert(io.open(f, "wb")); h:write("partial"); h:close() end
    local tr = Trainer.new(fit_cfg.cfg(tmp, { name = "stale", epochs = 1, val_outputs = false }))
    tr:fit(fit_cfg.build(tr))
    assert.is_nil(io.open(t1, "rb"))
    assert.is_nil(io.open(t2, "rb"))
    assert.is_not_nil(io.open(tmp .. "/stale/weights/last.safetensors", "rb"))
  end)

  it("phases: the loop pays the snapshot and the final wait, the writer the rest", function()
    local tr = Trainer.new(fit_cfg.cfg(tmp, { name = "phases", epochs = 2 }))
    local res = tr:fit(fit_cfg.build(tr))
    local p = res.phases
    assert.are.equal(0, checkpoint.pending())
    assert.is_true(p.ckpt_parts.snapshot > 0 and p.ckpt_parts.background > 0)
    assert.is_true(math.abs(p.checkpoints - p.ckpt_parts.snapshot - p.ckpt_parts.final_wait) < 1e-9)
    local b = read_all(res.save_dir .. "/weights/best.safetensors")
    local ck = checkpoint.load(res.save_dir .. "/weights/last.safetensors")
    assert.are.equal(1, ck.epoch)
    if ck.best_fitness and checkpoint.load(res.save_dir .. "/weights/best.safetensors").epoch == 1 then
      assert.is_true(read_all(res.save_dir .. "/weights/last.safetensors") == b)
    end
    ck:close()
  end)
end)
