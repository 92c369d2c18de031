"""Score files' columns are built from numpy buffers (runfolder.tables.arrow_array), not by
pa.array, which imports pandas on its first list (~1 s of a small job's start-up): the same arrays
pa.array(values, type, from_pandas=True) makes, and no pandas in the writing process."""
import math
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from wdsfilter.runfolder.tables import arrow_array, read_table

CASES = [
    (pa.float64(), [0.25, None, math.nan, math.inf, -math.inf, 3, np.float32(0.5), np.float64(-0.0), 1e308]),
    (pa.float64(), [None, None]),
    (pa.float64(), []),
    (pa.int64(), [0, None, -5, 2**62]),
    (pa.bool_(), [True, None, False, True, True, False, False, False, True]),
    (pa.string(), ["a", None, "", "ünïcødé ✓", "x" * 1000]),
    (pa.list_(pa.float64()), [[0.1, None, math.nan], None, [], [2, 3.5]]),
    (pa.float64(), [True, 1.0]),  # a bool where numbers belong: pa.array's own conversion
    (pa.int64(), [np.int64(3), None]),
    (pa.string(), ["\udcff"]),  # a lone surrogate: pa.array's own error, as before
]


def test_arrays_equal_pa_arrays():
    for kind, values in CASES:
        try:
            want = pa.array(values, type=kind, from_pandas=True)
        except (pa.ArrowException, ValueError, TypeError, UnicodeEncodeError) as e:
            try:
                arrow_array(values, kind)
            except type(e):
                continue
            raise AssertionError(f"{kind} {values!r}: pa.array raised {e!r}, arrow_array did not") from None
        got = arrow_array(values, kind)
        got.validate(full=True)
        assert got.type == want.type and got.equals(want), (kind, values, got, want)


WRITE = """
import sys
from wdsfilter.runfolder.tables import write_table
rows = [{"key": f"{i:04d}", "shard": "s", "index": i, "status": "scored", "reason": None, "message": None,
         "kept": i % 2 == 0, "caption": "a caption ✓", "clip_score": 0.1 * i, "clip_score_frames": [0.1 * i],
         "clip_frames": 1, "clip_truncated": False} for i in range(50)]
write_table(rows, {"clip_score": "float64", "clip_score_frames": "list<float64>", "clip_frames": "int64",
                   "clip_truncated": "bool"}, sys.argv[1], "parquet")
print("pandas" in sys.modules)
"""


def test_a_score_file_is_written_without_pandas(tmp_path):
    path = str(tmp_path / "s.parquet")
    out = subprocess.run([sys.executable, "-c", WRITE, path], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
    table = read_table(path)
    assert table["clip_score"][3] == 0.1 * 3 and table["kept"][:3] == [True, False, True]
    assert table["clip_score_frames"][2] == [0.2] and table["caption"][0] == "a caption ✓"
    assert pq.read_metadata(path).schema.to_arrow_schema().field("clip_frames").type == pa.int64()
