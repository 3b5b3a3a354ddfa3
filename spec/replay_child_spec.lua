-- replay_child_spec.lua — the child-process source of spec/support/
-- replay_child.lua (used by the gpu specs of conv_wcast, bn_dy_terms and side_sms):
-- on the CPU it must run its eager pass and stop at the recording with the
-- engine's own error, so that a broken template shows here and not only on
-- the GPU machine.
local child = require("support.replay_child")

describe("support.replay_child", function()
  it("the child runs its eager pass and names the recording's CPU refusal", function()
    local out = child.run(child.source({
      shape = { 1, 3, 64, 64 }, device = "cpu",
      setup = "local marker = 'setup ran'\nio.write(marker, '\\n')\n",
      before_capture = "io.write('before capture\\n')\n",
    }), "env")
    assert.truthy(out:find("setup ran", 1, true), out)
    assert.truthy(out:match("eager=%x+/%x+"), out)
    assert.truthy(out:find("before capture", 1, true), out)
    assert.truthy(out:find("capture_begin: CUDA graphs need a context on a CUDA device", 1, true), out)
    assert.is_nil(out:match("replay="), out)
  end)

  it("digests reads the eager and replay digests and a printed count from the child's output", function()
    local src = child.source({
      shape = { 1, 3, 64, 64 }, device = "cpu",
      setup = "io.write('side_streams=3\\n')\n",
    })
    local e, r, n, out = child.digests(src, "env", "side_streams")
    assert.truthy(e and e:match("^%x+/%x+$"), out)
    assert.is_nil(r, out) -- the CPU stops at the recording
    assert.equal(3, n, out)
    local _, _, none = child.digests(src, "env")
    assert.is_nil(none)
  end)
end)
