"""Builders for the `wdsfilter filter` tests (no tests in this module): real shards made with GNU
tar (pax headers, modes, times, long names) and real `wdsfilter score` runs over them."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile

import numpy as np

from shardkit import image_bytes
from wdsfilter.runfolder.tables import read_rows
from wdsfilter.storage.shardcopy import member_ranges

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gnu_tar_shards(folder, counts, extra_bytes=0, long_names=False, tie_every=0, refused=(), corrupt=()):
    """Shards made by GNU tar (pax format) from files on disk, each sample a .jpg and a .txt (and a
    .bin of `extra_bytes` random bytes when asked), with distinct modes and times per member.
    tie_every=N: every N-th sample repeats one colour (equal scores). refused, corrupt: (shard,
    sample) pairs whose caption the brightness scorer refuses, whose JPEG is broken. Returns the
    shard paths."""
    rng = np.random.default_rng(0)
    paths = []
    for s, n in enumerate(counts):
        src = os.path.join(folder, f"src{s}")
        os.makedirs(src, exist_ok=True)
        names = []
        for i in range(n):
            stem = (f"sample_with_a_rather_long_name_{'x' * 90}_{s}_{i:05d}" if long_names else f"s{s}_{i:05d}")
            color = (250, 250, 250) if tie_every and i % tie_every == 0 else \
                ((37 * i + 11 * s) % 256, (91 * i + 7 * s) % 256, (13 * i + 50) % 256)
            size = (24, 20) if tie_every and i % tie_every == 0 else (24 + i % 5, 20)
            jpeg = b"\xff\xd8\xff\xe0 not a jpeg" if (s, i) in corrupt else image_bytes(size=size, color=color)
            caption = f"caption {i} of shard {s}" + (" refuse-me" if (s, i) in refused else "")
            files = [(stem + ".jpg", jpeg), (stem + ".txt", caption.encode())]
            if extra_bytes:
                files.append((stem + ".bin", rng.integers(0, 256, extra_bytes, dtype=np.uint8).tobytes()))
            for j, (name, data) in enumerate(files):
                path = os.path.join(src, name)
                with open(path, "wb") as f:
                    f.write(data)
                os.chmod(path, 0o640 if j else 0o604)
                os.utime(path, (1_600_000_000 + i * 60 + j, 1_600_000_000 + i * 60 + j))
                names.append(name)
        shard = os.path.join(folder, f"shard-{s:04d}.tar")
        subprocess.run(["tar", "--format=pax", "-cf", shard, "-C", src, "-T", "-"], input="\n".join(names).encode(),
                       check=True)
        paths.append(shard)
    return paths


def score_folder(shards, out, **options):
    """A real `wdsfilter score` run (local engine) with the brightness scorer of the engine tests."""
    from scorekit import BrightnessScorer
    from wdsfilter.score import score
    options = dict(dict(device="cpu", progress=False, workers=0, batch_size=16), **options)
    score(shards, out=str(out), scorers=[BrightnessScorer(fail_word="refuse-me")], **options)
    return str(out)


def all_rows(out):
    folder = os.path.join(out, "scores")
    return [r for f in sorted(os.listdir(folder)) for r in read_rows(os.path.join(folder, f))]


def raw_members(path, rekey="first-dot"):
    """[(key, raw header+data bytes)] of a tar, in order (what a byte-exact copy must keep)."""
    _, ranges = member_ranges(path, rekey)
    with open(path, "rb") as f:
        data = f.read()
    return [(key, data[start:end]) for start, end, key in ranges]


def member_infos(path):
    with tarfile.open(path) as tar:
        return [(m.name, m.size, m.mode, m.mtime, m.uid, m.gid, m.uname, m.gname, dict(m.pax_headers),
                 tar.extractfile(m).read()) for m in tar if m.isreg()]


def run_cli(*args, env=None, timeout=300):
    """`python -m wdsfilter ARGS` in a child process (a real command line)."""
    return subprocess.run([sys.executable, "-m", "wdsfilter", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


def peak_rss_mb(*args):
    """(completed process, its peak RSS in MB): `python -m wdsfilter ARGS` run under a wrapper
    whose only child it is, so RUSAGE_CHILDREN's ru_maxrss is that command's (a bound, no timing)."""
    code = ("import resource, subprocess, sys\n"
            "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n"
            "sys.exit(r.returncode)\n")
    r = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "wdsfilter", *args], capture_output=True,
                       text=True, cwd=REPO, timeout=300)
    return r, int(r.stdout.split()[-1])


def img2dataset_shards(folder, counts, png_every=0, restart_keys=False, duplicate_every=0):
    """Shards written with webdataset's TarWriter the way img2dataset writes them: per sample an
    image, its caption (.txt) and a .json of img2dataset's fields (key, url, caption, status, and
    DataComp's uid). png_every=N: every N-th image is a PNG (jpg+png shards, as img2dataset's
    --encode_format keeps sources); restart_keys: keys start at 000000 in every shard (writers that
    number samples per shard), else img2dataset's shard+index keys; duplicate_every=N: every N-th
    image repeats the first one's bytes. Returns the shard paths."""
    import io

    import webdataset as wds
    from PIL import Image
    os.makedirs(folder, exist_ok=True)
    paths = []
    for s, n in enumerate(counts):
        path = os.path.join(folder, f"{s:05d}.tar")
        with wds.TarWriter(path) as sink:
            for i in range(n):
                key = f"{i:06d}" if restart_keys else f"{s:05d}{i:04d}"
                seed = 0 if duplicate_every and i % duplicate_every == 0 else 1 + s * 10_000 + i
                png = bool(png_every) and i % png_every == png_every - 1
                pixels = np.random.default_rng(seed).integers(0, 256, (24, 32, 3), dtype=np.uint8)  # a phash of its own
                buf = io.BytesIO()
                Image.fromarray(pixels).resize((64, 48)).save(buf, "PNG" if png else "JPEG")
                caption = f"photo {i} of shard {s}: a café sign"  # not ASCII: the text kept as UTF-8
                meta = {"key": key, "url": f"https://img.example.com/{s}/{i}.{'png' if png else 'jpg'}",
                        "caption": caption, "status": "success", "uid": f"{s:04x}{i:028x}"}
                sink.write({"__key__": key, "png" if png else "jpg": buf.getvalue(),
                            "txt": caption, "json": meta})
        paths.append(path)
    return paths
