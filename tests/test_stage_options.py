"""The stage options are declared once (config.STAGE_OPTIONS) for every command that reads
shards: `validate` and `score` take the same flags, and each reaches the run's StageConfig."""
import json
import os

from click.testing import CliRunner

from shardkit import image_text_members, write_shard
from wdsfilter.cli import main
from wdsfilter.stream.config import STAGE_OPTIONS, StageConfig
from wdsfilter.runfolder.tables import read_rows


def test_validate_and_score_take_every_stage_option():
    fields = set(StageConfig.__dataclass_fields__)
    for name in ("validate", "score"):
        declared = {p.name: p for p in main.commands[name].params}
        for flag, param, _, _ in STAGE_OPTIONS:
            assert param in declared, (name, flag)
            assert flag.split("/")[0] in declared[param].opts, (name, flag)
            assert param in fields or param in ("max_bytes", "storage_options"), param  # each sets its field


def test_score_max_pixels_and_image_token_reach_the_stage(tmp_path):
    """`score --max-pixels` guards images as validate's does (rows rejected, reason named), and
    --image-token is the run's stage setting (run.json)."""
    shard = write_shard(tmp_path / "a.tar", image_text_members(3))
    outs = {}
    for name, args in (("plain", []), ("guarded", ["--max-pixels", "10", "--image-token", "<image>"])):
        out = str(tmp_path / name)
        r = CliRunner().invoke(main, ["score", shard, "--out", out, "--scorer", "hash", "--device", "cpu",
                                      "--no-progress", "--workers", "0", *args])
        outs[name] = [row for f in sorted(os.listdir(os.path.join(out, "scores")))
                      for row in read_rows(os.path.join(out, "scores", f))]
        assert len(outs[name]) == 3, r.output
    assert {r["status"] for r in outs["plain"]} == {"scored"}
    assert {r["status"] for r in outs["guarded"]} == {"rejected"}
    assert all("max_pixels" in (r["message"] or "") + (r["reason"] or "") for r in outs["guarded"]), outs["guarded"]
    with open(tmp_path / "guarded" / "run.json") as f:
        stage = json.load(f)["stage"]
    assert stage["max_pixels"] == 10 and stage["image_token"] == "<image>"
