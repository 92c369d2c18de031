"""`filter --write-shards` output that training tools load as it is: `--unique-keys` (no key twice
in the output where the sources number samples per shard; the source key and shard kept in the
.json), `--interleave N` (source shards taken in turn), and Hugging Face `datasets` loading the
folder (its dataset card names the shards, so the sidecars are not taken for data, and declares
the columns of a jpg+png output). Shards written by webdataset's TarWriter with img2dataset-style
json; a real hash-scorer run (no model); the real `datasets` package, offline, from local files."""
import json
import os
import tarfile

import pytest
import webdataset as wds
from click.testing import CliRunner

from filterkit import img2dataset_shards
from shardkit import image_bytes
from wdsfilter.cli import main

COUNTS = [7, 6, 5]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Three shards whose keys all start at 000000 (every 3rd image a PNG), a fourth with samples
    without a .json and with a .json that is no object; their hash-scorer run."""
    folder = tmp_path_factory.mktemp("rekey")
    shards = img2dataset_shards(str(folder), COUNTS, png_every=3, restart_keys=True)
    odd = str(folder / "00003.tar")
    with wds.TarWriter(odd) as sink:
        sink.write({"__key__": "000000", "jpg": image_bytes(), "txt": "no json here"})
        sink.write({"__key__": "000001", "jpg": image_bytes(color=(1, 2, 3)), "txt": "a list", "json": b"[1, 2]"})
    shards.append(odd)
    out = str(folder / "run")
    r = CliRunner().invoke(main, ["score", *shards, "--out", out, "--scorer", "hash", "--device", "cpu",
                                  "--no-progress", "--workers", "0", "--image-key", "jpg;png", "-q"])
    assert r.exit_code == 0, r.output
    return shards, out


def filter_cli(*args):
    r = CliRunner().invoke(main, ["filter", *args])
    assert r.exit_code == 0, r.output
    return r


def samples(folder):
    """[(key, {ext: bytes})] of the written shards, in order (read with tarfile, as stored)."""
    out = []
    for name in sorted(f for f in os.listdir(folder) if f.endswith(".tar")):
        with tarfile.open(os.path.join(folder, name)) as tar:
            for m in tar:
                key, ext = m.name.split(".", 1)
                if not out or out[-1][0] != key:
                    out.append((key, {}))
                out[-1][1][ext] = tar.extractfile(m).read()
    return out


def source_samples(shards):
    got = {}
    for path in shards:
        with tarfile.open(path) as tar:
            for m in tar:
                key, ext = m.name.split(".", 1)
                got.setdefault((os.path.abspath(path), key), {})[ext] = (tar.extractfile(m).read(), m.mode, m.mtime)
    return got


def test_sources_numbered_per_shard_repeat_keys_unless_unique_keys(run, tmp_path):
    shards, out = run
    filter_cli(out, "--write-shards", str(tmp_path / "plain"), "--no-report")
    plain = samples(tmp_path / "plain")
    assert len(plain) == 20 and len({k for k, _ in plain}) == 7  # the problem: 000000 four times
    filter_cli(out, "--write-shards", str(tmp_path / "unique"), "--no-report", "--unique-keys", "--samples-per-shard", "8")
    written = samples(tmp_path / "unique")
    assert [k for k, _ in written] == [f"{j:09d}" for j in range(20)]  # unique, in the order written
    source = source_samples(shards)
    for _, members in written:
        meta = json.loads(members["json"])
        if not isinstance(meta, dict):
            continue  # the sample whose .json is a list (below)
        origin = (meta["source_shard"], meta["source_key"])
        original = source[origin]
        for ext, data in members.items():
            if ext != "json":
                assert data == original[ext][0]  # member bytes unchanged
        if "json" in original and original["json"][0].startswith(b"{"):
            before = json.loads(original["json"][0])
            assert {k: meta[k] for k in before} == before  # img2dataset's key, url, uid, caption kept
    by_origin = {(json.loads(m["json"])["source_shard"], json.loads(m["json"])["source_key"]) for _, m in written
                 if m["json"].startswith(b"{")}
    odd = os.path.abspath(shards[3])
    assert (odd, "000000") in by_origin  # a sample without a .json got one with its origin
    listed = next(m for _, m in written if m["json"] == b"[1, 2]")  # not an object: copied as it was
    assert listed["txt"] == b"a list"
    # the renamed members keep their mode and time
    with tarfile.open(tmp_path / "unique" / "shard-000000.tar") as tar:
        first = tar.getmembers()[0]
    assert first.name == "000000000.jpg"
    assert (first.mode, first.mtime) == source[(os.path.abspath(shards[0]), "000000")]["jpg"][1:]
    # the training-time reader sees 20 samples of 20 keys, and validate finds nothing wrong
    keys = [s["__key__"] for s in wds.WebDataset(str(tmp_path / "unique" / "shard-{000000..000002}.tar"),
                                                 shardshuffle=False)]
    assert len(keys) == len(set(keys)) == 20
    r = CliRunner().invoke(main, ["validate", str(tmp_path / "unique"), "--image-key", "jpg;png", "-q"])
    assert r.exit_code == 0, r.output


def test_interleave_takes_sources_in_turn_and_resumes(run, tmp_path):
    shards, out = run
    args = [out, "--write-shards", str(tmp_path / "mix"), "--no-report", "--unique-keys", "--interleave", "3",
            "--samples-per-shard", "5"]
    filter_cli(*args)
    order = [(json.loads(m["json"])["source_shard"], json.loads(m["json"])["source_key"])
             for _, m in samples(tmp_path / "mix") if m["json"].startswith(b"{")]
    a, b, c = (os.path.abspath(s) for s in shards[:3])
    expected = []
    for i in range(max(COUNTS)):  # one sample of each of the first three in turn, while each has one
        expected += [(src, f"{i:06d}") for src, n in zip((a, b, c), COUNTS) if i < n]
    assert order[:18] == expected
    assert order[18] == (os.path.abspath(shards[3]), "000000")  # the next group: the fourth shard alone
    before = {f: open(tmp_path / "mix" / f, "rb").read() for f in os.listdir(tmp_path / "mix") if f.endswith(".tar")}
    os.remove(tmp_path / "mix" / "shard-000002.tar")  # a shard lost: the run again writes it, the same bytes
    again = filter_cli(*args)
    assert "resume: 3 shard(s)" in again.output
    assert {f: open(tmp_path / "mix" / f, "rb").read() for f in before} == before
    other = CliRunner().invoke(main, ["filter", *args[:-4], "--interleave", "2", "--samples-per-shard", "5"])
    assert other.exit_code == 2 and "interleave" in other.output  # other settings: --overwrite needed


@pytest.fixture
def offline_hf(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets", reason="HF datasets is in the [test] extra")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return datasets


def test_hf_datasets_loads_the_written_folder_with_its_sidecars(run, tmp_path, offline_hf):
    datasets = offline_hf
    shards, out = run
    dest = tmp_path / "train"
    filter_cli(out, "--write-shards", str(dest), "--unique-keys", "--samples-per-shard", "6")
    names = sorted(os.listdir(dest))
    assert "sizes.json" in names and "shard-000000_stats.json" in names and "README.md" in names
    assert "report.html" in names  # filter's report, beside what it wrote
    # jpg and png samples in one folder: HF's own inference refuses them ...
    tars = sorted(str(dest / f) for f in names if f.endswith(".tar"))
    with pytest.raises(ValueError, match="same prefix or the same types"):
        datasets.load_dataset("webdataset", data_files=tars, cache_dir=str(tmp_path / "c0"))
    # ... the folder loads: the card names the shards (not the sidecars) and declares every column
    ds = datasets.load_dataset(str(dest), cache_dir=str(tmp_path / "c1"))["train"]
    assert ds.num_rows == 20 and set(ds.column_names) == {"jpg", "png", "txt", "json", "__key__", "__url__"}
    assert ds[0]["__key__"] == "000000000"
    pngs = [row for row in ds if row["png"] is not None]
    assert len(pngs) == sum(n // 3 for n in COUNTS) and all(row["jpg"] is None for row in pngs)
    assert pngs[0]["png"].format == "PNG" and ds[0]["jpg"].format == "JPEG"
    assert ds[0]["json"]["source_key"] == "000000" and ds[0]["json"]["url"].startswith("https://img.example.com/")
    # data_files= works too, with the card's columns
    features = datasets.load_dataset_builder(str(dest), cache_dir=str(tmp_path / "c2")).info.features
    again = datasets.load_dataset("webdataset", data_files=tars, features=features, cache_dir=str(tmp_path / "c3"))
    assert again["train"].num_rows == 20
    # our readers still find the sidecars where they were
    from wdsfilter.storage.shardstats import sizes_samples
    assert sizes_samples(tars) == 20


def test_a_card_of_the_users_is_kept(run, tmp_path):
    shards, out = run
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "README.md").write_text("my own card\n")
    filter_cli(out, "--write-shards", str(dest), "--no-report", "--samples-per-shard", "3")
    assert (dest / "README.md").read_text() == "my own card\n" and (dest / "sizes.json").exists()
    with open(dest / "filter_run.json") as f:
        assert "README.md" not in json.load(f)["files"]  # not ours: --overwrite leaves it too
    # a report.html of the user's is refused like their own shards (filter's report goes there)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "report.html").write_text("mine")
    r = CliRunner().invoke(main, ["filter", out, "--write-shards", str(theirs)])
    assert r.exit_code == 2 and "report.html" in r.output and (theirs / "report.html").read_text() == "mine"


def test_one_format_folder_loads_by_hf_inference_and_its_card_names_only_the_shards(tmp_path, offline_hf):
    datasets = offline_hf
    shards = img2dataset_shards(str(tmp_path / "src"), [4, 3])  # every image a JPEG
    out = str(tmp_path / "run")
    r = CliRunner().invoke(main, ["score", *shards, "--out", out, "--scorer", "hash", "--device", "cpu",
                                  "--no-progress", "--workers", "0", "-q"])
    assert r.exit_code == 0, r.output
    filter_cli(out, "--write-shards", str(tmp_path / "train"), "--no-report", "--samples-per-shard", "2",
               "--prefix", "part")
    card = (tmp_path / "train" / "README.md").read_text()
    assert 'path: "part-*.tar"' in card and "dtype:" not in card  # the same members everywhere: HF infers them
    ds = datasets.load_dataset(str(tmp_path / "train"), cache_dir=str(tmp_path / "c"))["train"]
    assert ds.num_rows == 7 and set(ds.column_names) == {"jpg", "txt", "json", "__key__", "__url__"}


def test_card_declares_columns_only_where_it_can():
    from wdsfilter.runfolder.hfcard import card_text
    jpg = {"successes": 2, "fields": {"jpg": 2, "txt": 2}}
    png = {"successes": 1, "fields": {"png": 1, "txt": 1, "cls": 1}}
    mixed = card_text("shard", [jpg, png])
    for name, kind in (("jpg", "image"), ("png", "image"), ("txt", "string"), ("cls", "int64"), ("__key__", "string")):
        assert f'- name: "{name}"\n    dtype: {kind}' in mixed
    assert "dtype" not in card_text("shard", [jpg, jpg])  # the same members everywhere: HF infers them
    assert "dtype" not in card_text("shard", [jpg, {"successes": 1, "fields": {"npy": 1, "txt": 1}}])  # no dtype for npy
    assert "dtype" not in card_text("shard", [jpg, {"successes": 1}])  # a shard's stats without fields: unknown
    assert 'path: "shard-*.tar"' in mixed


def test_unique_keys_renames_samples_whose_text_is_not_valid_unicode(tmp_path):
    """--unique-keys adds source_key/source_shard to each .json. A caption cut inside a surrogate
    pair (a lone "\\ud83d" escape: scraped captions have them) and a key that is not UTF-8 (a
    latin-1 file name) are written as JSON escapes, not a UnicodeEncodeError that stops the run."""
    import json
    import tarfile

    from shardkit import write_shard as _write_shard
    from wdsfilter.runfolder.reshard import Resharder, Source
    members = [("000000.jpg", image_bytes()), ("000000.json", b'{"caption": "cut \\ud83d", "uid": "u0"}'),
               ("caf\udce9.jpg", image_bytes())]  # the byte 0xe9: no .json of its own
    path = _write_shard(str(tmp_path / "odd.tar"), members)
    out = tmp_path / "out"
    writer = Resharder(str(out), per_shard=10, unique_keys=True)
    writer.prepare({"run": 1}, overwrite=False, kept=2)
    writer.write([Source(path, ["000000", "caf\\xe9"])])  # the key as the readers name it
    with tarfile.open(out / "shard-000000.tar") as tar:
        metas = {m.name: json.loads(tar.extractfile(m).read()) for m in tar.getmembers() if m.name.endswith(".json")}
    assert metas["000000000.json"] == {"caption": "cut \ud83d", "uid": "u0", "source_key": "000000",
                                       "source_shard": path}
    assert metas["000000001.json"] == {"source_key": "caf\\xe9", "source_shard": path}
