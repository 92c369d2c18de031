"""Measured quality of `wdsfilter dedup` on real photos (the table in docs/dedup.md).

    python tools/measure_dedup_quality.py [--bits 0,2,4,5,6,8,10,12]

Builds the photo shards of tests/dedupkit.py (scikit-image's photos with planted byte copies,
re-encodes, resizes, crops, PNG<->JPEG and mirrored copies, and distinct photos that look alike),
scores them once with `--scorer hash`, then runs `wdsfilter dedup` per near distance and prints,
per variant, the share found in its photo's group (recall), and the pairs of distinct photos put
in one group (false positives).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]


def main() -> None:
    import pyarrow.parquet as pq

    import dedupkit
    from wdsfilter.dedup import dedup
    from wdsfilter.score import score

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bits", default="0,2,4,5,6,8,10,12")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shards, truth = dedupkit.build(os.path.join(tmp, "shards"))
        run = os.path.join(tmp, "run")
        score(shards, out=run, scorers=["hash"], device="cpu", progress=False, workers=0, image_key="jpg;png")
        originals = {n: k for k, (n, v) in truth.items() if v == "original"}
        distinct = [k for k, (n, v) in truth.items() if v == "original"]
        print(f"{len(truth)} images: {len(dedupkit.BASES)} photos x {len(dedupkit.VARIANTS)} variants, "
              f"{len(distinct)} distinct photos ({len(distinct) * (len(distinct) - 1) // 2} pairs)")
        header = ["kind/bits"] + list(dedupkit.VARIANTS) + ["distinct pairs grouped"]
        print(" | ".join(header))
        for kind, bits in [("exact", 0)] + [("near", int(b)) for b in args.bits.split(",")]:
            dedup(run, kinds=[kind], near_bits=bits)
            group = {}
            for f in os.listdir(os.path.join(run, "dedup")):
                if f.endswith(".parquet"):
                    for row in pq.read_table(os.path.join(run, "dedup", f)).to_pylist():
                        group[row["key"]] = row["group"]
            cells = []
            for v in dedupkit.VARIANTS:
                pairs = [(originals[n], k) for k, (n, vv) in truth.items() if vv == v]
                found = sum(group[a] is not None and group[a] == group[b] for a, b in pairs)
                cells.append(f"{found}/{len(pairs)}")
            fp = [(truth[a][0], truth[b][0]) for i, a in enumerate(distinct) for b in distinct[i + 1:]
                  if group[a] is not None and group[a] == group[b]]
            label = kind if kind == "exact" else f"near k={bits}"
            print(" | ".join([label] + cells + [f"{len(fp)} {fp[:3] if fp else ''}"]))


if __name__ == "__main__":
    main()
