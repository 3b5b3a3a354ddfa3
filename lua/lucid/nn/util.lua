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
    -- the class's own argument signature (M.signature), not a parent's
    local sig = rawget(cls, "_args")
    if sig then M.check_args(sig, ...) end
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

--- A value as an argument error shows it: "string 'one'", "-16", "1.5",
-- "{17, 3}" (a short list of numbers and strings), "nn.Conv" (a module),
-- "lucid.Tensor" (a binding object), "table", "nil", "function", ...
-- @param v any
-- @return string
function M.describe(v)
  local t = type(v)
  if t == "string" then return string.format("string '%s'", v) end
  if t == "number" then return M.pyrepr(v) end
  if t == "table" and getmetatable(v) == nil and next(v) ~= nil and #v <= 8 then
    local p = {}
    for k in pairs(v) do
      if type(k) ~= "number" or k < 1 or k > #v or k ~= math.floor(k) then return "table" end
    end
    for i = 1, #v do
      local e = v[i]
      if type(e) == "number" then p[i] = M.pyrepr(e)
      elseif type(e) == "string" then p[i] = "'" .. e .. "'"
      elseif type(e) == "boolean" then p[i] = tostring(e)
      else return "table" end
    end
    return "{" .. table.concat(p, ", ") .. "}"
  end
  local mt = (t == "table" or t == "userdata") and getmetatable(v)
  if type(mt) == "table" and type(mt.__name) == "string" then
    return (t == "table" and type(v._modules) == "table" and "nn." or "") .. mt.__name
  end
  return t
end

local function is_int(v, min)
  return type(v) == "number" and v == math.floor(v) and v >= min and v < 2 ^ 31
end

-- The argument kinds of M.signature: each returns nil when v fits, else the
-- "expected ..." part of the message. a = the argument's entry.
local KINDS = {}
function KINDS.int(v, a)
  if is_int(v, a.min or 0) and (a.max == nil or v <= a.max) then return nil end
  local what = a.what and " (" .. a.what .. ")" or ""
  if a.max then return string.format("an integer in %d..%d%s", a.min or 0, a.max, what) end
  return string.format("an integer >= %d%s", a.min or 0, what)
end
function KINDS.odd(v, a)
  if is_int(v, a.min or 1) and v % 2 == 1 then return nil end
  return string.format("an odd integer >= %d", a.min or 1)
