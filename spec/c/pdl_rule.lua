-- pdl_rule.lua — the programmatic-dependent-launch rule of cuda/launch.cuh,
-- checked over CUDA sources (run by spec/c/test_pdl_rule.sh).
--
--   luajit spec/c/pdl_rule.lua FILE...
--
-- For every FILE it checks, on the text with comments and string/char
-- literals blanked out (line numbers kept):
--   1. every __global__ function definition's body begins with
--        lucid_pdl_wait(); lucid_pdl_launch_dependents();
--      as its first two statements (whitespace free; nothing before them, not
--      even a declaration or a preprocessor line), so every thread of every
--      kernel waits for the preceding grid before it touches memory;
--   2. no <<<...>>> launch remains (kernels go through lucid_launch(), which
--      adds the PDL attribute; a plain launch next to a PDL kernel is correct
--      but loses the overlap, and the lint keeps the tree uniform).
-- Output, one line per check in the C test convention (spec/c/test.h):
--   ok pdl_rule FILE (K kernels, L lucid_launch)
--   not ok pdl_rule FILE:LINE: <what is wrong>
-- Exit status 1 when any check failed, 2 on a usage/IO error.

local function blank(src)
    -- comments and literals -> spaces; newlines kept; a backslash that
    -- continues a line (macro bodies) -> space
    local out, i, n = {}, 1, #src
    while i <= n do
        local c = src:sub(i, i)
        local c2 = src:sub(i, i + 1)
        if c2 == "//" then
            local j = src:find("\n", i, true) or n + 1
            out[#out + 1] = string.rep(" ", j - i)
            i = j
        elseif c2 == "/*" then
            local j = src:find("*/", i + 2, true)
            j = j and j + 1 or n
            out[#out + 1] = src:sub(i, j):gsub("[^\n]", " ")
            i = j + 1
        elseif c == '"' or c == "'" then
            local j = i + 1
            while j <= n do
                local d = src:sub(j, j)
                if d == "\\" then j = j + 2
                elseif d == c or d == "\n" then break
                else j = j + 1 end
            end
            local body = src:sub(i + 1, j - 1):gsub("[^\n]", " ")
            if j <= n and src:sub(j, j) == c then -- closed
                out[#out + 1] = c .. body .. c
                i = j + 1
            else -- unterminated at a newline / the end: keep the newline
                out[#out + 1] = c .. body
                i = j
            end
        elseif c == "\\" and src:sub(i + 1, i + 1) == "\n" then
            out[#out + 1] = " "
            i = i + 1
        else
            out[#out + 1] = c
            i = i + 1
        end
    end
    return table.concat(out)
end

local function line_of(text, pos)
    local _, nl = text:sub(1, pos - 1):gsub("\n", "")
    return nl + 1
end

local PROLOGUE = "^%s*lucid_pdl_wait%s*%(%s*%)%s*;%s*lucid_pdl_launch_dependents%s*%(%s*%)%s*;"

-- returns the list of failure messages and the counts
local function check(name, src)
    local t = blank(src)
    local fails, kernels, launches = {}, 0, 0
    local function fail(pos, msg)
        fails[#fails + 1] = { line = line_of(t, pos), msg = msg }
    end
    -- 1. kernels
    local from = 1
    while true do
        local s, e = t:find("%f[%w_]__global__%f[^%w_]", from)
        if not s then break end
        from = e + 1
        -- the declarator: up to the first '{' or ';' outside parentheses
        local depth, j, lastparen, stop = 0, e + 1, nil, nil
        while j <= #t do
            local d = t:sub(j, j)
            if d == "(" then
                if depth == 0 then lastparen = j end
                depth = depth + 1
            elseif d == ")" then depth = depth - 1
            elseif depth == 0 and (d == "{" or d == ";") then stop = j; break end
            j = j + 1
        end
        local fname = "?"
        if lastparen then
            fname = t:sub(e + 1, lastparen - 1):match("([%a_][%w_]*)%s*$") or "?"
        end
        if not stop then
            fail(s, "__global__ " .. fname .. ": no body or ';' found")
        elseif t:sub(stop, stop) == "{" then
            kernels = kernels + 1
            if not t:find(PROLOGUE, stop + 1) then
                fail(s, "__global__ " .. fname .. ": body does not begin with "
                    .. "lucid_pdl_wait(); lucid_pdl_launch_dependents();")
            end
            from = stop + 1
        end -- ';': a declaration; its definition is checked where it is
    end
    -- 2. launches
    from = 1
    while true do
        local s = t:find("<<<", from, true)
        if not s then break end
        fail(s, "<<< launch (use lucid_launch from cuda/launch.cuh)")
        local close = t:find(">>>", s + 3, true)
        from = (close or s) + 3
    end
    for _ in t:gmatch("%f[%w_]lucid_launch%s*%(") do launches = launches + 1 end
    table.sort(fails, function(a, b) return a.line < b.line end)
    for k, f in ipairs(fails) do fails[k] = string.format("%s:%d: %s", name, f.line, f.msg) end
    return fails, kernels, launches
end

if #arg == 0 then
    io.stderr:write("usage: luajit spec/c/pdl_rule.lua FILE...\n")
    os.exit(2)
end
local bad = 0
for _, name in ipairs(arg) do
    local f, err = io.open(name, "rb")
    if not f then
        print("not ok pdl_rule " .. name .. ": " .. tostring(err))
        bad = bad + 1
    else
        local src = f:read("*a")
        f:close()
        local fails, k, l = check(name, src)
        if #fails == 0 then
            print(string.format("ok pdl_rule %s (%d kernels, %d lucid_launch)", name, k, l))
        else
            for _, m in ipairs(fails) do print("not ok pdl_rule " .. m) end
            bad = bad + #fails
        end
    end
end
os.exit(bad > 0 and 1 or 0)
