"""A scorer's scores do not depend on which other scorers share the pass (issue 35 item 16): the
decode stage decodes a JPEG once at the DCT scale every scorer can use, and a scorer that alone
would have been given a smaller scale gets the image decoded again at its own (transport.OwnPixels).
Before, adding --scorer hash changed clip_score by up to 0.006 (0.002 on the sample shards with
the tiny CLIP). Real photos (scikit-image's) as JPEG members of shards written by webdataset."""
import io
import os

import pyarrow.parquet as pq
import pytest

from scorekit import SmallFloorScorer

pytest.importorskip("imagehash")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    import skimage.data as data
    import webdataset as wds
    from PIL import Image
    folder = tmp_path_factory.mktemp("pixels")
    path = str(folder / "photos-000000.tar")
    with wds.TarWriter(path) as sink:
        for i, name in enumerate(("astronaut", "coffee", "chelsea", "rocket", "camera", "coins")):
            img = Image.fromarray(getattr(data, name)()).convert("RGB").resize((600, 480))
            buf = io.BytesIO()
            img.save(buf, "JPEG", quality=90)
            sink.write({"__key__": f"{i:04d}", "jpg": buf.getvalue(), "txt": f"a photo of {name}"})
    return [path]


def _columns(out, *names):
    folder = os.path.join(out, "scores")
    t = pq.read_table(os.path.join(folder, sorted(os.listdir(folder))[0])).to_pydict()
    return [t[n] for n in names]


def test_each_scorer_gets_the_pixels_it_would_get_alone(shards, tmp_path):
    from wdsfilter.score import score
    common = dict(device="cpu", workers=0, progress=False)
    score(shards, out=str(tmp_path / "alone"), scorers=[SmallFloorScorer()], **common)
    score(shards, out=str(tmp_path / "hash"), scorers=["hash"], **common)
    score(shards, out=str(tmp_path / "both"), scorers=[SmallFloorScorer(), "hash"], **common)
    alone, = _columns(str(tmp_path / "alone"), "small_brightness")
    hashed, = _columns(str(tmp_path / "hash"), "phash")
    both, phash = _columns(str(tmp_path / "both"), "small_brightness", "phash")
    assert both == alone and phash == hashed
    # the two scales really differ here: the hash scorer's 128 px floor is 1/4 of these photos, the
    # small scorer's 16 px 1/8, and brightness from 8x8 samples sees the difference
    import webdataset as wds

    from wdsfilter.media.images import decode_image
    first = next(iter(wds.WebDataset(shards, shardshuffle=False)))
    eighth, quarter = (decode_image(first["jpg"], None, floor=f) for f in ((16, 16), (128, 128)))
    assert eighth.size != quarter.size
    small = SmallFloorScorer()
    small.load("cpu")
    at = [small.score_batch([small.prepare({"image": im, "caption": "x", "__key__": "k"})])[0]["small_brightness"]
          for im in (eighth, quarter)]
    assert at[0] != at[1] and at[0] == pytest.approx(alone[0])
