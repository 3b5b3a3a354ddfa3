--[[
lucid.progress — what a user watches during training: a progress bar per
epoch on a terminal (one plain line per epoch otherwise) with the running
losses, iterations per second and device memory, and the validation table
in the Ultralytics layout.

  local progress = require "lucid.progress"
  local bar = progress.bar{total = nb, epoch = e, epochs = E, out = io.stdout}
  bar:update(i, {box = .., pose = .., kobj = .., cls = .., dfl = ..}, mem_gb, instances)
  bar:finish(losses, mem_gb)
  progress.val_table(metrics, out)
]]
local progress = {}

local LOSS_NAMES = { "box", "pose", "kobj", "cls", "dfl" }
progress.LOSS_NAMES = LOSS_NAMES

-- Is `out` a terminal? (LuaJIT has no isatty; the recipe may force it with
-- LUCID_PROGRESS=bar|plain; unset, empty or auto: ask `test -t 1` for stdout;
-- any other value is an error naming it.)
local tty_cache
function progress.is_tty()
  local env = os.getenv("LUCID_PROGRESS")
  env = env and env:lower() -- any case, as the recipes' device and optimizer names
  if env == "bar" then return true end
  if env == "plain" then return false end
  if env ~= nil and env ~= "" and env ~= "auto" then
    error(string.format("LUCID_PROGRESS=%q: expected bar, plain or auto (unset: bar on a terminal, plain "
      .. "otherwise)", env), 0)
  end
  if tty_cache == nil then
    tty_cache = os.execute("test -t 1") == 0 or os.execute("test -t 1") == true
  end
  return tty_cache
end

local Bar = {}
Bar.__index = Bar

--- progress.bar{total, epoch (1-based for display), epochs, out, tty}
function progress.bar(o)
  local b = setmetatable({
    total = o.total, epoch = o.epoch, epochs = o.epochs, out = o.out or io.stdout,
    tty = o.tty == nil and progress.is_tty() or o.tty,
    t0 = os.clock(), wall0 = progress.now(), last_draw = -1,
  }, Bar)
  if b.tty then
    b.out:write(string.format("\n%10s %10s %10s %10s %10s %10s %10s %10s %10s\n", "Epoch", "GPU_mem",
      "box_loss", "pose_loss", "kobj_loss", "cls_loss", "dfl_loss", "Instances", "Size"))
  end
  return b
end

-- Wall-clock seconds (os.time has 1 s resolution; use the monotonic clock
-- through lucid when available).
function progress.now()
  local ok, lucid = pcall(require, "lucid")
  if ok and lucid.wall_time then return lucid.wall_time() end
  return os.time()
end

local function line(b, i, losses, mem, inst, size, rate)
  local parts = { string.format("%10s", string.format("%d/%d", b.epoch, b.epochs)),
                  string.format("%10s", string.format("%.3gG", mem or 0)) }
  for _, k in ipairs(LOSS_NAMES) do parts[#parts + 1] = string.format("%10.4g", losses and losses[k] or 0) end
  parts[#parts + 1] = string.format("%10d", inst or 0)
  parts[#parts + 1] = string.format("%10d", size or 0)
  local pct = math.floor(100 * i / b.total)
  local width = 20
  local fill = math.floor(width * i / b.total)
  parts[#parts + 1] = string.format(" %3d%% %s%s %d/%d %.2fit/s", pct, string.rep("#", fill),
    string.rep("-", width - fill), i, b.total, rate or 0)
  return table.concat(parts, " ")
end

--- bar:update(i, losses, mem_gb, instances, size): redraw (TTY only).
function Bar:update(i, losses, mem, inst, size)
  if not self.tty then return end
  local el = progress.now() - self.wall0
  local rate = el > 0 and i / el or 0
  self.out:write("\r" .. line(self, i, losses, mem, inst, size, rate))
  self.out:flush()
end

--- bar:finish(losses, mem_gb, instances, size): the final line of the epoch.
function Bar:finish(losses, mem, inst, size)
  local el = progress.now() - self.wall0
  local rate = el > 0 and self.total / el or 0
  if self.tty then
    self.out:write("\r" .. line(self, self.total, losses, mem, inst, size, rate) .. "\n")
  else
    local p = {}
    for _, k in ipairs(LOSS_NAMES) do p[#p + 1] = string.format("%s_loss %.4g", k, losses and losses[k] or 0) end
    self.out:write(string.format("epoch %d/%d  %s  %d it in %.1fs (%.2f it/s)  mem %.3gG\n",
      self.epoch, self.epochs, table.concat(p, "  "), self.total, el, rate, mem or 0))
  end
  self.out:flush()
end

--- The validation table (Ultralytics PoseValidator layout).
function progress.val_table(m, out)
  out = out or io.stdout
  out:write(string.format("%22s %11s %11s %11s %11s %11s %11s %11s %11s %11s %11s\n", "Class", "Images",
    "Instances", "Box(P", "R", "mAP50", "mAP50-95)", "Pose(P", "R", "mAP50", "mAP50-95)"))
  out:write(string.format("%22s %11d %11d %11.3g %11.3g %11.3g %11.3g %11.3g %11.3g %11.3g %11.3g\n", "all",
    m.images, m.box.instances, m.box.precision, m.box.recall, m.box.map50, m.box.map50_95,
    m.pose.precision, m.pose.recall, m.pose.map50, m.pose.map50_95))
  out:flush()
end

return progress
