--- spec/support/ffi_lib.lua — the engine's test hooks through the LuaJIT FFI.
-- lib_with(probe, cdefs): declares each C declaration of `cdefs` (a string or
-- a list of strings; a declaration made before is ignored), then returns the
-- library that exports the symbol `probe` — ffi.C when lucid.so's symbols are
-- global in the process, else lucid.so loaded by the FFI (found on
-- package.cpath) — and the ffi module; nil when the FFI or the symbol is
-- missing (a CPU-only build has no CUDA hooks).
local M = {}

function M.lib_with(probe, cdefs)
  local okf, ffi = pcall(require, "ffi")
  if not okf then return nil end
  if type(cdefs) == "string" then cdefs = { cdefs } end
  for _, d in ipairs(cdefs or {}) do pcall(ffi.cdef, d) end
  if pcall(function() return ffi.C[probe] end) then return ffi.C, ffi end
  local path = package.searchpath and package.searchpath("lucid", package.cpath)
  local okl, l = pcall(ffi.load, path or "lucid")
  if okl and pcall(function() return l[probe] end) then return l, ffi end
  return nil
end

return M
