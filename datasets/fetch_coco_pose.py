#!/usr/bin/env python3
"""fetch_coco_pose.py — rebuild coco-pose-mini from the public COCO 2017 files.

Needs internet access and Python 3 (standard library only). It cannot run on
the build machines (no network there); run it on a workstation.

  python3 datasets/fetch_coco_pose.py OUT_DIR [--manifest manifest.csv] [--cache DIR]

What it does (the subset is defined by manifest.csv of the shipped dataset:
one row per image with split, file, coco_id, coco_split, in_coco_json,
sha256):
  1. downloads annotations_trainval2017.zip (person_keypoints_{train,val}2017.json)
     from images.cocodataset.org (cached in --cache);
  2. downloads every image of the manifest from
     http://images.cocodataset.org/<coco_split>/<file> into
     OUT_DIR/images/<split>/ and checks its sha256 against the manifest;
  3. writes the YOLO-pose labels OUT_DIR/labels/<split>/<stem>.txt from the
     official records, as the Ultralytics / YOLOv7 coco-kpts label set does:
     persons with iscrowd == 0 and num_keypoints > 0, one row
     "0 cx cy w h" + 17 x "x y v", normalised by width/height, 6 decimals;
  4. writes OUT_DIR/annotations/person_keypoints_{train,val}.json with the
     unmodified images/annotations/licenses/categories records of the
     images whose manifest row has in_coco_json = 1.

Without --manifest it looks for coco-pose-mini/manifest.csv in
$LUCID_DATASETS, ../shared/datasets and datasets/.
"""
import argparse
import csv
import hashlib
import json
import os
import sys
import urllib.request
import zipfile

ANN_URL = "http://images.cocodataset.org/annotations/annotations_trainval2017.zip"
IMG_URL = "http://images.cocodataset.org/{split}/{file}"


def find_manifest():
    roots = [os.environ.get("LUCID_DATASETS"), "../shared/datasets", "datasets"]
    for r in roots:
        if r:
            p = os.path.join(r, "coco-pose-mini", "manifest.csv")
            if os.path.exists(p):
                return p
    return None


def download(url, dest):
    if os.path.exists(dest):
        return dest
    tmp = dest + ".part"
    print("download", url, file=sys.stderr)
    with urllib.request.urlopen(url, timeout=120) as r, open(tmp, "wb") as f:
        while True:
            chunk = r.read(1 << 20)
            if not chunk:
                break
            f.write(chunk)
    os.replace(tmp, dest)
    return dest


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def label_rows(img, anns):
    """YOLO-pose rows of one image (convert_coco with use_keypoints)."""
    w, h = float(img["width"]), float(img["height"])
    rows = []
    for a in anns:
        if a.get("iscrowd", 0) or a.get("num_keypoints", 0) == 0:
            continue
        x, y, bw, bh = a["bbox"]
        if bw <= 0 or bh <= 0:
            continue
        vals = [(x + bw / 2) / w, (y + bh / 2) / h, bw / w, bh / h]
        k = a["keypoints"]
        for i in range(0, len(k), 3):
            vals += [k[i] / w, k[i + 1] / h, float(k[i + 2])]
        rows.append("0 " + " ".join("%.6f" % v for v in vals))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--manifest", default=None)
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/lucid-coco"))
    args = ap.parse_args()
    manifest = args.manifest or find_manifest()
    if not manifest:
        sys.exit("manifest.csv not found: pass --manifest")
    with open(manifest, newline="") as f:
        rows = list(csv.DictReader(f))
    os.makedirs(args.cache, exist_ok=True)
    zpath = download(ANN_URL, os.path.join(args.cache, "annotations_trainval2017.zip"))
    coco = {}
    with zipfile.ZipFile(zpath) as z:
        for split in ("train2017", "val2017"):
            with z.open("annotations/person_keypoints_%s.json" % split) as f:
                coco[split] = json.load(f)
    index = {}
    for split, d in coco.items():
        anns = {}
        for a in d["annotations"]:
            anns.setdefault(a["image_id"], []).append(a)
        for img in d["images"]:
            index[(split, img["id"])] = (img, anns.get(img["id"], []))

    out_json = {"train": {"images": [], "annotations": []}, "val": {"images": [], "annotations": []}}
    bad = 0
    for r in rows:
        split, fname, cid, csplit = r["split"], r["file"], int(r["coco_id"]), r["coco_split"]
        img, anns = index[(csplit, cid)]
        idir = os.path.join(args.out, "images", split)
        ldir = os.path.join(args.out, "labels", split)
        os.makedirs(idir, exist_ok=True)
        os.makedirs(ldir, exist_ok=True)
        ipath = download(IMG_URL.format(split=csplit, file=fname), os.path.join(idir, fname))
        if r.get("sha256") and sha256(ipath) != r["sha256"]:
            print("sha256 mismatch:", ipath, file=sys.stderr)
            bad += 1
        lines = label_rows(img, anns)
        with open(os.path.join(ldir, os.path.splitext(fname)[0] + ".txt"), "w") as f:
            f.write("".join(line + "\n" for line in lines))
        if int(r.get("in_coco_json", "0") or 0):
            out_json[split]["images"].append(img)
            out_json[split]["annotations"].extend(anns)
    os.makedirs(os.path.join(args.out, "annotations"), exist_ok=True)
    for split, d in out_json.items():
        src = coco["val2017"]
        doc = {
            "info": {"description": "coco-pose-mini %s subset of the COCO 2017 person keypoints "
                                    "(official records, filtered)" % split},
            "licenses": src.get("licenses", []),
            "images": d["images"],
            "annotations": d["annotations"],
            "categories": src["categories"],
        }
        with open(os.path.join(args.out, "annotations", "person_keypoints_%s.json" % split), "w") as f:
            json.dump(doc, f)
    print("%d images, %d sha256 mismatches" % (len(rows), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
