--- lucid.nn.util — small helpers shared by the nn library: the class
-- helper, the scaling arithmetic of Ultralytics' parse_model, and the
-- formatting helpers that print modules the way PyTorch does.
local M = {}

--- Define a class. `parent` (optional) is another class; methods are
-- inherited through __index, and so is the parent's __newindex (a
-- metamethod, read from the metatable itself: copied here; the Module
-- classes' one announces instance overrides of forward/backward, see
-- lucid.nn.module). The returned class has `new(...)` which calls
-- `cls.__init(self, ...)` and returns the instance.
-- @param name string: the class name (also what tostring prints)
-- @param parent table|nil: base class
-- @return table: the class
function M.class(name, parent)
  local cls = {}
  cls.__index = cls
  cls.__name = name
  if parent then
    setmetatable(cls, { __index = parent })
    cls.__newindex = parent.__newindex
  end
  cls.__tostring = function(self) return self:repr() end
  function cls.new(...)
    local self = setmetatable({}, cls)
    self.__init(self, ...)
    return self
  end
  return cls
end

--- Python's round() on a float: round half to even.
-- @param x number
-- @return integer
function M.round(x)
  local f = math.floor(x)
  local d = x - f
  if d > 0.5 then return f + 1 end
  if d < 0.5 then return f end
  return (f % 2 == 0) and f or f + 1
end

--- make_divisible(x, divisor): ceil x to a multiple of divisor.
-- @param x number
-- @param divisor integer (8 in parse_model)
-- @return integer
function M.make_divisible(x, divisor)
  return math.ceil(x / divisor) * divisor
end

--- Channel scaling of parse_model: make_divisible(min(c2, max_ch) * width, 8).
-- @param c2 integer: YAML channels
-- @param width number: width multiple (0.25 for nano)
-- @param max_channels integer (1024 for nano)
-- @return integer
function M.scale_channels(c2, width, max_channels)
  return M.make_divisible(math.min(c2, max_channels) * width, 8)
end

--- Depth scaling of parse_model: n > 1 becomes max(round(n * depth), 1).
-- @param n integer: YAML repeats
-- @param depth number: depth multiple
-- @return integer
function M.scale_depth(n, depth)
  if n > 1 then return math.max(M.round(n * depth), 1) end
  return n
end

--- Python int(x) for x >= 0 (truncation).
function M.int(x)
  if x >= 0 then return math.floor(x) end
  return math.ceil(x)
end

--- Greatest common divisor of two positive integers.
function M.gcd(a, b)
  while b ~= 0 do a, b = b, a % b end
  return a
end

--- Format a Lua value the way Python's repr would print it in a module's
-- extra_repr (tables as tuples, booleans as True/False, nil as None).
function M.pyrepr(v)
  local t = type(v)
  if t == "boolean" then return v and "True" or "False" end
  if t == "nil" then return "None" end
  if t == "string" then return "'" .. v .. "'" end
  if t == "table" then
    local parts = {}
    for i = 1, #v do parts[i] = M.pyrepr(v[i]) end
    if #v == 1 then return "(" .. parts[1] .. ",)" end
    return "(" .. table.concat(parts, ", ") .. ")"
  end
  if t == "number" and v == math.floor(v) and math.abs(v) < 2^53 then
    return string.format("%d", v)
  end
  return tostring(v)
end

--- Indent every line but the first by two spaces (PyTorch's _addindent).
function M.addindent(s, n)
  local pad = string.rep(" ", n or 2)
  return (s:gsub("\n", "\n" .. pad))
end

--- Product of a shape's entries (1 for the empty shape).
function M.numel(shape)
  local n = 1
  for i = 1, #shape do n = n * shape[i] end
  return n
end

--- Shape as "[a, b, c]".
function M.shape_str(shape)
  local p = {}
  for i = 1, #shape do p[i] = tostring(shape[i]) end
  return "[" .. table.concat(p, ", ") .. "]"
end

--- M.check_int(who, name, v, min, optional) -> v: a named argument error
-- ("nn.Conv2d: bad argument c1: expected an integer >= 1, got string 'a'")
-- unless v is an integer >= min (or nil when optional).  Raised at the
-- user's constructor call (level 4: check_int, __init, new, the caller).
function M.check_int(who, name, v, min, optional)
  if v == nil and optional then return v end
  if type(v) ~= "number" or v ~= math.floor(v) or v < min then
    local got = type(v) == "string" and string.format("string '%s'", v) or
      (type(v) == "number" and tostring(v) or type(v))
    error(string.format("%s: bad argument %s: expected an integer >= %d, got %s", who, name, min, got), 4)
  end
  return v
end

return M
