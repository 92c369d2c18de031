"""Third code review's findings (the report/runfolder/remote rework): each test fails without its fix."""
import pytest

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

from remotekit import FaultServer, clear_http_cache  # noqa: E402


@pytest.fixture
def web():
    clear_http_cache()
    with FaultServer() as server:
        yield server
    clear_http_cache()


@pytest.mark.parametrize("status", [403, 404, 500])
def test_a_failed_read_of_a_presigned_url_never_shows_its_signature(web, status):
    """aiohttp's error text holds the URL it asked for, query and all: the shard's error and each
    retry's line show it redacted (remote._strip), as the shard's own name is."""
    from wdsfilter.remote import RemoteOptions, open_remote
    path = "a.tar?X-Amz-Signature=SeCrEt99&X-Amz-Credential=AKIDx"
    url = web.put(path, b"x" * 4096)
    web.fail(path, *[("status", status, None)] * 4)
    retries = []
    with pytest.raises(OSError) as e:
        open_remote(url, RemoteOptions(attempts=2, backoff_seconds=0.01), on_retry=retries.append).read()
    text = str(e.value) + "".join(retries)
    assert str(status) in text and "a.tar?<hidden>" in text, text
    assert "SeCrEt99" not in text and "AKIDx" not in text, text
