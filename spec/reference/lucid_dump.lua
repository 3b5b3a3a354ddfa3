--- lucid side of the PyTorch comparison (spec/reference/yolo11_pose_ref.py).
--
--   luajit spec/reference/lucid_dump.lua DIR [yolo11|yolov8] [B] [S] [device]
--
-- Builds the nano pose network (nc=1, 17x3) from seed 0, writes
--   DIR/weights.safetensors  the initial state dict (model:save)
--   DIR/io.safetensors       x [B,3,S,S] and output gradients g.boxes,
--                            g.scores, g.kpts (random normal)
--   DIR/lucid.safetensors    lucid's outputs (boxes, scores, kpts), every
--                            parameter gradient (grad.<name>) and the BN
--                            buffers after the train-mode step
-- Then run: python3 spec/reference/yolo11_pose_ref.py --weights
-- DIR/weights.safetensors --io DIR/io.safetensors --out DIR/ref.safetensors
-- --compare DIR/lucid.safetensors --model yolo11
package.path = "./lua/?.lua;./lua/?/init.lua;" .. package.path
package.cpath = "./?.so;" .. package.cpath
local lucid = require("lucid")

local dir = arg[1] or "runs/ref_check"
local name = arg[2] or "yolo11"
local B, S = tonumber(arg[3] or 2), tonumber(arg[4] or 128)
local device = arg[5] or "cpu"
os.execute("mkdir -p '" .. dir .. "'")

lucid.manual_seed(0)
local build = require(name == "yolov8" and "lucid.models.yolov8_pose" or "lucid.models.yolo11_pose")
local model = build({ scale = "n", nc = 1, kpt_shape = { 17, 3 }, device = device })
model:save(dir .. "/weights.safetensors")

local x = lucid.rand({ B, 3, S, S })
local A = (S / 8) ^ 2 + (S / 16) ^ 2 + (S / 32) ^ 2
local gy = {
  boxes = lucid.randn({ B, 64, A }), scores = lucid.randn({ B, 1, A }), kpts = lucid.randn({ B, 51, A }),
}
lucid.io.safetensors_save(dir .. "/io.safetensors", {
  { "x", x }, { "g.boxes", gy.boxes }, { "g.scores", gy.scores }, { "g.kpts", gy.kpts } })

local function dev(t) return device == "cpu" and t or t:to(device) end
local xd = dev(x)
model:train()
model:zero_grad()
local out = model:forward(xd)
model:backward(xd, { boxes = dev(gy.boxes), scores = dev(gy.scores), kpts = dev(gy.kpts) })

local entries = { { "boxes", out.boxes }, { "scores", out.scores }, { "kpts", out.kpts } }
for _, p in ipairs(model.params:list("param")) do
  if p.trainable then entries[#entries + 1] = { "grad." .. p.name, p:grad() } end
end
for _, p in ipairs(model.params:list("buffer")) do
  if p.dtype ~= "i64" then entries[#entries + 1] = { p.name, p:data() } end
end
lucid.io.safetensors_save(dir .. "/lucid.safetensors", entries)
print(string.format("lucid %s: %d parameters; wrote %s/{weights,io,lucid}.safetensors (x %dx3x%dx%d, %d anchors)",
  name, model:num_params(), dir, B, S, S, A))
