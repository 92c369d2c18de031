"""The package's shape, checked on every import statement, the lazy ones inside functions included:
its floors (ARCHITECTURE.md, "Floors"), each a folder of wdsfilter/, from the bottom up

    core < storage < media < stream < runfolder < report < validate < score < filtering (and dedup) < front doors

where a module imports only from its own floor or a lower one, and no module imports another that
imports it back, directly or round a loop. The front doors are the modules left in wdsfilter/
itself: the package's `__init__.py`, `cli.py` (every command), `__main__.py`, `dataloader.py`
(`wdsfilter.loader()`) with the loader's score filter (`scorefilter.py`), `sortshard.py` (a command),
and the documented import paths kept as aliases of a floor's module (`stages.py`, `errors.py`,
`hashes.py`). Also here: what filtering and dedup may take from score/, and the function budgets
(lines and complexity). Modules are split by concept, not by size: there is no line limit.
"""
import ast
import os
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "wdsfilter")
FLOORS = ("core", "storage", "media", "stream", "runfolder", "report", "validate", "score", "filtering", "front door")
# the folder of wdsfilter/ that is each floor; dedup is a command over finished runs, beside filtering
FOLDERS = {**{f: f for f in FLOORS[:-1]}, "dedup": "filtering"}
FRONT_DOORS = {"wdsfilter", "wdsfilter.__main__", "wdsfilter.cli", "wdsfilter.dataloader", "wdsfilter.scorefilter",
               "wdsfilter.sortshard"}
ALIASES = {"wdsfilter.stages", "wdsfilter.errors", "wdsfilter.hashes"}  # documented paths: a floor's module by another name
PENDING: dict = {}  # modules still flat in wdsfilter/, each on the floor it is moving to: none today

# (importer, imported) -> why it is still there. Each entry is checked to be still needed, so a fix
# that removes the import must remove the entry too.
ALLOWED: dict = {}  # none today


def module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


class NoFloor(ValueError):
    """A module in no floor's folder (nor a front door)."""


def floor(module: str) -> int:
    if module in FRONT_DOORS or module in ALIASES:
        return FLOORS.index("front door")
    if module in PENDING:
        return FLOORS.index(PENDING[module][0])
    parts = module.split(".")
    if len(parts) > 2 and parts[1] in FOLDERS:
        return FLOORS.index(FOLDERS[parts[1]])
    if len(parts) == 2 and parts[1] in FOLDERS:  # the floor's package itself
        return FLOORS.index(FOLDERS[parts[1]])
    raise NoFloor(f"{module} lies in no floor: put it in the folder of the floor whose modules it uses "
                  f"(ARCHITECTURE.md, Floors)")


def _exists(module: str) -> bool:
    path = os.path.join(ROOT, *module.split("."))
    return os.path.exists(path + ".py") or os.path.exists(os.path.join(path, "__init__.py"))


def _deepest(module: str) -> str:
    """The module an import loads last: `wdsfilter.score.config.parse_size` -> `wdsfilter.score.config`."""
    while module and not _exists(module):
        module = module.rpartition(".")[0]
    return module


def _type_checking_only(tree: ast.AST) -> set:
    """The import nodes under `if TYPE_CHECKING:` (a type for annotations, never imported at run time)."""
    return {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
            and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
            for stmt in node.body for inner in ast.walk(stmt)}


