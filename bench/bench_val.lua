--[[
bench/bench_val.lua — host time of one validation pass over the mini
dataset's val split (32 images, batch 8 -> 4 batches, letterboxed 640), by
stage, on the CPU. The network forward is excluded: the head outputs of the
4 batches are computed once (or synthesised) and then fed to the validator
`runs` times; every number is the median over those runs.

  luajit bench/bench_val.lua [source=auto|model|synthetic] [weights=PATH]
                             [imgsz=640] [batch=8] [runs=7] [outputs=true]
                             [impl=fast|reference|both] [threads=1]
                             [cache=PATH] [bf16=false]

source
  model      the YOLO11n pose model on the CPU (f32) with `weights` (default
             runs/pose_nano/weights/last.safetensors, the EMA weights when the
             file has them; random init when the file is missing), forwarded
             once over the 4 val batches
  synthetic  seeded random head outputs of the real shapes [8, 64|1|51, 8400]:
             class logits ~ N(-4.5, 1) (nearly every anchor passes conf 0.001,
             as with a barely trained model), DFL logits ~ N(0, 1.5), keypoints
             ~ N(0, 1)
  auto       model when the weights file exists, else synthetic
impl
  fast       the validator as the trainer uses it
  reference  the straightforward path (full sort, every candidate decoded,
             NMS over all candidates; lucid.PoseValidator{reference = true})
  both       both, and a check that their metrics and detections are equal
threads      images of a batch in parallel in the fast path (1: one thread,
             0: the machine's CPUs, as the trainer runs it); the reference
             always runs on one thread
cache        a file for the head outputs: written on the first run, read on
             later ones (skips the slow CPU forward)
bf16         round the head outputs to bf16 (what the GPU run produces; many
             tied confidences)

Stages (seconds for the whole pass of 32 images, and per image):
  select     conf filter over all anchors + ordering by confidence
  decode     DFL box decoding of the candidates NMS looks at
  nms        greedy per-class NMS up to max_det
  kpts       keypoint decoding of the kept detections
  match      ground truth setup, IoU/OKS matrices, matching at 10 thresholds,
             crowd rule
  accum      appending to the AP accumulators
  compute    val:compute() (AP, P, R for box and pose)
  glue       the trainer's Lua side per batch (host views of the outputs and
             targets, the add_batch call overhead)
  outputs    the final epoch's val_output: collect (COCO entries of every
             image, preview tiles) and finish() (the JSON file, the PNG
             mosaic), measured in separate passes (outputs=false skips it)
The bench also runs on a build from before the optimisation (no timings,
threads or reference there: it then reports the totals), which gives the
"before" column of a comparison on the same head outputs (cache=).
]]
local lucid = require "lucid"
local recipe = require "lucid.recipe"
local data = require "lucid.data"

local cfg = recipe.resolve({ source = "auto", weights = "runs/pose_nano/weights/last.safetensors", imgsz = 640,
  batch = 8, runs = 7, outputs = true, impl = "fast", seed = 1, cache = "", threads = 1, bf16 = false }, arg)
local S, B = cfg.imgsz, cfg.batch
local ctx = lucid.Context{ device = "cpu", seed = cfg.seed }

local function file_exists(p)
  local f = io.open(p, "rb")
  if f then f:close() return true end
  return false
end

