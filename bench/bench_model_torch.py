#!/usr/bin/env python3
"""Forward+backward(+SGD) time of the PyTorch reference YOLO11n-pose network
(spec/reference/yolo11_pose_ref.py) at batch 4, 640x640, bf16 autocast, on
the GPU: eager, and replayed as a CUDA graph (torch.cuda.graphs), so lucid's
numbers (bench/bench_model.lua) are read against a baseline measured in the
same `make bench` run on the same GPU. Prints one line per arm:
    torch eager fwd+bwd+sgd  median_ms  min_ms  max_ms
Median over 50 timed iterations after 20 warm-up ones (CUDA events)."""
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "spec", "reference"))
from yolo11_pose_ref import PoseModel, YOLO11  # noqa: E402

B, S, WARM, ITERS = 4, 640, 20, 50


def timed(fn):
    times = []
    for _ in range(WARM):
        fn()
    torch.cuda.synchronize()
    for _ in range(ITERS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), min(times), max(times)


def main():
    if not torch.cuda.is_available():
        print("skip bench_model_torch: no CUDA device")
        return
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    model = PoseModel(YOLO11, nc=1).to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, nesterov=True)
    x = torch.rand(B, 3, S, S, device=dev)

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            loss = out["boxes"].float().square().mean() + out["scores"].float().mean() + out["kpts"].float().square().mean()
        loss.backward()
        opt.step()

    def fwd_bwd():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            loss = out["boxes"].float().square().mean() + out["scores"].float().mean() + out["kpts"].float().square().mean()
        loss.backward()

    for name, fn in (("eager fwd+bwd", fwd_bwd), ("eager fwd+bwd+sgd", step)):
        m, lo, hi = timed(fn)
        print(f"torch {name:24s} {m:9.3f} ms  (min {lo:.3f}, max {hi:.3f})")

    # CUDA graph of the whole step (warm up on a side stream first)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=False)
    with torch.cuda.graph(g):
        step()
    m, lo, hi = timed(g.replay)
    print(f"torch {'graph fwd+bwd+sgd':24s} {m:9.3f} ms  (min {lo:.3f}, max {hi:.3f})")


if __name__ == "__main__":
    main()
