-- Shared by the specs that stop a training run with a signal (Ctrl-C in
-- recipe_checks_spec, SIGTERM in stop_signal_spec): start
-- recipes/pose_nano.lua on the CPU in the background (epochs=30,
-- imgsz=64), wait for its first checkpoint, send the signal, wait for the
-- process to end; it is never left running.
local files = require "support.files"

local M = {}

--- M.shell_quote(s) -> s as one single-quoted shell word.
function M.shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function read_num(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local v = tonumber(f:read("*a"))
  f:close()
  return v
end

--- M.run(tmp, name, sig, extra) -> rc, stderr text, path of weights/last.
-- tmp: the project folder; name: the run name (also the log prefix under
-- tmp); sig: "INT" or "TERM"; extra: more recipe arguments ("" for none).
-- Fails the spec when no checkpoint appears within 60 s; rc is nil when
-- the process did not end within 60 s of the signal (then it is killed).
function M.run(tmp, name, sig, extra)
  local q, log = M.shell_quote, tmp .. "/" .. name
  -- started in the background: its pid (the one that gets the signal) and,
  -- once it ended, its exit status go to files
  os.execute("(luajit recipes/pose_nano.lua device=cpu workers=1 epochs=30 imgsz=64 " .. (extra or "")
    .. " project=" .. q(tmp) .. " name=" .. q(name) .. " >" .. q(log .. ".out") .. " 2>" .. q(log .. ".err")
    .. " & echo $! >" .. q(log .. ".pid") .. "; wait $!; echo $? >" .. q(log .. ".rc") .. ") >/dev/null 2>&1 &")
  local last = log .. "/weights/last.safetensors"
  local pid
  for _ = 1, 600 do
    pid = pid or read_num(log .. ".pid")
    local f = io.open(last, "rb")
    if f then f:close(); break end
    os.execute("sleep 0.1")
  end
  assert(pid and io.open(last, "rb"), "no checkpoint after 60 s")
  os.execute("kill -" .. sig .. " " .. pid)
  local rc
  for _ = 1, 600 do
    rc = read_num(log .. ".rc")
    if rc then break end
    os.execute("sleep 0.1")
  end
  if not rc then os.execute("kill -KILL " .. pid .. " 2>/dev/null") end -- never left running
  return rc, files.read(log .. ".err"), last
end

return M
