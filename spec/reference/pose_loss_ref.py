#!/usr/bin/env python3
"""pose_loss_ref.py - PyTorch re-implementation of the pose training loss
(Ultralytics v8PoseLoss + TaskAlignedAssigner), written from the formulas of
../shared/reference/yolo_pose_reference.md section 2, in the reference's own
dense style ([B, G, A] tensors, torch.topk, argmax), to check lucid's C loss
(engine/train/loss*.c), which is written per anchor / per gt.

    LUCID_LOSS_DUMP=DIR build/tests/test_loss_ref   # lucid writes DIR/<case>/
    python3 spec/reference/pose_loss_ref.py DIR [--device cuda|cpu]

For every case directory it recomputes the loss in float64 and float32 on the
device, compares with lucid's results and prints "ok ..." / "not ok ..." lines
(the spec/c/test.h convention); the exit status is 1 when a check fails.
Tolerances (issue 4): total and components 1e-4 relative, gradients 1e-3
relative to the largest gradient of each output; f64 is also held to 1e-9.
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

OKS_SIGMA = np.array([.26, .25, .25, .35, .35, .79, .79, .72, .72, .62, .62,
                      1.07, 1.07, .87, .87, .89, .89]) / 10.0
GAINS = [7.5, 12.0, 1.0, 0.5, 1.5]  # box, pose, kobj, cls, dfl


def make_anchors(levels, dtype, device):
    """Cell centres (j+0.5, i+0.5) per level, row-major; strides [A, 1]."""
    pts, st = [], []
    for h, w, s in levels:
        sx = torch.arange(w, dtype=dtype, device=device) + 0.5
        sy = torch.arange(h, dtype=dtype, device=device) + 0.5
        yy, xx = torch.meshgrid(sy, sx, indexing="ij")
        pts.append(torch.stack((xx, yy), -1).view(-1, 2))
        st.append(torch.full((h * w, 1), float(s), dtype=dtype, device=device))
    return torch.cat(pts), torch.cat(st)


def xywh2xyxy(x):
    y = torch.empty_like(x)
    wh = x[..., 2:] / 2
    y[..., :2] = x[..., :2] - wh
    y[..., 2:] = x[..., :2] + wh
    return y


def xyxy2xywh(x):
    y = torch.empty_like(x)
    y[..., 0] = (x[..., 0] + x[..., 2]) / 2
    y[..., 1] = (x[..., 1] + x[..., 3]) / 2
    y[..., 2] = x[..., 2] - x[..., 0]
    y[..., 3] = x[..., 3] - x[..., 1]
    return y


def bbox_ciou(box1, box2, eps=1e-7):
    """bbox_iou(xywh=False, CIoU=True); alpha under no_grad."""
    b1_x1, b1_y1, b1_x2, b1_y2 = box1.unbind(-1)
    b2_x1, b2_y1, b2_x2, b2_y2 = box2.unbind(-1)
    w1, h1 = b1_x2 - b1_x1, b1_y2 - b1_y1 + eps
    w2, h2 = b2_x2 - b2_x1, b2_y2 - b2_y1 + eps
    inter = (b1_x2.minimum(b2_x2) - b1_x1.maximum(b2_x1)).clamp(0) * \
            (b1_y2.minimum(b2_y2) - b1_y1.maximum(b2_y1)).clamp(0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    cw = b1_x2.maximum(b2_x2) - b1_x1.minimum(b2_x1)
    ch = b1_y2.maximum(b2_y2) - b1_y1.minimum(b2_y1)
    c2 = cw.pow(2) + ch.pow(2) + eps
    rho2 = ((b2_x1 + b2_x2 - b1_x1 - b1_x2).pow(2) +
            (b2_y1 + b2_y2 - b1_y1 - b1_y2).pow(2)) / 4
    v = (4 / math.pi ** 2) * (torch.atan(w2 / h2) - torch.atan(w1 / h1)).pow(2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


@torch.no_grad()
def assign(pd_scores, pd_bboxes, anc, gt_labels, gt_bboxes, mask_gt, strides,
           nc, topk=10, alpha=0.5, beta=6.0, eps=1e-9):
    """TaskAlignedAssigner. pd_scores [B,A,nc] (sigmoid), pd_bboxes [B,A,4]
    px, anc [A,2] px, gt_labels [B,G] long, gt_bboxes [B,G,4] px,
    mask_gt [B,G] bool. Returns target boxes, scores, fg, target_gt_idx."""
    bs, n_max, _ = gt_bboxes.shape
    na = anc.shape[0]
    # select_candidates_in_gts, with the 8.4 small-box widening
    xywh = xyxy2xywh(gt_bboxes)
    small = (xywh[..., 2:] < strides[0]) & mask_gt[..., None]
    xywh[..., 2:] = torch.where(small, torch.full_like(xywh[..., 2:], strides[1]),
                                xywh[..., 2:])
    cand = xywh2xyxy(xywh)
    deltas = torch.cat((anc[None, None] - cand[:, :, None, :2],
                        cand[:, :, None, 2:] - anc[None, None]), -1)
    mask_in = deltas.amin(-1).gt(eps)                        # B, G, A
    m = mask_in & mask_gt[..., None]
    # get_box_metrics
    overlaps = torch.zeros(bs, n_max, na, dtype=pd_bboxes.dtype, device=anc.device)
    scores = torch.zeros_like(overlaps)
    sc_g = pd_scores.permute(0, 2, 1).gather(1, gt_labels[..., None].expand(-1, -1, na))
    scores[m] = sc_g[m]
    pd = pd_bboxes[:, None].expand(-1, n_max, -1, -1)[m]
    gt = gt_bboxes[:, :, None].expand(-1, -1, na, -1)[m]
    overlaps[m] = bbox_ciou(gt, pd).clamp(0)
    align = scores.pow(alpha) * overlaps.pow(beta)
    # select_topk_candidates
    topk_idx = torch.topk(align, topk, dim=-1, largest=True).indices
    topk_idx.masked_fill_(~mask_gt[..., None].expand(-1, -1, topk), 0)
    count = torch.zeros(align.shape, dtype=torch.int8, device=anc.device)
    ones = torch.ones_like(topk_idx[:, :, :1], dtype=torch.int8)
    for k in range(topk):
        count.scatter_add_(-1, topk_idx[:, :, k:k + 1], ones)
    count.masked_fill_(count > 1, 0)
    mask_pos = count.to(align.dtype) * mask_in * mask_gt[..., None]
    # select_highest_overlaps
    fg = mask_pos.sum(-2)
    if fg.max() > 1:
        multi = (fg.unsqueeze(1) > 1).expand(-1, n_max, -1)
        is_max = torch.zeros_like(mask_pos)
        is_max.scatter_(1, overlaps.argmax(1).unsqueeze(1), 1)
        mask_pos = torch.where(multi, is_max, mask_pos)
        fg = mask_pos.sum(-2)
    tidx = mask_pos.argmax(-2)                                # B, A
    # get_targets and normalisation
    tlabels = gt_labels.gather(1, tidx).clamp(0)
    tboxes = gt_bboxes.gather(1, tidx[..., None].expand(-1, -1, 4))
    align = align * mask_pos
    pos_al = align.amax(-1, keepdim=True)
    pos_ov = (overlaps * mask_pos).amax(-1, keepdim=True)
    norm = (align * pos_ov / (pos_al + eps)).amax(-2)         # B, A
    tscores = F.one_hot(tlabels, nc).to(norm.dtype) * (fg > 0)[..., None] * norm[..., None]
    return tboxes, tscores, fg > 0, tidx


def pose_loss(pred_box, pred_cls, pred_kpt, t_cls, t_boxes, t_kpts, t_valid,
              levels, nc, K, reg_max=16):
    """v8PoseLoss. pred_* [B, C, A]. Returns (total, items, (fg, tidx, score))."""
    dt, dev = pred_box.dtype, pred_box.device
    B, A = pred_box.shape[0], pred_box.shape[2]
    pd = pred_box.permute(0, 2, 1)                  # B, A, 4R
    ps = pred_cls.permute(0, 2, 1)                  # B, A, nc
    pk = pred_kpt.permute(0, 2, 1).reshape(B, A, K, 3)
    anc, st = make_anchors(levels, dt, dev)
    strides = [float(s) for _, _, s in levels]
    H, W = levels[0][0] * strides[0], levels[0][1] * strides[0]
    # preprocess: normalised xywh -> pixel xyxy; padding = not valid or sum 0
    gtb = xywh2xyxy(t_boxes.to(dt) * torch.tensor([W, H, W, H], dtype=dt, device=dev))
    mask_gt = (t_valid != 0) & (gtb.sum(-1) > 0)
    gtb = gtb * mask_gt[..., None]
    labels = torch.where(mask_gt, t_cls.long().clamp(0, nc - 1), 0)
    # bbox_decode, kpts_decode
    proj = torch.arange(reg_max, dtype=dt, device=dev)
    dist = pd.view(B, A, 4, reg_max).softmax(3).matmul(proj)
    pbox = torch.cat((anc - dist[..., :2], anc + dist[..., 2:]), -1)
    pkd = pk.clone()
    pkd[..., :2] = pkd[..., :2] * 2.0
    pkd[..., 0] = pkd[..., 0] + (anc[:, [0]] - 0.5)
    pkd[..., 1] = pkd[..., 1] + (anc[:, [1]] - 0.5)

    tboxes, tscores, fg, tidx = assign(ps.detach().sigmoid(), pbox.detach() * st,
                                       anc * st, labels, gtb, mask_gt, strides, nc)
    tss = max(tscores.sum(), 1)
    loss = torch.zeros(5, dtype=dt, device=dev)
    loss[3] = F.binary_cross_entropy_with_logits(ps, tscores.to(dt), reduction="none").sum() / tss
    if fg.sum():
        tb = tboxes / st
        weight = tscores.sum(-1)[fg].unsqueeze(-1)
        iou = bbox_ciou(pbox[fg], tb[fg]).unsqueeze(-1)
        loss[0] = ((1.0 - iou) * weight).sum() / tss
        ltrb = torch.cat((anc - tb[..., :2], tb[..., 2:] - anc), -1).clamp(0, reg_max - 1 - 0.01)[fg]
        tl = ltrb.long()
        tr = tl + 1
        wl = tr - ltrb
        wr = 1 - wl
        pdf = pd[fg].reshape(-1, reg_max)
        dfl = (F.cross_entropy(pdf, tl.view(-1), reduction="none").view(tl.shape) * wl +
               F.cross_entropy(pdf, tr.view(-1), reduction="none").view(tl.shape) * wr).mean(-1, keepdim=True)
        loss[4] = (dfl * weight).sum() / tss
        # calculate_keypoints_loss
        kp = t_kpts.to(dt).clone()
        kp[..., 0] *= W
        kp[..., 1] *= H
        kp = kp * mask_gt[..., None, None]
        sel = kp.gather(1, tidx[..., None, None].expand(-1, -1, K, 3))
        sel[..., :2] /= st.view(1, -1, 1, 1)
        gk = sel[fg]
        area = xyxy2xywh(tb[fg])[:, 2:].prod(1, keepdim=True)
        pkf = pkd[fg]
        kmask = gk[..., 2] != 0
        sig = torch.from_numpy(OKS_SIGMA).to(dev) if K == 17 else torch.ones(K, device=dev) / K
        d = (pkf[..., 0] - gk[..., 0]).pow(2) + (pkf[..., 1] - gk[..., 1]).pow(2)
        factor = kmask.shape[1] / (torch.sum(kmask != 0, dim=1) + 1e-9)
        e = d / ((2 * sig).pow(2) * (area + 1e-9) * 2)
        loss[1] = (factor.view(-1, 1) * ((1 - torch.exp(-e)) * kmask)).mean()
        loss[2] = F.binary_cross_entropy_with_logits(pkf[..., 2], kmask.to(dt))
    loss = loss * torch.tensor(GAINS, dtype=dt, device=dev)
    score = tscores.sum(-1)
    return loss.sum() * B, loss.detach(), (fg, tidx, score)


# ---------------------------------------------------------------- checks
failures = 0


def check(name, cond, why=""):
    global failures
    if cond:
        print(f"ok {name}")
    else:
        failures += 1
        print(f"not ok {name}: {why}")


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))


def run_case(d, device):
    name = os.path.basename(d.rstrip("/"))
    ld = lambda n: np.load(os.path.join(d, n + ".npy"))
    meta = ld("meta")
    B, nc, K, G, R, nl = (int(x) for x in meta[:6])
    levels = [(int(meta[6 + 3 * l]), int(meta[7 + 3 * l]), float(meta[8 + 3 * l])) for l in range(nl)]
    for prec, dt in (("c64", torch.float64), ("c32", torch.float32)):
        outs = [torch.tensor(ld(n), dtype=dt, device=device, requires_grad=True)
                for n in ("pred_box", "pred_cls", "pred_kpt")]
        tg = [torch.tensor(ld(n), dtype=torch.float32, device=device)
              for n in ("t_cls", "t_boxes", "t_kpts", "t_valid")]
        total, items, (fg, tidx, score) = pose_loss(*outs, *tg, levels, nc, K, R)
        total.backward()
        tag = f"torch {name} {'f64' if dt == torch.float64 else 'f32'}"
        ctgt = ld(prec + "_tgt")
        ttgt = torch.where(fg, tidx, -1).cpu().numpy()
        nd = int((ctgt != ttgt).sum())
        check(f"{tag}: same assignment ({int(fg.sum())} fg)", nd == 0, f"{nd} anchors differ")
        if nd == 0:
            check(f"{tag}: target scores", rel(ld(prec + "_score")[ctgt >= 0], score.cpu().numpy()[ctgt >= 0]) < 1e-4,
                  f"rel {rel(ld(prec + '_score')[ctgt >= 0], score.cpu().numpy()[ctgt >= 0]):.3g}")
        tol = 1e-9 if dt == torch.float64 else 1e-4
        ci, ti = ld(prec + "_items"), items.cpu().numpy()
        ct, tt = float(ld(prec + "_total")[0]), float(total.detach().cpu())
        e = max(rel(ci, ti), rel(ct, tt))
        check(f"{tag}: total and items within {tol:g}", e < tol,
              f"rel {e:.3g}; lucid {ci} {ct}, torch {ti} {tt}")
        print(f"# {tag}: total lucid {ct:.10g} torch {tt:.10g}, max rel {e:.3g}")
        gtol = 1e-9 if dt == torch.float64 else 1e-3
        for o, gn in zip(outs, ("gbox", "gcls", "gkpt")):
            cg, tgr = ld(prec + "_" + gn).astype(np.float64), o.grad.double().cpu().numpy()
            e = float(np.max(np.abs(cg - tgr)) / max(np.max(np.abs(tgr)), 1e-30))
            check(f"{tag}: grad {gn} within {gtol:g} of max", e < gtol, f"err {e:.3g}")
            print(f"# {tag}: grad {gn} max err / max |g| = {e:.3g}")


def main():
    args = sys.argv[1:]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if "--device" in args:
        i = args.index("--device")
        device = args[i + 1]
        del args[i:i + 2]
    if len(args) != 1:
        print(__doc__)
        return 2
    root = args[0]
    print(f"# torch {torch.__version__} on {device}")
    cases = sorted(c for c in os.listdir(root) if os.path.exists(os.path.join(root, c, "meta.npy")))
    check("found cases", len(cases) > 0, f"no case directories under {root}")
    for c in cases:
        run_case(os.path.join(root, c), device)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
