"""Memory per key is flat in the name's length (issue 20, finding 11): the sets that remember
every key of a shard (duplicates, keys that come back, each key's outcome) hold a 16-byte digest
(specs.key_digest), not the name: 50,000 names of 4,000 characters held 450 MB in validate."""
import io
import tarfile

from filterkit import peak_rss_mb


def shard(path, n, name_length):
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(n):
            info = tarfile.TarInfo(f"{i:06d}".ljust(name_length, "k") + ".txt")
            info.size = 7
            tar.addfile(info, io.BytesIO(b"caption"))
    return str(path)


def test_validate_memory_does_not_grow_with_name_length(tmp_path):
    peaks = {}
    for length in (6, 4000):
        r, peaks[length] = peak_rss_mb("validate", shard(tmp_path / f"n{length}.tar", 6000, length),
                                       "--caption-key", "txt", "--image-key", "txt")
        assert r.returncode == 0, r.stderr
    # 6,000 names of 4,000 characters are 24 MB; each was held twice (about 48 MB more)
    assert peaks[4000] - peaks[6] < 16, peaks
