-- lucid.recipe: key=value overrides and the configuration of a resumed run
-- (the checkpoint's saved settings; only recipe.RESUME_OVERRIDES from the
-- command line, as Ultralytics' check_resume).
local recipe = require("lucid.recipe")

local defaults = {
  epochs = 10, batch = 4, imgsz = 640, lr0 = 0.01, device = "auto", name = "run", project = "runs",
  exist_ok = false, resume = false, workers = 4,
  augment = { mosaic = 1.0, close_mosaic = 0 },
}

describe("recipe.resolve", function()
  it("parses overrides to the default's type and rejects unknown keys by name", function()
    local cfg = recipe.resolve(defaults, { "epochs=3", "augment.mosaic=0.5", "device=cpu" })
    assert.are.equal(3, cfg.epochs)
    assert.are.equal(0.5, cfg.augment.mosaic)
    assert.are.equal("cpu", cfg.device)
    assert.are.equal(10, defaults.epochs) -- the defaults table is not modified
    assert.has_error(function() recipe.resolve(defaults, { "epoch=3" }) end,
      "recipe: unknown key 'epoch' (did you mean 'epochs'?)")
  end)

  it("a key given again on the command line replaces the earlier value (Ultralytics' entrypoint keeps the last)", function()
    local cfg = recipe.resolve(defaults, { "epochs=3", "batch=8", "epochs=5" })
    assert.are.equal(5, cfg.epochs)
    assert.are.equal(8, cfg.batch)
    -- only the value that applies is checked (Ultralytics merges, then checks)
    cfg = recipe.resolve(defaults, { "epochs=bad", "epochs=1" })
    assert.are.equal(1, cfg.epochs)
    assert.has_error(function() recipe.resolve(defaults, { "epochs=1", "epochs=bad" }) end)
    -- an unknown key is refused wherever it stands
    assert.has_error(function() recipe.resolve(defaults, { "epoch=1", "epoch=2" }) end,
      "recipe: unknown key 'epoch' (did you mean 'epochs'?)")
    -- the command line wins over the override table
    cfg = recipe.resolve(defaults, { "epochs=3" }, { epochs = 7 })
    assert.are.equal(3, cfg.epochs)
  end)
end)

describe("progress.is_tty", function()
  local progress = require("lucid.progress")
  local function with_env(v, f)
    local getenv = os.getenv
    os.getenv = function(k) if k == "LUCID_PROGRESS" then return v end return getenv(k) end
    local ok, err = pcall(f)
    os.getenv = getenv
    if not ok then error(err, 0) end
  end
  it("takes LUCID_PROGRESS=bar|plain and refuses any other value by name", function()
    with_env("bar", function() assert.is_true(progress.is_tty()) end)
    with_env("BAR", function() assert.is_true(progress.is_tty()) end) -- any case
    with_env("Plain", function() assert.is_false(progress.is_tty()) end)
    with_env("plain", function() assert.is_false(progress.is_tty()) end)
    with_env("auto", function() assert.is_boolean(progress.is_tty()) end)
    with_env("fancy", function()
      assert.has_error(function() progress.is_tty() end,
        'LUCID_PROGRESS="fancy": expected bar, plain or auto (unset: bar on a terminal, plain otherwise)')
    end)
  end)
end)

describe("recipe.print", function()
  local function printed(cfg)
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    recipe.print(cfg, f)
    f:close()
    f = assert(io.open(path, "r"))
    local s = f:read("*a")
    f:close()
    os.remove(path)
    return s
  end
  it("lists the configuration, and nothing with quiet=true", function()
    assert.truthy(printed({ epochs = 3, quiet = false }):find("configuration:", 1, true))
    assert.truthy(printed({ epochs = 3 }):find("epochs", 1, true))
    assert.are.equal("", printed({ epochs = 3, quiet = true }))
  end)
end)

describe("recipe.apply_resume", function()
  local path
  before_each(function()
    path = os.tmpname() .. ".safetensors"
    local f = assert(io.open(path, "wb"))
    f:write("x")
    f:close()
  end)
  after_each(function() os.remove(path) end)

  local saved = { epochs = 1, batch = 8, imgsz = 64, lr0 = 0.02, device = "cpu", name = "t1", project = "runs",
                  exist_ok = false, resume = false, workers = 2, augment = { mosaic = 0.0, close_mosaic = 0 },
                  gone = "a setting this recipe no longer has" }
  local function loader(p)
    assert.are.equal(path, p)
    return { config = saved }
  end

  it("leaves a configuration without resume unchanged", function()
    local cfg = recipe.resolve(defaults, { "epochs=2" })
    local out, note = recipe.apply_resume(cfg, defaults, { "epochs=2" }, function() error("not called") end)
    assert.are.equal(cfg, out)
    assert.is_nil(note)
  end)

  it("takes the saved settings, applies only the allowed overrides and names the ignored ones", function()
    local args = { "resume=" .. path, "epochs=3", "lr0=0.5", "augment.mosaic=1" }
    local cfg = recipe.resolve(defaults, args)
    local out, note = recipe.apply_resume(cfg, defaults, args, loader)
    assert.are.equal(3, out.epochs)      -- allowed: extends the run
    assert.are.equal(8, out.batch)       -- saved
    assert.are.equal(64, out.imgsz)      -- saved
    assert.are.equal(0.02, out.lr0)      -- saved; the override is ignored
    assert.are.equal(0.0, out.augment.mosaic)
    assert.are.equal("cpu", out.device)
    assert.are.equal(path, out.resume)
    assert.is_nil(out.gone)              -- settings the recipe no longer has are dropped
    assert.truthy(note:find("ignored on resume: augment.mosaic, lr0", 1, true))
  end)

  it("lets imgsz, batch and device change on resume", function()
    local args = { "resume=" .. path, "imgsz=128", "batch=2", "device=cuda" }
    local out = recipe.apply_resume(recipe.resolve(defaults, args), defaults, args, loader)
    assert.are.equal(128, out.imgsz)
    assert.are.equal(2, out.batch)
    assert.are.equal("cuda", out.device)
  end)

  it("says clearly when there is no checkpoint to resume", function()
    local args = { "resume=true", "name=nothere", "project=/nonexistent-lucid" }
    local cfg = recipe.resolve(defaults, args)
    assert.has_error(function() recipe.apply_resume(cfg, defaults, args, loader) end,
      "resume: no checkpoint at /nonexistent-lucid/nothere/weights/last.safetensors (a run resumes from its "
        .. "weights/last.safetensors; check project= and name=, or start the run without resume=)")
  end)
end)

describe("lucid.cpu_count", function()
  it("returns the online CPUs as an integer >= 1 (the trainer's loader threads are min(workers, it))", function()
    local n = require("lucid").cpu_count()
    assert.are.equal("number", type(n))
    assert.is_true(n >= 1 and n == math.floor(n))
    local p = io.popen("getconf _NPROCESSORS_ONLN 2>/dev/null")
    local want = p and tonumber(p:read("*l") or "")
    if p then p:close() end
    if want then assert.are.equal(want, n) end
  end)
end)
