"""easyocr weights are downloaded once (issue 8 item 15): by the engine in its own process before
model workers start, and under a lock in the model folder when several processes still ask at
once; easyocr's fixed temp.zip is written in a private folder, so racing downloads never share it.
There is no network here: easyocr's real downloader (urlretrieve, zip extraction) fetches from a
local web server that counts the downloads (faultkit.weights_server)."""
import hashlib
import multiprocessing
import os

import pytest

easyocr = pytest.importorskip("easyocr")

from faultkit import fetch_easyocr_weights, weights_server  # noqa: E402

FILENAME = "craft_mlt_25k.pth"


def leftovers(folder):
    return [f for f in os.listdir(folder) if f == "temp.zip" or ".tmp-" in f]


def test_processes_that_fetch_at_once_download_once(tmp_path):
    payload = os.urandom(1 << 20)
    md5 = hashlib.md5(payload).hexdigest()
    folder = str(tmp_path / "models")
    with weights_server(FILENAME, payload, delay=1.0) as (url, hits):
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(4) as pool:
            paths = pool.starmap(fetch_easyocr_weights, [(folder, url, md5)] * 4)
    assert len(hits) == 1  # one download; the other three waited for it and found the file
    assert paths == [os.path.join(folder, FILENAME)] * 4
    assert hashlib.md5(open(paths[0], "rb").read()).hexdigest() == md5
    assert leftovers(folder) == []


def test_the_engine_downloads_once_before_its_model_workers_start(tmp_path, monkeypatch):
    """Two model worker processes need the weights; the engine fetched them first, in its own
    process, so neither downloads (they could not: the test's download source exists only here)."""
    torch = pytest.importorskip("torch")
    from easyocr import config
    from easyocr.craft import CRAFT
    from scorekit import make_shards
    from wdsfilter.score import score
    from wdsfilter.score.scorers.ocr import OcrScorer
    import io
    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.save(CRAFT().state_dict(), buf)
    payload = buf.getvalue()
    folder = str(tmp_path / "models")
    urls = make_shards(tmp_path / "shards", [3])[0]
    with weights_server(FILENAME, payload) as (url, hits):
        monkeypatch.setitem(config.detection_models["craft"], "url", url)
        monkeypatch.setitem(config.detection_models["craft"], "md5sum", hashlib.md5(payload).hexdigest())
        # verify_checksum=False: the workers (fresh processes, easyocr's own table) accept the file as it is.
        # The random CRAFT runs on the frames at their own size (min_side 0) and its boxes are not read
        # (min_text_score=None): this test is about the weights, not about detection.
        scorer = OcrScorer(backend="easyocr", model_dir=folder, download=True, min_text_score=None,
                           backend_options={"verify_checksum": False, "min_side": 0})
        summary = score(urls, out=str(tmp_path / "out"), scorers=[scorer], devices=["cpu", "cpu"], workers=0,
                        progress=False, batch_size=2)
    assert len(hits) == 1 and summary.status == {"scored": 3}
    assert leftovers(folder) == []