def imports(module: str, source: str, is_package: bool = False):
    """(line, imported module) for every import of a wdsfilter module in the source, at any depth
    (inside functions too), but for the types imported under `if TYPE_CHECKING:`."""
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    typing_only = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            # `from wdsfilter.score import engine` loads the module engine; `import X from module` the module
            names = [f"{base}.{a.name}" if _exists(f"{base}.{a.name}") else base for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "wdsfilter" and _deepest(name):
                yield node.lineno, _deepest(name)


def upward_imports(module: str, source: str, path: str, is_package: bool = False):
    """'path:line importer (floor) -> imported (floor)' for each import of a higher floor."""
    for line, target in imports(module, source, is_package):
        # the package itself (`from .. import __version__`) is imported before any of its modules
        if target != "wdsfilter" and floor(target) > floor(module):
            yield (module, target), (f"{path}:{line} {module} ({FLOORS[floor(module)]}) imports {target} "
                                     f"({FLOORS[floor(target)]})")


def package_sources():
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    yield path, f.read()


def test_every_module_lies_in_a_floor():
    outside = []
    for path, _ in package_sources():
        try:
            floor(module_name(path))
        except NoFloor as e:
            outside.append(str(e))
    assert outside == []
    assert [m for m in PENDING if not _exists(m)] == [], "moved: remove its PENDING entry"


def import_graph() -> dict:
    """module -> the wdsfilter modules it imports (any depth, lazy ones too)."""
    graph = {}
    for path, source in package_sources():
        module = module_name(path)
        graph[module] = {t for _, t in imports(module, source, path.endswith("__init__.py")) if t != module}
    return graph


def circles(graph: dict) -> list:
    """The groups of modules that import one another round a loop (strongly connected, more than one)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):  # Tarjan's algorithm; the graph is a few hundred modules deep at most
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for child in graph.get(node, ()):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in on_stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_round_a_loop():
    assert circles(import_graph()) == [], "modules that import one another: move what both need into its own module"


def test_a_loop_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_a_higher_floor():
    found, used = [], set()
    for path, source in package_sources():
        module = module_name(path)
        for pair, text in upward_imports(module, source, os.path.relpath(path, ROOT), path.endswith("__init__.py")):
            if pair in ALLOWED:
                used.add(pair)
            else:
                found.append(text)
    assert found == [], "imports of a higher layer (move what is needed down):\n" + "\n".join(found)
    assert set(ALLOWED) - used == set(), "allow-list entries no longer needed: remove them"


def private_imports(module: str, source: str, is_package: bool = False):
    """(line, 'module.name') for each `_name` imported from another wdsfilter module: a private name
    is its module's own; what two modules share is public (or moves into a module of its own)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("wdsfilter")):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    yield node.lineno, f"{base}.{alias.name}"


def test_no_module_imports_another_modules_private_names():
    found = [f"{os.path.relpath(path, ROOT)}:{line} imports {name}" for path, source in package_sources()
             for line, name in private_imports(module_name(path), source, path.endswith("__init__.py"))]
    assert found == [], "private names imported across modules (make them public, or move them):\n" + "\n".join(found)


def test_a_private_import_is_found():
    source = "from .base import Scorer\n\n\ndef f():\n    from ..core.tally import _merge, Tally\n"
    assert list(private_imports("wdsfilter.score.engine", source)) == [(5, "wdsfilter.core.tally._merge")]


# Imports inside functions (issue 37 step 8): a file's head says what it depends on. An import of a
# wdsfilter module stays inside a function only where the head would cost every user of the file:
# - the module imported loads a heavy package at its head (HEAVY: torch and webdataset, which
#   imports it, open_clip, Ray, pyarrow, EasyOCR, PyAV, ONNX Runtime), directly or through the heads
#   of the wdsfilter modules it imports (`heavy_modules`);
# - the importer is a command's front, which loads the command's code when the command runs: a
#   click layer (a `cli.py`, `sortshard.py`) or a package's `__init__.py` (its Python entry points:
#   wdsfilter.score.score(), wdsfilter.validate(), run_report, filter_scores, dedup).
# Anything else is listed in LAZY_ALLOWED with the reason, checked to be still needed.
HEAVY = {"torch", "torchvision", "webdataset", "open_clip", "ray", "pyarrow", "easyocr", "av", "onnxruntime", "cv2"}
LAZY_ALLOWED: dict = {  # (importer, imported) -> why
    ("wdsfilter.filtering.apply", "wdsfilter.filtering.write"):
        "a count (`filter --dry-run`) does not import the write side (the report with PIL, the resharder): a "
        "tenth of a dry run over 4 M rows, tools/bench_filter.py",
    ("wdsfilter.runfolder.reader", "wdsfilter.runfolder.remote_out"):
        "a local score folder does not import a bucket's client side (its lease, conditional writes, scratch "
        "folders: ~10 ms of a 0.3 s `filter --dry-run` over 4 M rows, tools/bench_filter.py)",
}


def function_import_lines(tree: ast.AST) -> set:
    """The lines of the import statements inside a function body (methods and nested ones too)."""
    lines = set()

    def visit(node, inside: bool):  # one pass: a nested function's body is walked once
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, (ast.Import, ast.ImportFrom)):
                lines.add(child.lineno)
            visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
    visit(tree, False)
    return lines


def _head_imports(module: str, source: str, is_package: bool):
    """(the wdsfilter modules, the other top-level packages) the module imports outside functions."""
    tree = ast.parse(source)
    inside, typing_only = function_import_lines(tree), _type_checking_only(tree)
    own = {t for line, t in imports(module, source, is_package) if line not in inside}
    others = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in typing_only or node.lineno in inside:
            continue
        if isinstance(node, ast.Import):
            others |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            others.add(node.module.split(".")[0])
    return own, others


