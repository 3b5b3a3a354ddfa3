-- lucid.predict, lucid.image, lucid.eval.decode_nms and lucid.val_output (CPU):
-- annotated PNGs and a COCO results JSON from a model on real images; the
-- letterbox equals the validation loader's and maps back within half a
-- pixel; pose drawing colours the expected pixels; checkpoints prefer EMA;
-- an image of a folder or list that cannot be decoded (a truncated JPEG) is
-- skipped with its path and reason, a single one is an error; imgsz
-- defaults to the checkpoint's training imgsz, else 640.
local lucid = require("lucid")
local data = require("lucid.data")
local predict = require("lucid.predict")
local val_output = require("lucid.val_output")
local build = require("lucid.models.yolo11_pose")
local cjson = require("cjson")

local mini = data.find_dataset("coco-pose-mini")
local describe_data = mini and describe or pending

local files = require "support.files"
local read_all, tmpdir = files.read, files.tmpdir
local checkpoint = require("lucid.checkpoint")

-- The message of the error fn(...) raises (fails the spec when none).
local function err_of(fn, ...)
  local ok, e = pcall(fn, ...)
  assert(not ok, "expected an error")
  return tostring(e)
end

local function val_images(n)
  local list = predict.list_sources(mini .. "/images/val")
  local out = {}
  for i = 1, n do out[i] = list[i] end
  return out
end

local function pixel(t, x, y)
  local v = t:narrow(1, y + 1, 1):narrow(2, x + 1, 1):contiguous():to("cpu", "f32"):totable()
  return v[1][1]
end

