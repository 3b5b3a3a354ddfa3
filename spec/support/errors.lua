-- Shared by the specs that check error messages and child processes:
-- the message of a call that must fail, and a shell command's output with
-- its exit status.
local luassert = require "luassert" -- busted's assert (a required module sees plain Lua's)
local M = {}

--- M.err_of(f, ...) -> the error message (a string) of f(...), which must
--- fail (the spec fails "expected an error" when it returns).
function M.err_of(f, ...)
  local ok, e = pcall(f, ...)
  luassert.is_false(ok, "expected an error")
  return tostring(e)
end

--- M.run(cmd) -> combined stdout+stderr of the shell command cmd, and its
--- exit status (a number).
function M.run(cmd)
  local p = assert(io.popen("(" .. cmd .. ") 2>&1; echo \"__rc=$?\""))
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)%s*$"))
  return (out:gsub("__rc=%d+%s*$", "")), rc
end

return M
