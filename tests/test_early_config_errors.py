"""Every configuration error answers before torch is imported (issue 24, item 5): exit 2 and one
line, from a process where importing torch fails, so an error found after the import (a model
name checked by open_clip, a threshold column checked once the scorers are built) shows up as the
wrong message. Nothing here is timed: what is slow is the import, and the test forbids it."""
from __future__ import annotations

import os

import pytest

from scorekit import assert_one_line_error, run_with_blocked_imports, run_without_torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS = os.path.join(REPO, "sample_shards", "images-000000.tar")


@pytest.mark.parametrize("args, needles", [
    (["--model", "local-dir:no-such-folder"], ["model folder 'no-such-folder' (local-dir:) does not exist"]),
    (["--model", "ViT-B-99"], ["unknown CLIP model 'ViT-B-99'", "did you mean"]),
    (["--model", "ViT-B-32", "--pretrained", "/no/such/weights.safetensors"], ["does not exist"]),
    (["--min", "ocr_area=0.1"], ["threshold(s) on ['ocr_area'], which no scorer of this run writes"]),
    (["--scorer", "ocr", "--min-clip", "0.2"], ["threshold(s) on ['clip_score']", "ocr_area"]),
    (["--top", "ocr_area=30%"], ["threshold(s) on ['ocr_area'], which no scorer of this run writes"]),
    (["--top", "clip_score=130%"], ["--top 'clip_score=130%'", "must be in (0, 100]%"]),
    (["--bottom", "clip_score=0%"], ["--bottom 'clip_score=0%'", "must be in (0, 100]%"]),
    (["--top", "clip_score=30"], ["--top expects COLUMN=P% (e.g. clip_score=30%)"]),
    (["--top", "clip_score=30%", "--write-shards", "{tmp}/kept"],
     ["--write-shards with --top clip_score=...%", "wdsfilter filter", "--top clip_score=P% --write-shards DIR"]),
], ids=["missing-local-dir", "unknown-model", "missing-checkpoint", "threshold-column-clip", "threshold-column-ocr",
        "top-column", "top-over-100", "bottom-zero", "top-no-percent", "top-with-write-shards"])
def test_score_configuration_errors_answer_before_torch(tmp_path, args, needles):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, output, open_clip = run_without_torch(tmp_path, "score", SHARDS, "--out", str(tmp_path / "out"), *args)
    assert code == 2, output
    assert_one_line_error(output, *needles)
    assert not open_clip
    assert not os.path.exists(tmp_path / "out" / "scores")  # nothing was started


def test_a_known_model_name_is_taken_before_torch(tmp_path):
    """The name check reads open_clip's config list without importing it: a good name passes it
    and the run goes on to the first import of torch (here: refused, as torch is poisoned)."""
    code, output, _ = run_without_torch(tmp_path, "score", SHARDS, "--out", str(tmp_path / "out"),
                                        "--model", "ViT-B-32", "--min-clip", "0.2")
    assert code == 2 and "torch" in output and "unknown CLIP model" not in output and "threshold" not in output, output


@pytest.mark.parametrize("command", [
    ["score", SHARDS, "--out", "{tmp}/out", "--write-shards", "/proc/wds"],
    ["score", SHARDS, "--out", "/proc/wds-out"],
    ["validate", SHARDS, "--output", "/proc/nope"],
], ids=["score-write-shards", "score-out", "validate-output"])
def test_an_output_that_cannot_be_created_is_a_usage_error(tmp_path, command):
    """/proc passes os.access for root but refuses new files: the output check creates a probe file."""
    if not os.path.isdir("/proc"):
        pytest.skip("no /proc")
    code, output, open_clip = run_without_torch(tmp_path, *[c.format(tmp=tmp_path) for c in command])
    assert code == 2, output
    assert_one_line_error(output, "/proc/")
    assert not open_clip


def test_an_ocr_option_error_answers_before_torch(tmp_path):
    code, output, _ = run_without_torch(tmp_path, "score", SHARDS, "--out", str(tmp_path / "out"), "--scorer", "ocr",
                                        "--scorer-opt", "ocr.max_side=10")
    assert code == 2, output
    assert_one_line_error(output, "max_side must be >= 32")


@pytest.mark.parametrize("option", ["--top", "--min"])
def test_score_refuses_a_threshold_on_a_column_that_holds_no_numbers_before_scoring(tmp_path, option):
    """score --top sha256=30% (the hash scorer's sha256 is declared a string): refused at once, as
    `wdsfilter filter` refuses it; it was found only when the run ended, after every shard was
    scored (the share resolved by filter's rule), with exit 2 and no thresholds.json."""
    from click.testing import CliRunner
    from scorekit import make_shards

    from wdsfilter.cli import main
    shards, _ = make_shards(str(tmp_path / "src"), [4])
    value = "sha256=30%" if option == "--top" else "sha256=0.5"
    r = CliRunner().invoke(main, ["score", shards[0], "--scorer", "hash", "--out", str(tmp_path / "run"), option,
                                  value, "--device", "cpu", "--workers", "0", "--no-progress"])
    assert r.exit_code == 2 and "sha256" in r.output and "not hold numbers" in r.output, r.output
    assert not os.path.exists(tmp_path / "run" / "done") or not os.listdir(tmp_path / "run" / "done")


def test_a_score_config_given_a_dict_for_its_stage_names_the_type_it_wants(tmp_path):
    # The output checks read stage.storage_options first: a dict there was an AttributeError, a
    # traceback instead of the configuration error the API promises.
    from wdsfilter.core.errors import ConfigError
    from wdsfilter.score.config import ScoreConfig
    with pytest.raises(ConfigError, match=r"stage must be a StageConfig .*got dict"):
        ScoreConfig(stage={}, out=str(tmp_path / "out"))




def test_a_cuda_device_that_is_not_there_answers_before_the_models_are_imported(tmp_path):
    """--device cuda:99 needs torch to be refused (torch.cuda says which devices there are), not
    open_clip: the local engine checks its devices once torch is imported, before the scorers
    import open_clip and torchvision (with torch._dynamo, which imports pandas: ~10 s at load 1,
    issue 36 item 4). Before, the check ran when the model workers started, after them."""
    code, output, loaded = run_with_blocked_imports(tmp_path, ("open_clip", "torchvision"), "score", SHARDS, "--out",
                                                    str(tmp_path / "out"), "--device", "cuda:99", "--no-progress")
    assert code == 2, output
    # no GPU here: "no CUDA device is available"; on a GPU machine: "GPU(s) [99] requested but only N visible"
    assert_one_line_error(output, "99")
    assert "open_clip" not in output and "torchvision" not in output, output
    assert loaded == [], output  # nor pyarrow (the score columns' types), nor pandas
    assert not os.path.exists(tmp_path / "out" / "scores")
