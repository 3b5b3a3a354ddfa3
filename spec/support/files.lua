-- Shared by the specs that write their own fixture files (data, data YAML,
-- checkpoint, background checkpoint and predict specs): whole-file write and
-- read (binary), a fresh temporary folder, a sorted folder listing and the
-- numbers of a nested table; each fails the spec on an I/O error.
local M = {}

--- M.write(path, s): the file at path holds exactly s.
function M.write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

--- M.read(path) -> the whole content of the file at path.
function M.read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

--- M.tmpdir() -> the path of a new, empty folder under the system's temp dir.
function M.tmpdir()
  local d = os.tmpname()
  os.remove(d)
  assert(os.execute("mkdir -p '" .. d .. "'"))
  return d
end

--- M.listdir(d) -> the names in folder d (dot files included), sorted.
function M.listdir(d)
  local p = io.popen("ls -A '" .. d .. "'")
  local names = {}
  for line in p:lines() do names[#names + 1] = line end
  p:close()
  table.sort(names)
  return names
end

--- M.flatten(t) -> the numbers of a nested table (Tensor:totable()) in order.
function M.flatten(t, out)
  out = out or {}
  if type(t) == "number" then out[#out + 1] = t; return out end
  for i = 1, #t do M.flatten(t[i], out) end
  return out
end

return M
