--- lucid.model_io — model:save / model:load in the safetensors format with
-- the Ultralytics state-dict names ("model.0.conv.weight", ...), so a state
-- dict exported from PyTorch loads into lucid and back.
local util = require("lucid.nn.util")

local M = {}

local function binding()
  local lucid = require("lucid")
  if not (lucid.io and lucid.io.safetensors_open) then
    error("lucid.io (safetensors) binding is not available", 3)
  end
  return lucid.io
end

--- model:save(path, [metadata]) — every parameter and buffer of the model,
-- in state-dict order, written atomically (a failed save never replaces an
-- existing file).
-- @param path string
-- @param metadata table|nil: extra string -> string header entries
function M.save(self, path, metadata)
  local io_ = binding()
  if not self.params then error("save: model is not materialised", 2) end
  local entries = {}
  for _, p in ipairs(self.params:list()) do entries[#entries + 1] = { p.name, p:data() } end
  local meta = { format = "pt", producer = "lucid", model = tostring(self.yaml_name or "") }
  for k, v in pairs(metadata or {}) do meta[k] = tostring(v) end
  io_.safetensors_save(path, entries, meta)
end

-- Up to 8 names of a list, then "... (N more)".
local function name_list(list)
  local shown = {}
  for i = 1, math.min(#list, 8) do shown[i] = list[i] end
  local s = table.concat(shown, ", ")
  if #list > 8 then s = s .. string.format(", ... (%d more)", #list - 8) end
  return s
end

--- model:load(path, [opts]) — copy the file's tensors into the model.
-- Every tensor of the model must be in the file with the same shape, and
-- the file may hold nothing else; otherwise (strict, the default) nothing is
-- loaded and the error names the missing, unexpected and mis-shaped tensors.
-- With opts.strict == false the matching tensors are loaded and the rest is
-- reported. Float dtypes are converted (an fp16 checkpoint loads into f32).
-- @param path string
-- @param opts table|nil: strict (true); another key is an error
-- @return report {loaded = n, missing = {names}, unexpected = {names},
--   mismatched = {"name: file [..] vs model [..]"}}
function M.load(self, path, opts)
  if type(path) ~= "string" then error("model:load: path: expected a string, got " .. util.describe(path), 2) end
  opts = util.check_options("model:load", opts, { "strict" })
  local strict = opts.strict ~= false
  local io_ = binding()
  if not self.params then error("load: model is not materialised", 2) end
  local f = io_.safetensors_open(path)
  local report = { loaded = 0, missing = {}, unexpected = {}, mismatched = {} }
  local known, todo = {}, {}
  for _, p in ipairs(self.params:list()) do
    known[p.name] = true
    local info = f:info(p.name)
    if not info then
      report.missing[#report.missing + 1] = p.name
    elseif util.shape_str(info.shape) ~= util.shape_str(p.shape) then
      report.mismatched[#report.mismatched + 1] = string.format("%s: file %s vs model %s",
        p.name, util.shape_str(info.shape), util.shape_str(p.shape))
    else
      todo[#todo + 1] = p
    end
  end
  for _, name in ipairs(f:names()) do
    if not known[name] then report.unexpected[#report.unexpected + 1] = name end
  end
  local bad = #report.missing + #report.unexpected + #report.mismatched
  if strict and bad > 0 then
    local parts = {}
    if #report.missing > 0 then parts[#parts + 1] = string.format("missing %d: %s", #report.missing, name_list(report.missing)) end
    if #report.unexpected > 0 then parts[#parts + 1] = string.format("unexpected %d: %s", #report.unexpected, name_list(report.unexpected)) end
    if #report.mismatched > 0 then parts[#parts + 1] = string.format("mis-shaped %d: %s", #report.mismatched, name_list(report.mismatched)) end
    f:close()
    error(string.format("load %s: %s (nothing loaded; pass {strict=false} for a partial load)",
      path, table.concat(parts, "; ")), 2)
  end
  for _, p in ipairs(todo) do
    f:load(p.name, p:data())
    report.loaded = report.loaded + 1
  end
  f:close()
  return report
end

return M
