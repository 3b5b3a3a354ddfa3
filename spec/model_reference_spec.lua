-- lucid vs the PyTorch reference (spec/reference/yolo11_pose_ref.py): same
-- safetensors weights, same input and output gradients; outputs, parameter
-- gradients and BN buffers agree to a norm-wise relative error < 1e-4 in
-- fp32. Tagged gpu: it needs python3 with torch and safetensors (the GPU
-- machine); lucid runs on LUCID_REF_DEVICE (default cpu).
-- os.execute gives 0 (Lua 5.1) or true (5.2 compatibility) on success
local function succeeded(rc) return rc == 0 or rc == true end

local function have_torch()
  return succeeded(os.execute("python3 -c 'import torch, safetensors' >/dev/null 2>&1"))
end

describe("#gpu lucid agrees with the PyTorch reference", function()
  local device = os.getenv("LUCID_REF_DEVICE") or "cpu"
  for _, name in ipairs({ "yolo11", "yolov8" }) do
    it(name .. "n-pose forward and backward (fp32, rel err < 1e-4)", function()
      if not have_torch() then
        pending("python3 with torch and safetensors is not available")
        return
      end
      local dir = os.tmpname() .. "_ref_" .. name
      assert.is_true(succeeded(os.execute(string.format("luajit spec/reference/lucid_dump.lua %s %s 2 128 %s",
        dir, name, device))))
      local cmd = string.format("python3 spec/reference/yolo11_pose_ref.py --model %s --weights %s/weights.safetensors "
        .. "--io %s/io.safetensors --out %s/ref.safetensors --compare %s/lucid.safetensors --tol 1e-4 > %s/log 2>&1",
        name, dir, dir, dir, dir, dir)
      local rc = os.execute(cmd)
      local f = io.open(dir .. "/log")
      local log = f and f:read("*a") or ""
      if f then f:close() end
      os.execute("rm -rf '" .. dir .. "'")
      assert.is_true(succeeded(rc), log)
    end)
  end
end)
