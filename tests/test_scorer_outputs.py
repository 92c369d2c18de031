"""A user's scorer that returns what its float column cannot hold (an array, no value for its
column, a column it does not declare, an infinity) is the scorer's error: the sample's row fails
with `bad_score_output`, in the ledger, naming the scorer and the column; a scorer that does so
for every sample stops the run in one line naming it, the column and the sample (exit 3), not as
"internal error ... a bug in wdsfilter" and not as rows marked scored with no score
(wdsfilter/score/outputs.py)."""
import os

import pytest
from click.testing import CliRunner

from scorekit import make_shards
from wdsfilter.cli import main
from wdsfilter.runfolder.tables import read_rows
from wdsfilter.score.ledger import read_entries

ODD = (3, 9)
WHAT = {"array": "returned ndarray of shape (2,) for its float column 'wrong_score'",
        "missing": "returned no value for its column(s) 'wrong_score'",
        "extra": "returned column 'undeclared', which it does not declare",
        "inf": "returned float inf for its float column 'wrong_score'"}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards")
    make_shards(folder, [20], refused={0: ODD})  # "refuse-me" in the captions of samples 3 and 9
    return str(folder)


def _score(shards, out, mode, word):
    return CliRunner().invoke(main, ["score", shards, "--scorer", "scorekit:WrongTypeScorer", "--scorer-opt",
                                     f"wrong.mode={mode}", "--scorer-opt", f"wrong.word={word}", "--out", out,
                                     "--device", "cpu", "--workers", "0", "--no-progress"])


@pytest.mark.parametrize("mode", list(WHAT))
def test_a_wrong_output_fails_its_sample_into_the_ledger(shards, tmp_path, mode):
    out = str(tmp_path / "out")
    r = _score(shards, out, mode, "refuse-me")
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    rows = read_rows(os.path.join(out, "scores", "shard-0000.parquet"))
    odd = {f"s0_{i:05d}" for i in ODD}
    for row in rows:
        if row["key"] in odd:
            assert row["status"] == "failed" and row["reason"] == "bad_score_output", row
            assert "scorer 'wrong'" in row["message"] and WHAT[mode] in row["message"], row["message"]
        else:
            assert row["status"] == "scored" and isinstance(row["wrong_score"], float), row
    ledger = read_entries(os.path.join(out, "failures.parquet"))
    assert {e["key"]: (e["reason"], e["stage"]) for e in ledger} == {k: ("bad_score_output", "score") for k in odd}


def test_a_scorer_wrong_on_every_sample_stops_the_run_in_one_line(shards, tmp_path):
    r = _score(shards, str(tmp_path / "out"), "array", "")
    lines = [ln for ln in r.output.splitlines() if "error:" in ln]
    assert r.exit_code == 3 and len(lines) == 1 and "Traceback" not in r.output, r.output
    line = lines[0]
    assert "internal error" not in line and "scorer 'wrong'" in line and "'wrong_score'" in line, line
    assert "shard-0000.tar" in line and "(at row " in line, line
