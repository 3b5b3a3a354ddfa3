#!/usr/bin/env python3
"""PyTorch reference of lucid's nano pose networks (YOLO11n-pose, YOLOv8n-pose).

Plain torch.nn modules written from ../shared/reference/yolo_pose_reference.md
section 1 (Ultralytics 8.4.114 blocks), with the Ultralytics state-dict names
("model.0.conv.weight", "model.23.cv4.0.2.bias", ...), so the safetensors file
that lucid writes (model:save) loads with strict=True.

    python3 yolo11_pose_ref.py --weights W --io IO --out REF [--model yolo11]
                               [--device cpu|cuda] [--compare LUCID] [--tol 1e-4]

IO (written by spec/reference/lucid_dump.lua) holds "x" [B,3,H,W] and the
output gradients "g.boxes", "g.scores", "g.kpts". The model runs in train mode
(BatchNorm on batch statistics), forward then backward with those gradients,
and REF receives the outputs ("boxes", "scores", "kpts"), every parameter
gradient ("grad.<name>") and the BN buffers after the step ("<name>" of each
buffer). With --compare LUCID (a file of the same names written by lucid), the
script prints the norm-wise relative error ||a-b||/||b|| per tensor and exits 1
when any exceeds --tol. TF32 is disabled so cuda runs in true fp32.
"""
import argparse
import math
import sys

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file


def autopad(k, p=None, d=1):
    if d > 1:
        k = d * (k - 1) + 1
    return k // 2 if p is None else p


class Conv(nn.Module):
    def __init__(self, c1, c2, k=1, s=1, p=None, g=1, d=1, act=True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p, d), groups=g, dilation=d, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=1e-3, momentum=0.03)
        self.act = nn.SiLU() if act is True else nn.Identity()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class DWConv(Conv):
    def __init__(self, c1, c2, k=1, s=1, d=1, act=True):
        super().__init__(c1, c2, k, s, g=math.gcd(c1, c2), d=d, act=act)


class Bottleneck(nn.Module):
    def __init__(self, c1, c2, shortcut=True, g=1, k=(3, 3), e=0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, k[0], 1)
        self.cv2 = Conv(c_, c2, k[1], 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    def __init__(self, c1, c2, n=1, shortcut=False, g=1, e=0.5):
        super().__init__()
        self.c = int(c2 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, self.c, shortcut, g, k=(3, 3), e=1.0) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class C3(nn.Module):
    def __init__(self, c1, c2, n=1, shortcut=True, g=1, e=0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut, g, k=(1, 3), e=1.0) for _ in range(n)))

    def forward(self, x):
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class C3k(C3):
    def __init__(self, c1, c2, n=1, shortcut=True, g=1, e=0.5, k=3):
        super().__init__(c1, c2, n, shortcut, g, e)
        c_ = int(c2 * e)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut, g, k=(k, k), e=1.0) for _ in range(n)))


class Attention(nn.Module):
    def __init__(self, dim, num_heads=8, attn_ratio=0.5):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.key_dim = int(self.head_dim * attn_ratio)
        self.scale = self.key_dim ** -0.5
        h = dim + self.key_dim * num_heads * 2
        self.qkv = Conv(dim, h, 1, act=False)
        self.proj = Conv(dim, dim, 1, act=False)
        self.pe = Conv(dim, dim, 3, 1, g=dim, act=False)

    def forward(self, x):
        B, C, H, W = x.shape
        N = H * W
        q, k, v = self.qkv(x).view(B, self.num_heads, self.key_dim * 2 + self.head_dim, N).split(
            [self.key_dim, self.key_dim, self.head_dim], dim=2)
        attn = ((q.transpose(-2, -1) @ k) * self.scale).softmax(dim=-1)
        x = (v @ attn.transpose(-2, -1)).view(B, C, H, W) + self.pe(v.reshape(B, C, H, W))
        return self.proj(x)


