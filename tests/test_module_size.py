"""Small modules with one job: no module over 450 lines (issue 12; ARCHITECTURE.md).
reading.py grew past it by the fixes for real-tool shards; its compression layer became
decompress.py."""
import os

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "wdsfilter")
LIMIT = 450


def test_no_module_is_over_the_line_limit():
    sizes = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    sizes[os.path.relpath(path, PACKAGE)] = sum(1 for _ in f)
    assert len(sizes) > 50
    assert {name: n for name, n in sizes.items() if n > LIMIT} == {}
