--- spec/support/replay_child.lua — a YOLO11n-pose forward + backward run
-- eagerly and replayed from a recorded graph, in a child process (for the
-- process switches read once per process).
--   source(o) -> Lua source of the child: the model on o.device (default
--     "cuda"), bf16, input lucid.rand(o.shape) and a 0.01 gradient on boxes,
--     scores and kpts; one pass, prints "eager=<digest>" (kpts and the flat
--     parameter gradients); a second pass (the buffers a recording needs);
--     o.before_capture (source, optional); one pass recorded; o.after_capture
--     (source, optional); every f32 parameter and buffer halved (not the i64
--     num_batches_tracked); the graph replayed; prints "replay=<digest>".
--     o.setup (source, optional) runs after `lucid` is loaded.
--   run(src, env) -> the child's stdout and stderr: src written to a
--     temporary file, run as `<env> luajit <file>` (env: a shell prefix such
--     as "env -u LUCID_X"), the file removed.
--   digests(src, env, key) -> run's output read: the eager digest, the
--     replay digest (nil when missing), the whole number the child printed
--     as "<key>=<n>" (nil without key or line), and the output itself.
local M = {}

function M.source(o)
  local dev = o.device or "cuda"
  return table.concat({ [[
package.path = "./lua/?.lua;./lua/?/init.lua;" .. package.path
package.cpath = "./?.so;" .. package.cpath
local lucid = require "lucid"
]], o.setup or "", ([[
local yolo11 = require "lucid.models.yolo11_pose"
local ctx = lucid.Context({ device = "%s", seed = 3 })
local m = yolo11({ scale = "n", nc = 1, kpt_shape = { 17, 3 }, device = "%s", ctx = ctx })
local o = { device = "%s", dtype = "bf16", ctx = ctx }
local x = lucid.rand({ %s }):to(o)
local y
local gy -- made once, in the first (eager) pass: nothing is allocated while recording
local function pass()
  m:zero_grad()
  y = m:forward(x)
  if not gy then
    gy = {}
    for _, k in ipairs({ "boxes", "scores", "kpts" }) do gy[k] = lucid.ones(y[k]:shape(), o) * 0.01 end
  end
  m:backward(x, gy)
end
local function digest()
  ctx:synchronize()
  return lucid.hash_tensor(y.kpts) .. "/" .. lucid.hash_tensor(m.params:flat_grads())
end
pass()
io.write("eager=", digest(), "\n")
pass() -- the buffers a recording needs exist now
]]):format(dev, dev, dev, table.concat(o.shape, ", ")), o.before_capture or "", [[
lucid.graph.capture_begin(ctx)
pass()
local g = lucid.graph.capture_end(ctx)
]], o.after_capture or "", [[
-- a weight change between replays: the replay must read it
for _, p in ipairs(m.params:list()) do
  if p:data():dtype() == "f32" then p:data():mul_(0.5) end -- not the i64 num_batches_tracked
end
g:launch()
io.write("replay=", digest(), "\n")
]] })
end

function M.run(src, env)
  local script = os.tmpname()
  local f = assert(io.open(script, "w"))
  f:write(src)
  f:close()
  local p = io.popen(env .. " luajit " .. script .. " 2>&1")
  local out = p:read("*a")
  p:close()
  os.remove(script)
  return out
end

function M.digests(src, env, key)
  local out = M.run(src, env)
  return out:match("eager=(%S+)"), out:match("replay=(%S+)"), key and tonumber(out:match(key .. "=(%d+)")),
    out
end

return M
