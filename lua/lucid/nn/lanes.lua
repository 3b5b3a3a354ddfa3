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
  if ctx == nil or t:device() == "cpu" then return nil end
  return ctx
end

--- Call fn(1), ..., fn(n) in order, the device work of fn(b) on branch
-- lane b of ctx (n <= 3; ctx nil: plain calls); then the current stream
-- waits for every lane. An error in fn(b) closes its fork, joins the lanes
-- and is raised again (level 0: the message as raised).
-- @param ctx Context|nil
-- @param n integer: number of branches, 1..3
-- @param fn function(b)
function M.run(ctx, n, fn)
  M.queue(ctx, n, fn)
  if ctx ~= nil then ctx:branch_join() end
end

--- As run, without the final join: the branches' device work stays queued
-- on the lanes, and the caller joins later (ctx:branch_join), or waits for
-- marks recorded inside fn (ctx:branch_mark(b, m) / ctx:branch_wait(b, m)).
-- On an error the lanes are joined before it is raised again.
function M.queue(ctx, n, fn)
  if ctx == nil then
    for b = 1, n do fn(b) end
    return
  end
  for b = 1, n do
    local forked = ctx:branch_fork(b)
    local ok, err = pcall(fn, b)
    if forked then ctx:branch_return() end
    if not ok then
      ctx:branch_join()
      error(err, 0)
    end
  end
end

return M