def heavy_modules(sources) -> dict:
    """wdsfilter module -> the heavy packages importing it loads (its head, the heads of the wdsfilter
    modules it imports there, and its packages' __init__), for the modules that load any."""
    heads = {}
    for path, source in sources:
        module = module_name(path)
        heads[module] = _head_imports(module, source, path.endswith("__init__.py"))
    heavy = {m: others & HEAVY for m, (_, others) in heads.items()}
    changed = True
    while changed:  # until nothing more is learnt: what a module loads is what its imports load
        changed = False
        for module, (own, _) in heads.items():
            parents = {module.rsplit(".", i)[0] for i in range(1, module.count(".") + 1)}
            more = set().union(*(heavy.get(m, set()) for m in own | parents)) - heavy[module]
            if more:
                heavy[module] |= more
                changed = True
    return {m: h for m, h in heavy.items() if h}


def command_front(module: str) -> bool:
    return module.endswith(".cli") or module == "wdsfilter.sortshard" or module in PACKAGES


PACKAGES = {module_name(os.path.join(folder, "__init__.py")) for folder, _, files in os.walk(PACKAGE)
            if "__init__.py" in files}


def lazy_imports(sources, heavy: dict):
    """('path:line importer -> imported', (importer, imported)) for each import of a light wdsfilter
    module inside a function of a module that is not a command's front."""
    for path, source in sources:
        module = module_name(path)
        inside = function_import_lines(ast.parse(source))
        for line, target in imports(module, source, path.endswith("__init__.py")):
            if line in inside and target not in heavy and target != module and not command_front(module):
                yield f"{os.path.relpath(path, ROOT)}:{line} {module} -> {target}", (module, target)


def test_imports_sit_inside_functions_only_for_heavy_modules_and_commands():
    sources = list(package_sources())
    found, used = [], set()
    for text, pair in lazy_imports(sources, heavy_modules(sources)):
        if pair in LAZY_ALLOWED:
            used.add(pair)
        else:
            found.append(text)
    assert found == [], ("imports inside functions of modules that load nothing heavy (move them to the file's "
                         "head):\n" + "\n".join(found))
    assert set(LAZY_ALLOWED) - used == set(), "LAZY_ALLOWED entries no longer needed: remove them"


def test_a_heavy_module_is_known_by_its_head_and_a_light_one_is_not():
    sources = [(os.path.join(PACKAGE, "stream", "pipeline.py"), "import webdataset as wds\n"),
               (os.path.join(PACKAGE, "score", "engine.py"), "from ..stream.pipeline import sample_pipeline\n\n\n"
                                                              "def f():\n    import torch\n"),
               (os.path.join(PACKAGE, "core", "tally.py"), "def f():\n    import torch\n")]
    heavy = heavy_modules(sources)
    assert heavy == {"wdsfilter.stream.pipeline": {"webdataset"}, "wdsfilter.score.engine": {"webdataset"}}
    lazy = "def f():\n    from ..core.tally import Tally\n    from ..stream.pipeline import sample_pipeline\n"
    found = list(lazy_imports([(os.path.join(PACKAGE, "score", "join.py"), lazy)], heavy))
    assert [pair for _, pair in found] == [("wdsfilter.score.join", "wdsfilter.core.tally")]
    assert list(lazy_imports([(os.path.join(PACKAGE, "score", "cli.py"), lazy)], heavy)) == []


# Filtering and dedup (the commands over finished runs) import nothing from score/ but the CLIP
# scorer dedup embeds eval images with: the run folder, the lease, the tar copier and the embeddings
# layout live below score/ (runfolder/, tars.py, shardcopy.py). Each entry is checked to be still used.
BORROWED_FROM_SCORE = {
    "wdsfilter.score.scorers.clip": "the CLIP model dedup embeds eval images with",
}


def test_filtering_and_dedup_borrow_from_score_only_what_is_listed():
    found, used = [], set()
    for path, source in package_sources():
        module = module_name(path)
        if floor(module) != FLOORS.index("filtering"):
            continue
        for line, target in imports(module, source, path.endswith("__init__.py")):
            if target == "wdsfilter.score" or target.startswith("wdsfilter.score."):
                if target in BORROWED_FROM_SCORE:
                    used.add(target)
                else:
                    found.append(f"{os.path.relpath(path, ROOT)}:{line} {module} imports {target}")
    assert found == [], "filtering or dedup import from score/ (move what they need below it):\n" + "\n".join(found)
    assert set(BORROWED_FROM_SCORE) - used == set(), "entries no longer borrowed: remove them"


