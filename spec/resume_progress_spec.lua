-- resume_progress_spec.lua — a resume never goes back in time silently.
-- A checkpoint resumes into the run folder its settings name (as
-- Ultralytics' resume); when that folder's weights/last.safetensors has
-- completed more epochs than the resumed file (an older copy), the resume
-- is refused before any file in the folder is touched, naming both files,
-- both epoch counts and the ways on. Negative controls: equal progress (a
-- copy of the folder's last), the folder's own last, and a new run folder
-- (name=) pass. One real 2-epoch CPU run at imgsz 64 (a few seconds) makes
-- the files; the refusals themselves train nothing.
local Trainer = require "lucid.trainer"
local checkpoint = require "lucid.checkpoint"
local data = require "lucid.data"
local files = require "support.files"
local fit_cfg = require "support.fit_cfg"
local errors = require "support.errors"

local describe_data = data.find_dataset("coco-pose-mini") and describe or pending

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Every file under folder d (recursively) with its bytes, by relative path.
local function snapshot(d)
  local out = {}
  local p = assert(io.popen("cd " .. shell_quote(d) .. " && find . -type f | sort"))
  for rel in p:lines() do out[rel] = files.read(d .. "/" .. rel) end
  p:close()
  return out
end

-- The same files with the same bytes (names listed on a difference).
local function assert_same_files(want, got)
  local names = {}
  for k in pairs(want) do names[#names + 1] = k end
  for k in pairs(got) do if want[k] == nil then names[#names + 1] = "new: " .. k end end
  table.sort(names)
  for _, k in ipairs(names) do
    assert.is_truthy(want[k] and got[k], "file added or removed: " .. k)
    assert.is_true(want[k] == got[k], "file changed: " .. k)
  end
end

describe_data("resume from an older checkpoint into a run folder with newer progress", function()
  local tmp, run_dir, old, last
  setup(function()
    tmp = files.tmpdir()
    run_dir = tmp .. "/run"
    old = tmp .. "/backup/epoch1.safetensors"
    last = run_dir .. "/weights/last.safetensors"
    os.execute("mkdir -p " .. shell_quote(tmp .. "/backup"))
    -- a 2-epoch run; after epoch 1 its last checkpoint is kept aside (the
    -- user's older copy), then epoch 2 writes a newer last.safetensors
    local tr = Trainer.new(fit_cfg.cfg(tmp, { name = "run", epochs = 2, exist_ok = false }))
    tr:add_callback("on_epoch_end", function(_, ev)
      if ev.epoch == 0 then
        checkpoint.wait()
        files.write(old, files.read(last))
      end
    end)
    tr:fit(fit_cfg.build(tr))
  end)
  teardown(function() if tmp then os.execute("rm -rf " .. shell_quote(tmp)) end end)

  local function refusal(path)
    return "trainer: resume: " .. path .. " has completed 1 epoch, but the run folder it would continue, "
      .. run_dir .. ", holds newer progress: " .. last .. " has completed 2 epochs. Resuming would overwrite that "
      .. "folder's weights/last.safetensors, weights/best.safetensors and its results.csv rows from epoch 2 on, so "
      .. "nothing was written. Resume from the newer checkpoint (resume=" .. last .. "), or branch off from " .. path
      .. " into a new run folder with name= (and project=); to continue " .. run_dir .. " from the older file on "
      .. "purpose, move " .. last .. " out of it first"
  end

  it("the files: the copy holds epoch 1 of 2, the folder's last epoch 2, and its settings name the folder", function()
    local a, b = checkpoint.load(old), checkpoint.load(last)
    assert.are.same({ 1, 2, "run", tmp }, { a.epochs_completed, b.epochs_completed, a.config.name, a.config.project })
    a:close()
    b:close()
  end)

  it("Trainer:fit refuses before anything in the run folder is touched", function()
    local before = snapshot(run_dir)
    local tr = Trainer.new(fit_cfg.cfg(tmp, { name = "run", resume = old, epochs = 3 }))
    local e = errors.err_of(tr.fit, tr, fit_cfg.build(tr))
    assert.are.equal(refusal(old), e)
    assert_same_files(before, snapshot(run_dir))
    assert.are.same({ "epoch1.safetensors" }, files.listdir(tmp .. "/backup")) -- nothing beside the copy
  end)

  it("pose_nano resume=<older copy>: the same refusal, exit status 1, the folder as it was", function()
    local before = snapshot(run_dir)
    -- the copy's saved settings name the run folder (project, name) and the
    -- device; workers is allowed on resume
    local out, rc = errors.run("luajit recipes/pose_nano.lua workers=1 resume=" .. shell_quote(old))
    assert.are.equal(1, rc, out)
    assert.truthy(out:find("\npose_nano: " .. refusal(old) .. "\n", 1, true), out)
    assert_same_files(before, snapshot(run_dir))
  end)

  it("negative controls: equal progress, the folder's own last, and a new run folder pass the check", function()
    -- a copy of the folder's last (equal progress) and the last itself
    local same = tmp .. "/backup/same.safetensors"
    files.write(same, files.read(last))
    assert.has_no.errors(function() Trainer.check_resume_progress(same, run_dir) end)
    assert.has_no.errors(function() Trainer.check_resume_progress(last, run_dir) end)
    -- branching off: the older copy into a folder without a last checkpoint
    assert.has_no.errors(function() Trainer.check_resume_progress(old, tmp .. "/branch") end)
    os.remove(same)
  end)

  it("a run folder whose last checkpoint cannot be read is not overwritten either", function()
    local d = tmp .. "/rot"
    os.execute("mkdir -p " .. shell_quote(d .. "/weights"))
    files.write(d .. "/weights/last.safetensors", "not a checkpoint")
    local e = errors.err_of(Trainer.check_resume_progress, old, d)
    assert.truthy(e:find("trainer: resume: " .. old .. " is to continue the run in " .. d .. ", whose " .. d
      .. "/weights/last.safetensors cannot be read (", 1, true), e)
    assert.truthy(e:find("nothing was written", 1, true), e)
    assert.are.equal("not a checkpoint", files.read(d .. "/weights/last.safetensors"))
  end)
end)
