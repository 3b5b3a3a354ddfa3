--- lucid.nn.lanes — run independent branches of a network on the branch
-- lanes of a CUDA context (ctx:branch_fork / branch_return / branch_join,
-- lua/lua_context.c; lucid_ctx_branch_fork in engine/lucid.h).
--
-- The host still calls every op in the same order; only the device work of
-- branch b is queued on lane b, a stream that first waits for everything
-- queued before the branch, and the caller's stream waits for all lanes
-- before run returns. Each lane has its own scratch, so the results are
-- bitwise those of running the branches one after another. A branch must
-- only read what was complete before run was called and write what nothing
-- else reads until run returns (the pose head's box / class / keypoint
-- branches: lua/lucid/nn/head.lua).
local M = {}

--- The context whose branch lanes a module's forward should use for input
-- t: ctx when t lives on a CUDA device, else nil (run then just calls).
-- @param ctx Context|nil: the context the module was materialised with
-- @param t Tensor: an input of the forward
function M.ctx_for(ctx, t)
  if type(t) ~= "userdata" or type(t.device) ~= "function" then
    error("lanes.ctx_for: bad argument #2 (t): expected a lucid.Tensor, got " .. type(t), 2)
  end
  if ctx == nil or t:device() == "cpu" then return nil end
  return ctx
end

-- The checks of run and queue (raised at their caller).
local function check(who, ctx, n, fn)
  if ctx ~= nil and (type(ctx) ~= "userdata" or type(ctx.branch_fork) ~= "function") then
    error(string.format("lanes.%s: bad argument #1 (ctx): expected a lucid.Context or nil, got %s", who,
      type(ctx)), 3)
  end
  if type(n) ~= "number" or n ~= math.floor(n) or n < 1 or n > 3 then
    error(string.format("lanes.%s: bad argument #2 (n): expected a branch count 1..3, got %s", who,
      tostring(n)), 3)
  end
  if type(fn) ~= "function" then
    error(string.format("lanes.%s: bad argument #3 (fn): expected a function, got %s", who, type(fn)), 3)
  end
end

-- The current stream waits for the lanes in forked (a list of lane
-- numbers); errors are raised unless quiet (the error path: the first error
-- is the one reported).
local function join(ctx, forked, quiet)
  for i = 1, #forked do
    if quiet then pcall(ctx.branch_join, ctx, forked[i]) else ctx:branch_join(forked[i]) end
  end
end

--- Call fn(1), ..., fn(n) in order, the device work of fn(b) on branch
-- lane b of ctx (n <= 3; ctx nil: plain calls); then the current stream
-- waits for the lanes this call forked (only those: a run nested in a
-- branch of another run leaves the outer branch's lane, which is open, to
-- the outer run; a fork of an open lane runs inline). An error in fn(b) or
-- in a fork closes the open fork, joins the lanes forked so far (their own
-- errors then ignored) and is raised again (level 0: the message as
-- raised).
-- @param ctx Context|nil
-- @param n integer: number of branches, 1..3
-- @param fn function(b)
function M.run(ctx, n, fn)
  check("run", ctx, n, fn)
  local forked = M.queue(ctx, n, fn)
  if forked then join(ctx, forked, false) end
end

--- As run, without the final join: the branches' device work stays queued
-- on the lanes, and the caller joins later (ctx:branch_join(b) for each
-- lane of the returned list), or waits for marks recorded inside fn
-- (ctx:branch_mark(b, m) / ctx:branch_wait(b, m)). Returns the list of the
-- lanes forked (nil when ctx is nil). On an error the lanes forked so far
-- are joined before it is raised again.
function M.queue(ctx, n, fn)
  check("queue", ctx, n, fn)
  if ctx == nil then
    for b = 1, n do fn(b) end
    return nil
  end
  local forked = {}
  for b = 1, n do
    local okf, f = pcall(ctx.branch_fork, ctx, b)
    if not okf then
      join(ctx, forked, true)
      error(f, 0)
    end
    if f then forked[#forked + 1] = b end
    local ok, err = pcall(fn, b)
    if f then ctx:branch_return() end
    if not ok then
      join(ctx, forked, true)
      error(err, 0)
    end
  end
  return forked
end

return M
