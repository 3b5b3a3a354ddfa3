-- replay_child_spec.lua — the child-process source of spec/support/
-- replay_child.lua (used by the gpu specs of conv_wcast and bn_dy_terms):
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
end)
