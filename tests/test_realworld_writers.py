"""Verdicts on shards written by the tools users have: GNU tar (glob and directory order, --sort),
webdataset's TarWriter/ShardWriter, and an img2dataset-style output folder (its empty shards, its
{shard}_stats.json). Every shard is written inside the test by the real writer."""
import json
import os
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from tests.shardkit import image_bytes
from wdsfilter.cli import main
from wdsfilter.validate import validate

GNU_TAR = shutil.which("tar")
needs_tar = pytest.mark.skipif(GNU_TAR is None, reason="GNU tar is not installed")


def _files(folder, n=20):
    """n samples as loose files: {k}.txt caption, {k}.json metadata (caption too), {k}.png image."""
    os.makedirs(folder, exist_ok=True)
    for i in range(n):
        key = f"{i:05d}"
        with open(os.path.join(folder, key + ".txt"), "w") as f:
            f.write(f"a red square number {i}")
        with open(os.path.join(folder, key + ".json"), "w") as f:
            json.dump({"description": f"a red square number {i}", "key": key}, f)
        with open(os.path.join(folder, key + ".png"), "wb") as f:
            f.write(image_bytes(fmt="PNG"))
    return folder


def _tar(cwd, out, *args):
    subprocess.run([GNU_TAR, "-cf", str(out), *args], cwd=cwd, check=True)
    return str(out)


def _listing(shard):
    return subprocess.run([GNU_TAR, "-tf", shard], capture_output=True, text=True, check=True).stdout.split()


@needs_tar
def test_gnu_tar_by_extension_glob_is_a_scattered_error_not_a_caption_key_problem(tmp_path):
    src = _files(tmp_path / "data")
    names = sorted(os.listdir(src))
    shard = _tar(src, tmp_path / "glob.tar", *[n for n in names if n.endswith(".txt")],
                 *[n for n in names if n.endswith(".json")], *[n for n in names if n.endswith(".png")])
    assert _listing(shard)[:2] == ["00000.txt", "00001.txt"]  # what `tar -cf x.tar *.txt *.json *.png` writes

    report = validate(shard, jobs=1)
    # 20 samples (distinct keys), not 60 fragments; none kept by any reader.
    assert (report.samples, report.kept) == (20, 0)
    assert report.counts["scattered_key"] == 1 and report.counts["all_filtered"] == 1 and not report.passed
    finding = next(f for f in report.findings if f.kind == "scattered_key")
    assert "20 of 20 keys (100%)" in finding.message and "60 half-samples" in finding.message
    assert f"wdsfilter sort-shard {shard}" in finding.message and "--sort=name" in finding.message
    assert report.dropped == {"scattered_key": 20}
    # The caption is in the shard under the asked key: no key change is suggested, and the
    # fragments' missing_* / nonadjacent findings are not listed as if they were real.
    suggestions = report.suggestions()
    assert suggestions and all("--caption-key" not in s and "--image-key" not in s for s in suggestions)
    assert any("sort-shard" in s for s in suggestions)
    assert not {"missing_caption", "missing_image", "nonadjacent_key"} & set(report.counts)
    all_filtered = next(f for f in report.findings if f.kind == "all_filtered")
    assert "0 of 20 samples" in all_filtered.message and "sort-shard" in all_filtered.message
    # The training stages on the same shard: the starvation error names the scattering, not a key.
    from wdsfilter import StageConfig, StarvationError, sample_pipeline
    with pytest.raises(StarvationError, match="scattered_key") as info:
        for _ in sample_pipeline(shard, StageConfig(), decode_images=False):
            pass
    assert "wdsfilter sort-shard IN OUT" in str(info.value)
    # The same with the json caption the user asked for.
    report = validate(shard, jobs=1, caption_key="json:description")
    assert report.samples == 20 and all("--caption-key" not in s for s in report.suggestions())

    # The fix the message names: sort-shard (the CLI), then every sample is whole.
    fixed = str(tmp_path / "sorted.tar")
    result = CliRunner().invoke(main, ["sort-shard", shard, fixed])
    assert result.exit_code == 0 and "60 member(s) of 20 key(s)" in result.output, result.output
    assert _listing(fixed)[:3] == ["00000.json", "00000.png", "00000.txt"]
    again = validate(fixed, jobs=1)
    assert again.passed and (again.samples, again.kept) == (20, 20) and not again.counts
    # Bytes unchanged: webdataset reads the same captions from both.
    import webdataset as wds
    captions = sorted(s["txt"] for s in wds.WebDataset(fixed, shardshuffle=False))
    assert captions == sorted(open(os.path.join(src, n), "rb").read() for n in names if n.endswith(".txt"))


