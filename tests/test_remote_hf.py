"""hf:// through huggingface_hub's HfFileSystem (a real client) against a Hub of our own on
127.0.0.1 (hubkit: the repo info, tree, paths-info and resolve endpoints with Range): listing,
validate and score give what the local read of the same shards gives; HF_TOKEN reaches the server
as a bearer token and nothing written or printed holds it; outputs to hf:// are refused before any
work."""
import glob
import json
import os
import tarfile

import pytest
from click.testing import CliRunner

pytest.importorskip("huggingface_hub")

from hubkit import HubServer, clear_hf_cache, hub_endpoint  # noqa: E402
from remotekit import three_shards  # noqa: E402
from scorekit import assert_one_line_error, run_without_torch  # noqa: E402
from wdsfilter.cli import main  # noqa: E402
from wdsfilter.core.errors import ConfigError  # noqa: E402
from wdsfilter.storage.remote import RemoteOptions  # noqa: E402
from wdsfilter.storage.shards import expand_urls, open_shard  # noqa: E402
from wdsfilter.validate import validate  # noqa: E402

SCORER = "scorekit:BrightnessScorer"
REPO = "wdsf-org/laion-mini"
TOKEN = "hf_wdsfSECRETq8Zr3LkPw"  # distinctive: looked for in every output
FAST = dict(remote_backoff_seconds=0.01, remote_block_bytes=16 << 10, remote_readahead=2)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return three_shards(tmp_path_factory)


@pytest.fixture(scope="module")
def hub(local):
    with HubServer(token=TOKEN) as server, \
            hub_endpoint(server.url, HF_TOKEN=TOKEN, HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_OFFLINE=None):
        clear_hf_cache()
        urls = []
        for path in local[1]:
            with open(path, "rb") as f:
                urls.append(server.put(REPO, f"data/train/{os.path.basename(path)}", f.read()))
        server.put(REPO, "README.md", b"# a dataset card, not a shard\n")
        try:
            yield server, urls
        finally:
            clear_hf_cache()


