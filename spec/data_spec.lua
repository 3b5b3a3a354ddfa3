-- data_spec.lua — the data pipeline from Lua: augmentation schedules
-- (close_mosaic), option checking, descriptors, the mini dataset, the
-- loader's batch layout and determinism, and bad files / rows reported by
-- policy. The C tests (spec/c/test_data_*.c) cover decoding and the
-- augmentation geometry in depth.
local lucid = require "lucid"
local data = require "lucid.data"
local files = require "support.files"
local write, read = files.write, files.read

local function tmpdir()
  local p = os.tmpname()
  os.remove(p)
  assert(os.execute("mkdir -p '" .. p .. "/images/train' '" .. p .. "/labels/train'"))
  return p
end

local function same(a, b)
  return (a:double() - b:double()):abs():max():item() == 0
end

local mini = data.find_dataset("coco-pose-mini")

describe("data.schedule", function()
  it("close_mosaic switches mosaic off at epoch epochs - N (reference rule)", function()
    local s = data.schedule({ close_mosaic = 10 }, 100)
    assert.are.equal(1.0, s(0).mosaic)
    assert.are.equal(1.0, s(89).mosaic)
    assert.are.equal(0.0, s(90).mosaic)
    assert.are.equal(0.0, s(99).mosaic)
    assert.are.equal(0.5, s(95).fliplr)
  end)

  it("keeps the reference quirks for short runs", function()
    local short = data.schedule({ close_mosaic = 10 }, 5) -- epochs < N: never
    for e = 0, 4 do assert.are.equal(1.0, short(e).mosaic) end
    local equal = data.schedule({ close_mosaic = 10 }, 10) -- epochs == N: from 0
    assert.are.equal(0.0, equal(0).mosaic)
    local never = data.schedule({ close_mosaic = 0 }, 10)
    assert.are.equal(1.0, never(9).mosaic)
  end)

  it("accepts a function of the epoch, merged over the defaults", function()
    local s = data.schedule(function(e, n) return { degrees = e, scale = e / n } end, 10)
    assert.are.equal(3, s(3).degrees)
    assert.are.equal(0.3, s(3).scale)
    assert.are.equal(0.015, s(3).hsv_h)
  end)

  it("rejects unknown keys (typos)", function()
    assert.has_error(function() data.schedule({ mosiac = 0 }, 10) end)
    local s = data.schedule(function() return { fliprl = 1 } end, 3)
    assert.has_error(function() s(0) end)
  end)
end)

