"""A scoring run folder is input (issue 20, items 2 and 4): `wdsfilter filter` and
`wdsfilter.loader(scores=...)` read score files from the folder only (never the current folder,
never outside it through a recorded path or a symlink), read a source shard only where the run's
own shards.json names it (or under --source-root), and a damaged folder is a one-line error or a
counted unfinished shard, never an internal error. Real `wdsfilter score` runs, edited as users do."""
import json
import os
import shutil

import pytest
from click.testing import CliRunner

from scorekit import BrightnessScorer
from shardkit import image_bytes, write_shard
from wdsfilter.cli import main
from wdsfilter.core.errors import ConfigError


def members(n, prefix, bright=90):
    out = []
    for i in range(n):
        out += [(f"{prefix}{i:03d}.jpg", image_bytes(size=(24, 20), color=((bright + 17 * i) % 256, 90, 30))),
                (f"{prefix}{i:03d}.txt", f"caption {i}")]
    return out


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """Two shards scored from their own folder with a relative --out, as the README does (so the
    markers record paths relative to that folder); a parquet and a jsonl run."""
    from wdsfilter.score import score
    base = tmp_path_factory.mktemp("runfolder")
    os.makedirs(base / "data")
    shards = [write_shard(str(base / "data" / f"part-{s:06d}.tar"), members(6, f"p{s}_")) for s in range(2)]
    old = os.getcwd()
    os.chdir(base)
    try:
        for fmt in ("parquet", "jsonl"):
            score([os.path.relpath(s, base) for s in shards], out=f"run-{fmt}", scorers=[BrightnessScorer()],
                  device="cpu", progress=False, workers=0, batch_size=16, format=fmt)
    finally:
        os.chdir(old)
    return base, shards


@pytest.fixture
def run(scored, tmp_path):
    """A copy of the parquet run (moved: its markers' recorded paths no longer point at it)."""
    base, shards = scored
    return shutil.copytree(base / "run-parquet", tmp_path / "run"), shards


def filter_cli(*args, cwd=None):
    old = os.getcwd()
    if cwd:
        os.chdir(cwd)
    try:
        result = CliRunner().invoke(main, ["filter", *map(str, args)])
    finally:
        os.chdir(old)
    assert "internal error" not in result.output and not isinstance(result.exception, (TypeError, KeyError)), \
        result.output
    return result


def edit_json(path, **changes):
    data = json.load(open(path))
    data.update(changes)
    json.dump(data, open(path, "w"))


def test_score_files_come_from_the_folder_not_the_current_one(run, tmp_path):
    out, shards = run
    marker = json.load(open(out / "done" / "part-000000.json"))
    assert marker["score_file"] == "scores/part-000000.parquet"  # recorded relative to the run folder
    # another project's folder with its own scores/ of the same names (every row dropped there)
    other = tmp_path / "project"
    shutil.copytree(out / "scores", other / "scores")
    for name in os.listdir(other / "scores"):
        import pyarrow.parquet as pq
        t = pq.read_table(other / "scores" / name).to_pydict()
        t["status"] = ["rejected"] * len(t["status"])
        import pyarrow as pa
        pq.write_table(pa.table(t), other / "scores" / name)
    here = filter_cli(out, "--no-report", "--dry-run")
    there = filter_cli(out, "--no-report", "--dry-run", cwd=other)
    assert here.exit_code == there.exit_code == 0, there.output
    assert "no thresholds: 12 of 12 kept" in here.output and "no thresholds: 12 of 12 kept" in there.output


@pytest.mark.parametrize("recorded", ["/etc/passwd", "../../elsewhere/part-000000.parquet",
                                      "scores/part-000001.parquet"])
def test_a_score_path_that_is_not_the_shards_own_is_refused(run, recorded):
    out, shards = run
    edit_json(out / "done" / "part-000000.json", score_file=recorded)
    result = filter_cli(out, "--no-report", "--dry-run")
    assert result.exit_code == 2 and "part-000000.json" in result.output and recorded in result.output
    import wdsfilter
    with pytest.raises(ConfigError, match="part-000000.json"):
        wdsfilter.loader(shards, batch_size=2, scores=str(out))


def test_an_old_absolute_path_of_a_moved_folder_reads_the_folders_own_file(run, tmp_path):
    out, shards = run
    edit_json(out / "done" / "part-000000.json", score_file="/nowhere/old-place/scores/part-000000.parquet")
    result = filter_cli(out, "--no-report", "--dry-run")
    assert result.exit_code == 0 and "12 of 12 kept" in result.output


