"""Check that `wdsfilter score --save-embeddings` output is what clip-retrieval's index reads.

    python tools/check_embeddings_index.py OUT/embeddings        (needs: pip install autofaiss)

Builds the image and text indices with autofaiss's build_index, as `clip-retrieval index` does
(one per folder, img_emb/ and text_emb/), reads metadata/ in sorted order as clip-retrieval's back
does, and checks that vector i of each index is metadata row i: every image vector's nearest
neighbour in the image index is itself, and the index holds as many vectors as the metadata has
rows. Prints one line per check; exits 1 when one fails. Not part of the test suite: autofaiss
pins numpy < 2.
"""
from __future__ import annotations

import glob
import os
import sys
import tempfile


def main(argv=None) -> int:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from autofaiss import build_index

    folder = (argv or sys.argv[1:])[0]
    files = sorted(glob.glob(os.path.join(folder, "metadata", "*.parquet")))
    meta = pa.concat_tables([pq.read_table(f) for f in files])
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for part in ("img_emb", "text_emb"):
            vectors = np.concatenate([np.load(f) for f in sorted(glob.glob(os.path.join(folder, part, "*.npy")))])
            index, _ = build_index(embeddings=os.path.join(folder, part), index_path=os.path.join(tmp, part + ".index"),
                                   index_infos_path=os.path.join(tmp, part + ".json"), max_index_memory_usage="1G",
                                   current_memory_available="2G", verbose=40)
            _, nearest = index.search(vectors.astype("float32"), 1)
            # itself, or a vector equal to it (the same image in two samples: faiss returns either);
            # checked for unit vectors: a video's mean embedding (--frame-reduce mean) is shorter, and
            # by inner product a unit vector near it can be nearer to it than it is to itself
            found = vectors[nearest[:, 0]]
            hit = (nearest[:, 0] == np.arange(len(vectors))) | (found == vectors).all(1)
            unit = np.abs(np.linalg.norm(vectors.astype("float32"), axis=1) - 1) < 3e-3
            itself = int(hit[unit].sum())
            ok = index.ntotal == meta.num_rows == len(vectors) and (part == "text_emb" or itself == int(unit.sum()))
            failed += not ok
            print(f"{'ok ' if ok else 'BAD'} {part}: index of {index.ntotal} vectors ({type(index).__name__}), "
                  f"{meta.num_rows} metadata rows; nearest neighbour is itself for {itself} of {int(unit.sum())} "
                  f"unit vectors ({len(vectors) - int(unit.sum())} shorter: videos' mean embeddings)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