describe("data descriptors", function()
  it("coco_pose_mini describes 17 keypoints with an involutive flip_idx", function()
    local d = data.load_descriptor("coco_pose_mini")
    assert.are.same({ 17, 3 }, d.kpt_shape)
    assert.are.equal(17, #d.flip_idx)
    for i, j in ipairs(d.flip_idx) do
      assert.are.equal(i - 1, d.flip_idx[j + 1])
    end
    if mini then assert.is_string(d.path) end
  end)

  it("an unknown descriptor is an error naming it", function()
    assert.has_error(function() data.load_descriptor("no_such_dataset") end)
  end)
end)

describe("data options", function()
  it("misspelled loader or dataset options raise", function()
    local dir = tmpdir()
    assert.has_error(function() data.open_yolo(dir .. "/images/train", { imgsize = 640 }) end)
    assert.has_error(function() data.open_yolo(dir .. "/images/train", { policy = "ignore" }) end)
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("a missing folder returns nil and a message naming it", function()
    local ds, msg, code = data.open_yolo("/nonexistent/images/train")
    assert.is_nil(ds)
    assert.matches("/nonexistent/images/train", msg)
    assert.are.equal("io error", code)
  end)
end)

describe("bad files and rows", function()
  local dir
  setup(function()
    dir = tmpdir()
    local png = "\137PNG\r\n\26\n" -- a signature and nothing else: truncated PNG
    write(dir .. "/images/train/trunc.png", png)
    write(dir .. "/images/train/garbage.jpg", string.rep("\1\2\3\4", 100))
    write(dir .. "/images/train/empty.jpg", "")
    if mini then
      local jpg = read(mini .. "/images/val/000000000139.jpg")
      write(dir .. "/images/train/good.jpg", jpg)
      write(dir .. "/labels/train/good.txt", read(mini .. "/labels/val/000000000139.txt"))
      write(dir .. "/images/train/badrow.jpg", jpg)
      write(dir .. "/labels/train/badrow.txt", "0 0.5 0.5 0.1 0.1 1 2\n")
      write(dir .. "/images/train/cut.jpg", jpg:sub(1, math.floor(#jpg / 2)))
    end
  end)
  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)

  it("are counted by reason with policy skip", function()
    if not mini then pending("coco-pose-mini not found") return end
    local ds, msg = data.open_yolo(dir .. "/images/train", { max_reject_fraction = 1.0, imgsz = 64 })
    assert.is_not_nil(ds, msg)
    local st = ds:stats()
    assert.are.equal(1, st.kept)
    assert.are.equal(5, st.rejected)
    assert.are.equal(3, st.rejects.image_corrupt) -- trunc.png, garbage.jpg, cut.jpg
    assert.are.equal(1, st.rejects.image_empty)
    assert.are.equal(1, st.rejects.label_columns)
    local all = table.concat(ds:rejects(), "\n")
    assert.matches("badrow.txt:1: 7 columns, expected 56", all, 1, true)
    assert.matches("cut.jpg", all, 1, true)
    ds:free()
  end)

  it("the Trainer warns for each rejected file, with a summary (Trainer.warn_rejects)", function()
    if not mini then pending("coco-pose-mini not found") return end
    local ds = assert(data.open_yolo(dir .. "/images/train", { max_reject_fraction = 1.0, imgsz = 64 }))
    local lines = {}
    local out = { write = function(_, s) lines[#lines + 1] = s end }
    require("lucid.trainer").warn_rejects(out, "train", ds)
    local all = table.concat(lines)
    assert.are.equal(6, #lines) -- 5 files, then the summary
    assert.matches("WARNING: train: ignoring .*badrow.txt:1: 7 columns, expected 56", all)
    assert.matches("WARNING: train: ignoring .*cut.jpg", all)
    assert.matches("WARNING: train: .*5 rejected", all)
    -- a clean split says nothing
    local clean = { rejects = function() return {} end, summary = function() error("not called") end }
    lines = {}
    require("lucid.trainer").warn_rejects(out, "val", clean)
    assert.are.equal(0, #lines)
    ds:free()
  end)

  it("fail the open with policy fail, naming the file", function()
    local ds, msg = data.open_yolo(dir .. "/images/train", { policy = "fail", imgsz = 64 })
    assert.is_nil(ds)
    assert.matches("policy fail", msg, 1, true)
    assert.matches(dir, msg, 1, true)
  end)

  it("fail the open when too many are rejected", function()
    if not mini then pending("coco-pose-mini not found (the good image comes from it)") return end
    local ds, msg = data.open_yolo(dir .. "/images/train", { max_reject_fraction = 0.2, imgsz = 64 })
    assert.is_nil(ds)
    assert.matches("max_reject_fraction", msg, 1, true)
  end)
end)

describe("the mini dataset", function()
  if not mini then
    it("is not present", function() pending("coco-pose-mini not found ($LUCID_DATASETS, ../shared/datasets, datasets)") end)
    return
  end
  local desc = data.load_descriptor("coco_pose_mini")

  it("loads train and val with zero rejects", function()
    for split, n in pairs({ train = 137, val = 32 }) do
      local ds = assert(data.open(desc, split, { imgsz = 320 }))
      local st = ds:stats()
      assert.are.equal(n, #ds)
      assert.are.equal(0, st.rejected)
      assert.are.equal(desc.instances[split], st.instances)
      assert.is_true(st.cache_bytes > 0)
      ds:free()
    end
  end)

  it("reads the same val labels from the COCO JSON", function()
    local a = assert(data.open(desc, "val", { imgsz = 320 }))
    local b = assert(data.open(desc, "val", { imgsz = 320, format = "coco" }))
    assert.are.equal(#a, #b)
    for i = 1, #a do
      assert.are.equal(a:image_path(i), b:image_path(i))
      assert.are.equal(#a:labels(i).box, #b:labels(i).box)
    end
    assert.are.equal(25, b:stats().crowd + b:stats().no_keypoints)
  end)

  it("refuses loader counts past a C int by option name (batch = 1e12 was cast to -2147483648)", function()
    local ds = assert(data.open(desc, "val", { imgsz = 128 }))
    for _, k in ipairs({ "batch", "max_gt", "imgsz", "threads", "prefetch" }) do
      local ok, e = pcall(data.loader, ds, { [k] = 1e12 })
      assert.is_false(ok)
      assert.truthy(tostring(e):find("loader options: option '" .. k .. "': expected an integer in [-2147483648, "
        .. "2147483647] (a C int), got 1000000000000", 1, true), tostring(e))
    end
    local ok, e = pcall(data.loader, ds, { batch = 2.5 })
    assert.is_false(ok)
    assert.truthy(tostring(e):find("option 'batch': expected an integer", 1, true), tostring(e))
    -- negative control: in range, the engine's own check speaks (batch >= 1)
    ok, e = pcall(data.loader, ds, { batch = 0 })
    assert.is_false(ok)
    assert.truthy(tostring(e):find("loader options: batch 0", 1, true), tostring(e))
  end)

  it("delivers fixed-shape batches with a short last batch", function()
    local ds = assert(data.open(desc, "val", { imgsz = 128 }))
    local ld = data.loader(ds, { batch = 5, threads = 2, max_gt = 16, seed = 3 })
    assert.are.equal(7, ld:num_batches())
    local count, last = 0, nil
    for b in data.batches(ld, 0, data.val) do
      count = count + 1
      assert.are.same({ 5, 3, 128, 128 }, b.images:shape())
      assert.are.equal("u8", b.images:dtype())
      assert.are.same({ 5, 16, 17, 3 }, b.kpts:shape())
      assert.are.same({ 5, 16, 4 }, b.boxes:shape())
      assert.are.same({ 5, 16 }, b.mask:shape())
      last = b.n
      assert.are.equal(0, b.overflow)
    end
    assert.are.equal(7, count)
    assert.are.equal(2, last)
    ld:free()
    ds:free()
  end)

  it("gives the same bytes with 0 (the calling thread), 1, 2 and 3 worker threads", function()
    local ds = assert(data.open(desc, "val", { imgsz = 128 }))
    local aug = data.schedule({ degrees = 10 }, 10)(0)
    local function run(threads)
      local ld = data.loader(ds, { batch = 4, threads = threads, max_gt = 32, seed = 11 })
      local out = {}
      for b in data.batches(ld, 2, aug) do
        out[#out + 1] = { b.images:clone(), b.kpts:clone(), b.boxes:clone(), b.mask:clone() }
      end
      ld:free()
      return out
    end
    local r1 = run(1)
    assert.is_true(#r1 > 1)
    for _, threads in ipairs({ 0, 2, 3 }) do
      local r = run(threads)
      assert.are.equal(#r1, #r, threads .. " threads")
      for i = 1, #r1 do
        for j = 1, 4 do
          assert.is_true(same(r1[i][j], r[i][j]), threads .. " threads: batch " .. i .. " tensor " .. j)
        end
      end
    end
    -- negative control: another seed gives other bytes
    local ld = data.loader(ds, { batch = 4, threads = 0, max_gt = 32, seed = 12 })
    ld:start_epoch(2, aug)
    assert.is_false(same(r1[1][1], ld:next().images))
    ld:free()
    ds:free()
  end)

  it("too many instances for max_gt are reported, not dropped", function()
    local ds = assert(data.open(desc, "train", { imgsz = 128 }))
    local ld = data.loader(ds, { batch = 8, threads = 2, max_gt = 2, shuffle = false })
    local over, maxc = 0, 0
    for b in data.batches(ld, 0, data.val) do
      over = over + b.overflow
      if b.max_count > maxc then maxc = b.max_count end
      local counts = b.counts:totable()
      for j = 1, b.n do
        if counts[j] > 2 then assert.is_true(b.overflow > 0) end
      end
    end
    assert.is_true(over > 0)
    assert.are.equal(ds:stats().max_instances, maxc)
    ld:free()
    ds:free()
  end)
end)