end
function KINDS.number(v, a)
  local ok = type(v) == "number" and v == v
  if ok and a.gt ~= nil and not (v > a.gt) then ok = false end
  if ok and a.ge ~= nil and not (v >= a.ge) then ok = false end
  if ok and a.le ~= nil and not (v <= a.le) then ok = false end
  if ok then return nil end
  local r = {}
  if a.gt ~= nil then r[#r + 1] = "> " .. M.pyrepr(a.gt) end
  if a.ge ~= nil then r[#r + 1] = ">= " .. M.pyrepr(a.ge) end
  if a.le ~= nil then r[#r + 1] = "<= " .. M.pyrepr(a.le) end
  return "a number" .. (#r > 0 and " " .. table.concat(r, " and ") or "")
end
function KINDS.boolean(v) if type(v) == "boolean" then return nil end return "a boolean" end
-- a list of a.n integers >= a.min (a.n nil: a.lo..a.hi entries)
function KINDS.ints(v, a)
  local lo, hi = a.n or a.lo or 1, a.n or a.hi or 32
  local want = a.n and string.format("a list of %d integers >= %d", a.n, a.min or 1)
    or string.format("a list of %d to %d integers >= %d", lo, hi, a.min or 1)
  if a.what then want = want .. " (" .. a.what .. ")" end
  if type(v) ~= "table" or getmetatable(v) ~= nil or #v < lo or #v > hi then return want end
  for k in pairs(v) do
    if type(k) ~= "number" or k < 1 or k > #v or k ~= math.floor(k) then return want end
  end
  for i = 1, #v do if not is_int(v[i], a.min or 1) then return want end end
  return nil
end
function KINDS.kpt_shape(v)
  if type(v) == "table" and #v == 2 and is_int(v[1], 1) and (v[2] == 2 or v[2] == 3) then return nil end
  return "{K, 2} or {K, 3} (K keypoints >= 1; x, y[, visibility])"
end
local function is_module(v)
  return type(v) == "table" and getmetatable(v) ~= nil and type(v._modules) == "table"
end
function KINDS.module(v) if is_module(v) then return nil end return "an nn module" end
function KINDS.modules(v)
  local want = "a list of nn modules"
  if type(v) ~= "table" or getmetatable(v) ~= nil then return want end
  for k in pairs(v) do
    if type(k) ~= "number" or k < 1 or k > #v or k ~= math.floor(k) then return want end
  end
  for i = 1, #v do if not is_module(v[i]) then return want end end
  return nil
end
function KINDS.any() return nil end

--- Declare the positional arguments of a constructor (util.class's new
-- checks them before __init runs, so a bad value raises at the user's call:
-- "nn.C3k2: bad argument n: expected an integer >= 1, got string 'one'").
-- @param who string: the constructor as the user calls it ("nn.C3k2")
-- @param args list of {name, kind, opt = true (nil allowed), min, max, n,
--   gt, ge, le, what (int, ints: said after the range)}; kinds: int, odd, number, boolean, ints (a list of n
--   or lo..hi integers), kpt_shape, module, modules, any (checked by
--   `check`). A vararg constructor ends the list with {"...", kind}: every
--   further argument is of that kind (nil allowed).
-- @param check function|nil: check(...) over the arguments (after the
--   per-argument checks) returning nil, or the argument's name and the
--   message for a combination that cannot work ("g", "groups 3 must divide
--   c1 = 16 and c2 = 32")
-- @return table: the signature (assign to Class._args)
function M.signature(who, args, check)
  for _, a in ipairs(args) do
    assert(KINDS[a[2]], "signature: unknown kind " .. tostring(a[2]))
  end
  return { who = who, args = args, check = check }
end

--- Check the arguments against a signature (M.signature); raises at the
-- caller of the constructor (level 3: check_args, new, the caller).
function M.check_args(sig, ...)
  local n = select("#", ...)
  while n > 0 and select(n, ...) == nil do n = n - 1 end -- trailing nils are absent arguments
  local args, who = sig.args, sig.who
  local last = args[#args]
  local vararg = last and last[1] == "..."
  local fixed = vararg and #args - 1 or #args
  for i = 1, math.max(n, fixed) do
    local v = (select(i, ...))
    local a = args[i] or (vararg and last) or nil
    if a == nil then
      local most = fixed == 0 and "no arguments" or
        string.format("at most %d argument%s", fixed, fixed == 1 and "" or "s")
      error(string.format("%s: bad argument #%d: expected %s, got %d (extra: %s)", who, i, most, n,
        M.describe(v)), 3)
    end
    if not (v == nil and (a.opt or (vararg and i > fixed))) then
      local want = KINDS[a[2]](v, a)
      if want then
        local name = a[1] == "..." and "#" .. i or a[1]
        error(string.format("%s: bad argument %s: expected %s, got %s", who, name, want, M.describe(v)), 3)
      end
    end
  end
  if sig.check then
    local name, msg = sig.check(...)
    if name then error(string.format("%s: bad argument %s: %s", who, name, msg), 3) end
  end
end

local function is_tensor(v) return type(v) == "userdata" and M.describe(v) == "lucid.Tensor" end

-- "a lucid.Tensor of shape [1, 3, 64, 64]" / M.describe(v) for another value
local function describe_shaped(v)
  if is_tensor(v) then return "a lucid.Tensor of shape " .. M.shape_str(v:shape()) end
  return M.describe(v)
end

local function same_shape(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

--- Check the output gradient handed to a backward against the output of
-- the forward it differentiates. When `out` is a tensor, gy must be a
-- tensor of its shape; when `out` is a table of tensors (a head's
-- {boxes=, scores=, kpts=, feats=}), gy must be a plain table whose keys
-- are among out's tensor keys, each present entry a tensor of that entry's
-- shape (a missing key is a zero gradient). Raises "<who>: bad argument
-- #<argn> (gy): gy.boxes: expected shape [1, 64, 84] (the forward
-- output's), got [1, 64, 189]" and the like.
-- @param who string: the function as the user calls it ("model:backward")
-- @param out tensor|table: the forward's output
-- @param gy any: the gradient given
-- @param argn integer: gy's argument number in the message (2 for
--   backward(x, gy) methods)
-- @param level integer|nil: as error()'s, seen from the function calling
--   check_output_grad (default 2: the caller of that function)
function M.check_output_grad(who, out, gy, argn, level)
  level = (level or 2) + 2 -- seen from bad(): bad, check_output_grad
  local function bad(fmt, ...)
    error(string.format("%s: bad argument #%d (gy): " .. fmt, who, argn, ...), level)
  end
  if is_tensor(out) then
    if not is_tensor(gy) then bad("expected %s, got %s", describe_shaped(out), describe_shaped(gy)) end
    if not same_shape(gy:shape(), out:shape()) then
      bad("expected shape %s (the forward output's), got %s", M.shape_str(out:shape()), M.shape_str(gy:shape()))
    end
    return
  end
  local keys = {}
  for k, v in pairs(out) do
    if type(k) == "string" and is_tensor(v) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b)
    local order = { boxes = 1, scores = 2, kpts = 3 }
    local x, y = order[a] or 9, order[b] or 9
    if x ~= y then return x < y end
    return a < b
  end)
  local list = {}
  for i, k in ipairs(keys) do list[i] = k .. "=" end
  local form = "{" .. table.concat(list, ", ") .. "}"
  if type(gy) ~= "table" or getmetatable(gy) ~= nil then
    bad("expected a table %s of gradients (a missing key is a zero gradient), got %s", form, describe_shaped(gy))
  end
  for k in pairs(gy) do
    if not is_tensor(type(k) == "string" and out[k] or nil) then
      bad("unexpected key %s (expected %s; a missing key is a zero gradient)",
        type(k) == "string" and "'" .. k .. "'" or M.describe(k), form)
    end
  end
  for _, k in ipairs(keys) do
    local o, g = out[k], gy[k]
    if g == nil then
      -- absent: a zero gradient
    elseif not is_tensor(g) then
      bad("gy.%s: expected %s, got %s", k, describe_shaped(o), describe_shaped(g))
    elseif not same_shape(g:shape(), o:shape()) then
      bad("gy.%s: expected shape %s (the forward output's), got %s", k, M.shape_str(o:shape()),
        M.shape_str(g:shape()))
    end
  end
end

--- Refuse what an options table must not hold: raises "<who>: opts:
-- unknown option 'typo' (expected one of a, b, c)", or "<who>: opts:
-- expected a table, got <value>" when opts is neither nil nor a table.
-- @param who string: the function as the user calls it ("nn.materialize")
-- @param opts table|nil
-- @param keys list of the accepted keys, in the order the message lists them
-- @param level integer|nil: as error()'s, seen from the function calling
--   check_options (default 2: the caller of that function)
-- @param what string|nil: the argument's name in the message ("opts")
-- @return opts, or an empty table for nil
function M.check_options(who, opts, keys, level, what)
  level, what = (level or 2) + 1, what or "opts"
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    error(string.format("%s: %s: expected a table, got %s", who, what, M.describe(opts)), level)
  end
  for k in pairs(opts) do
    local known = false
    for _, key in ipairs(keys) do
      if k == key then known = true break end
    end
    if not known then
      error(string.format("%s: %s: unknown option '%s' (expected %s)", who, what, tostring(k),
        #keys == 1 and keys[1] or "one of " .. table.concat(keys, ", ")), level)
    end
  end
  return opts
end

return M
