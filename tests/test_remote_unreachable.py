"""Network failures named as what they are (issue 35): a host name that does not resolve, a
connection refused, a server that never answers, a TLS failure, a forbidden object, a missing one;
for http(s), s3, gs and hf, with no network: closed loopback ports, unresolvable `*.invalid` names
and servers of our own on 127.0.0.1, never real traffic. When no shard can be opened for one such
reason, `validate` and `score` print one line and exit 3 (not reached) or 2 (access), with no
library log line or traceback; beside a shard that is read, each is a finding or a ledger row."""
import contextlib
import json
import logging
import os
import socket

import pytest
from click.testing import CliRunner

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

from remotekit import environment, three_shards  # noqa: E402
from wdsfilter.cli import main  # noqa: E402

SCORER = "scorekit:ByteLengthScorer"


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return three_shards(tmp_path_factory)


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _silent_server():
    """A port that takes connections (the kernel's backlog) and never answers a request."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


class _Records(logging.Handler):
    """Every log record of the block (any logger, any level): a library's retry shows up here."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@contextlib.contextmanager
def _recorded():
    handler, root = _Records(), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler.records
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _one_line(result, code: int) -> str:
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == code and len(lines) == 1, result.output
    assert "Traceback" not in result.output
    return lines[0]


def _clear_clients():
    from remotekit import clear_http_cache
    clear_http_cache()
    for module, cls in (("s3fs", "S3FileSystem"), ("gcsfs.core", "GCSFileSystem"), ("huggingface_hub", "HfFileSystem")):
        with contextlib.suppress(ImportError, AttributeError):
            getattr(__import__(module, fromlist=[cls]), cls).clear_instance_cache()


def test_each_way_a_web_shard_cannot_be_opened_is_named(web, local, tmp_path):
    data = open(local[1][0], "rb").read()
    closed = _closed_port()
    forbidden = web.put("forbidden.tar", data, denied=True)
    with _silent_server() as silent:
        cases = {
            "cannot resolve host 'shards.invalid'": ("http://shards.invalid/x.tar", 3),
            f"connection refused by 127.0.0.1:{closed}": (f"http://127.0.0.1:{closed}/x.tar", 3),
            "timed out": (f"http://127.0.0.1:{silent}/x.tar", 3),
            "TLS failure": (web.url.replace("http://", "https://") + "/forbidden.tar", 3),
            "access denied (HTTP 403)": (forbidden, 2),
        }
        for why, (url, code) in cases.items():
            for command in (["validate", url], ["score", url, "--scorer", SCORER, "--out", str(tmp_path / why[:6]),
                                                "--device", "cpu", "--workers", "0", "--no-progress"]):
                r = CliRunner().invoke(main, [*command, "--remote-speed-time", "2"])
                line = _one_line(r, code)
                assert why in line and url in line and "does not exist" not in line, (why, line)
    # missing is missing: a finding of the report, as before
    r = CliRunner().invoke(main, ["validate", f"{web.url}/nope.tar", "--format", "json"])
    assert r.exit_code == 1 and json.loads(r.output)["shards"][0]["findings"] == {"remote_object_missing": 1}


