"""ARCHITECTURE.md stays a true map: at most 300 lines; every path, `module.name`, class, function
and flag it names exists; every module of the package is on it; and the "one X" rules it marks
(checked) hold on the source, read with ast (issue 37 step 10)."""
import ast
import fnmatch
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "wdsfilter")
DOC = os.path.join(ROOT, "ARCHITECTURE.md")
MAX_LINES = 300
REPO_FOLDERS = ("tests/", "tools/", "docs/", "sample_shards/")
# a token ending in one of these is a file named in prose (`summary.json`), not a module attribute
FILE_SUFFIXES = {"json", "yaml", "parquet", "jsonl", "html", "png", "md", "py", "tar", "gz", "npy", "sh"}
# the first part of a `name.attribute` that is another package's (`tarfile.open`, `wds.DataPipeline`)
EXTERNAL = {"tarfile", "av", "Image", "wds", "torch", "os"}


def doc_text() -> str:
    with open(DOC, encoding="utf-8") as f:
        return f.read()


def tokens(text: str) -> list:
    """What the page writes as code: the text between backticks (a span may wrap a line)."""
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", text)]


def sources() -> dict:
    """Package path ('core/errors.py') -> its parsed source."""
    found = {}
    for path in sorted(glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            found[os.path.relpath(path, PACKAGE).replace(os.sep, "/")] = ast.parse(f.read())
    return found


SOURCES = sources()
NODES = [(path, node) for path, tree in SOURCES.items() for node in ast.walk(tree)]  # walked once
FLOOR_FOLDERS = {path.split("/")[0] for path in SOURCES if "/" in path}
TOP_MODULES = {path for path in SOURCES if "/" not in path}


def _expand(pattern: str) -> list:
    """`a/{b,c}.py` -> [`a/b.py`, `a/c.py`]; other patterns as they are."""
    match = re.search(r"\{([^}]*)\}", pattern)
    if not match:
        return [pattern]
    return [p for part in match.group(1).split(",") for p in _expand(pattern[:match.start()] + part + pattern[match.end():])]


def package_path(token: str):
    """The package-relative pattern a token names (`wdsfilter/core/errors.py`, `core/errors.py`,
    `validate/checks/`, `storage/remote_*.py`), or None for a token that is no package path."""
    token = token[len("wdsfilter/"):] if token.startswith("wdsfilter/") else token
    if " " in token or not (token.endswith(".py") or token.endswith("/")):
        return None
    if token.split("/")[0] in FLOOR_FOLDERS or token in TOP_MODULES:
        return token
    return None


def covered(pattern: str) -> set:
    """The package modules a path pattern names; a folder names every module below it."""
    names = set()
    for one in _expand(pattern):
        names |= {p for p in SOURCES if (p.startswith(one) if one.endswith("/") else fnmatch.fnmatch(p, one))}
    return names


def test_the_map_is_at_most_300_lines():
    lines = doc_text().count("\n")
    assert lines <= MAX_LINES, f"ARCHITECTURE.md is {lines} lines; a map a newcomer reads in ten minutes is at most {MAX_LINES}"


def test_every_path_it_names_exists():
    missing = []
    for token in tokens(doc_text()):
        if token.startswith(REPO_FOLDERS):
            if not any(glob.glob(os.path.join(ROOT, p)) for p in _expand(token)):
                missing.append(token)
        elif package_path(token) is not None:
            if not covered(package_path(token)):
                missing.append(token)
        elif re.fullmatch(r"[\w*]+\.py", token):  # `devices.py` of which floor? the path says
            missing.append(f"{token} (give its path below wdsfilter/)")
    assert not missing, "paths in ARCHITECTURE.md that do not exist:\n" + "\n".join(missing)


def test_every_module_of_the_package_is_on_the_map():
    on_map = set()
    for token in tokens(doc_text()):
        pattern = package_path(token)
        if pattern is not None and pattern.count("/") >= (2 if pattern.endswith("/") else 0):
            on_map |= covered(pattern)  # a file, a pattern, or a group below a floor (`validate/checks/`); not `score/`
    missing = sorted(set(SOURCES) - on_map)
    assert not missing, "modules missing from ARCHITECTURE.md's map (add a line or a group):\n" + "\n".join(missing)


# -- names ----------------------------------------------------------------------------------------
def module_members(tree: ast.Module) -> set:
    """The names a module defines or imports at its top level."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def class_members(node: ast.ClassDef) -> set:
    names = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    return names


CLASSES: dict = {}  # class name -> its definitions
DEFINED: set = set()  # every name defined anywhere: functions, classes, their members, top-level names
STRINGS: set = set()  # every string constant (marker names, column names, option names)
for _tree in SOURCES.values():
    DEFINED |= module_members(_tree)
for _, _node in NODES:
    if isinstance(_node, ast.ClassDef):
        CLASSES.setdefault(_node.name, []).append(_node)
        DEFINED |= class_members(_node)
    elif isinstance(_node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        DEFINED.add(_node.name)
    elif isinstance(_node, ast.Constant) and isinstance(_node.value, str):
        STRINGS.add(_node.value)


def modules_named(dotted: str) -> list:
    """The package modules whose dotted path ends with `dotted` (`rows`, `scorers.base`, `validate`)."""
    found = []
    for path in SOURCES:
        parts = path[:-3].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and parts[-len(dotted.split(".")):] == dotted.split("."):
            found.append(path)
    return found


def _has(scope_members: set, classes: list, rest: list) -> bool:
    """Whether rest[0] is among the members, and each later part a member of the class before it."""
    if not rest:
        return True
    if rest[0] not in scope_members:
        return False
    inner = [c for c in classes if c.name == rest[0]]
    return len(rest) == 1 or any(_has(class_members(c), [n for n in c.body if isinstance(n, ast.ClassDef)], rest[1:])
                                 for c in inner) or not inner  # a module-level name's attribute: not followed


def public_names() -> set:
    """The package's `__all__` (its lazy names, `loader`, included)."""
    for node in SOURCES["__init__.py"].body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def dotted_name_exists(token: str) -> bool:
    """`rows.write_shard`, `scorers.base.Scorer`, `transport.Batch.open`, `Selection.parse`,
    `wdsfilter.stages`, `wdsfilter.loader`: a module and what it defines, or a class and its member."""
    parts = token.split(".")
    if parts[0] == "wdsfilter":
        parts = parts[1:]
        module = "/".join(parts)
        if f"{module}.py" in SOURCES or f"{module}/__init__.py" in SOURCES or parts == [p for p in parts[:1] if p in public_names()]:
            return True
        return len(parts) > 1 and dotted_name_exists(".".join(parts))
    for cut in range(len(parts) - 1, 0, -1):  # the longest prefix that names a module
        paths = modules_named(".".join(parts[:cut]))
        if paths:
            return any(_has(module_members(SOURCES[p]), [n for n in SOURCES[p].body if isinstance(n, ast.ClassDef)],
                            parts[cut:]) for p in paths)
    if parts[0] in CLASSES:
        return any(_has(class_members(c), [n for n in c.body if isinstance(n, ast.ClassDef)], parts[1:])
                   for c in CLASSES[parts[0]])
    return False


def code_names(text: str) -> tuple:
    """(dotted names, bare names, flags) among the page's code tokens."""
    dotted, bare, flags = [], [], []
    for token in tokens(text):
        token = token[:-2] if token.endswith("()") else token
        if re.fullmatch(r"--[a-z][a-z0-9-]*", token):
            flags.append(token)
        elif (re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", token) and token.rsplit(".", 1)[1] not in FILE_SUFFIXES
              and token.split(".")[0] not in EXTERNAL):
            dotted.append(token)
        elif re.fullmatch(r"[A-Za-z_]\w*", token) and (not token.islower() or "_" in token.strip("_")):
            bare.append(token)  # snake_case and CamelCase names; plain words are prose
    return dotted, bare, flags


def test_every_module_name_it_gives_exists():
    dotted, _, _ = code_names(doc_text())
    missing = [t for t in dotted if not dotted_name_exists(t)]
    assert not missing, "module.name in ARCHITECTURE.md that do not exist:\n" + "\n".join(missing)


def test_every_class_and_function_it_names_exists():
    _, bare, _ = code_names(doc_text())
    missing = [t for t in bare if t not in DEFINED and t not in STRINGS and not modules_named(t)]
    assert not missing, "names in ARCHITECTURE.md defined nowhere in the package:\n" + "\n".join(missing)


def test_every_flag_it_names_is_an_option_of_a_command():
    _, _, flags = code_names(doc_text())
    options = {part for s in STRINGS if s.startswith("--") for part in s.split("/")}
    missing = [f for f in flags if f not in options]
    assert not missing, "flags in ARCHITECTURE.md that no command takes:\n" + "\n".join(missing)


def test_a_name_that_is_gone_is_found():
    assert dotted_name_exists("rows.write_shard") and dotted_name_exists("scorers.base.Scorer")
    assert dotted_name_exists("Selection.parse") and dotted_name_exists("wdsfilter.stages")
    assert not dotted_name_exists("rows.write_shards") and not dotted_name_exists("Selection.parsed")
    assert package_path("core/errors.py") == "core/errors.py" and package_path("OUT/run.json") is None
    assert "storage/remote_read.py" in covered("storage/remote_*.py") and "storage/remote.py" not in covered("storage/remote_*.py")
    assert covered("report/{html,charts}.py") == {"report/html.py", "report/charts.py"}


# -- the "one X" rules the page marks (checked) ----------------------------------------------------
def calls(attribute: str, owner: str):
    """(path, call node) for each call of `owner.attribute(...)` in the package."""
    for path, node in NODES:
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attribute
                and isinstance(node.func.value, ast.Name) and node.func.value.id == owner):
            yield path, node


