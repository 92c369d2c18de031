"""The files of a scoring run folder, their records and the rules that keep a folder inside itself
(the layout is drawn in wdsfilter/runfolder/__init__.py).

A folder handed over by someone else is input: every path it names is checked here before a file
is opened. The rules:

* a marker's score file is always `FOLDER/scores/<name>.<ext>`: the path the marker recorded
  (relative to the scoring run's working folder in older runs, absolute in some) only names the
  file; it is never opened where it points, nor resolved against the current folder. A recorded
  path that is not `.../scores/<the marker's name>.parquet|.jsonl` is refused (ConfigError);
* no file of the folder (run.json, shards.json, a marker, a score file) may be a symlink that
  leads out of it: refused (ConfigError);
* a marker's source shard (`source.path`, where the run read it) is used only where the run's own
  record, shards.json, lists that shard with that URL (and, since shards.json records it, that
  path); with a source root (`wdsfilter filter --source-root DIR`, for data moved since scoring,
  or a folder received from someone else) the shard is DIR/<its file name>, whatever the folder says;
* a file that is not what `wdsfilter score` wrote (broken JSON, wrong types) is damaged: a damaged
  marker makes its shard unfinished (counted and named), a damaged run.json or shards.json is a
  ConfigError naming it.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from ..storage.atomic import write_json, check_guards, temporary_path
from ..core.errors import ConfigError
from ..core.publish import published
from ..storage.shardurls import absolute_url, is_local, local_path, split_suffix
from .names import DONE, RUN_JSON, SCORES, SHARDS_FILE
from .tables import FORMATS, WRITER_META, DamagedRunFolder, damaged, format_for

RUN_ID = "run_id"  # run.json's: the run the folder holds (a --resume continues it, --overwrite starts another)
JOINED = "joined"  # run.json's: a joined run's shard list (shard_list_digest), which every worker must be given
WRITER = "writer"  # a joined run's marker: the worker (its token) that scored the shard; its score file says the same


def shard_names(urls: Sequence[str]) -> Dict[str, str]:
    """url -> output name: the shard's file name without its suffix; when two shards share one
    (a/00.tar, b/00.tar), each gets a short hash of its path too."""
    stems = {u: split_suffix(u)[0] for u in urls}
    counts: Dict[str, int] = {}
    for stem in stems.values():
        counts[stem] = counts.get(stem, 0) + 1
    names = {}
    for url, stem in stems.items():
        if counts[stem] > 1:
            import hashlib
            stem = f"{stem}-{hashlib.sha1(os.path.abspath(url).encode()).hexdigest()[:8]}"
        names[url] = stem
    return names


# -- confinement ---------------------------------------------------------------------------------------
def inside(folder: str, path: str) -> bool:
    """`path`, with every symlink resolved, lies in `folder` (itself resolved)."""
    return _within(os.path.realpath(folder), os.path.realpath(path))


def _within(root: str, resolved: str) -> bool:
    return resolved.startswith(root.rstrip(os.sep) + os.sep)


def confined(folder: str, path: str) -> str:
    """`path` if it stays in the run folder; else a ConfigError naming it."""
    return Confinement(folder)(path)


class Confinement:
    """`confined` for the many files of one folder (a run's 400 markers and score files): each
    directory is resolved once, and a file that is not a symlink lies where its directory does,
    so it costs one lstat instead of a realpath (a symlink is resolved whole, as by `inside`)."""

    def __init__(self, folder: str):
        self.folder = folder
        self._root: Optional[str] = None
        self._dirs: Dict[str, bool] = {}  # directory -> it lies in the folder (or is it)

    def _dir_inside(self, head: str) -> bool:
        ok = self._dirs.get(head)
        if ok is None:
            self._root = self._root or os.path.realpath(self.folder)
            resolved = os.path.realpath(head)
            ok = self._dirs[head] = resolved == self._root or _within(self._root, resolved)
        return ok

    def __call__(self, path: str) -> str:
        try:
            st = os.lstat(path)
        except OSError:  # nothing there (os.path.lexists): nothing to lead out
            return path
        head, base = os.path.split(path)
        if (not stat.S_ISLNK(st.st_mode) and base not in ("", ".", "..") and self._dir_inside(head)) \
                or inside(self.folder, path):
            _plain(path, st)
            return path
        raise ConfigError(f"{path} leads out of the run folder {self.folder} (a symlink to {os.path.realpath(path)}); "
                          f"a run folder's files stay inside it: replace the link with the file, or score again")


def _plain(path: str, st: os.stat_result) -> None:
    """A run folder's entries are files and folders: opening a named pipe (or a device) a handed-over
    folder planted would wait for ever, or read without end."""
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(path)
        except OSError:  # a dangling link: reading it fails with its own message
            return
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise ConfigError(f"{path} in the run folder is not a regular file (a named pipe, socket or device); "
                          f"a run folder holds only files and folders: remove it, or score again")


def read_json(folder: str, path: str, default: Any = None, confine: Optional[Confinement] = None) -> Any:
    """A JSON file of the run folder (confined); `default` when there is none; DamagedRunFolder
    when it is not JSON. confine: the folder's Confinement, for many files."""
    (confine or Confinement(folder))(path)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return default
    except (ValueError, UnicodeDecodeError) as e:
        raise damaged(path, f"not JSON: {e}") from None
    except OSError as e:
        raise ConfigError(f"{path} cannot be read: {e}") from None


def read_run_json(folder: str) -> dict:
    """run.json (the run's settings: scorers, stage options, thresholds); {} when there is none."""
    path = os.path.join(folder, RUN_JSON)
    data = read_json(folder, path, {})
    if not isinstance(data, dict) or not isinstance(data.get("stage") or {}, dict) \
            or not isinstance(data.get("scorers") or [], list) \
            or not all(isinstance(s, dict) for s in data.get("scorers") or []):
        raise damaged(path, "not the settings object `wdsfilter score` writes")
    return data


# -- the run's shard list (shards.json) ----------------------------------------------------------------
@dataclass(frozen=True)
class ListedShard:
    """One shard of the run as it recorded itself: its URL as given, its output name and, for a
    local shard, the absolute path it was read from (shards.json of older runs has none)."""
    url: str
    name: str
    path: Optional[str] = None


def write_shard_list(folder: str, urls: Sequence[str], names: Dict[str, str],
                     keep: Iterable[ListedShard] = ()) -> None:
    """shards.json: the shards of this run, then `keep` (shards of earlier runs with a marker)."""
    listed = [ListedShard(u, names[u], absolute_url(u) if is_local(u) else None) for u in urls]
    seen = {s.name for s in listed}
    listed += [s for s in keep if s.name not in seen]
    # the one file that keeps each URL as given, secrets and all (--resume, filter read shards again
    # through it): readable by its owner only; every other file names a shard as publish.published does
    write_json(os.path.join(folder, SHARDS_FILE), {"shards": [asdict(s) for s in listed]}, private=True)


def read_shard_list(folder: str) -> Optional[List[ListedShard]]:
    """shards.json; None when the folder has none (hand-made, or older than it)."""
    path = os.path.join(folder, SHARDS_FILE)
    data = read_json(folder, path)
    if data is None:
        return None
    entries = data.get("shards") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise damaged(path, "no list of shards")
    out = []
    for e in entries:
        if not (isinstance(e, dict) and isinstance(e.get("url"), str) and isinstance(e.get("name"), str)
                and isinstance(e.get("path"), (str, type(None)))):
            raise damaged(path, f"an entry is not {{url, name, path}}: {str(e)[:80]}")
        out.append(ListedShard(e["url"], e["name"], e.get("path")))
    return out


def unhidden_shards(recipe: str, shards: Sequence[str]) -> List[str]:
    """A run recipe's shards (OUT/run.yaml) as the run was given them: a URL named there without
    its password or signature (publish.py) is the one in the shards.json beside the recipe, the one
    file that keeps it. A hidden URL no shards.json names is a ConfigError."""
    listed = {published(s.url): s.url for s in read_shard_list(os.path.dirname(os.path.abspath(recipe))) or ()}
    missing = [u for u in shards if "<hidden>" in str(u) and u not in listed]
    if missing:
        raise ConfigError(f"--config {recipe}: {missing[0]} is named with its secret hidden, and no shards.json "
                          f"beside it holds the URL; give the shards on the command line")
    return [listed.get(u, u) for u in shards]


# -- the source shard ---------------------------------------------------------------------------------
def source_state(url: str) -> Optional[dict]:
    """What a marker records of a local source shard: where it was read (its absolute path, so
    `wdsfilter filter` finds a shard named by a relative path from any folder), its size and
    modification time (None for a pipe: or remote shard: not checked)."""
    if not is_local(url):
        return None
    path = absolute_url(url)
    try:
        st = os.stat(path)
    except OSError:
        return {"path": path}
    return {"path": path, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def source_changed(url: str, recorded: Optional[dict]) -> bool:
    """The local shard `url` is not the one a marker recorded (`recorded`: its source_state then):
    its size or its modification time differ; a time in whole seconds on either side (a shared
    filesystem that shows seconds only on another machine: a Ray worker recorded it) is compared
    to the second. False when nothing was recorded (a pipe: or remote shard, an older marker). The
    one test of "this shard changed since it was scored", for --resume, `wdsfilter filter` and the
    loader's score filter."""
    if not recorded or "bytes" not in recorded:
        return False
    now = source_state(url) or {}
    if now.get("bytes") != recorded["bytes"]:  # a different size, or gone
        return True
    a, b = now["mtime_ns"], int(recorded.get("mtime_ns", 0))
    second = 1_000_000_000
    if a % second == 0 or b % second == 0:
        return a // second != b // second
    return a != b


def trusted_source(marker: "Marker", listed: Optional[Dict[str, ListedShard]],
                   source_root: Optional[str] = None) -> Optional[str]:
    """Where the marker's source shard may be read (see the module docstring), None where the
    run's own record does not name it."""
    if source_root:
        base = marker.url.rstrip("/").rsplit("/", 1)[-1]
        return os.path.join(source_root, base) if base and not base.startswith(".") else None
    entry = (listed or {}).get(marker.name)
    if entry is None or published(entry.url) != published(marker.url):  # markers name it published
        return None
    recorded = (marker.source or {}).get("path")
    named = entry.path or (None if is_local(entry.url) else entry.url)
    if named is not None:
        return named if recorded in (None, named) else None
    if recorded is None:  # an older run's relative URL: as given
        return entry.url
    relative = os.path.normpath(local_path(entry.url))
    return recorded if recorded == entry.url or recorded.endswith(os.sep + relative) else None


# -- the completion marker (done/<name>.json) ----------------------------------------------------------
@dataclass
class Marker:
    """A shard's completion marker, written last, after its outputs are in place."""
    url: str  # the shard as the run was given it
    name: str  # its output name: done/<name>.json, scores/<name>.<ext>
    score_file: str  # recorded as scores/<name>.<ext> (older runs: the path as the run wrote it)
    rows: int = 0
    status: Dict[str, int] = field(default_factory=dict)  # rows per status
    kept: int = 0
    members: int = 0
    error: Optional[str] = None  # the tar broke here: the shard was scored up to it
    filtered: Optional[dict] = None  # the filtered shard's counts (score --write-shards)
    filtered_shard: Optional[str] = None
    embeddings: List[str] = field(default_factory=list)  # relative to the run folder
    failures: Optional[str] = None  # the shard's failure ledger file, relative to the run folder
    source: Optional[dict] = None  # source_state of a local shard where it was read
    sizes: Dict[str, int] = field(default_factory=dict)  # output file (relative to the folder) -> bytes
    engine: Optional[str] = None
    run_id: Optional[str] = None  # run.json's run_id when it was written (vouches)
    extra: Dict[str, Any] = field(default_factory=dict)  # fields of later versions, kept as they are

    _TYPES = {"url": str, "name": str, "score_file": str, "rows": int, "status": dict, "kept": int,
              "members": int, "error": (str, type(None)), "filtered": (dict, type(None)),
              "filtered_shard": (str, type(None)), "embeddings": list, "failures": (str, type(None)), "source": (dict, type(None)),
              "sizes": dict, "engine": (str, type(None)), "run_id": (str, type(None))}

    @classmethod
    def from_json(cls, data: Any) -> "Marker":
        """ValueError naming the first field that is not what `wdsfilter score` writes."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        known = _MARKER_FIELDS
        values = {k: v for k, v in data.items() if k in known and v is not None or k in ("error", "source")}
        for key in ("url", "name", "score_file"):
            if key not in values:
                raise ValueError(f"no {key!r}")
        for key, value in values.items():
            types = cls._TYPES[key]
            if not isinstance(value, types) or (types is int and isinstance(value, bool)):
                raise ValueError(f"{key!r} is {type(value).__name__}")
        if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                   for k, v in values.get("sizes", {}).items()):
            raise ValueError("'sizes' is not {file: bytes}")
        if not all(isinstance(p, str) and not os.path.isabs(p) and ".." not in p.split("/")
                   for p in [*values.get("embeddings", []), *([values["failures"]] if values.get("failures") else [])]):
            raise ValueError("'embeddings' or 'failures' names a path outside the run folder")
        source = values.get("source") or {}
        if not (isinstance(source.get("path", ""), str)
                and all(isinstance(source.get(k, 0), int) for k in ("bytes", "mtime_ns"))):
            raise ValueError("'source' is not {path, bytes, mtime_ns}")
        return cls(**values, extra={k: v for k, v in data.items() if k not in known})

    def to_json(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**data, **self.extra}


_MARKER_FIELDS = frozenset(f.name for f in fields(Marker)) - {"extra"}


def marker_path(folder: str, name: str) -> str:
    return os.path.join(folder, DONE, name + ".json")


def marker_names(folder: str) -> List[str]:
    """The names of the shards with a marker in done/, sorted (temporaries left out)."""
    done = os.path.join(folder, DONE)
    if not os.path.isdir(done):
        return []
    return sorted(f[:-5] for f in os.listdir(done) if f.endswith(".json") and not f.startswith("."))


def read_marker(folder: str, name: str, confine: Optional[Confinement] = None) -> Marker:
    """done/<name>.json; DamagedRunFolder when it is not a marker of that name (FileNotFoundError
    when there is none; a ConfigError when it is a symlink out of the folder)."""
    path = marker_path(folder, name)
    data = read_json(folder, path, FileNotFoundError, confine)
    if data is FileNotFoundError:
        raise FileNotFoundError(path)
    try:
        marker = Marker.from_json(data)
    except ValueError as e:
        raise damaged(path, str(e)) from None
    if marker.name != name:
        raise damaged(path, f"it names shard {marker.name!r}")
    return marker


def vouches(marker: Marker, run_id: Optional[str]) -> bool:
    """The marker was written for the run the folder holds (run.json's run_id; both None in a
    folder written before run ids): a marker a stalled run wrote after another run took the
    folder over (--overwrite) names another and vouches for nothing. The one test, for --resume,
    `wdsfilter filter`, the loader's score filter and the report."""
    return marker.run_id == run_id


def written_by(marker: Marker, score_file: str) -> bool:
    """A joined run's score file is the one its marker's worker wrote (the Parquet file's writer,
    tables.WRITER_META, is the marker's WRITER): a worker stalled past its claim in the moment
    between its fence and its rename replaced it otherwise, and the marker vouches for it no more.
    True where the marker names no writer (one process's run), the file's format has no footer (JSONL)
    or the file is not here."""
    writer = marker.extra.get(WRITER)
    if not writer or not os.path.exists(score_file):
        return True
    try:
        footer = format_for(score_file).footer(score_file)
    except (OSError, ValueError, DamagedRunFolder):  # a damaged file: not the marker's
        return False
    return footer.rows is None or footer.metadata.get(WRITER_META) == writer


def write_marker(folder: str, marker: Marker) -> None:
    write_json(marker_path(folder, marker.name), marker.to_json(), fsync=True)


def create_marker(folder: str, marker: Marker) -> bool:
    """The marker written only where there is none (a joined run's worker: a worker stalled past
    its claim, in the moment between its fence and its write, cannot replace the marker of the
    worker that took the shard over). False when one is there; the folder's guard runs first."""
    path = marker_path(folder, marker.name)
    tmp = temporary_path(path)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(marker.to_json(), f, indent=1, default=str)
            f.flush()
            os.fsync(f.fileno())
        check_guards(path)
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def shard_list_digest(urls: Sequence[str]) -> Dict[str, Any]:
    """A run's shard list as a joined run's run.json records it: how many, and a digest of the
    set (local shards by absolute path), which every worker's list must match."""
    import hashlib
    listed = sorted({absolute_url(u) if is_local(u) else u for u in urls})
    return {"shards": len(listed), "digest": hashlib.sha1("\n".join(listed).encode()).hexdigest()}


def score_file(folder: str, marker: Marker, confine: Optional[Confinement] = None) -> str:
    """The marker's score file, FOLDER/scores/<name>.<ext> (see the module docstring)."""
    head, base = os.path.split(os.path.normpath(marker.score_file.replace("\\", "/")))
    if os.path.basename(head) != SCORES or base not in {marker.name + f.suffix for f in FORMATS.values()}:
        raise ConfigError(f"{marker_path(folder, marker.name)} names the score file {marker.score_file!r}, which is "
                          f"not the run's scores/{marker.name}{' or '.join(f.suffix for f in FORMATS.values())}; a run "
                          f"folder's files stay inside it: restore the marker or score the shard again")
    return (confine or Confinement(folder))(os.path.join(folder, SCORES, base))


def output_sizes(out: str, paths: Iterable[str]) -> Dict[str, int]:
    """What a marker records of its shard's output files: size by path relative to `out`."""
    return {os.path.relpath(p, out): os.path.getsize(p) for p in paths}


def outputs_intact(marker: Marker, out: str, paths: Iterable[str],
                   size_of: Callable[[str], int] = os.path.getsize) -> bool:
    """Every path exists, with the size the marker recorded for it (markers written before sizes
    were recorded have none: existence is all they vouch for). The one test of a marker's files,
    for --resume, `wdsfilter filter` and the loader's score filter. size_of: a file's size (a
    bucket's run folder: the object's, for files left in the bucket)."""
    for p in paths:
        try:
            size = size_of(p)
        except OSError:
            return False
        if marker.sizes.get(os.path.relpath(p, out), size) != size:
            return False
    return True
