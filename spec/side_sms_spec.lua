-- side_sms_spec.lua — the SM partition of the low-priority lanes
-- (cuda/green.cu, LUCID_SIDE_SMS): the parameter-gradient, cast and cols
-- lanes' streams in a green context of n SMs. #gpu: make test-gpu on the
-- GPU machine; `make test` lists it as skipped.
--
-- Child processes (the switch is read once per process) run YOLO11n-pose
-- forward + backward eagerly and replayed from a recording
-- (spec/support/replay_child.lua), with and without LUCID_SIDE_SMS (half
-- the device's SMs; 64 on the H200's 132), and with a bad value: the
-- partition must be used (streams created in it) and change no bit, eager
-- or replayed (the kernels are the same; only where they may run moves);
-- a value that is not a whole number fails the first fork, naming it.
local lucid = require "lucid"

local gpu = lucid.cuda_available and lucid.cuda_available()
  or (lucid.Context{ device = "auto" }:device():sub(1, 4) == "cuda")
-- the partition asked for: half the device's SMs, in the driver's steps of
-- 8 (sm_90); a device without the sm_90 hook or with fewer than 16 SMs has
-- no partition to test (pending)
local n_side = 0
if gpu then
  package.path = "spec/?.lua;" .. package.path
  local lib = require("support.ffi_lib").lib_with("lucid_cuda_bn_coop_sm_count",
    "int lucid_cuda_bn_coop_sm_count(void);")
  local sms = lib and tonumber(lib.lucid_cuda_bn_coop_sm_count()) or 0
  n_side = 8 * math.floor(sms / 16)
end
local describe_gpu = n_side >= 8 and describe or pending

describe_gpu("the side lanes' SM partition (LUCID_SIDE_SMS) #gpu", function()
  it("runs the lanes in a partition and gives the bits of the whole device, eager and replayed", function()
    package.path = "spec/?.lua;" .. package.path
    local child = require("support.replay_child")
    local src = child.source({
      shape = { 4, 3, 320, 320 },
      setup = [[
package.path = "spec/?.lua;" .. package.path
local lib = require("support.ffi_lib").lib_with("lucid_cuda_side_stream_count",
  "unsigned long lucid_cuda_side_stream_count(void);")
]],
      after_capture = 'io.write("side_streams=", tonumber(lib.lucid_cuda_side_stream_count()), "\\n")\n',
    })
    local e0, r0, n0, o0 = child.digests(src, "env -u LUCID_SIDE_SMS", "side_streams")
    local e1, r1, n1, o1 = child.digests(src, "env LUCID_SIDE_SMS=" .. n_side, "side_streams")
    assert.is_truthy(e0 and r0, o0)
    assert.is_truthy(e1 and r1, o1)
    assert.equal(0, n0, o0)
    assert.is_true(n1 > 0, o1) -- the parameter-gradient lanes at least
    assert.are_not.equal(e0, r0) -- the halved weights changed the replay's result
    assert.equal(e0, e1, o1)
    assert.equal(r0, r1, o1)
    local e2, _, _, o2 = child.digests(src, "env LUCID_SIDE_SMS=half", "side_streams")
    assert.is_nil(e2, o2)
    assert.truthy(o2:find('LUCID_SIDE_SMS="half": expected a whole number of SMs', 1, true), o2)
  end)
end)
