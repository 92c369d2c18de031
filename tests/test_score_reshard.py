"""`score --write-shards DIR --samples-per-shard N --prefix P` (issue 35, item 7): the kept samples
resharded once, at the end of the run, by filter's resharder: DIR byte for byte what `filter RUN
--write-shards DIR2 --samples-per-shard N --prefix P` writes with the run's rules (shards made by
GNU tar); a resumed run reshards once over every shard; of a joined run only the worker that
finishes it; the options' usage errors; run.yaml replays them."""
import os
import shutil

import pytest
from click.testing import CliRunner

from filterkit import all_rows, gnu_tar_shards, raw_members
from scorekit import make_shards
from wdsfilter.cli import main
from wdsfilter.filtering import filter_scores
from wdsfilter.score.recipe import RECIPE_FILE, read_recipe

SCORER = "scorekit:BrightnessScorer"
N, PREFIX = 4, "kept"


def score_cli(shards, out, *extra):
    return CliRunner().invoke(main, ["score", *shards, "--out", str(out), "--scorer", SCORER, "--device", "cpu",
                                     "--workers", "0", "--batch-size", "8", "--no-progress", *extra])


def folder_bytes(folder) -> dict:
    """Every file of a written-shards folder and its bytes, but for filter's lease on it."""
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))
            if not name.startswith(".lock")}


def sample_keys(folder) -> list:
    """The keys of the samples of every written shard, in order (a key once per sample)."""
    keys = []
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".tar")):
        keys += list(dict.fromkeys(k for k, _ in raw_members(os.path.join(folder, name))))
    return keys


