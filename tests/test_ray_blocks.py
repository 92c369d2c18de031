"""A read task's blocks are bounded in bytes, not only in rows (score/batches.read_shard): on Ray
a block is one object in its object store, which may be as small as 100 MB per node. Run here
as the plain, engine-neutral generator it is, without Ray."""
from scorekit import BrightnessScorer, make_shards
from wdsfilter.score import build_config
from wdsfilter.score.batches import SHARD_END_ROW, read_shard
from wdsfilter.score.payload import PAYLOAD, PAYLOAD_META


def test_a_read_task_cuts_its_blocks_at_a_byte_size(tmp_path):
    (url,), _ = make_shards(str(tmp_path / "shards"), [20])
    scorer = BrightnessScorer(size=448)  # 3 x 448 x 448 uint8 pixels: 602 KB a row
    cfg = build_config(str(tmp_path / "out"), [scorer], progress=False)
    limit, row = 2 * 2**20, 3 * 448 * 448
    blocks = list(read_shard({"shard": [url], "path": [url]}, cfg, [scorer], rows_per_block=64, block_bytes=limit))
    held = [sum(len(p) for p in b[PAYLOAD]) + sum(map(len, b[PAYLOAD_META])) for b in blocks]
    assert len(blocks) >= 5 and max(held) < limit + row + 4096, held  # at most one row past the limit
    statuses = [s for b in blocks for s in b["status"]]
    assert statuses[-1] == SHARD_END_ROW and len(statuses) == 21
    assert [i for b in blocks for i in b["index"]][:-1] == list(range(20))
    # the row count still cuts too
    by_rows = list(read_shard({"shard": [url], "path": [url]}, cfg, [scorer], rows_per_block=8, block_bytes=2**40))
    assert [len(b["key"]) for b in by_rows] == [8, 8, 5]
