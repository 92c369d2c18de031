"""The package's shape in numbers, for a tree checked out anywhere (issue 37's before/after figures):

    python tools/structure.py [--root CHECKOUT]

- modules and lines per floor, as the checkout's own tests/test_layers.py assigns them (its `floor`
  function, or the older `layer`);
- circles: groups of modules that import one another, directly or round a loop (lazy imports included);
- upward imports: an import of a higher floor (what the layer test refuses, its allow-list included);
- imports inside functions: imports of wdsfilter modules in a function body, of all imports of
  wdsfilter modules; imports of another module's private (`_name`) names;
- functions of radon grade E or F (cyclomatic complexity over 30; needs radon, the [test] extra);
- the widest public function: the most parameters (self and cls not counted).
"""
import argparse
import ast
import importlib.util
import os
import sys


def load_layer_test(root: str):
    spec = importlib.util.spec_from_file_location("layers_under_measure", os.path.join(root, "tests", "test_layers.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The walkers (imports inside functions, private imports, circles) are the layer test's own, from
# this tool's checkout: one implementation, whichever checkout is measured (its floors are its own).
WALKERS = load_layer_test(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sources(root: str):
    for folder, _, files in os.walk(os.path.join(root, "wdsfilter")):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    yield path, f.read()


def is_command(node) -> bool:
    """A click command: its parameters are the command line's options."""
    return any("click" in ast.unparse(d) or ast.unparse(d).endswith("command") for d in node.decorator_list)


def widest_public_functions(tree: ast.AST, module: str):
    """((parameters, name) of the widest public function, the same of the widest click command)."""
    best = {False: (0, ""), True: (0, "")}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs] + [x.arg for x in (a.vararg, a.kwarg) if x]
            count = len([n for n in names if n not in ("self", "cls")])
            best[is_command(node)] = max(best[is_command(node)], (count, f"{module}.{node.name}"))
    return best[False], best[True]


def grade_ef(path: str, source: str):
    try:
        from radon.complexity import cc_visit
    except ImportError:
        return None
    return [(block.fullname, block.complexity) for block in cc_visit(source) if block.complexity > 30]


def measure(root: str) -> dict:
    layers = load_layer_test(root)
    floor_of = getattr(layers, "floor", None) or layers.layer
    names = getattr(layers, "FLOORS", None) or layers.LAYERS
    per_floor, graph, upward = {}, {}, []
    inside = total = 0
    privates, grades, widest, command = [], [], (0, ""), (0, "")
    for path, source in sources(root):
        module = layers.module_name(path)
        tree = ast.parse(source)
        floor = floor_of(module)
        count, lines = per_floor.get(floor, (0, 0))
        per_floor[floor] = (count + 1, lines + len(source.splitlines()))
        lazy = WALKERS.function_import_lines(tree)
        statements = set()
        for line, target in layers.imports(module, source, path.endswith("__init__.py")):
            statements.add(line)
            if target != module:
                graph.setdefault(module, set()).add(target)
            if target != "wdsfilter" and floor_of(target) > floor:  # the package root loads first anyway
                upward.append(f"{module}:{line} -> {target}")
        total += len(statements)
        inside += len(statements & lazy)
        privates += [f"{module}:{line} {name}" for line, name in
                     WALKERS.private_imports(module, source, path.endswith("__init__.py"))]
        found = grade_ef(path, source)
        grades = None if found is None or grades is None else grades + [f"{module}.{n} ({c})" for n, c in found]
        function, click_command = widest_public_functions(tree, module)
        widest, command = max(widest, function), max(command, click_command)
    return {"floors": [(names[i], *per_floor[i]) for i in sorted(per_floor)], "circles": sorted(WALKERS.circles(graph)),
            "upward": upward, "inside": inside, "total": total, "privates": privates, "grades": grades,
            "widest": widest, "command": command}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("-v", "--verbose", action="store_true", help="list each upward import and private import")
    args = parser.parse_args(argv)
    m = measure(os.path.abspath(args.root))
    print("modules per floor (lowest first):")
    for name, count, lines in m["floors"]:
        print(f"  {name:<14} {count:>4} modules {lines:>7} lines")
    print(f"circles: {len(m['circles'])}")
    for group in m["circles"]:
        print("  " + " <-> ".join(group))
    print(f"upward imports: {len(m['upward'])}")
    if args.verbose:
        print("".join(f"  {u}\n" for u in m["upward"]), end="")
    share = m["inside"] / m["total"] if m["total"] else 0
    print(f"import statements of wdsfilter modules inside functions: {m['inside']} of {m['total']} ({share:.0%})")
    print(f"imports of another module's private names: {len(m['privates'])}")
    if args.verbose:
        print("".join(f"  {p}\n" for p in m["privates"]), end="")
    if m["grades"] is None:
        print("grade E/F functions: radon is not installed (pip install radon, or the [test] extra)")
    else:
        print(f"grade E/F functions (cyclomatic complexity > 30): {len(m['grades'])}")
        print("".join(f"  {g}\n" for g in m["grades"]), end="")
    print(f"widest public function: {m['widest'][1]} ({m['widest'][0]} parameters)")
    print(f"widest click command: {m['command'][1]} ({m['command'][0]} options)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