def test_a_symlink_out_of_the_folder_is_refused(run, tmp_path):
    out, shards = run
    outside = tmp_path / "outside.parquet"
    shutil.move(out / "scores" / "part-000000.parquet", outside)
    os.symlink(outside, out / "scores" / "part-000000.parquet")
    result = filter_cli(out, "--no-report", "--dry-run")
    assert result.exit_code == 2 and "leads out of the run folder" in result.output
    assert "part-000000.parquet" in result.output
    import wdsfilter
    with pytest.raises(ConfigError, match="leads out of the run folder"):
        wdsfilter.loader(shards, batch_size=2, scores=str(out))
    # a marker that is a link out too
    os.remove(out / "scores" / "part-000000.parquet")
    shutil.move(outside, out / "scores" / "part-000000.parquet")
    shutil.move(out / "done" / "part-000001.json", tmp_path / "m.json")
    os.symlink(tmp_path / "m.json", out / "done" / "part-000001.json")
    assert filter_cli(out, "--no-report", "--dry-run").exit_code == 2


def test_confinement_resolves_each_folder_once_with_the_same_rule(run, tmp_path):
    """layout.Confinement (a directory resolved once, an lstat per file) refuses and allows what a
    realpath of every file would: scores/ and done/ as links out are refused; a link that stays in
    the folder, and a folder reached through a link, are read."""
    out, shards = run
    # a link inside the folder, to a file inside it: allowed
    os.makedirs(out / "kept")
    shutil.move(out / "scores" / "part-000000.parquet", out / "kept" / "part-000000.parquet")
    os.symlink(out / "kept" / "part-000000.parquet", out / "scores" / "part-000000.parquet")
    # the folder itself through a link: allowed
    os.symlink(out, tmp_path / "via-link")
    for folder in (out, tmp_path / "via-link"):
        result = filter_cli(folder, "--no-report", "--dry-run")
        assert result.exit_code == 0 and "12 of 12 kept" in result.output
    # scores/ (a folder of plain files) a link out of the run folder: refused
    shutil.move(out / "scores", tmp_path / "scores-outside")
    os.symlink(tmp_path / "scores-outside", out / "scores")
    result = filter_cli(out, "--no-report", "--dry-run")
    assert result.exit_code == 2 and "leads out of the run folder" in result.output
    os.remove(out / "scores")
    shutil.move(tmp_path / "scores-outside", out / "scores")
    # done/ too
    shutil.move(out / "done", tmp_path / "done-outside")
    os.symlink(tmp_path / "done-outside", out / "done")
    result = filter_cli(out, "--no-report", "--dry-run")
    assert result.exit_code == 2 and "leads out of the run folder" in result.output


def test_a_source_the_run_did_not_record_is_never_read(run, tmp_path):
    out, shards = run
    os.makedirs(tmp_path / "evil")
    evil = write_shard(str(tmp_path / "evil" / "part-000000.tar"), members(6, "p0_", bright=7))
    marker = out / "done" / "part-000000.json"
    data = json.load(open(marker))
    data["source"]["path"] = evil
    json.dump(data, open(marker, "w"))
    written = tmp_path / "written"
    result = filter_cli(out, "--write-shards", written, "--no-report")
    assert result.exit_code == 2 and "part-000000.json" in result.output and "--source-root" in result.output
    assert not os.path.exists(written / "shard-000000.tar")
    assert filter_cli(out, "--dry-run").exit_code == 0  # counting reads no source
    # the data moved: --source-root names where it is now, whatever the folder says
    moved = tmp_path / "moved"
    shutil.copytree(os.path.dirname(shards[0]), moved)
    result = filter_cli(out, "--write-shards", written, "--no-report", "--source-root", moved)
    assert result.exit_code == 0, result.output
    with open(written / "shard-000000.tar", "rb") as f, open(shards[0], "rb") as g:
        assert image_bytes(size=(24, 20), color=(7, 90, 30)) not in f.read()  # not the evil tar's pixels
        assert g.read()
    assert filter_cli(out, "--dry-run", "--source-root", tmp_path / "nope").exit_code == 2


def parquet_of_another_schema(path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"a": [1, 2]}), path)


def damage(out, how):
    """Edit the folder `out` as a damaged or hand-edited one is; returns the file named."""
    score = out / "scores" / "part-000000.parquet"
    marker = out / "done" / "part-000000.json"
    if how == "other-schema":
        parquet_of_another_schema(score)
    elif how == "not-parquet":
        score.write_bytes(b"PAR1 this is not parquet PAR1")
    elif how == "strings-for-floats":
        import pyarrow as pa
        import pyarrow.parquet as pq
        t = pq.read_table(score).to_pydict()
        t["brightness"] = [str(v) for v in t["brightness"]]
        pq.write_table(pa.table(t), score)
    else:
        return None
    edit_json(marker, sizes={"scores/part-000000.parquet": os.path.getsize(score)})  # sizes edited too
    return score