@needs_tar
def test_gnu_tar_sort_name_passes_and_directory_order_counts_keys(tmp_path):
    _files(tmp_path / "data")
    sorted_shard = _tar(tmp_path, tmp_path / "sorted.tar", "--sort=name", "data")
    report = validate(sorted_shard, jobs=1)
    assert report.passed and (report.samples, report.kept) == (20, 20)

    # Directory order (the file system's readdir order): whatever order tar wrote, samples are the
    # 20 keys, and a key read as fragments is reported as scattered, never as a wrong caption key.
    shard = _tar(tmp_path, tmp_path / "dirorder.tar", "data")
    names = [n for n in _listing(shard) if not n.endswith("/")]
    report = validate(shard, jobs=1)
    assert report.samples == 20
    keys = [n.rsplit("/", 1)[1].split(".")[0] for n in names]
    grouped = all(keys[i] == keys[i - 1] or keys[i] not in keys[:i] for i in range(1, len(keys)))
    if grouped:
        assert report.kept == 20
    else:
        assert "--caption-key" not in " ".join(report.suggestions())
        assert report.counts.get("scattered_key", 0) + report.counts.get("nonadjacent_key", 0) > 0
    fixed = str(tmp_path / "fixed.tar")
    CliRunner().invoke(main, ["sort-shard", shard, fixed])
    assert validate(fixed, jobs=1).kept == 20


@needs_tar
def test_sort_shard_reads_gzip_keeps_last_dot_keys_whole_and_refuses_bad_outputs(tmp_path):
    src = tmp_path / "data"
    os.makedirs(src)
    # Dotted basenames with --rekey last-dot: sorting by name alone would put a.k.* between a.jpg and a.txt.
    members = {"a.jpg": image_bytes(), "a.txt": "a", "a.k.jpg": image_bytes(), "a.k.txt": "ak"}
    for name, data in members.items():
        (src / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    shard = _tar(src, tmp_path / "x.tar", "a.txt", "a.k.txt", "a.jpg", "a.k.jpg")
    subprocess.run(["gzip", "-k", shard], check=True)
    out = tmp_path / "out" / "x.tar"
    result = CliRunner().invoke(main, ["sort-shard", shard + ".gz", str(out), "--rekey", "last-dot"])
    assert result.exit_code == 0, result.output
    assert _listing(str(out)) == ["a.jpg", "a.txt", "a.k.jpg", "a.k.txt"]
    assert not [f for f in os.listdir(tmp_path / "out") if f != "x.tar"]  # no temporary left
    # Usage errors (exit 2), before anything is written.
    result = CliRunner().invoke(main, ["sort-shard", shard, str(tmp_path)])  # OUT a folder: OUT/x.tar, the input
    assert result.exit_code == 2 and "is the input shard" in result.output
    result = CliRunner().invoke(main, ["sort-shard", shard, shard])
    assert result.exit_code == 2 and "is the input shard" in result.output
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 100)
    result = CliRunner().invoke(main, ["sort-shard", str(tmp_path / "junk.tar"), str(tmp_path / "o.tar")])
    assert result.exit_code == 2 and "cannot read" in result.output and not (tmp_path / "o.tar").exists()