def defining(name: str, kind=(ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) -> list:
    return sorted(path for path, node in NODES if isinstance(node, kind) and node.name == name)


@pytest.mark.parametrize("name, home", [
    ("Selection", "core/selection.py"),  # one selection type, flag to row
    ("keep_reason", "runfolder/keep.py"),  # one keep rule
    ("Lease", "runfolder/lease.py"),  # one lease
    ("ShardTarInfo", "storage/tars.py"),  # one tar header rule
    ("Bound", "core/thresholds.py"),  # one threshold test
])
def test_one_definition(name, home):
    assert defining(name) == [home]


def test_run_folder_files_are_spelt_only_where_they_are_named():
    """A string that is a run-folder file's name (or an f-string's piece of one) only in
    runfolder/names.py, and sizes.json and _stats.json only in storage/shardstats.py; in messages
    the names stay words."""
    from wdsfilter.runfolder import names
    from wdsfilter.storage import shardstats
    files = {getattr(names, n) for n in names.__all__ if isinstance(getattr(names, n), str)}
    files = {f for f in files if "." in f and f != names.GUARD}  # the plain words (scores, done) are words too
    homes = {"runfolder/names.py": files - {shardstats.SIZES, shardstats.STATS_SUFFIX},
             "storage/shardstats.py": {shardstats.SIZES, shardstats.STATS_SUFFIX}}
    found = [f"wdsfilter/{path}:{node.lineno} {node.value!r}" for path, node in NODES
             if isinstance(node, ast.Constant) and node.value in files and node.value not in homes.get(path, ())]
    assert found == [], "run-folder file names spelt outside runfolder/names.py (import the name):\n" + "\n".join(found)


def test_every_tarfile_open_parses_headers_with_shard_tar_info():
    found = [f"wdsfilter/{path}:{node.lineno}" for path, node in calls("open", "tarfile")
             if not any(k.arg == "tarinfo" and isinstance(k.value, ast.Name) and k.value.id == "ShardTarInfo"
                        for k in node.keywords)]
    found += [f"wdsfilter/{path}:{node.lineno} tarfile.TarFile()" for path, node in calls("TarFile", "tarfile")]
    assert found == [], "tars opened without storage/tars.ShardTarInfo (tarinfo=ShardTarInfo):\n" + "\n".join(found)


def test_one_opener_of_a_clip():
    assert sorted({path for path, _ in calls("open", "av")}) == ["media/videos.py"]


# Image.open outside media/images.py: path -> why it is not an image member
IMAGE_OPENS = {"score/scorers/nsfw.py": "open_nsfw's preprocessing: a JPEG round trip of its own resized image"}
# files renamed into place outside storage/atomic.py: path -> why
RENAMES = {
    "runfolder/lease.py": "the lease record, replaced under its POSIX guard (atomic.py's guard checks the lease)",
    "core/tally.py": "the worker tallies in a private working folder (core is below storage)",
    "runfolder/remote_out.py": "objects pulled from a bucket into the local staging copy",
    "score/ocr_backends/easyocr_backend.py": "a downloaded model file moved in from its private download folder",
}


@pytest.mark.parametrize("attribute, owner, home, listed", [
    ("open", "Image", "media/images.py", IMAGE_OPENS),
    ("replace", "os", "storage/atomic.py", RENAMES),
    ("rename", "os", "storage/atomic.py", RENAMES),
])
def test_one_place_and_its_listed_exceptions(attribute, owner, home, listed):
    used = {path for path, _ in calls(attribute, owner)}
    assert used - {home} - set(listed) == set(), f"{owner}.{attribute} outside {home}: use it, or list why"
    if attribute != "rename":
        assert set(listed) - used == set(), "listed exceptions no longer needed: remove them"


# -- the tests' own shape --------------------------------------------------------------------------
TESTS = os.path.join(ROOT, "tests")
REVIEW_WORDS = ("review", "round", "issue", "finding", "hour", "redteam", "red_team", "audit", "session", "fixes")


def test_test_files_are_named_after_behaviour_not_the_review_they_came_from():
    named = [n for n in sorted(os.listdir(TESTS)) if n.startswith("test_") and any(w in n for w in REVIEW_WORDS)]
    assert named == [], "name a test file after what it checks (git mv, and fix the docs that name it)"


def test_kits_hold_no_tests_and_test_files_import_only_kits():
    found = []
    for name in sorted(os.listdir(TESTS)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(TESTS, name), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        if not name.startswith("test_"):
            found += [f"{name}: test {n.name}" for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
        for node in ast.walk(tree):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{name}:{node.lineno} imports {m}" for m in modules if m.split(".")[-1].startswith("test_")]
    assert found == [], "tests belong in test_*.py, helpers in tests/*kit.py"