def _cli(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _members(stream):
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        return [(m.name, tar.extractfile(m).read() if m.isfile() else None) for m in tar]


def _rows(out):
    return {os.path.basename(p): [{k: v for k, v in json.loads(line).items() if k != "shard"}
                                  for line in open(p) if line.strip()]
            for p in sorted(glob.glob(os.path.join(out, "scores", "*.jsonl")))}


def test_hf_repo_folders_and_globs_list_like_a_folder_with_the_token_as_bearer(hub):
    server, urls = hub
    assert len(urls) == 3
    assert expand_urls(f"hf://datasets/{REPO}/data/") == urls
    assert expand_urls(f"hf://datasets/{REPO}/data") == urls
    assert expand_urls(f"hf://datasets/{REPO}") == urls  # the whole repo: README.md is no shard
    assert expand_urls(f"hf://datasets/{REPO}/data/train/shard-000[01].tar") == urls[:2]
    assert expand_urls(f"hf://datasets/{REPO}/**/*.tar") == urls
    assert expand_urls(f"hf://datasets/{REPO}/data/train/shard-{{0000..0002}}.tar") == urls
    with pytest.raises(ConfigError, match="the prefix is empty"):
        expand_urls(f"hf://datasets/{REPO}/nothing-here/")
    with pytest.raises(ConfigError, match=r"wdsf-org/no-such-repo.*repository not found.*credentials: HF_TOKEN"):
        expand_urls("hf://datasets/wdsf-org/no-such-repo/data/")
    assert server.auth and set(server.auth) == {f"Bearer {TOKEN}"}
    assert server.unknown == []


def test_hf_members_are_byte_exact_and_validate_finds_what_it_finds_on_disk(hub, local):
    server, urls = hub
    for url, path in zip(urls, local[1]):
        with open(path, "rb") as f:
            expected = _members(f)
        stream = open_shard(url, remote=RemoteOptions(block_bytes=4096, readahead=3))
        assert _members(stream) == expected and stream.size == os.path.getsize(path) and stream.retries == 0
    ranges = [r for m, p, r in server.requests if m == "GET" and p.endswith("/shard-0000.tar")]
    assert len(ranges) > 1 and all(r and r.startswith("bytes=") for r in ranges)  # ranged blocks, never whole
    remote = validate(f"hf://datasets/{REPO}/data/", jobs=2, config=FAST)
    on_disk = validate(local[0], jobs=2)

    def comparable(report):
        found = [(os.path.basename(f.shard), f.kind, f.member, f.key, f.message) for f in report.findings]
        shards = [{k: v for k, v in r.stats().items() if k not in ("shard", "seconds")} for r in report.shards]
        return found, shards, report.counts, report.exit_code
    assert comparable(remote) == comparable(on_disk)
    assert {"corrupt_image", "missing_caption"} <= set(remote.counts)
    assert [r.shard for r in remote.shards] == urls
    missing = validate([f"hf://datasets/{REPO}/data/train/shard-0009.tar"], jobs=1)
    [finding] = missing.shards[0].findings
    assert finding.kind == "remote_object_missing" and "shard-0009.tar" in finding.message
    assert "HF_TOKEN" in finding.message and TOKEN not in finding.message
    assert server.unknown == [] and set(server.auth) == {f"Bearer {TOKEN}"}


def test_score_on_hf_gives_the_rows_of_the_local_read_and_writes_no_token(hub, local, tmp_path):
    server, urls = hub
    rows = {}
    for name, shards, workers in (("local", local[0], "0"), ("remote", f"hf://datasets/{REPO}/data/", "0"),
                                  ("remote-workers", f"hf://datasets/{REPO}/data/train/*.tar", "2")):
        out = str(tmp_path / name)
        r = _cli("score", shards, "--scorer", SCORER, "--out", out, "--device", "cpu", "--workers", workers,
                 "--no-progress", "--batch-size", "4", "--format", "jsonl")
        assert r.exit_code == 0, r.output
        assert TOKEN not in r.output
        rows[name] = _rows(out)
        for path in glob.glob(os.path.join(out, "**", "*"), recursive=True):
            if os.path.isfile(path):
                assert TOKEN.encode() not in open(path, "rb").read(), path
    assert len(rows["local"]) == 3 and rows["remote"] == rows["local"] == rows["remote-workers"]
    shards_seen = {json.loads(line)["shard"] for p in glob.glob(str(tmp_path / "remote" / "scores" / "*"))
                   for line in open(p) if line.strip()}
    assert shards_seen == set(urls)
    assert server.unknown == [] and set(server.auth) == {f"Bearer {TOKEN}"}


def test_a_read_reset_mid_shard_resumes_inside_it_through_a_fault_proxy(hub, local, monkeypatch):
    """A proxy in front of the Hub resets the connection of one ranged read in the middle of the
    shard: that block is asked again (not the shard from byte 0), the retry is ours (counted), the
    members are byte-exact, and the token went through the proxy to the Hub."""
    from faultkit import S3FaultProxy
    server, urls = hub
    with S3FaultProxy(server.url) as proxy:
        monkeypatch.setenv("HF_ENDPOINT", proxy.url)
        clear_hf_cache()
        try:
            path = f"datasets/{REPO}/resolve/main/data/train/shard-0000.tar"
            size, block = os.path.getsize(local[1][0]), 8 << 10
            mid = size // 2 // block * block
            proxy.fail(path, ("reset", mid + 100))
            with open(local[1][0], "rb") as f:
                expected = _members(f)
            stream = open_shard(urls[0], remote=RemoteOptions(block_bytes=block, readahead=1, backoff_seconds=0.01))
            assert _members(stream) == expected
            assert stream.retries == 1
            starts = [int(r.split("=")[1].split("-")[0]) for r in proxy.gets(path) if r]
            assert starts.count(mid) == 2 and mid > 0 and starts.count(0) == 1
        finally:
            clear_hf_cache()
    assert set(server.auth) == {f"Bearer {TOKEN}"}


@pytest.mark.parametrize("command", [["filter", "hf://datasets/wdsf-org/runs/x", "--min", "brightness=0.5"],
                                     ["dedup", "hf://datasets/wdsf-org/runs/x"]], ids=["filter", "dedup"])
def test_a_run_folder_on_the_hub_is_refused_in_place_with_one_line_before_torch(tmp_path, command):
    code, output, _ = run_without_torch(tmp_path, *command)
    assert code == 2, output
    assert_one_line_error(output, "a run folder on the Hub is not used in place", "huggingface-cli download")


def test_a_wrong_token_is_exit_2_naming_hf_token_never_its_value(hub, monkeypatch):
    server, _ = hub
    monkeypatch.setenv("HF_TOKEN", "hf_wrongWRONGwrong")
    clear_hf_cache()
    try:
        r = _cli("validate", f"hf://datasets/{REPO}/data/")
    finally:
        clear_hf_cache()
    assert r.exit_code == 2 and "credentials: HF_TOKEN" in r.output, r.output
    assert "hf_wrongWRONGwrong" not in r.output and TOKEN not in r.output and "Traceback" not in r.output
    assert "Bearer hf_wrongWRONGwrong" in server.auth  # the token the environment named reached the server


@pytest.mark.parametrize("command", [
    ["score", "SHARDS", "--out", "hf://datasets/wdsf-org/runs/x"],
    ["score", "SHARDS", "--out", "OUT", "--write-shards", "hf://datasets/wdsf-org/kept"],
    ["validate", "SHARDS", "--output", "hf://datasets/wdsf-org/reports/r.json"],
], ids=["score-out", "score-write-shards", "validate-output"])
def test_outputs_to_hf_are_refused_with_one_line_before_torch(tmp_path, local, command):
    args = [local[0] if a == "SHARDS" else str(tmp_path / "out") if a == "OUT" else a for a in command]
    code, output, _ = run_without_torch(tmp_path, *args)
    assert code == 2, output
    assert_one_line_error(output, "the Hugging Face Hub is not written to directly", "huggingface-cli upload")
    assert not (tmp_path / "out").exists()


def test_the_loader_and_sort_shard_read_hf_shards(hub, local, tmp_path):
    import wdsfilter
    urls = hub[-1]
    loaders = [wdsfilter.loader(source, batch_size=4, num_workers=workers, output="dict", **FAST)
               for source, workers in ((local[0], 0), (f"hf://datasets/{REPO}/data/", 0), (f"hf://datasets/{REPO}/data/", 2))]
    seen = []
    for loader in loaders:  # workers open their own shards: the order across workers may differ
        seen.append(sorted((s["__key__"], s["caption"], s["image"].tobytes()) for batch in loader for s in batch))
    assert len(seen[0]) == 26 and seen[0] == seen[1] == seen[2]
    r = _cli("sort-shard", urls[0], str(tmp_path / "sorted.tar"))
    assert r.exit_code == 0, r.output
    assert _cli("sort-shard", local[1][0], str(tmp_path / "sorted-local.tar")).exit_code == 0
    assert open(tmp_path / "sorted.tar", "rb").read() == open(tmp_path / "sorted-local.tar", "rb").read()