@pytest.mark.parametrize("source, line", [
    ("import os\n\n\ndef f():\n    from ..score import engine\n    return engine\n", 5),  # lazy, relative
    ("from wdsfilter.filtering.rules import resolve\n", 1),  # absolute, a name from a module
    ("import wdsfilter.score.config\n", 1),
    ("class C:\n    def m(self):\n        from .. import cli\n", 3),  # a front door
    ("from ..stream.stages import select\n", 1),  # core below stream
])
def test_an_upward_import_is_named_with_its_line(source, line):
    found = list(upward_imports("wdsfilter.core.tally", source, "wdsfilter/core/tally.py"))
    assert len(found) == 1 and found[0][1].startswith(f"wdsfilter/core/tally.py:{line} wdsfilter.core.tally (core)")


def test_imports_of_the_same_or_a_lower_floor_pass():
    source = ("from ..core.errors import ConfigError\nfrom .config import ScoreConfig\nfrom ..validate.findings import KINDS\n"
              "def f():\n    from .. import __version__\n    import wdsfilter.media.videos\n"
              "if TYPE_CHECKING:\n    from ..filtering import apply\n")  # a type only: not imported at run time
    assert len(list(imports("wdsfilter.score.runner", source))) == 5  # it reads them, but the type ...
    assert list(upward_imports("wdsfilter.score.runner", source, "x.py")) == []  # ... and none is upward


def test_a_module_outside_the_floors_is_named():
    with pytest.raises(NoFloor, match="wdsfilter.newthing lies in no floor"):
        floor("wdsfilter.newthing")
    assert floor("wdsfilter.dedup.find") == floor("wdsfilter.filtering.apply")
    assert floor("wdsfilter.stages") == FLOORS.index("front door")


MAX_FUNCTION_LINES = 80
# function -> why it is longer for now
LONG_FUNCTIONS: dict = {}  # "path:function" -> why it may be longer (none today)


def long_functions(source: str, path: str):
    """'path:name' -> lines (from `def` to its last line) of each function over the limit."""
    return {f"{path}:{node.name}": node.end_lineno - node.lineno + 1 for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES}


def test_no_function_is_over_80_lines():
    found = {}
    for path, source in package_sources():
        found.update(long_functions(source, os.path.relpath(path, ROOT).replace(os.sep, "/")))
    assert {name: n for name, n in found.items() if name not in LONG_FUNCTIONS} == {}
    assert set(LONG_FUNCTIONS) - set(found) == set(), "allow-list entries no longer needed: remove them"


# Complexity, not only length: a function of more than 30 independent paths (radon's grade E or F)
# is split by concept (validators per group, a renderer per section), not by lines.
MAX_COMPLEXITY = 30
# "path:function" -> why it may be more complex for now (checked to be still needed)
COMPLEX_FUNCTIONS: dict = {}  # none today


def complex_functions(source: str, path: str):
    """'path:Class.function' -> cyclomatic complexity of each function over the ceiling."""
    from radon.complexity import cc_visit
    from radon.visitors import Function
    found, blocks = {}, list(cc_visit(source))
    while blocks:
        block = blocks.pop()
        blocks += [*getattr(block, "methods", []), *getattr(block, "inner_classes", []), *getattr(block, "closures", [])]
        if isinstance(block, Function) and block.complexity > MAX_COMPLEXITY:
            found[f"{path}:{block.fullname}"] = block.complexity
    return found


def test_no_function_is_more_complex_than_the_ceiling():
    pytest.importorskip("radon", reason="the [test] extra's radon measures complexity")
    found = {}
    for path, source in package_sources():
        found.update(complex_functions(source, os.path.relpath(path, ROOT).replace(os.sep, "/")))
    assert {name: n for name, n in found.items() if name not in COMPLEX_FUNCTIONS} == {}, \
        "functions over the complexity ceiling: split them by concept"
    assert set(COMPLEX_FUNCTIONS) - set(found) == set(), "allow-list entries no longer needed: remove them"


def test_a_complex_function_is_found_as_a_method_too():
    pytest.importorskip("radon")
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(MAX_COMPLEXITY))
    source = f"def simple(x):\n    return x\n\n\nclass C:\n    def m(self, x):\n{textwrap.indent(branches, '    ')}"
    assert complex_functions(source, "m.py") == {"m.py:C.m": MAX_COMPLEXITY + 1}


