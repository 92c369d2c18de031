"""A password or a presigned signature in a shard's URL is written in one file only, the run's
shards.json (0600), which `--resume` and `filter` read the shards again through; every other file
the commands write (locally and in a bucket), every folder name, every line they print shows the
URL without it (publish.py). The secrets are distinctive, so a plain byte search finds them."""
import json
import os
import stat

import pytest
from click.testing import CliRunner

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")
pytest.importorskip("moto")

from remotekit import BUCKET, FaultServer, clear_http_cache, s3_server  # noqa: E402
from wdsfilter.cli import main  # noqa: E402

PASSWORD = "pwSECRET7q7Zr"
SIGNATURE = "sigSECRET3z9Xk"
SECRETS = (PASSWORD.encode(), SIGNATURE.encode())
SCORER = "scorekit:ByteLengthScorer"


def _leaks(data: bytes):
    return [s.decode() for s in SECRETS if s in data]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """(server, urls): a shard behind a password, one behind a presigned query, one behind a
    password whose reads fail (503) until cleared, one missing (404) behind a signature."""
    from scorekit import make_shards
    folder = str(tmp_path_factory.mktemp("src"))
    paths, _ = make_shards(folder, [12, 9, 7])
    clear_http_cache()
    with FaultServer() as web:
        with_password = lambda url: url.replace("http://", f"http://wdsf:{PASSWORD}@")  # noqa: E731
        signed = f"?X-Amz-Signature={SIGNATURE}&X-Amz-Expires=300"
        urls = [with_password(web.put("d/a.tar", open(paths[0], "rb").read())),
                web.put("d/b.tar" + signed, open(paths[1], "rb").read()),
                with_password(web.put("d/c.tar", open(paths[2], "rb").read())),
                f"{web.url}/d/missing.tar{signed}"]
        web.fail("d/c.tar", *[("status", 503)] * 1000)
        yield web, urls
    clear_http_cache()


def _run(outputs, *args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    outputs.append((args[0], r.exit_code, r.output))
    return r


def test_no_secret_of_a_shard_url_outside_shards_json(shards, tmp_path):
    web, urls = shards
    config = tmp_path / "stage.json"
    config.write_text(json.dumps({"remote_backoff_seconds": 0.01, "remote_attempts": 2}))
    out, outputs = tmp_path / "out", []
    common = ["--scorer", SCORER, "--device", "cpu", "--workers", "0", "--no-progress"]
    assert _run(outputs, "validate", *urls, "--config", config, "--stats-dir", tmp_path / "stats", "--format",
                "json", "--output", tmp_path / "report.json", "-v").exit_code == 1
    assert _run(outputs, "validate", *urls, "--config", config, "--format", "junit", "--output",
                tmp_path / "report.xml").exit_code == 1
    assert _run(outputs, "score", *urls, *common, "--config", config, "--out", out, "--write-shards",
                tmp_path / "kept", "--debug").exit_code == 3
    web.faults.clear()  # the store is back: --resume reads the failed shard again, by its URL in shards.json
    resumed = _run(outputs, "score", *urls, *common, "--config", config, "--out", out, "--write-shards",
                   tmp_path / "kept", "--resume")
    assert resumed.exit_code == 3 and "resume: 2 of 4 shard(s) already done" in resumed.output, resumed.output
    assert sorted(os.listdir(out / "done")) == ["a.json", "b.json", "c.json"]
    # run.yaml names the shards published; a replay finds them in the shards.json beside it
    assert _run(outputs, "score", *common, "--config", out / "run.yaml", "--out", tmp_path / "again").exit_code == 3
    assert len(os.listdir(tmp_path / "again" / "done")) == 3
    r = _run(outputs, "filter", out, "--min", "caption_bytes=1", "--write-shards", tmp_path / "filtered",
             "--allow-remote", "--allow-incomplete")
    assert r.exit_code == 0 and "wrote 28 samples" in r.output, r.output
    import wdsfilter  # the loader filtered by the run: the shards as given, matched to its score files
    batches = wdsfilter.loader(urls[:3], scores=str(out), min_scores={"caption_bytes": 1}, batch_size=4,
                               output="dict")
    assert sum(len(b) for b in batches) == 28
    for command, _code, text in outputs:
        assert not _leaks(text.encode()), (command, text)
    shards_json = []
    for root, folders, files in os.walk(tmp_path):
        for name in folders:
            assert not _leaks(name.encode()), os.path.join(root, name)
        for name in files:
            path = os.path.join(root, name)
            if name == "shards.json":
                shards_json.append(path)
                assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
                continue
            assert not _leaks(open(path, "rb").read()), path
    assert len(shards_json) == 2 and all(_leaks(open(p, "rb").read()) for p in shards_json)


def test_nor_in_a_bucket(shards, tmp_path):
    """A run folder and validate's stats in a bucket: no object but shards.json holds a secret."""
    _, urls = shards
    with s3_server() as (_, client):
        outputs = []
        _run(outputs, "validate", *urls, "--stats-dir", f"s3://{BUCKET}/stats/", "--format", "json", "--output",
             f"s3://{BUCKET}/reports/r.json", "--remote-retry-budget", "0")
        _run(outputs, "score", *urls[:2], urls[3], "--scorer", SCORER, "--out", f"s3://{BUCKET}/runs/x",
             "--device", "cpu", "--workers", "0", "--no-progress", "--write-shards", f"s3://{BUCKET}/kept/")
        assert [code for _, code, _ in outputs] == [1, 3], outputs
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
        assert any(k.startswith("stats/") for k in keys) and any(k.startswith("runs/x/scores/") for k in keys)
        for key in keys:
            assert not _leaks(key.encode()), key
            data = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
            assert key.endswith("/shards.json") or not _leaks(data), key
        for command, _code, text in outputs:
            assert not _leaks(text.encode()), (command, text)


def test_the_packages_log_lines_show_urls_redacted(caplog):
    """In a user's own process too (the loader's warnings): every record of the "wdsfilter" logger."""
    import logging
    import wdsfilter  # noqa: F401 - installs the filter
    with caplog.at_level(logging.WARNING, logger="wdsfilter"):
        logging.getLogger("wdsfilter").warning("shard %s failed", f"https://u:{PASSWORD}@h/x.tar?sig={SIGNATURE}")
    assert caplog.records and not _leaks(caplog.text.encode()) and "https://<hidden>@h/x.tar?<hidden>" in caplog.text