describe("lucid.image", function()
  it("writes a PNG that reads back to the same pixels (HWC and CHW)", function()
    local d = tmpdir()
    local t = lucid.arange(0, 5 * 7 * 3):view({ 5, 7, 3 }):to("cpu", "u8")
    assert.is_true(lucid.image.write_png(d .. "/a.png", t))
    local back, orient = lucid.image.read(d .. "/a.png")
    assert.are.same({ 5, 7, 3 }, back:shape())
    assert.equals(1, orient)
    assert.equals(0, (back:to("cpu", "f32") - t:to("cpu", "f32")):abs():max():item())
    -- the same image as CHW (a permuted view) writes the same file content
    local chw = t:permute(3, 1, 2)
    assert.is_true(lucid.image.write_png(d .. "/b.png", chw))
    assert.equals(read_all(d .. "/a.png"), read_all(d .. "/b.png"))
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("reports an unwritable or unreadable path with nil, message naming it", function()
    local t = lucid.zeros({ 4, 4, 3 }, { dtype = "u8" })
    local ok, msg, st = lucid.image.write_png("/nonexistent-lucid-dir/x.png", t)
    assert.is_nil(ok)
    assert.truthy(msg:find("/nonexistent-lucid-dir/x.png", 1, true))
    assert.truthy(st:find("io", 1, true))
    local img, msg2 = lucid.image.read("/nonexistent-lucid-dir/y.jpg")
    assert.is_nil(img)
    assert.truthy(msg2:find("/nonexistent-lucid-dir/y.jpg", 1, true))
    assert.has_error(function() lucid.image.write_png("/tmp/x.png", lucid.zeros({ 4, 4 }, { dtype = "u8" })) end)
    assert.has_error(function() lucid.image.draw_pose(lucid.zeros({ 4, 4, 3 }), {}) end) -- f32
    assert.has_error(function() lucid.image.draw_pose(lucid.zeros({ 4, 4, 3 }, { dtype = "u8" }), {}, { bogus = 1 }) end)
  end)

  it("draw_pose colours the pixels along a limb and skips low-confidence keypoints", function()
    local img = lucid.zeros({ 64, 64, 3 }, { dtype = "u8" })
    local k = {}
    for i = 1, 51 do k[i] = 0 end
    -- left shoulder (6th keypoint) and left elbow (8th): limb [6, 8] of COCO
    k[16], k[17], k[18] = 10.5, 10.5, 0.9
    k[22], k[23], k[24] = 40.5, 40.5, 0.9
    -- left hip (12th) below the threshold: limbs [6, 12] and [12, 13] absent
    k[34], k[35], k[36] = 10.5, 60.5, 0.4
    lucid.image.draw_pose(img, { { box = { 0, 0, 63, 63 }, conf = 0.9, cls = 0, kpts = k } },
      { boxes = false, kpt_threshold = 0.5 })
    -- the arm palette colour (Ultralytics pose palette entry 0, as RGB)
    for _, p in ipairs({ { 20, 20 }, { 25, 25 }, { 30, 30 } }) do
      assert.are.same({ 0, 128, 255 }, pixel(img, p[1], p[2]))
    end
    assert.are.same({ 0, 0, 0 }, pixel(img, 10, 58)) -- the hip is not drawn
    assert.are.same({ 0, 0, 0 }, pixel(img, 10, 35)) -- nor the torso limb to it
    assert.are.same({ 0, 0, 0 }, pixel(img, 50, 10)) -- far from the limb
    -- with boxes: the box outline is drawn in the class colour
    lucid.image.draw_pose(img, { { box = { 2, 30, 60, 62 }, conf = 0.5, cls = 0 } }, { labels = false })
    assert.are_not.same({ 0, 0, 0 }, pixel(img, 2, 45))
    -- below `conf`: nothing is drawn
    local img2 = lucid.zeros({ 32, 32, 3 }, { dtype = "u8" })
    lucid.image.draw_pose(img2, { { box = { 2, 2, 30, 30 }, conf = 0.1, cls = 0 } }, { conf = 0.25 })
    assert.equals(0, img2:to("cpu", "f32"):max():item())
  end)

  it("letterbox geometry maps a point into the network input and back within 0.5 px", function()
    for _, c in ipairs({ { 640, 426, 128 }, { 500, 375, 640 }, { 333, 500, 128 }, { 17, 900, 320 } }) do
      local w, h, s = c[1], c[2], c[3]
      local g = lucid.image.geometry(w, h, s)
      g.w, g.h = w, h
      for _, p in ipairs({ { 0.3, 0.7 }, { w * 0.5, h * 0.25 }, { w - 0.2, h - 0.9 } }) do
        local nx, ny = p[1] * g.rx + g.pad_x, p[2] * g.ry + g.pad_y
        assert.is_true(nx >= 0 and nx <= s and ny >= 0 and ny <= s)
        local back = predict.unletterbox({ box = { nx, ny, nx, ny }, conf = 1, cls = 0 }, g)
        assert.is_true(math.abs(back.box[1] - p[1]) < 0.5 and math.abs(back.box[2] - p[2]) < 0.5)
      end
    end
  end)

  it("decode_nms checks its arguments", function()
    local b = lucid.zeros({ 1, 64, 21 })
    local c = lucid.zeros({ 1, 1, 21 })
    local k = lucid.zeros({ 1, 51, 21 })
    assert.has_error(function() lucid.eval.decode_nms(b, c, k, { imgsz = 64 }) end) -- 84 anchors at 64
    assert.has_error(function() lucid.eval.decode_nms(b, c, k, { imgsz = 100 }) end)
    assert.has_error(function() lucid.eval.decode_nms(b, c, k, { imgsz = 64, confidence = 1 }) end)
    -- a max_det past a C int is named, not wrapped to a negative count
    assert.has_error(function() lucid.eval.decode_nms(b, c, k, { imgsz = 64, max_det = 1e12 }) end,
      "lucid.eval.decode_nms: option 'max_det': expected an integer in [-2147483648, 2147483647] (a C int), got "
      .. "1000000000000")
    local b2, c2, k2 = lucid.zeros({ 1, 64, 84 }), lucid.zeros({ 1, 1, 84 }), lucid.zeros({ 1, 51, 84 })
    -- sigmoid(0) = 0.5: every anchor passes conf 0.25; NMS keeps the distinct boxes
    local dets = lucid.eval.decode_nms(b2, c2, k2, { imgsz = 64, conf = 0.25, max_det = 5 })
    assert.is_true(#dets >= 1 and #dets <= 5)
    assert.equals(51, #dets[1].kpts)
    assert.equals(0, #lucid.eval.decode_nms(b2, c2, k2, { imgsz = 64, conf = 0.6 }))
    -- the largest max_det (a C int) keeps what max_det = 84 (one per anchor)
    -- keeps, without buffers for 2^31 - 1 detections
    local all = lucid.eval.decode_nms(b2, c2, k2, { imgsz = 64, conf = 0.25, max_det = 84 })
    assert.equals(#all, #lucid.eval.decode_nms(b2, c2, k2, { imgsz = 64, conf = 0.25, max_det = 2 ^ 31 - 1 }))
  end)
end)

describe_data("lucid.predict on real images", function()
  local S = 128

  it("letterbox equals the validation loader's image byte for byte", function()
    local desc = data.load_descriptor("coco_pose_mini")
    local ds = assert(data.open(desc, "val", { imgsz = S, cache = false }))
    local ld = data.loader(ds, { batch = 2, imgsz = S, max_gt = 32, threads = 1, shuffle = false })
    ld:start_epoch(0, data.val)
    local vb = ld:next()
    for i = 1, 2 do
      local idx = vb.sample_index[i]
      local img = assert(lucid.image.read(ds:image_path(idx)))
      local w, h = lucid.image.dataset_image_size(ds, idx)
      assert.are.same({ h, w, 3 }, img:shape())
      local lb, rx, px, py, ry = lucid.image.letterbox(img, S)
      local g = lucid.image.geometry(w, h, S)
      assert.are.same({ g.rx, g.pad_x, g.pad_y, g.ry }, { rx, px, py, ry })
      local ref = vb.images:select(1, i):permute(2, 3, 1):contiguous()
      assert.equals(0, (lb:to("cpu", "f32") - ref:to("cpu", "f32")):abs():max():item())
    end
    ld:free()
    ds:free()
  end)

  it("writes annotated PNGs and a COCO results JSON in original pixels", function()
    local d = tmpdir()
    lucid.manual_seed(0)
    local model = build{ scale = "n", nc = 1, kpt_shape = { 17, 3 } }
    model:save(d .. "/w.safetensors")
    local model2 = build{ scale = "n", nc = 1, kpt_shape = { 17, 3 } }
    local rep = predict.load_weights(model2, d .. "/w.safetensors")
    assert.is_false(rep.ema)
    assert.equals(#model2.params:list(), rep.loaded)
    local srcs = val_images(2)
    local res = predict.run{ model = model2, sources = srcs, imgsz = S, conf = 0, max_det = 50,
      out_dir = d .. "/out" }
    assert.equals(2, #res.images)
    local sizes = {}
    for i, r in ipairs(res.images) do
      local orig = assert(lucid.image.read(srcs[i]))
      local png = assert(lucid.image.read(r.png))
      assert.are.same(orig:shape(), png:shape())
      assert.equals(d .. "/out/" .. srcs[i]:match("([^/]+)%.jpg$") .. ".png", r.png)
      assert.is_true(#r.detections > 0 and #r.detections <= 50)
      sizes[r.image_id] = { r.width, r.height }
      -- the numeric COCO stem is the image id
      assert.equals(tonumber(srcs[i]:match("(%d+)%.jpg$")), r.image_id)
    end
    local entries = cjson.decode(read_all(d .. "/out/predictions.json"))
    assert.equals(#res.images[1].detections + #res.images[2].detections, #entries)
    for _, e in ipairs(entries) do
      local wh = assert(sizes[e.image_id])
      assert.equals(1, e.category_id)
      assert.equals(51, #e.keypoints)
      local x, y, w, h = e.bbox[1], e.bbox[2], e.bbox[3], e.bbox[4]
      assert.is_true(x >= 0 and y >= 0 and w >= 0 and h >= 0)
      assert.is_true(x + w <= wh[1] + 1e-3 and y + h <= wh[2] + 1e-3)
      assert.is_true(e.score >= 0 and e.score <= 1)
      for k = 1, 51, 3 do
        assert.is_true(e.keypoints[k] >= 0 and e.keypoints[k] <= wh[1])
        assert.is_true(e.keypoints[k + 1] >= 0 and e.keypoints[k + 1] <= wh[2])
        assert.is_true(e.keypoints[k + 2] >= 0 and e.keypoints[k + 2] <= 1)
      end
    end
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("prefers a checkpoint's EMA weights and reports what it skipped", function()
    local d = tmpdir()
    local model = build{ scale = "n", nc = 1, kpt_shape = { 17, 3 } }
    local entries = {}
    local probe
    for _, p in ipairs(model.params:list()) do
      entries[#entries + 1] = { p.name, p:data() }
      if p:data():dtype() == "f32" then
        local e = p:data():clone():fill_(0.25)
        entries[#entries + 1] = { "ema." .. p.name, e }
        probe = probe or p.name
      end
    end
    entries[#entries + 1] = { "optimizer.x.momentum_buffer", lucid.zeros({ 2 }) }
    entries[#entries + 1] = { "something.else", lucid.zeros({ 3 }) }
    lucid.io.safetensors_save(d .. "/ck.safetensors", entries)
    local m2 = build{ scale = "n", nc = 1, kpt_shape = { 17, 3 } }
    local rep = predict.load_weights(m2, d .. "/ck.safetensors")
    assert.is_true(rep.ema)
    assert.is_true(rep.ema_loaded > 0)
    assert.are.same({ "something.else" }, rep.unexpected)
    assert.equals(0.25, m2:param(probe):data():max():item())
    assert.equals(0.25, m2:param(probe):data():min():item())
    local m3 = build{ scale = "n", nc = 1, kpt_shape = { 17, 3 } }
    local rep3 = predict.load_weights(m3, d .. "/ck.safetensors", { ema = false })
    assert.is_false(rep3.ema)
    assert.equals(0, (m3:param(probe):data() - model:param(probe):data()):abs():max():item())
    os.execute("rm -rf '" .. d .. "'")
  end)

  -- a real val image cut short (its first bytes still a JPEG's, so
  -- predict.check_images passes it) beside two good ones
  local function folder_with_truncated_jpeg()
    local d = tmpdir()
    os.execute("mkdir -p '" .. d .. "/src'")
    local imgs = val_images(2)
    local good = read_all(imgs[1])
    files.write(d .. "/src/a.jpg", good)
    files.write(d .. "/src/b.jpg", good:sub(1, math.floor(#good / 3)))
    files.write(d .. "/src/c.jpg", read_all(imgs[2]))
    return d, d .. "/src/a.jpg", d .. "/src/b.jpg", d .. "/src/c.jpg"
  end

  it("skips an image of a folder or a list that cannot be decoded (a truncated JPEG), naming it and the "
    .. "decoder's reason, and predicts the others", function()
    local d, a, b, c = folder_with_truncated_jpeg()
    -- the decoder returns the failure (never prints it): nil, the path and libjpeg's message
    local img, msg = lucid.image.read(b)
    assert.is_nil(img)
    assert.are.equal(b .. ": corrupt or truncated JPEG: Premature end of JPEG file", msg)
    local model = build{ scale = "n", nc = 1, kpt_shape = { 17, 3 } }
    local skips, seen = {}, {}
    local res = predict.run{ model = model, sources = d .. "/src", imgsz = 64, conf = 0, max_det = 5,
      out_dir = d .. "/out",
      on_image = function(r, i, n) seen[#seen + 1] = { r.path, i, n } end,
      on_skip = function(s, i, n) skips[#skips + 1] = { s.path, s.reason, i, n } end }
    assert.are.same({ { a, 1, 3 }, { c, 3, 3 } }, seen)
    assert.are.same({ { b, "corrupt or truncated JPEG: Premature end of JPEG file", 2, 3 } }, skips)
    assert.are.same({ { path = b, index = 2, reason = "corrupt or truncated JPEG: Premature end of JPEG file" } },
      res.skipped)
    assert.are.equal(2, #res.images)
    assert.are.same({ a, c }, { res.images[1].path, res.images[2].path })
    -- the image ids keep each image's place in the sources (a is 1, c is 3)
    assert.are.same({ 1, 3 }, { res.images[1].image_id, res.images[2].image_id })
    assert.are.same({ "a.png", "c.png", "predictions.json" }, files.listdir(d .. "/out"))
    local ids = {}
    for _, e in ipairs(cjson.decode(read_all(d .. "/out/predictions.json"))) do ids[e.image_id] = true end
    assert.are.same({ [1] = true, [3] = true }, ids)
    -- a list of files: the same (a corrupt header, libjpeg's error path, too)
    files.write(d .. "/src/e.jpg", "\255\216\255\224 not much of a JPEG")
    skips = {}
    res = predict.run{ model = model, sources = { b, c, d .. "/src/e.jpg" }, imgsz = 64, save = false,
      on_skip = function(s, i, n) skips[#skips + 1] = { s.path, i, n } end }
    assert.are.same({ { b, 1, 3 }, { d .. "/src/e.jpg", 3, 3 } }, skips)
    assert.are.equal(1, #res.images)
    assert.truthy(res.skipped[2].reason:find("^corrupt JPEG: "), res.skipped[2].reason)
    -- the default report: one line on stderr, the image, its place and the reason
    local lines = {}
    local stderr = io.stderr
    io.stderr = { write = function(_, ...) lines[#lines + 1] = table.concat({ ... }) end }
    local ok, err = pcall(predict.run, { model = model, sources = { a, b }, imgsz = 64, save = false })
    io.stderr = stderr
    assert(ok, err)
    assert.are.same({ "WARNING: predict: skipping image 2/2 " .. b .. ": corrupt or truncated JPEG: Premature end "
      .. "of JPEG file\n" }, lines)
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("a single image file that cannot be decoded is an error naming it; so is a source with no readable image",
    function()
    local d, a, b = folder_with_truncated_jpeg()
    local model = build{ scale = "n", nc = 1, kpt_shape = { 17, 3 } }
    local want = "predict: cannot read image " .. b .. ": corrupt or truncated JPEG: Premature end of JPEG file"
    assert.are.equal(want, err_of(predict.run, { model = model, sources = b, imgsz = 64, out_dir = d .. "/o1" }))
    assert.are.equal(want, err_of(predict.run, { model = model, sources = { b }, imgsz = 64, save = false }))
    assert.are.same({}, files.listdir(d .. "/o1"))
    -- a folder of one unreadable image, and a list of unreadable ones: nothing to predict
    os.execute("mkdir -p '" .. d .. "/one'")
    files.write(d .. "/one/b.jpg", read_all(b))
    local quiet = function() end
    assert.are.equal("predict: the only image could not be read (" .. d .. "/one/b.jpg: corrupt or truncated "
      .. "JPEG: Premature end of JPEG file); predictions.json was not written",
      err_of(predict.run, { model = model, sources = d .. "/one", imgsz = 64, out_dir = d .. "/o2", on_skip = quiet }))
    assert.are.equal("predict: none of the 2 images could be read (the first, " .. b .. ": corrupt or truncated "
      .. "JPEG: Premature end of JPEG file)", err_of(predict.run, { model = model, sources = { b, d .. "/one/b.jpg" },
      imgsz = 64, save = false, on_skip = quiet }))
    -- an older predictions.json in out= is left as it was, and the message says so
    files.write(d .. "/o2/predictions.json", "[]")
    assert.are.equal("predict: the only image could not be read (" .. d .. "/one/b.jpg: corrupt or truncated "
      .. "JPEG: Premature end of JPEG file); predictions.json was not written (the one already in " .. d
      .. "/o2 is left as it was)",
      err_of(predict.run, { model = model, sources = d .. "/one", imgsz = 64, out_dir = d .. "/o2", on_skip = quiet }))
    assert.are.equal("[]", files.read(d .. "/o2/predictions.json"))
    -- imgsz "auto" in any case is the weights' imgsz
    assert.are.equal(1, #predict.run{ model = model, sources = a, imgsz = "AUTO", save = false }.images)
    -- negative control: the good file alone
    assert.are.equal(1, #predict.run{ model = model, sources = a, imgsz = 64, save = false }.images)
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("predicts at the imgsz the checkpoint was trained at unless imgsz is given, else at 640", function()
    local d = tmpdir()
    local img = val_images(1)
    local model = build{ scale = "n", nc = 1, kpt_shape = { 17, 3 } }
    checkpoint.save(d .. "/ck96.safetensors", { model = model, epoch = 0, config = { imgsz = 96, epochs = 1 } })
    model:save(d .. "/plain.safetensors")
    local m2 = build{ scale = "n", nc = 1, kpt_shape = { 17, 3 } }
    local rep = predict.load_weights(m2, d .. "/ck96.safetensors")
    assert.are.equal(96, rep.imgsz)
    assert.are.equal(96, rep.train_args.imgsz)
    assert.are.equal(96, m2.train_args.imgsz)
    assert.are.same({ imgsz = 96, epochs = 1 }, predict.train_args(d .. "/ck96.safetensors"))
    local function side(o)
      o.model, o.sources, o.save, o.max_det = m2, img, false, 1
      return predict.run(o).images[1].input_shape[3]
    end
    assert.are.equal(96, side{})
    assert.are.equal(96, side{ imgsz = "auto" })
    assert.are.equal(64, side{ imgsz = 64 }) -- an explicit imgsz wins
    -- weights without training arguments (a model:save file): 640
    rep = predict.load_weights(m2, d .. "/plain.safetensors")
    assert.is_nil(rep.imgsz)
    assert.is_nil(rep.train_args)
    assert.is_nil(m2.train_args)
    assert.is_nil(predict.train_args(d .. "/plain.safetensors"))
    assert.are.equal(640, side{})
    assert.are.same({ 640, "default" }, { predict.resolve_imgsz(nil, nil) })
    assert.are.same({ 96, "weights" }, { predict.resolve_imgsz("auto", 96) })
    assert.are.same({ 320, "imgsz" }, { predict.resolve_imgsz(320, 96) })
    -- a stored imgsz prediction cannot use is named with the file where it
    -- would be used (no imgsz given); an explicit imgsz still predicts
    checkpoint.save(d .. "/ck100.safetensors", { model = model, epoch = 0, config = { imgsz = 100 } })
    rep = predict.load_weights(m2, d .. "/ck100.safetensors")
    assert.is_nil(rep.imgsz)
    assert.are.equal("predict: " .. d .. "/ck100.safetensors: the imgsz of its training arguments (metadata "
      .. "'config') is 100: expected a multiple of 32 (the network's largest stride), at least 32; give imgsz= to "
      .. "choose one", err_of(predict.train_imgsz, rep.train_args, d .. "/ck100.safetensors"))
    assert.truthy(err_of(predict.run, { model = m2, sources = img, save = false }):find("^predict: model%.train_args: "
      .. "the imgsz of its training arguments %(metadata 'config'%) is 100: "))
    assert.are.equal(64, side{ imgsz = 64 })
    assert.are.equal("predict: imgsz = 'big': expected a multiple of 32 (the network's largest stride), at least "
      .. "32, or auto (the imgsz the weights were trained at, else 640)", err_of(predict.check_options,
      { imgsz = "big" }))
    os.execute("rm -rf '" .. d .. "'")
  end)

  it("val_output writes val_predictions.json and the val_batch0_pred.png mosaic", function()
    local d = tmpdir()
    local desc = data.load_descriptor("coco_pose_mini")
    local ds = assert(data.open(desc, "val", { imgsz = S }))
    local ld = data.loader(ds, { batch = 8, imgsz = S, max_gt = 32, threads = 1, shuffle = false })
    local val = lucid.PoseValidator{ imgsz = S, nc = 1, kpt_shape = { 17, 3 } }
    local model = build{ scale = "n", nc = 1, kpt_shape = { 17, 3 } }
    model:eval()
    local vo = val_output.new{ dataset = ds, imgsz = S, save_dir = d, names = { "person" } }
    ld:start_epoch(0, data.val)
    local nimg = 0
    while true do
      local vb = ld:next()
      if not vb then break end
      local n = vb.n
      local x = lucid.empty({ n, 3, S, S })
      x:copy_(vb.images:narrow(1, 1, n)); x:mul_(1 / 255)
      local o = model:forward(x)
      local function host(t) return t:narrow(1, 1, n):to("cpu", "f32"):contiguous() end
      val:add_batch(host(o.boxes), host(o.scores), host(o.kpts), {
        cls = vb.cls:narrow(1, 1, n):contiguous(), boxes = vb.boxes:narrow(1, 1, n):contiguous(),
        kpts = vb.kpts:narrow(1, 1, n):contiguous(), mask = vb.mask:narrow(1, 1, n):to("f32"):contiguous() }, n)
      vo:add_batch(val, vb)
      nimg = nimg + n
    end
    local files = vo:finish()
    assert.equals(d .. "/val_predictions.json", files.json)
    assert.equals(d .. "/val_batch0_pred.png", files.png)
    assert.equals(#ds, files.images)
    local entries = cjson.decode(read_all(files.json))
    assert.equals(files.predictions, #entries)
    local ids = {}
    for i = 1, #ds do
      local id = tonumber(ds:image_path(i):match("(%d+)%.%a+$"))
      local w, h = lucid.image.dataset_image_size(ds, i)
      ids[id] = { w, h }
    end
    for _, e in ipairs(entries) do
      local wh = assert(ids[e.image_id], "image_id " .. tostring(e.image_id) .. " is a val image")
      assert.is_true(e.bbox[1] + e.bbox[3] <= wh[1] + 1e-3 and e.bbox[2] + e.bbox[4] <= wh[2] + 1e-3)
      assert.equals(51, #e.keypoints)
    end
    local png = assert(lucid.image.read(files.png))
    assert.are.same({ 2 * S, 2 * S, 3 }, png:shape())
    ld:free()
    ds:free()
    os.execute("rm -rf '" .. d .. "'")
  end)
end)
