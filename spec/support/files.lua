-- Shared by the specs that write their own fixture files (spec/data_spec.lua,
-- spec/data_yaml_spec.lua): whole-file write and read, binary, failing the
-- spec on an I/O error.
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

return M