def test_webdataset_writers_mixed_case_extension_and_stats(tmp_path):
    import webdataset as wds

    folder = tmp_path / "wds"
    folder.mkdir()
    with wds.ShardWriter(str(folder / "part-%06d.tar"), maxcount=10) as sink:
        for i in range(25):
            sink.write({"__key__": f"s{i:04d}", "jpg": image_bytes(), "txt": f"caption {i}"})
    shards = sorted(os.listdir(folder))
    assert shards == ["part-000000.tar", "part-000001.tar", "part-000002.tar"]
    stats = tmp_path / "stats"
    report = validate(str(folder), jobs=1, stats_dir=str(stats))
    assert report.passed and report.samples == 25 and not report.counts  # the short last shard is the remainder
    assert json.loads((stats / "sizes.json").read_text()) == {"part-000000.tar": 10, "part-000001.tar": 10,
                                                              "part-000002.tar": 5}

    # TarWriter with an upper-case extension: webdataset 1.x reads it lower-cased (checked here),
    # so the warning names the readers that are case sensitive instead.
    upper = str(tmp_path / "upper.tar")
    with wds.TarWriter(upper) as sink:
        sink.write({"__key__": "a", "JPG": image_bytes(), "txt": "a red square"})
    assert [sorted(k for k in s if not k.startswith("__")) for s in wds.WebDataset(upper, shardshuffle=False)] \
        == [["jpg", "txt"]]
    report = validate(upper, jobs=1)
    assert report.passed and report.kept == 1 and report.counts == {"mixed_case_extension": 1}
    message = next(f.message for f in report.findings)
    assert "HF datasets" in message and "DALI" in message and "case_sensitive_extensions" in message


def _img2dataset_stats(shard_id, successes, failed):
    """A {shard}_stats.json as img2dataset's logger writes it (the fields of img2dataset 1.47)."""
    return {"count": successes + failed, "successes": successes, "failed_to_download": failed,
            "failed_to_resize": 0, "duration": 1.5, "bytes_downloaded": 1234, "start_time": 1.0, "end_time": 2.5,
            "status_dict": {"success": successes, "<urlopen error [Errno 111] Connection refused>": failed}}


def test_img2dataset_folder_empty_shard_warning_and_stats_never_overwritten(tmp_path):
    import webdataset as wds

    folder = tmp_path / "out"
    folder.mkdir()
    with wds.TarWriter(str(folder / "00000.tar")) as sink:  # img2dataset's writer is webdataset's TarWriter
        for i in range(4):
            sink.write({"__key__": f"00000{i:04d}", "jpg": image_bytes(), "txt": f"caption {i}",
                        "json": json.dumps({"caption": f"caption {i}", "status": "success"}).encode()})
    with wds.TarWriter(str(folder / "00001.tar")):
        pass  # every URL of the shard failed: img2dataset still writes the (empty) tar
    with wds.TarWriter(str(folder / "00002.tar")) as sink:
        for i in range(4):
            sink.write({"__key__": f"00002{i:04d}", "jpg": image_bytes(), "txt": f"caption {i}"})
    theirs = {"00000": _img2dataset_stats(0, 4, 0), "00001": _img2dataset_stats(1, 0, 4),
              "00002": _img2dataset_stats(2, 4, 0)}
    for stem, data in theirs.items():
        (folder / f"{stem}_stats.json").write_text(json.dumps(data))

    result = CliRunner().invoke(main, ["validate", str(folder), "-j", "1", "--stats-dir", str(folder)])
    # An empty shard is a warning of its own kind (exit 0), not all_filtered pointing to no suggestion.
    assert result.exit_code == 0, result.output
    assert "empty_shard" in result.output and "all_filtered" not in result.output
    assert "uneven_shards" not in result.output  # the empty shard has its own warning
    assert "see the suggestion" not in result.output and "Suggestions" not in result.output
    # img2dataset's files are untouched; ours are beside them; sizes.json is ours.
    for stem, data in theirs.items():
        assert json.loads((folder / f"{stem}_stats.json").read_text()) == data
        ours = json.loads((folder / f"{stem}_validate.json").read_text())
        assert ours["tool"] == "wdsfilter validate" and ours["shard"].endswith(f"{stem}.tar")
    assert json.loads((folder / "sizes.json").read_text()) == {"00000.tar": 4, "00001.tar": 0, "00002.tar": 4}
    # A second run replaces its own files only.
    assert CliRunner().invoke(main, ["validate", str(folder), "-j", "1", "--stats-dir", str(folder)]).exit_code == 0
    assert json.loads((folder / "00000_stats.json").read_text()) == theirs["00000"]

    # A shard with samples where none is kept stays an error, with a suggestion that is there.
    bad = str(tmp_path / "nocap.tar")
    with wds.TarWriter(bad) as sink:
        sink.write({"__key__": "a", "jpg": image_bytes(), "json": json.dumps({"caption": "x"}).encode()})
    report = validate(bad, jobs=1)
    finding = next(f for f in report.findings if f.kind == "all_filtered")
    assert "use --caption-key json:caption" in finding.message and report.suggestions()


