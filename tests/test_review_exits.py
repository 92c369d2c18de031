"""Exit codes and cleanup on failures met half-way through a run (review of the remote writers and
the resharder): a store that fails while a shard is read is the run's failure (exit 3, 'run
again'), not a configuration error (2); a failed reshard leaves no temporary or open file."""
import os

import pytest
from click.testing import CliRunner

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

from remotekit import FaultServer, clear_http_cache  # noqa: E402
from shardkit import image_bytes, write_shard  # noqa: E402
from wdsfilter.cli import main  # noqa: E402


@pytest.fixture
def web():
    clear_http_cache()
    with FaultServer() as server:
        yield server
    clear_http_cache()


def _scattered(path, text="caption"):
    keys = [f"k{i:03d}" for i in range(6)]
    members = [(f"{k}.txt", f"{text} {k}") for k in keys] + [(f"{k}.jpg", image_bytes()) for k in keys]
    return write_shard(str(path), members)


def test_sort_shard_of_a_remote_shard_that_changes_while_read_exits_3(web, tmp_path):
    path = _scattered(tmp_path / "scattered.tar")
    data = open(path, "rb").read()
    url = web.put("scattered.tar", data)
    # The first read breaks off; its resumed GET finds the object replaced (412 on its If-Match).
    other = open(_scattered(tmp_path / "other.tar", "other"), "rb").read()
    web.fail("scattered.tar", ("short", 2048), ("replace", other))
    result = CliRunner().invoke(main, ["sort-shard", url, str(tmp_path / "sorted.tar")])
    assert result.exit_code == 3, result.output
    assert "scattered.tar" in result.output
    assert not os.path.exists(tmp_path / "sorted.tar")
