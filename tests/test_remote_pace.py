"""No web server can hold a run by being slow (docs/remote.md, "Bounds"): one that drips a byte
every half second fails the shard at the transfer floor (--remote-speed-limit over
--remote-speed-time), one that sends a byte then resets at the retry budget that bytes received
do not renew (--remote-retry-budget); one that is slow but healthy is read whole. The bounds are
set small here so the tests take seconds; no test asserts which limit fired first."""
import json
import os
import threading
import time

import pytest
from click.testing import CliRunner

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

from remotekit import three_shards  # noqa: E402
from wdsfilter.cli import main  # noqa: E402
from wdsfilter.storage.remote import RemoteOptions, RemoteReadError  # noqa: E402
from wdsfilter.storage.remote_read import open_remote  # noqa: E402

FLOOR = RemoteOptions(block_bytes=8192, readahead=2, backoff_seconds=0.01, idle_seconds=30, speed_limit=1024,
                      speed_seconds=1.0, retry_budget=2)
HANG_GUARD = 120.0  # seconds: a read past this is a hang (the old reader took hours on a drip)


def documented_bound(o: RemoteOptions) -> float:
    """docs/remote.md: a read that never keeps up with the floor fails within (retry budget + 1)
    windows of waiting, plus the back-offs between them (and the slice the floor is looked at in)."""
    backoffs = sum(min(o.max_backoff_seconds, o.backoff_seconds * 2 ** i) for i in range(o.retry_budget + 1))
    return (o.retry_budget + 1) * (o.speed_seconds + min(1.0, o.speed_seconds / 8)) + backoffs


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return three_shards(tmp_path_factory)


def _read(url, options):
    """(the bytes or the error, seconds), the read run in a thread under the hang guard."""
    box = {}

    def run():
        try:
            box["got"] = open_remote(url, options).read()
        except Exception as e:  # noqa: BLE001 - what the test looks at
            box["got"] = e
    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD)
    assert not thread.is_alive(), f"the read of {url} still runs after {HANG_GUARD:.0f}s"
    return box["got"], time.monotonic() - started


@pytest.mark.parametrize("pace", [("drip", 0.5), ("trickle",)], ids=["drip", "trickle"])
def test_a_drip_or_a_trickle_fails_the_shard_within_the_bound(web, local, pace):
    url = web.put("slow.tar", open(local[1][0], "rb").read())
    web.pace("slow.tar", pace)
    got, seconds = _read(url, FLOOR)
    assert isinstance(got, RemoteReadError), got
    text = str(got)
    # the shard, the rate seen and the flag
    assert url in text and "gave up after" in text and "B/s" in text and "--remote-" in text, text
    assert seconds < documented_bound(FLOOR) + 30, (seconds, text)  # + slack for a loaded machine
    if pace[0] == "drip":
        assert len(web.gets("slow.tar")) <= FLOOR.retry_budget + 1


def test_a_slow_but_healthy_server_is_read_whole(web, local):
    data = open(local[1][0], "rb").read() * 3  # ~120 KB at 50 KiB/s: a few windows of the floor
    url = web.put("healthy.tar", data)
    web.pace("healthy.tar", ("rate", 50 * 1024))
    got, _ = _read(url, RemoteOptions(**{**FLOOR.__dict__, "speed_seconds": 0.5}))
    assert got == data and web.gets("healthy.tar") == ["bytes=0-"]


def test_score_fails_the_slow_shards_into_the_ledger_and_scores_the_healthy_one(web, local, tmp_path):
    from scorekit import make_shards
    [first] = make_shards(str(tmp_path / "big"), [40])[0]  # read before scoring (key check, probe)
    urls = [web.put("first.tar", open(first, "rb").read())]
    for name, pace in (("drip.tar", ("drip", 0.5)), ("trickle.tar", ("trickle",)),
                       ("healthy.tar", ("rate", 50 * 1024))):
        urls.append(web.put(name, open(local[1][0], "rb").read()))
        web.pace(name, pace)
    out = str(tmp_path / "out")
    config = tmp_path / "stage.json"
    config.write_text(json.dumps({"remote_backoff_seconds": 0.01}))
    started = time.monotonic()
    r = CliRunner().invoke(main, ["score", *urls, "--scorer", "scorekit:ByteLengthScorer", "--out", out,
                                  "--device", "cpu", "--workers", "0", "--no-progress", "--config", str(config),
                                  "--remote-speed-limit", "1KiB/s", "--remote-speed-time", "1",
                                  "--remote-retry-budget", "2"])
    seconds = time.monotonic() - started
    assert r.exit_code == 3, r.output
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert sorted(f["url"] for f in summary["shards_failed"]) == sorted(urls[1:3])
    assert sorted(os.listdir(os.path.join(out, "done"))) == ["first.json", "healthy.json"]
    import pyarrow.parquet as pq
    ledger = [e for e in pq.read_table(os.path.join(out, "failures.parquet")).to_pylist() if e["index"] == -1]
    assert sorted(e["shard"] for e in ledger) == sorted(urls[1:3])
    for e in ledger:
        assert "gave up after" in e["message"] and "B/s" in e["message"] and "--remote-" in e["message"], e
    assert seconds < 2 * documented_bound(FLOOR) + 60  # two slow shards, one after the other, plus start-up


def test_the_bounds_are_checked_when_given(tmp_path):
    from wdsfilter.stream.config import StageConfig
    from wdsfilter.core.errors import ConfigError
    assert StageConfig(remote_speed_limit="50kB/s").remote_options().speed_limit == 50_000
    assert StageConfig(remote_speed_limit="0").remote_options().speed_limit == 0
    for bad in (dict(remote_speed_limit="fast"), dict(remote_speed_time=0), dict(remote_retry_budget=-1)):
        with pytest.raises(ConfigError):
            StageConfig(**bad)
    r = CliRunner().invoke(main, ["validate", str(tmp_path), "--remote-speed-limit", "fast"])
    assert r.exit_code == 2 and "--remote-speed-limit" in r.output, r.output