def test_sizes_json_merge_keeps_entries_of_other_shards(tmp_path):
    import webdataset as wds

    shard = str(tmp_path / "a.tar")
    with wds.TarWriter(shard) as sink:
        sink.write({"__key__": "k", "jpg": image_bytes(), "txt": "t"})
    stats = tmp_path / "stats"
    stats.mkdir()
    (stats / "sizes.json").write_text(json.dumps({"a.tar": 99, "b.tar": 7}))
    validate(shard, jobs=1, stats_dir=str(stats))
    assert json.loads((stats / "sizes.json").read_text()) == {"a.tar": 1, "b.tar": 7}


def test_ray_write_webdataset_output_passes_and_is_sized(tmp_path):
    ray = pytest.importorskip("ray")
    from raykit import local_ray
    out = tmp_path / "ray"
    with local_ray(num_cpus=1):
        import numpy as np
        from PIL import Image
        # Ray's default encoder turns an image array (what read_images gives) into JPEG bytes.
        pixels = np.asarray(Image.new("RGB", (32, 24), (200, 30, 30)))
        rows = [{"__key__": f"r{i:04d}", "jpg": pixels, "txt": f"caption {i}",
                 "json": {"description": f"caption {i}", "id": i}} for i in range(12)]
        ray.data.from_items(rows).repartition(2).write_webdataset(str(out))
    shards = sorted(os.listdir(out))
    assert len(shards) == 2 and all(s.endswith(".tar") for s in shards)
    stats = tmp_path / "stats"
    for caption_key in ("txt", "json:description"):
        report = validate(str(out), caption_key=caption_key, jobs=1, stats_dir=str(stats))
        assert report.passed and (report.samples, report.kept) == (12, 12) and not report.counts
    assert sum(json.loads((stats / "sizes.json").read_text()).values()) == 12


def test_a_sample_written_twice_far_apart_is_duplicated_not_scattered(tmp_path):
    from tests.shardkit import image_text_members, write_shard
    members = image_text_members(12)
    shard = write_shard(tmp_path / "dup.tar", members + members[:2])  # sample 000000 again at the end
    report = validate(shard, jobs=1)
    assert "scattered_key" not in report.counts and report.counts["duplicate_key"] == 2
    assert report.samples == 12 and report.kept == 12


def test_last_dot_keys_keep_compressed_members_in_their_sample(tmp_path):
    """webdataset's TarWriter gzips a field named `txt.gz`/`json.gz`. With dotted keys validate
    says "use --rekey last-dot"; last-dot then split `img.v2.0000.txt.gz` into key
    `img.v2.0000.txt` and extension `gz`: 9 samples of one member each, none kept. A compression
    suffix is part of the extension, as webdataset's decoder reads it."""
    import webdataset as wds

    import wdsfilter

    shard = str(tmp_path / "dotted-gz.tar")
    with wds.TarWriter(shard) as w:
        for i in range(3):
            w.write({"__key__": f"img.v2.{i:04d}", "jpg": image_bytes(), "txt.gz": f"a red square {i}",
                     "json.gz": {"caption": f"a red square {i}"}})
    first = validate([shard], jobs=1)
    assert "use --rekey last-dot" in next(f for f in first.findings if f.kind == "all_filtered").message
    report = validate([shard], jobs=1, rekey="last-dot")
    assert report.passed and (report.samples, report.kept) == (3, 3) and not report.counts, report.counts
    ld = wdsfilter.loader(shard, batch_size=4, output="dict", rekey="last-dot")
    assert sorted((s["__key__"], s["caption"]) for b in ld for s in b) == \
        [(f"img.v2.{i:04d}", f"a red square {i}") for i in range(3)]
