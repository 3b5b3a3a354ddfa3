-- host_spec.lua — the host programs: bin/lucid (scripts, -e, stdin REPL,
-- errors) and the example host build/examples/host_example.
-- Paths can be overridden with LUCID_BIN and LUCID_HOST_EXAMPLE.
local BIN = os.getenv("LUCID_BIN") or "bin/lucid"
local EXAMPLE = os.getenv("LUCID_HOST_EXAMPLE") or "build/examples/host_example"

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Run a shell command; returns its combined stdout+stderr and exit status.
local run = require("support.errors").run

local function write_tmp(text)
  local name = os.tmpname()
  local f = assert(io.open(name, "w"))
  f:write(text)
  f:close()
  return name
end

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() end
  return f ~= nil
end

describe("bin/lucid", function()
  local files = {}
  local function script(text)
    local n = write_tmp(text)
    files[#files + 1] = n
    return n
  end
  teardown(function() for _, n in ipairs(files) do os.remove(n) end end)

  it("is built", function() assert.is_true(exists(BIN), BIN .. " is missing (run make)") end)

  it("runs a script with arguments like luajit", function()
    local s = script([[
local lucid = require "lucid"
local a, b = ...
print("args", a, b, arg[1], arg[2], arg[0] ~= nil)
print("global", rawget(_G, "lucid"))
local t = lucid.tensor({{1, 2}, {3, 4}})
print("sum", t:matmul(t):sum():item())
]])
    local out, rc = run(BIN .. " " .. shell_quote(s) .. " x y")
    assert.are.equal(0, rc, out)
    assert.matches("args\tx\ty\tx\ty\ttrue", out)
    assert.matches("global\tnil", out)       -- scripts get no convenience global
    assert.matches("sum\t54", out)           -- [[7,10],[15,22]] sums to 54
  end)

  it("exits non-zero with the message and a traceback on error", function()
    local s = script("local lucid = require 'lucid'\nlocal function f() local t = lucid.zeros({-2}); return t end\nf()\n")
    local out, rc = run(BIN .. " " .. shell_quote(s))
    assert.are_not.equal(0, rc)
    assert.matches("lucid%.zeros: bad argument #1 %(shape%[1%]%): expected a non%-negative integer, got %-2", out)
    assert.matches("stack traceback:", out)
    local _, rc2 = run(BIN .. " /nonexistent/script.lua")
    assert.are_not.equal(0, rc2)
  end)

  it("runs -e chunks and reports the version", function()
    local out, rc = run(BIN .. " -e " .. shell_quote("print(require('lucid').ones({3}):sum():item())"))
    assert.are.equal(0, rc, out)
    assert.matches("^3\n", out)
    out, rc = run(BIN .. " -v")
    assert.are.equal(0, rc)
    assert.matches("^lucid %d+%.%d+%.%d+", out)
  end)

  it("reads a session from stdin with `lucid` preloaded, printing expressions", function()
    local input = script("1 + 1\nx = lucid.ones({2}) * 3\nx:sum():item()\nfor i = 1, 2 do\nprint('loop', i)\nend\nx\n")
    local out, rc = run(BIN .. " < " .. shell_quote(input))
    assert.are.equal(0, rc, out)
    assert.matches("^2\n6\nloop\t1\nloop\t2\ntensor%(%[3%., 3%.%], dtype=f32, device=cpu%)\n", out)
  end)

  it("a failing stdin session still runs later lines and exits non-zero", function()
    local input = script("error('boom')\nprint('after')\n")
    local out, rc = run(BIN .. " < " .. shell_quote(input))
    assert.matches("boom", out)
    assert.matches("after", out)
    assert.are_not.equal(0, rc)
  end)

  it("runs `-` as a script from stdin", function()
    local input = script("print(select('#', ...), rawget(_G, 'lucid'))\n")
    local out, rc = run(BIN .. " - < " .. shell_quote(input))
    assert.are.equal(0, rc, out)
    assert.matches("^0\tnil", out)
  end)

  it("finds the Lua library from another working directory", function()
    local abs = BIN:sub(1, 1) == "/" and BIN or (os.getenv("PWD") .. "/" .. BIN)
    local out, rc = run("cd / && " .. shell_quote(abs) .. " -e " ..
      shell_quote("require 'lucid'; print(package.path)"))
    assert.are.equal(0, rc, out)
    if exists("lua/lucid/") and not os.getenv("LUCID_BIN") then
      assert.matches(os.getenv("PWD"):gsub("%p", "%%%0") .. "/lua/%?%.lua;", out)
    end
  end)
end)

-- stdout, stderr and the exit status of a shell command, apart
local function run3(cmd)
  local errf = os.tmpname()
  local out, rc = run("(" .. cmd .. ") 2>" .. shell_quote(errf))
  local f = assert(io.open(errf, "rb"))
  local err = f:read("*a")
  f:close()
  os.remove(errf)
  return out, err, rc
end

describe("bin/lucid --help", function()
  it("prints the usage on stdout and exits 0; a bad flag still exits 2", function()
    for _, a in ipairs({ "--help", "-h" }) do
      local out, err, rc = run3(BIN .. " " .. a)
      assert.are.equal(0, rc, a)
      assert.truthy(out:find("^usage: %S*lucid %["), out)
      assert.are.equal("", err)
    end
    -- negative control: usage errors keep status 2, on stderr
    local out, err, rc = run3(BIN .. " -x")
    assert.are.same({ "", 2 }, { out, rc })
    assert.truthy(err:find("usage:", 1, true), err)
    _, _, rc = run3(BIN .. " -e")
    assert.are.equal(2, rc)
  end)
end)

describe("examples/host_example", function()
  it("computes a value in Lua and reads it back through the C API", function()
    assert.is_true(exists(EXAMPLE), EXAMPLE .. " is missing (run make)")
    local out, rc = run(EXAMPLE)
    assert.are.equal(0, rc, out)
    assert.matches("sum via Lua %(lua_tonumber%)%s+136%.0000", out)
    assert.matches("sum via C %(lucid_reduce_item%)%s+136%.0000", out)
    assert.matches("host_example: ok", out)
    assert.is_nil(out:find("MISMATCH", 1, true))
  end)
end)
