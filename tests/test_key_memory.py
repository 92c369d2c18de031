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


def test_duplicates_and_returning_keys_are_found_for_short_long_and_non_ascii_names(tmp_path):
    """A short ASCII key is held as it is and any other as a digest (specs.key_digest): both kinds
    tell a repeated member and a key that comes back, and a 32-character key is never taken for
    the digest of another."""
    from wdsfilter.core.specs import SHORT_KEY, key_digest
    from wdsfilter.validate import validate

    keys = ["a" * SHORT_KEY, "b" * (SHORT_KEY + 1), "é" * 8, "x" * 4000]
    assert key_digest(keys[0]) == keys[0] and all(isinstance(key_digest(k), bytes) for k in keys[1:])
    path = tmp_path / "mixed.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        # each key: its caption twice in a row (a duplicate member), then once more after the
        # next key (a key that comes back)
        names = [f"{k}.txt" for k in keys for _ in range(2)] + [f"{keys[0]}.json", f"{keys[2]}.json"]
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 7
            tar.addfile(info, io.BytesIO(b"caption"))
    report = validate(str(path), caption_key="txt", image_key="txt")
    assert report.counts["duplicate_key"] == len(keys), report.counts
    assert report.samples == len(keys)
    assert sorted(f.key for f in report.findings if f.kind == "nonadjacent_key") == sorted([keys[0], keys[2]])