def test_a_long_function_is_found_nested_or_not():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    source = f"def long():\n{body}\n\nclass C:\n    def short(self):\n        pass\n"
    assert long_functions(source, "m.py") == {"m.py:long": MAX_FUNCTION_LINES + 1}
    nested = "def outer():\n" + "".join("    " + line + "\n" for line in source.splitlines())
    assert set(long_functions(nested, "m.py")) == {"m.py:outer", "m.py:long"}


# Table formats (issue 37 step 4): a score table's format is decided in runfolder/ alone, by
# runfolder.tables.format_for (its suffix) and FORMATS (its name); no module outside runfolder/
# tests a table file's suffix or a format's name, or builds a file name from a suffix literal, so
# a new format is one module of runfolder/ and one line in FORMATS (the literals below are checked
# against FORMATS: a format added there must be added here).
TABLE_SUFFIXES = (".parquet", ".jsonl")
TABLE_FORMAT_NAMES = ("parquet", "jsonl")
SUFFIX_CALLS = {"endswith", "startswith", "removesuffix", "rsplit", "rpartition", "partition", "split", "len"}


def _is_suffix(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith(TABLE_SUFFIXES)


def _holds(node, test) -> bool:
    return any(test(n) for n in ast.walk(node))


def table_suffix_tests(source: str, path: str):
    """'path:line source' for each place that tests or builds a table file's suffix by a literal
    (`.endswith(".parquet")`, `x == ".jsonl"`, `name + ".parquet"`, `f"{name}.parquet"`,
    `len(".parquet")`, a bare ".parquet"), or compares a format's name (`fmt == "jsonl"`)."""
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        hit = False
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            hit = name in SUFFIX_CALLS and any(_holds(a, _is_suffix) for a in node.args)
        elif isinstance(node, ast.Compare):
            hit = any(_holds(n, lambda c: _is_suffix(c) or (isinstance(c, ast.Constant) and c.value in
                                                            TABLE_FORMAT_NAMES)) for n in [node.left, *node.comparators])
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            hit = _is_suffix(node.left) or _is_suffix(node.right)
        elif isinstance(node, ast.JoinedStr):
            hit = bool(node.values) and _is_suffix(node.values[-1])
        elif isinstance(node, ast.Constant):
            hit = node.value in TABLE_SUFFIXES
        if hit:
            yield f"{path}:{node.lineno} {lines[node.lineno - 1].strip()}"


def test_the_registry_names_the_suffixes_this_test_looks_for():
    from wdsfilter.runfolder.tables import FORMATS
    assert TABLE_SUFFIXES == tuple(f.suffix for f in FORMATS.values())
    assert TABLE_FORMAT_NAMES == tuple(FORMATS)


def test_no_module_outside_runfolder_tests_a_table_suffix():
    found = []
    for path, source in package_sources():
        rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
        if not rel.startswith("wdsfilter/runfolder/"):
            found += sorted(set(table_suffix_tests(source, rel)))
    assert found == [], ("table suffixes tested outside runfolder/ (ask runfolder.tables.format_for, or build the "
                         "name with table_name / the module that owns the file):\n" + "\n".join(found))


@pytest.mark.parametrize("source", [
    'def f(p):\n    return p.endswith(".parquet")\n',
    'def f(p):\n    return p.endswith((".tar", ".jsonl"))\n',
    'def f(p):\n    return os.path.splitext(p)[1] == ".parquet"\n',
    'def f(fmt):\n    return fmt == "jsonl"\n',
    'def f(name):\n    return name + ".parquet"\n',
    'def f(name):\n    return f"scores/{name}.jsonl"\n',
    'def f(name):\n    return name[:-len(".parquet")]\n',
    'EXTENSIONS = {"parquet": ".parquet"}\n',
])
def test_a_table_suffix_test_is_found(source):
    line = 1 + source.startswith("def")  # the line of the literal
    assert {found.split(" ", 1)[0] for found in table_suffix_tests(source, "m.py")} == {f"m.py:{line}"}


def test_a_suffix_in_text_is_not_a_test():
    source = ('"""Writes scores/<name>.parquet."""\n'
              'HELP = "the ledger (RUN/failures.parquet) lists them"\n'
              'def f(name):\n    return f"{name} is not scores/{name}.parquet or .jsonl; score it again"\n')
    assert list(table_suffix_tests(source, "m.py")) == []
