-- bench/fit_pairs.lua and bench/fit_once.lua on the CPU at a tiny size: one
-- pair of fresh processes (A: 2 loader workers, B: 0 — Ultralytics
-- workers=0, every batch made in the training thread), the JSON fields of
-- every fit, and identical value-byte hashes across processes and worker
-- counts. Also the FNV-1a 64 binding (lucid.hash_tensor / hash_string).
local lucid = require "lucid"
local data = require "lucid.data"
local cjson = require "cjson"

describe("lucid.hash_tensor / hash_string (FNV-1a 64)", function()
  it("matches the published FNV-1a 64 test vectors", function()
    assert.are.equal("cbf29ce484222325", lucid.hash_string(""))
    assert.are.equal("af63dc4c8601ec8c", lucid.hash_string("a"))
    assert.are.equal("85944171f73967e8", lucid.hash_string("foobar"))
  end)

  it("continues a stream from a previous hash", function()
    assert.are.equal(lucid.hash_string("foobar"), lucid.hash_string("bar", lucid.hash_string("foo")))
  end)

  it("hashes the value bytes in row-major order, whatever the layout", function()
    local a = lucid.tensor({ { 1, 2 }, { 3, 4 } })
    local b = lucid.tensor({ { 1, 3 }, { 2, 4 } }):t() -- a strided view with a's values
    assert.are.equal(lucid.hash_tensor(a), lucid.hash_tensor(b))
    assert.are_not.equal(lucid.hash_tensor(a), lucid.hash_tensor(lucid.tensor({ { 1, 2 }, { 4, 3 } })))
    -- the bytes of f32 1.0 (0x3f800000, little-endian)
    assert.are.equal(lucid.hash_string("\0\0\128\63"), lucid.hash_tensor(lucid.tensor({ 1 })))
    local h = lucid.hash_tensor(a)
    assert.are.equal(lucid.hash_tensor(lucid.tensor({ 3, 4 }), lucid.hash_tensor(lucid.tensor({ 1, 2 }))), h)
  end)

  it("rejects a malformed previous hash", function()
    assert.has_error(function() lucid.hash_string("x", "123") end)
    assert.has_error(function() lucid.hash_string("x", "zzzzzzzzzzzzzzzz") end)
  end)
end)

local have_data = data.find_dataset("coco-pose-mini") ~= nil
local describe_data = have_data and describe or pending

describe_data("bench/fit_pairs.lua (one tiny pair on the CPU)", function()
  local tmp = os.tmpname()
  local jsonl = tmp .. ".jsonl"
  local out_text, fits

  setup(function()
    local cmd = string.format("luajit bench/fit_pairs.lua pairs=1 budget_s=0 device=cpu epochs=1 imgsz=64 batch=8 "
      .. "armA=workers=2 armB=workers=0 json=%s 2>&1", jsonl)
    local p = io.popen(cmd)
    out_text = p:read("*a")
    p:close()
    fits = {}
    local f = io.open(jsonl, "r")
    if f then
      for l in f:lines() do fits[#fits + 1] = cjson.decode(l) end
      f:close()
    end
  end)

  teardown(function()
    os.remove(jsonl)
    os.remove(tmp)
  end)

  it("runs A then B in fresh processes and reports every JSON field", function()
    assert.are.equal(2, #fits, out_text)
    assert.are.equal("A1", fits[1].tag)
    assert.are.equal("B1", fits[2].tag)
    for _, r in ipairs(fits) do
      assert.is_true(r.fit_s > 0 and r.whole_s >= r.fit_s, "fit_s <= whole_s")
      assert.is_number(r.steady_step_ms)
      assert.is_true(r.steady_step_ms > 0)
      assert.is_number(r.peak_allocated_mib)
      assert.is_number(r.peak_reserved_mib)
      assert.are.equal("cpu", r.device)
      assert.are.equal("fp32", r.precision)
      assert.are.equal("eager", r.route)
      assert.are.equal(1, r.epochs)
      assert.are.equal(1, #r.windows)
      assert.is_true(r.steps > 0)
      assert.are.equal(r.steps, r.windows[1][2]) -- every step inside the measured window
      -- the host's wait for batches inside the window, per step: within the window's own time
      assert.is_number(r.loader_wait_ms)
      assert.is_true(r.loader_wait_ms >= 0 and r.loader_wait_ms <= 1000 * r.windows[1][1] / r.steps,
        tostring(r.loader_wait_ms))
      for _, k in ipairs({ "model", "optimizer", "ema", "losses", "metrics" }) do
        assert.matches("^%x+$", r.hashes[k], k)
        assert.are.equal(16, #r.hashes[k], k)
      end
    end
    assert.matches("workers=2", fits[1].config)
    assert.matches("workers=0", fits[2].config)
  end)

  it("gives identical hashes across processes and loader worker counts (2 and 0)", function()
    assert.are.same(fits[1].hashes, fits[2].hashes)
    assert.matches("Hashes: identical across all 2 fits of both arms", out_text, 1, true)
  end)

  it("prints the markdown table with median cells per arm", function()
    assert.matches("| arm | settings | route | fits | complete fit, s | whole process, s | steady train step, ms "
      .. "| contract check, µs/step | peak allocated, MiB | peak reserved, MiB |", out_text, 1, true)
    assert.matches("\n| A | `workers=2` | eager | 1 | ", out_text, 1, true)
    -- eager fits have no replays: the contract cell is a dash
    assert.matches("| – | ", out_text, 1, true)
    assert.matches("\n| B | `workers=0` | eager | 1 | ", out_text, 1, true)
  end)
end)

describe("bench/fit_pairs.lua arguments", function()
  it("rejects an unknown key before running anything", function()
    local p = io.popen("luajit bench/fit_pairs.lua device=cpu epochz=1 2>&1; echo \"rc=$?\"")
    local text = p:read("*a")
    p:close()
    assert.matches("unknown key 'epochz'", text, 1, true)
    assert.matches("rc=2", text, 1, true)
  end)
end)