def filter_into(out, dest, **rules):
    filter_scores(str(out), write_shards=str(dest), samples_per_shard=N, prefix=PREFIX, report=None, **rules)
    return folder_bytes(dest)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Shards made by GNU tar (long pax names), with a corrupt JPEG: 21 samples in 3 shards."""
    return gnu_tar_shards(str(tmp_path_factory.mktemp("src")), [8, 6, 7], long_names=True, corrupt={(1, 2)})


@pytest.mark.parametrize("rule,flags", [({"min_scores": {"brightness": 0.35}}, ["--min", "brightness=0.35"]),
                                        ({"top_shares": {"brightness": 60}}, ["--top", "brightness=60%"])],
                         ids=["min", "top-share"])
def test_score_reshards_the_kept_samples_as_filter_does_byte_for_byte(shards, tmp_path, rule, flags):
    """A share too: known at the end of the run, where the reshard happens (a copy per shard refuses it)."""
    dest = tmp_path / "kept"
    r = score_cli(shards, tmp_path / "run", *flags, "--write-shards", str(dest), "--samples-per-shard", str(N),
                  "--prefix", PREFIX)
    assert r.exit_code == 0, r.output
    written = folder_bytes(dest)
    tars = [n for n in written if n.endswith(".tar")]
    assert tars and all(n.startswith(f"{PREFIX}-") for n in tars)
    assert not any(os.path.basename(s) in written for s in shards)  # no copy per source shard
    assert written == filter_into(tmp_path / "run", tmp_path / "by-filter", **rule)
    kept = len(sample_keys(dest))
    assert 0 < kept < 20 and f"resharded {kept} kept sample(s) into {len(tars)} shard(s)" in r.output
    # filter into the score run's own folder finds its shards whole and writes none again
    before = {t: os.stat(os.path.join(dest, t)).st_mtime_ns for t in tars}
    filter_scores(str(tmp_path / "run"), write_shards=str(dest), samples_per_shard=N, prefix=PREFIX, report=None,
                  **rule)
    assert {t: os.stat(os.path.join(dest, t)).st_mtime_ns for t in tars} == before


def test_a_resumed_run_reshards_once_over_every_shard(shards, tmp_path):
    """A shard that failed (not a tar): nothing in DIR, exit 3; --resume scores it and reshards the
    whole run once: the samples of every shard, none twice."""
    src = tmp_path / "src"
    src.mkdir()
    urls = [str(src / os.path.basename(s)) for s in shards]
    for s, u in zip(shards[:2], urls):
        shutil.copy(s, u)
    open(urls[2], "wb").write(b"<html>not a tar</html>" * 40)
    dest, out = tmp_path / "kept", tmp_path / "run"
    options = ["--min", "brightness=0.3", "--write-shards", str(dest), "--samples-per-shard", str(N), "--prefix", PREFIX]
    first = score_cli(urls, out, *options)
    assert first.exit_code == 3, first.output
    assert not [n for n in os.listdir(dest) if n.endswith(".tar")] if dest.exists() else True
    assert "not resharded" in first.output
    shutil.copy(shards[2], urls[2])
    again = score_cli(urls, out, *options, "--resume")
    assert again.exit_code == 0, again.output
    written = folder_bytes(dest)
    keys = sample_keys(dest)
    kept = [r["key"] for r in all_rows(str(out)) if r["kept"]]
    assert sorted(keys) == sorted(kept) and len(set(keys)) == len(keys)  # every kept sample once
    assert any(k.rsplit("_", 2)[-2] == "2" for k in keys)  # the shard scored by the resumed run
    assert written == filter_into(out, tmp_path / "by-filter", min_scores={"brightness": 0.3})
    # a resume with nothing left to score rewrites no shard
    before = {t: os.stat(os.path.join(dest, t)).st_mtime_ns for t in written if t.endswith(".tar")}
    assert score_cli(urls, out, *options, "--resume").exit_code == 0
    assert {t: os.stat(os.path.join(dest, t)).st_mtime_ns for t in before} == before


def test_of_a_joined_run_only_the_worker_that_finishes_it_reshards(tmp_path):
    urls = make_shards(str(tmp_path / "src"), [5, 4, 6, 3])[0]
    dest, out = tmp_path / "kept", tmp_path / "run"
    options = ["--write-shards", str(dest), "--samples-per-shard", "3", "--prefix", PREFIX, "--task-count", "2",
               "--no-steal"]
    first = score_cli(urls, out, *options, "--task-index", "0")
    assert first.exit_code == 0, first.output
    assert not dest.exists() or not [n for n in os.listdir(dest) if n.endswith(".tar")]
    second = score_cli(urls, out, *options, "--task-index", "1")
    assert second.exit_code == 0, second.output
    written = folder_bytes(dest)
    filter_scores(str(out), write_shards=str(tmp_path / "by-filter"), samples_per_shard=3, prefix=PREFIX, report=None)
    assert written == folder_bytes(tmp_path / "by-filter") and sum(n.endswith(".tar") for n in written) == 6


@pytest.mark.parametrize("args,says", [
    (["--write-shards", "{tmp}/k", "--prefix", "p"], "--prefix names the shards --samples-per-shard writes"),
    (["--samples-per-shard", "5"], "--samples-per-shard only applies with --write-shards"),
    (["--write-shards", "{tmp}/k", "--samples-per-shard", "0"], "--samples-per-shard must be a whole number >= 1"),
    (["--write-shards", "{tmp}/k", "--samples-per-shard", "3", "--prefix", "a/b"], "--prefix must be"),
], ids=["prefix-alone", "no-write-shards", "zero", "prefix-folder"])
def test_the_reshard_options_usage_errors_are_one_line_exit_2(tmp_path, args, says):
    r = score_cli(["nothing-read.tar"], tmp_path / "run", *[a.format(tmp=tmp_path) for a in args])
    assert r.exit_code == 2 and says in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_another_runs_reshard_in_dir_is_refused_before_scoring_and_run_yaml_replays_the_options(tmp_path):
    urls = make_shards(str(tmp_path / "src"), [5, 4])[0]
    dest = tmp_path / "kept"
    r = score_cli(urls, tmp_path / "run", "--write-shards", str(dest), "--samples-per-shard", "3", "--prefix", PREFIX)
    assert r.exit_code == 0, r.output
    recipe = read_recipe(os.path.join(tmp_path / "run", RECIPE_FILE))
    assert recipe["samples_per_shard"] == 3 and recipe["prefix"] == PREFIX
    other = score_cli(urls, tmp_path / "other", "--write-shards", str(dest), "--samples-per-shard", "3")
    assert other.exit_code == 2 and "holds shards resharded from another score folder" in other.output, other.output
    assert not (tmp_path / "other" / "scores").exists() or not os.listdir(tmp_path / "other" / "scores")
    replay = CliRunner().invoke(main, ["score", "--config", os.path.join(tmp_path / "run", RECIPE_FILE), "--out",
                                       str(tmp_path / "again"), "--write-shards", str(tmp_path / "again-kept"),
                                       "--no-progress"])
    assert replay.exit_code == 0, replay.output
    assert folder_bytes(tmp_path / "again-kept").keys() == folder_bytes(dest).keys()
    tars = [n for n in folder_bytes(dest) if n.endswith(".tar")]
    assert all(open(tmp_path / "again-kept" / t, "rb").read() == open(dest / t, "rb").read() for t in tars)