@pytest.mark.parametrize("store", ["s3", "gs", "hf"])
@pytest.mark.parametrize("how", ["dns", "refused"])
def test_a_store_with_no_network_is_one_line_at_once(store, how, tmp_path):
    host = f"{store}-endpoint.invalid" if how == "dns" else f"127.0.0.1:{_closed_port()}"
    why = f"cannot resolve host '{store}-endpoint.invalid'" if how == "dns" else f"connection refused by {host}"
    variables = {"s3": dict(AWS_ENDPOINT_URL=f"http://{host}", AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s",
                            AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_CONFIG_FILE=os.devnull,
                            AWS_EC2_METADATA_DISABLED="true"),
                 "gs": dict(STORAGE_EMULATOR_HOST=f"http://{host}"),
                 "hf": dict(HF_ENDPOINT=f"http://{host}")}[store]
    prefix = {"s3": "s3://b/", "gs": "gs://b/", "hf": "hf://datasets/org/name/"}[store]
    _clear_clients()
    with environment(**variables), _recorded() as records:
        for url, what in ((prefix + "x.tar", "the shard could not be opened"), (prefix, "cannot be listed")):
            for command in (["validate", url], ["score", url, "--scorer", SCORER, "--out",
                                                str(tmp_path / f"o{len(records)}"), "--device", "cpu",
                                                "--workers", "0", "--no-progress"]):
                line = _one_line(CliRunner().invoke(main, command), 3)
                assert what in line and f"cannot be reached: {why}" in line, line
    _clear_clients()
    # at once: no client was asked, so none retried (botocore, gcsfs and huggingface_hub log their retries)
    assert not [r for r in records if "retr" in r.getMessage().lower() and not r.name.startswith("wdsfilter")]


def test_beside_a_shard_that_is_read_each_is_a_finding_and_a_ledger_row(web, local, tmp_path):
    good = web.put("good.tar", open(local[1][0], "rb").read())
    closed = f"http://127.0.0.1:{_closed_port()}/gone.tar"
    forbidden = web.put("forbidden.tar", b"x", denied=True)
    r = CliRunner().invoke(main, ["validate", good, closed, forbidden, "--format", "json"])
    assert r.exit_code == 1, r.output
    kinds = [s["findings"] for s in json.loads(r.output)["shards"]]
    assert kinds == [{}, {"remote_unreachable": 1}, {"remote_access_denied": 1}], kinds
    out = str(tmp_path / "out")
    r = CliRunner().invoke(main, ["score", good, closed, forbidden, "--scorer", SCORER, "--out", out, "--device",
                                  "cpu", "--workers", "0", "--no-progress"])
    assert r.exit_code == 3 and "Traceback" not in r.output, r.output
    import pyarrow.parquet as pq
    ledger = {e["shard"]: e for e in pq.read_table(os.path.join(out, "failures.parquet")).to_pylist()
              if e["index"] == -1}
    assert {u: (e["reason"], e["transient"]) for u, e in ledger.items()} == {
        closed: ("remote_unreachable", True), forbidden: ("remote_access_denied", False)}
    assert "connection refused" in ledger[closed]["message"]


def test_library_log_lines_stay_off_the_terminal_unless_debug(tmp_path):
    """A library's own warning (here aiohttp's, a real record from a real client path would take its
    retries' time) reaches the terminal only with --debug; wdsfilter's own do."""
    from wdsfilter.core.progress import library_logs_off
    library_logs_off(debug=False)
    try:
        import io
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        logging.getLogger().addHandler(handler)
        library_logs_off(debug=False)
        logging.getLogger("gcsfs").error("out of retries", exc_info=ValueError("x"))
        logging.getLogger("wdsfilter").warning("ours")
        assert stream.getvalue() == "ours\n"
        library_logs_off(debug=True)
        logging.getLogger("gcsfs").error("out of retries")
        assert "out of retries" in stream.getvalue()
    finally:
        logging.getLogger().removeHandler(handler)
        library_logs_off(debug=False)


def test_a_small_object_from_a_server_that_never_answers_is_given_up_in_its_time():
    # sizes.json beside remote shards (validate's size check, the loader's epoch size) was read with
    # the client's own timeouts: a server that takes the connection and never answers held the
    # command for aiohttp's 5 minutes. The read now has the answer time of every other request.
    import time

    from wdsfilter.storage.remote import read_object
    _clear_clients()
    with _silent_server() as silent:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=f"127.0.0.1:{silent}/set/sizes.json: no answer in 1s"):
            read_object(f"http://127.0.0.1:{silent}/set/sizes.json", seconds=1)
        assert time.monotonic() - started < 30  # the client's own wait is 300 s