class PSABlock(nn.Module):
    def __init__(self, c, attn_ratio=0.5, num_heads=4, shortcut=True):
        super().__init__()
        self.attn = Attention(c, attn_ratio=attn_ratio, num_heads=num_heads)
        self.ffn = nn.Sequential(Conv(c, c * 2, 1), Conv(c * 2, c, 1, act=False))
        self.add = shortcut

    def forward(self, x):
        x = x + self.attn(x) if self.add else self.attn(x)
        return x + self.ffn(x) if self.add else self.ffn(x)


class C2PSA(nn.Module):
    def __init__(self, c1, c2, n=1, e=0.5):
        super().__init__()
        assert c1 == c2
        self.c = int(c1 * e)
        self.cv1 = Conv(c1, 2 * self.c, 1, 1)
        self.cv2 = Conv(2 * self.c, c1, 1)
        self.m = nn.Sequential(*(PSABlock(self.c, attn_ratio=0.5, num_heads=self.c // 64) for _ in range(n)))

    def forward(self, x):
        a, b = self.cv1(x).split((self.c, self.c), dim=1)
        return self.cv2(torch.cat((a, self.m(b)), 1))


class C3k2(C2f):
    def __init__(self, c1, c2, n=1, c3k=False, e=0.5, attn=False, g=1, shortcut=True):
        super().__init__(c1, c2, n, shortcut, g, e)
        self.m = nn.ModuleList(
            nn.Sequential(Bottleneck(self.c, self.c, shortcut, g),
                          PSABlock(self.c, attn_ratio=0.5, num_heads=max(self.c // 64, 1)))
            if attn else C3k(self.c, self.c, 2, shortcut, g) if c3k else Bottleneck(self.c, self.c, shortcut, g)
            for _ in range(n))


class SPPF(nn.Module):
    def __init__(self, c1, c2, k=5, n=3, shortcut=False):
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, 1, act=False)
        self.cv2 = Conv(c_ * (n + 1), c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)
        self.n = n
        self.add = shortcut and c1 == c2

    def forward(self, x):
        y = [self.cv1(x)]
        y.extend(self.m(y[-1]) for _ in range(self.n))
        y = self.cv2(torch.cat(y, 1))
        return y + x if self.add else y


class Concat(nn.Module):
    def __init__(self, dimension=1):
        super().__init__()
        self.d = dimension

    def forward(self, x):
        return torch.cat(x, self.d)


class DFL(nn.Module):
    def __init__(self, c1=16):
        super().__init__()
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        self.conv.weight.data[:] = torch.arange(c1, dtype=torch.float).view(1, c1, 1, 1)
        self.c1 = c1

    def forward(self, x):
        b, _, a = x.shape
        return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)


class Pose(nn.Module):
    def __init__(self, nc=80, kpt_shape=(17, 3), reg_max=16, ch=(), legacy=False):
        super().__init__()
        self.nc, self.nl, self.reg_max = nc, len(ch), reg_max
        self.kpt_shape = kpt_shape
        self.nk = kpt_shape[0] * kpt_shape[1]
        c2, c3 = max((16, ch[0] // 4, self.reg_max * 4)), max(ch[0], min(self.nc, 100))
        self.cv2 = nn.ModuleList(
            nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * self.reg_max, 1)) for x in ch)
        self.cv3 = (
            nn.ModuleList(nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, self.nc, 1)) for x in ch)
            if legacy else nn.ModuleList(
                nn.Sequential(nn.Sequential(DWConv(x, x, 3), Conv(x, c3, 1)),
                              nn.Sequential(DWConv(c3, c3, 3), Conv(c3, c3, 1)),
                              nn.Conv2d(c3, self.nc, 1)) for x in ch))
        self.dfl = DFL(self.reg_max) if self.reg_max > 1 else nn.Identity()
        c4 = max(ch[0] // 4, self.nk)
        self.cv4 = nn.ModuleList(nn.Sequential(Conv(x, c4, 3), Conv(c4, c4, 3), nn.Conv2d(c4, self.nk, 1)) for x in ch)

    def forward(self, x):
        bs = x[0].shape[0]
        boxes = torch.cat([self.cv2[i](x[i]).view(bs, 4 * self.reg_max, -1) for i in range(self.nl)], -1)
        scores = torch.cat([self.cv3[i](x[i]).view(bs, self.nc, -1) for i in range(self.nl)], -1)
        kpts = torch.cat([self.cv4[i](x[i]).view(bs, self.nk, -1) for i in range(self.nl)], -1)
        return dict(boxes=boxes, scores=scores, kpts=kpts)


# Layer tables (the same data as lua/lucid/models/*.lua).
YOLO11 = dict(scales=dict(n=(0.50, 0.25, 1024)), rows=[
    (-1, 1, "Conv", [64, 3, 2]), (-1, 1, "Conv", [128, 3, 2]), (-1, 2, "C3k2", [256, False, 0.25]),
    (-1, 1, "Conv", [256, 3, 2]), (-1, 2, "C3k2", [512, False, 0.25]), (-1, 1, "Conv", [512, 3, 2]),
    (-1, 2, "C3k2", [512, True]), (-1, 1, "Conv", [1024, 3, 2]), (-1, 2, "C3k2", [1024, True]),
    (-1, 1, "SPPF", [1024, 5]), (-1, 2, "C2PSA", [1024]),
    (-1, 1, "Upsample", [None, 2, "nearest"]), ([-1, 6], 1, "Concat", [1]), (-1, 2, "C3k2", [512, False]),
    (-1, 1, "Upsample", [None, 2, "nearest"]), ([-1, 4], 1, "Concat", [1]), (-1, 2, "C3k2", [256, False]),
    (-1, 1, "Conv", [256, 3, 2]), ([-1, 13], 1, "Concat", [1]), (-1, 2, "C3k2", [512, False]),
    (-1, 1, "Conv", [512, 3, 2]), ([-1, 10], 1, "Concat", [1]), (-1, 2, "C3k2", [1024, True]),
    ([16, 19, 22], 1, "Pose", ["nc", "kpt_shape"])])
YOLOV8 = dict(scales=dict(n=(0.33, 0.25, 1024)), rows=[
    (-1, 1, "Conv", [64, 3, 2]), (-1, 1, "Conv", [128, 3, 2]), (-1, 3, "C2f", [128, True]),
    (-1, 1, "Conv", [256, 3, 2]), (-1, 6, "C2f", [256, True]), (-1, 1, "Conv", [512, 3, 2]),
    (-1, 6, "C2f", [512, True]), (-1, 1, "Conv", [1024, 3, 2]), (-1, 3, "C2f", [1024, True]),
    (-1, 1, "SPPF", [1024, 5]),
    (-1, 1, "Upsample", [None, 2, "nearest"]), ([-1, 6], 1, "Concat", [1]), (-1, 3, "C2f", [512]),
    (-1, 1, "Upsample", [None, 2, "nearest"]), ([-1, 4], 1, "Concat", [1]), (-1, 3, "C2f", [256]),
    (-1, 1, "Conv", [256, 3, 2]), ([-1, 12], 1, "Concat", [1]), (-1, 3, "C2f", [512]),
    (-1, 1, "Conv", [512, 3, 2]), ([-1, 9], 1, "Concat", [1]), (-1, 3, "C2f", [1024]),
    ([15, 18, 21], 1, "Pose", ["nc", "kpt_shape"])])

MODULES = dict(Conv=Conv, C2f=C2f, C3k2=C3k2, SPPF=SPPF, C2PSA=C2PSA)
REPEAT = {"C2f", "C3k2", "C2PSA"}


class PoseModel(nn.Module):
    """parse_model of the layer table (scaling rules of section 1.2)."""

    def __init__(self, table, scale="n", nc=1, kpt_shape=(17, 3), ch=3):
        super().__init__()
        depth, width, max_ch = table["scales"][scale]
        chs, layers, self.froms, legacy = [ch], [], [], True
        for i, (f, n, name, args) in enumerate(table["rows"]):
            args = [nc if a == "nc" else list(kpt_shape) if a == "kpt_shape" else a for a in args]
            n = max(round(n * depth), 1) if n > 1 else n
            if name in MODULES:
                c1, c2 = chs[f], args[0]
                if c2 != nc:
                    c2 = math.ceil(min(c2, max_ch) * width / 8) * 8
                args = [c1, c2, *args[1:]]
                if name in REPEAT:
                    args.insert(2, n)
                    n = 1
                if name == "C3k2":
                    legacy = False
                m = MODULES[name](*args)
            elif name == "Concat":
                c2 = sum(chs[x] for x in f)
                m = Concat(args[0])
            elif name == "Upsample":
                c2 = chs[f]
                m = nn.Upsample(None, args[1], args[2])
            elif name == "Pose":
                m = Pose(nc, tuple(kpt_shape), 16, [chs[x] for x in f], legacy)
                c2 = None
            else:
                raise ValueError(name)
            assert n == 1
            layers.append(m)
            self.froms.append(f)
            if i == 0:
                chs = []
            chs.append(c2)
        self.model = nn.Sequential(*layers)

    def forward(self, x):
        y = []
        for m, f in zip(self.model, self.froms):
            if f != -1:
                x = y[f] if isinstance(f, int) else [x if j == -1 else y[j] for j in f]
            x = m(x)
            y.append(x)
        return x


def rel_err(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--io", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="yolo11", choices=["yolo11", "yolov8"])
    ap.add_argument("--nc", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--compare")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True

    model = PoseModel(YOLO11 if a.model == "yolo11" else YOLOV8, nc=a.nc)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"reference {a.model}n-pose: {n_params} parameters")
    sd = load_file(a.weights)
    model.load_state_dict(sd, strict=True)
    model.to(a.device).train()
    io = load_file(a.io)
    x = io["x"].to(a.device).float()
    out = model(x)
    grads = [io["g." + k].to(a.device).float() for k in ("boxes", "scores", "kpts")]
    torch.autograd.backward([out["boxes"], out["scores"], out["kpts"]], grads)
    res = {k: out[k].detach().float().cpu().contiguous() for k in ("boxes", "scores", "kpts")}
    for name, p in model.named_parameters():
        if p.grad is not None:
            res["grad." + name] = p.grad.detach().float().cpu().contiguous()
    for name, b in model.named_buffers():
        if b.dtype.is_floating_point:
            res[name] = b.detach().float().cpu().contiguous()
    save_file(res, a.out)
    if a.compare:
        sys.exit(compare(res, load_file(a.compare), a.tol))


def compare(res, mine, tol):
    """Norm-wise relative error per tensor. A gradient whose reference norm
    is below 1e-6 of the largest gradient norm is zero up to rounding (e.g.
    the bias of a BatchNorm whose output only reaches later train-mode
    BatchNorms through linear maps: a per-channel shift is normalised away),
    so it passes when lucid's norm is that small too. Returns the exit code."""
    gmax = max((res[k].double().norm().item() for k in res if k.startswith("grad.")), default=0.0)
    zero_tol = 1e-6 * gmax
    failed, missing, zeros, errs = [], [], [], {}
    for k, ref in res.items():
        if k not in mine:
            missing.append(k)
            continue
        if k.startswith("grad.") and ref.double().norm().item() < zero_tol:
            if mine[k].double().norm().item() < zero_tol:
                zeros.append(k)
                continue
        e = rel_err(mine[k], ref)
        errs[k] = e
        if e > tol or not math.isfinite(e):
            failed.append((k, e))
    groups = {"outputs": [k for k in errs if k in ("boxes", "scores", "kpts")],
              "grads": [k for k in errs if k.startswith("grad.")],
              "buffers": [k for k in errs if k.startswith("model.")]}
    for kind, keys in groups.items():
        if keys:
            print(f"{kind}: {len(keys)} tensors, max rel err {max(errs[k] for k in keys):.3e}")
    print(f"zero gradients (norm < {zero_tol:.2e} in both): {len(zeros)}: {', '.join(zeros)}")
    print(f"compared {len(errs)} tensors, worst rel err {max(errs.values(), default=0):.3e} (tol {tol:g})")
    for k, e in sorted(failed, key=lambda t: -t[1])[:20]:
        print(f"FAIL {k}: rel err {e:.3e}")
    for k in missing[:20]:
        print(f"MISSING in lucid file: {k}")
    return 1 if failed or missing else 0


if __name__ == "__main__":
    main()