@pytest.mark.parametrize("how", ["other-schema", "not-parquet", "strings-for-floats"])
def test_a_damaged_score_file_is_one_line_naming_it(run, how):
    out, shards = run
    named = damage(out, how)
    result = filter_cli(out, "--min", "brightness=0.1", "--no-report")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert (named.name in result.output if how != "strings-for-floats" else "not hold numbers" in result.output)
    import wdsfilter
    with pytest.raises(ConfigError):
        wdsfilter.loader(shards, batch_size=2, scores=str(out), min_scores={"brightness": 0.1})


@pytest.mark.parametrize("content", ["{broken", '{"url": 3, "name": "part-000000", "score_file": "x"}',
                                     '{"url": "u", "name": "part-000000", "score_file": "scores/part-000000.parquet",'
                                     ' "sizes": [1]}', "[]", '{"source": "x"}'])
def test_a_damaged_marker_is_an_unfinished_shard(run, content):
    out, shards = run
    (out / "done" / "part-000000.json").write_text(content)
    result = filter_cli(out, "--no-report", "--dry-run")
    assert result.exit_code == 3 and "INCOMPLETE: 1 shard" in result.output, result.output
    assert "6 rows in 1 finished shard" in result.output
    import wdsfilter
    loader = wdsfilter.loader(shards, batch_size=1, output="dict", scores=str(out))
    keys = [s["__key__"] for b in loader for s in b]
    assert keys == [f"p1_{i:03d}" for i in range(6)] and loader.stats.dropped.get("no_score") == 6


@pytest.mark.parametrize("name,content", [("run.json", "{not json"), ("run.json", '{"stage": "x"}'),
                                          ("shards.json", '{"shards": [1]}'), ("shards.json", "[")])
def test_a_damaged_run_record_is_one_line_naming_it(run, name, content):
    out, shards = run
    (out / name).write_text(content)
    result = filter_cli(out, "--no-report", "--dry-run")
    assert result.exit_code == 2 and name in result.output and "damaged" in result.output, result.output
    import wdsfilter
    with pytest.raises(ConfigError, match=name):
        wdsfilter.loader(shards, batch_size=2, scores=str(out))


def test_jsonl_damage_is_named_and_strings_count_as_no_value(scored, tmp_path):
    base, shards = scored
    out = shutil.copytree(base / "run-jsonl", tmp_path / "run")
    score = out / "scores" / "part-000000.jsonl"
    rows = [json.loads(line) for line in score.read_text().splitlines()]
    rows[0]["brightness"] = "bright"  # a string where a float belongs
    score.write_text("".join(json.dumps(r) + "\n" for r in rows))
    edit_json(out / "done" / "part-000000.json", sizes={})
    result = filter_cli(out, "--min", "brightness=0", "--no-report", "--dry-run")
    assert result.exit_code == 0 and "11 of 12 kept" in result.output, result.output
    import wdsfilter
    loader = wdsfilter.loader(shards, batch_size=1, output="dict", scores=str(out), min_scores={"brightness": 0})
    assert sum(len(b) for b in loader) == 11 and loader.stats.dropped.get("no_score") == 1
    score.write_text(score.read_text() + "not json\n")
    result = filter_cli(out, "--min", "brightness=0", "--no-report", "--dry-run")
    assert result.exit_code == 2 and "part-000000.jsonl" in result.output and "line 7" in result.output
    # damaged after the loader was built: that shard's samples are no_score, the rest go on
    score.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    loader = wdsfilter.loader(shards, batch_size=1, output="dict", scores=str(out))
    score.write_text("[1, 2]\n")
    assert sum(len(b) for b in loader) == 6 and loader.stats.dropped.get("no_score") == 6


def test_resume_reads_markers_through_the_same_rules(scored, tmp_path):
    """--resume: a marker of wrong types is no marker (its shard is scored again, the marker
    rewritten whole); a damaged run.json is a one-line error naming it, not a JSONDecodeError."""
    from wdsfilter.score import score
    base, shards = scored
    out = shutil.copytree(base / "run-parquet", tmp_path / "run")
    marker = out / "done" / "part-000001.json"
    edit_json(marker, rows="six", sizes=[1])
    old = os.getcwd()
    os.chdir(base)  # the run's relative shard URLs
    try:
        summary = score([os.path.relpath(s, base) for s in shards], out=str(out), scorers=[BrightnessScorer()],
                        device="cpu", progress=False, workers=0, batch_size=16, resume=True)
        assert summary.shards_resumed == 1
        assert json.load(open(marker))["rows"] == 6
        (out / "run.json").write_text("{broken")
        with pytest.raises(ConfigError, match="run.json"):
            score([os.path.relpath(s, base) for s in shards], out=str(out), scorers=[BrightnessScorer()],
                  device="cpu", progress=False, workers=0, batch_size=16, resume=True)
    finally:
        os.chdir(old)