-- val batches (cloned out of the loader's slots) --------------------------------
local desc = data.load_descriptor("coco_pose_mini")
local ds = assert(data.open(desc, "val", { imgsz = S, cache = true, ctx = ctx }))
local loader = data.loader(ds, { batch = B, imgsz = S, max_gt = 64, threads = 2, shuffle = false, ctx = ctx })
local batches = {}
local t_load0 = lucid.wall_time()
loader:start_epoch(0, data.val)
while true do
  local vb = loader:next()
  if not vb then break end
  local c = { n = vb.n, sample_index = {} }
  for k, v in pairs(vb.sample_index) do c.sample_index[k] = v end
  for _, k in ipairs({ "images", "cls", "boxes", "kpts", "mask" }) do c[k] = vb[k]:clone() end
  batches[#batches + 1] = c
end
local t_load = lucid.wall_time() - t_load0
local nimg = 0
for _, b in ipairs(batches) do nimg = nimg + b.n end

-- head outputs --------------------------------------------------------------------
local source = cfg.source
if source == "auto" then source = file_exists(cfg.weights) and "model" or "synthetic" end
local outs = {}
local t_fwd = 0
local cached = cfg.cache ~= "" and file_exists(cfg.cache)
if cached then
  -- head outputs saved by an earlier run with the same cache= path
  local f = lucid.io.safetensors_open(cfg.cache)
  local md = f:metadata()
  if md.source ~= source or tonumber(md.imgsz) ~= S or tonumber(md.batch) ~= B then
    error(string.format("cache %s holds source %s, imgsz %s, batch %s; delete it or pass another cache=",
      cfg.cache, tostring(md.source), tostring(md.imgsz), tostring(md.batch)), 0)
  end
  for i = 1, #batches do
    local o = {}
    for _, k in ipairs({ "boxes", "scores", "kpts" }) do
      local info = f:info(k .. i)
      o[k] = lucid.empty(info.shape, { ctx = ctx })
      f:load(k .. i, o[k])
    end
    outs[i] = o
  end
  f:close()
elseif source == "model" then
  local model = require("lucid.models.yolo11_pose"){ scale = "n", nc = 1, kpt_shape = { 17, 3 }, ctx = ctx,
    device = "cpu" }
  if file_exists(cfg.weights) then
    local rep = require("lucid.predict").load_weights(model, cfg.weights)
    io.write(string.format("weights %s (%s)\n", cfg.weights, rep.ema and "EMA" or "plain"))
  else
    io.write("weights: none (random init)\n")
  end
  model:eval()
  local x = lucid.empty({ B, 3, S, S }, { ctx = ctx })
  for i, b in ipairs(batches) do
    local t0 = lucid.wall_time()
    local xi = b.images:size(1) == B and x or lucid.empty(b.images:shape(), { ctx = ctx })
    lucid.input_prepare(xi, b.images)
    local o = model:forward(xi)
    outs[i] = { boxes = o.boxes:clone(), scores = o.scores:clone(), kpts = o.kpts:clone() }
    t_fwd = t_fwd + lucid.wall_time() - t0
  end
else
  for i, b in ipairs(batches) do
    local n = b.images:size(1)
    local A = (S / 8) ^ 2 + (S / 16) ^ 2 + (S / 32) ^ 2
    outs[i] = { boxes = lucid.randn({ n, 64, A }, { ctx = ctx }):mul_(1.5),
      scores = lucid.randn({ n, 1, A }, { ctx = ctx }):add_(-4.5),
      kpts = lucid.randn({ n, 51, A }, { ctx = ctx }) }
  end
end
if cfg.bf16 then
  -- as the GPU run delivers them: bf16 head outputs widened to f32 (many
  -- equal confidences: the ordering's tie rule matters)
  for _, o in ipairs(outs) do
    for _, k in ipairs({ "boxes", "scores", "kpts" }) do o[k] = o[k]:to("bf16"):to("f32") end
  end
end
if cfg.cache ~= "" and not cached then
  local entries = {}
  for i, o in ipairs(outs) do
    for _, k in ipairs({ "boxes", "scores", "kpts" }) do entries[#entries + 1] = { k .. i, o[k] } end
  end
  lucid.io.safetensors_save(cfg.cache, entries, { source = source, imgsz = tostring(S), batch = tostring(B) })
end
if cached then source = source .. " (cached in " .. cfg.cache .. ")" end
io.write(string.format("bench_val: %d images in %d batches of %d, %dpx, source %s (forward %.2f s once, "
  .. "loader %.2f s once), median of %d runs, validator threads %s\n", nimg, #batches, B, S, source, t_fwd, t_load,
  cfg.runs, cfg.threads == 0 and "auto" or tostring(cfg.threads)))

-- one validation pass ---------------------------------------------------------------
local STAGES = { "select", "decode", "nms", "kpts", "match", "accum" }

local function make_val(reference)
  local o = { imgsz = S, nc = 1, kpt_shape = { 17, 3 }, conf = 0.001, iou = 0.7, max_det = 300, ap = "coco",
    reference = reference or nil, threads = cfg.threads, ctx = ctx }
  local ok, v = pcall(lucid.PoseValidator, o)
  if not ok and tostring(v):find("unknown option 'threads'", 1, true) and not reference then
    -- a build from before the optimisation (for the "before" column): one thread
    o.threads = nil
    ok, v = pcall(lucid.PoseValidator, o)
  end
  if not ok then
    if reference then error("this build has no reference validator (" .. tostring(v) .. ")", 0) end
    error(v, 0)
  end
  return v
end

local function pass(val, with_outputs)
  local t = {}
  local t0 = lucid.wall_time()
  val:reset()
  local glue, add = 0, 0
  local vout
  if with_outputs then
    vout = require("lucid.val_output").new{ dataset = ds, imgsz = S, save_dir = os.tmpname() .. ".d",
      names = desc.names }
  end
  local t_out = 0
  for i, vb in ipairs(batches) do
    local o = outs[i]
    local g0 = lucid.wall_time()
    -- the trainer's per-batch Lua side (Trainer:validate)
    local n = vb.n
    local function host(x) return x:narrow(1, 1, n):to("cpu", "f32"):contiguous() end
    local pb, ps, pk = host(o.boxes), host(o.scores), host(o.kpts)
    local tg = { cls = vb.cls:narrow(1, 1, n):contiguous(), boxes = vb.boxes:narrow(1, 1, n):contiguous(),
      kpts = vb.kpts:narrow(1, 1, n):contiguous(), mask = vb.mask:narrow(1, 1, n):to("f32"):contiguous() }
    local a0 = lucid.wall_time()
    val:add_batch(pb, ps, pk, tg, n)
    local a1 = lucid.wall_time()
    glue = glue + (a0 - g0)
    add = add + (a1 - a0)
    if vout then
      local c0 = lucid.wall_time()
      vout:add_batch(val, vb)
      t_out = t_out + lucid.wall_time() - c0
      t.collect = (t.collect or 0) + lucid.wall_time() - c0
    end
  end
  local c0 = lucid.wall_time()
  local m = val:compute()
  t.compute = lucid.wall_time() - c0
  t.total = lucid.wall_time() - t0 - t_out
  t.add = add
  if vout then
    local f0 = lucid.wall_time()
    local files = vout:finish()
    t_out = t_out + lucid.wall_time() - f0
    t.finish = lucid.wall_time() - f0
    os.remove(files.json)
    if files.png then os.remove(files.png) end
    os.remove(vout.save_dir)
  end
  t.outputs = with_outputs and t_out or nil
  local tm = val.timings and val:timings() or nil
  if tm then
    for _, k in ipairs(STAGES) do t[k] = tm[k] end
    t.counts = { candidates = tm.candidates, decoded = tm.decoded, kept = tm.kept, images = tm.images }
    t.wall = tm.wall
    -- what add_batch spent outside the timed C stages belongs to the glue
    local sum = 0
    for _, k in ipairs(STAGES) do sum = sum + (tm[k] or 0) end
    -- (with threads > 1 the stages are CPU time summed over images; the
    -- add_batch wall time is what counts)
    t.glue = glue + math.max(add - (tm.wall or sum), 0)
  else
    t.glue = glue
  end
  return t, m
end

local function median(xs)
  table.sort(xs)
  local n = #xs
  if n == 0 then return nil end
  return n % 2 == 1 and xs[(n + 1) / 2] or 0.5 * (xs[n / 2] + xs[n / 2 + 1])
end

local function run_impl(reference)
  local val = make_val(reference)
  pass(val, false) -- warm-up
  local rows = {}
  local m
  for r = 1, cfg.runs do
    local t
    t, m = pass(val, false)
    rows[r] = t
  end
  local out_t
  if cfg.outputs then
    local ts, tc, tf = {}, {}, {}
    for r = 1, math.max(3, math.floor(cfg.runs / 2)) do
      local t = pass(val, true)
      ts[r], tc[r], tf[r] = t.outputs, t.collect, t.finish
    end
    out_t = { total = median(ts), collect = median(tc), finish = median(tf) }
  end
  local med = {}
  for _, k in ipairs({ "select", "decode", "nms", "kpts", "match", "accum", "compute", "glue", "add", "wall", "total" }) do
    local xs = {}
    for _, t in ipairs(rows) do if t[k] then xs[#xs + 1] = t[k] end end
    med[k] = median(xs)
  end
  med.outputs = out_t
  med.counts = rows[#rows].counts
  return med, m, val
end

local function report(name, med, m)
  io.write(string.format("\n%s  (metrics: box P %.6g R %.6g mAP50 %.6g mAP50-95 %.6g | pose mAP50 %.6g "
    .. "mAP50-95 %.6g | %d predictions)\n", name, m.box.precision, m.box.recall, m.box.map50, m.box.map50_95,
    m.pose.map50, m.pose.map50_95, m.box.predictions))
  io.write(string.format("  %-9s %10s %12s\n", "stage", "32 images", "per image"))
  local order = { "select", "decode", "nms", "kpts", "match", "accum", "compute", "glue" }
  for _, k in ipairs(order) do
    if med[k] then
      io.write(string.format("  %-9s %8.2f ms %9.3f ms\n", k, 1000 * med[k], 1000 * med[k] / nimg))
    end
  end
  if med.wall then
    io.write(string.format("  %-9s %8.2f ms %9.3f ms   (add_batch wall time; the stages above are summed over "
      .. "images%s)\n", "validator", 1000 * med.wall, 1000 * med.wall / nimg,
      cfg.threads ~= 1 and ", i.e. CPU time over the threads" or ""))
  end
  io.write(string.format("  %-9s %8.2f ms %9.3f ms   (reset .. compute; add_batch calls: %.2f ms)\n", "total",
    1000 * med.total, 1000 * med.total / nimg, 1000 * med.add))
  local c = med.counts
  if c and c.images > 0 and c.candidates > 0 then
    io.write(string.format("  per image: %.0f candidates above conf, %.0f boxes decoded, %.0f kept\n",
      c.candidates / c.images, c.decoded / c.images, c.kept / c.images))
  end
  if med.outputs then
    local o = med.outputs
    io.write(string.format("  %-9s %8.2f ms %9.3f ms   (final epoch only: val_output collect %.2f ms (JSON "
      .. "entries, preview tiles) + finish %.2f ms (JSON file, PNG mosaic))\n", "outputs", 1000 * o.total,
      1000 * o.total / nimg, 1000 * o.collect, 1000 * o.finish))
  end
end

local function same_metrics(a, b)
  for _, g in ipairs({ "box", "pose" }) do
    for _, k in ipairs({ "precision", "recall", "map50", "map50_95", "instances", "predictions" }) do
      if a[g][k] ~= b[g][k] then return false, g .. "." .. k end
    end
  end
  return true
end

if cfg.impl == "fast" or cfg.impl == "both" then
  local med, m, val = run_impl(false)
  report("fast", med, m)
  if cfg.impl == "both" then
    local med2, m2, ref = run_impl(true)
    report("reference", med2, m2)
    local ok, what = same_metrics(m, m2)
    -- detections of every image, bitwise (each batch again through both)
    local ndiff = 0
    for i, vb in ipairs(batches) do
      local o, n = outs[i], vb.n
      local tg = { cls = vb.cls:narrow(1, 1, n):contiguous(), boxes = vb.boxes:narrow(1, 1, n):contiguous(),
        kpts = vb.kpts:narrow(1, 1, n):contiguous(), mask = vb.mask:narrow(1, 1, n):to("f32"):contiguous() }
      val:add_batch(o.boxes, o.scores, o.kpts, tg, n)
      ref:add_batch(o.boxes, o.scores, o.kpts, tg, n)
      for j = 1, n do
        local a, b = val:detections(j), ref:detections(j)
        if #a ~= #b then ndiff = ndiff + 1 else
          for k = 1, #a do
            local x, y = a[k], b[k]
            local same = x.conf == y.conf and x.cls == y.cls
            for q = 1, 4 do same = same and x.box[q] == y.box[q] end
            for q = 1, #x.kpts do same = same and x.kpts[q] == y.kpts[q] end
            if not same then ndiff = ndiff + 1; break end
          end
        end
      end
    end
    io.write(string.format("\nfast vs reference: metrics %s, detections %s\n",
      ok and "bitwise equal" or ("DIFFER at " .. what), ndiff == 0 and "bitwise equal on every image"
      or (ndiff .. " images DIFFER")))
    if not ok or ndiff > 0 then os.exit(1) end
    io.write(string.format("speed-up of the validator host time (total): %.1fx\n", med2.total / med.total))
  end
else
  local med, m = run_impl(true)
  report("reference", med, m)
end
