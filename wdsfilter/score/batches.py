"""A run as column batches: the worker side of an engine that moves rows as tables (Ray Data
today; Spark or Dask the same way). Nothing here knows the engine: it is given the functions and
the node's name it needs, and the engine's driver (engines/ray.py) only schedules these.

    read_shard   ─ the read task of a shard: the decode side (sample_pipeline + Prepare); every
                   sample's row, its prepared inputs as payload columns (payload.py)
    BatchScorer  ─ the model side: the local engine's ModelRunner on one GPU share or CPU slot,
                   each scorer at its batch through its own out-of-memory back-off
    measure      ─ the task that loads and probes before planning (planner.make_plan on the driver)
    ShardCollector, write_finished ─ on the driver: the rows back into their shards, each shard
                   written (rows.write_shard) as soon as its rows are all in

Nothing on the workers writes the run folder: the rows come back to the driver, which writes every
shard. Each row says which node scored it (NODE), each shard which node read it (its
SHARD_END_ROW), for its marker. An engine that pickles these by path (Ray) imports them from the
package on every worker.
"""
from __future__ import annotations

import json
import pickle
from typing import Callable, Dict, Iterator, List, Optional, Sequence

from ..core.markers import MEMBER, STAGE, MARKER, SHARD_END, ShardEnd
from ..runfolder.embeddings import FIELD as EMBEDDINGS
from ..runfolder.tables import json_value
from .payload import EMPTY, PAYLOAD, PAYLOAD_META, pack_payload, unpack_payload
from .retry import write_retried
from .rows import BASE_FIELDS, complete_row, item_row, new_row, write_shard
from ..core.tally import Tally
from .transport import Prepare
from .modelrunner import ModelRunner
from .planner import default_min_free_host, frames_of_samples, ProbeReport
from .probe import collect_probe
from .memory import host_status

PENDING = "__pending__"  # a row whose inputs still need the model
SHARD_END_ROW = "__shard_end__"  # one per shard: carries the reader's error and member count
LEDGER_FIELDS = (STAGE, MEMBER)  # row fields the failure ledger reads (ledger.row_entries)
NODE = "scored_on"  # the node whose model worker scored the row ("" where no model ran)
# A read task's block holds at most this many bytes of prepared inputs: a block is one object in
# an engine's object store (Ray's may be as small as 100 MB per node), and every read task of a
# node has blocks in flight (64 CLIP rows are 9.6 MB; 64 rows of three 720p frames would be 530 MB).
BLOCK_BYTES = 8 * 2**20


# -- decode side: one task per shard --------------------------------------------------------------
def no_node() -> str:
    """The node's name where the engine has none (one machine)."""
    return ""


def read_shard(batch, cfg, scorers, rows_per_block: int = 64, only=None, node_inputs=None,
               block_bytes: int = BLOCK_BYTES, node: Callable[[], str] = no_node) -> Iterator[Dict[str, list]]:
    """A generator over a batch of shard URLs (Ray Data's map_batches): every sample's row, with its
    prepared inputs in the PAYLOAD columns (pack_payload) where a model still has to score it, then
    one SHARD_END_ROW row whose message tells the driver how many rows the shard has, how the reader
    ended and the shard's stage counts. Yields column batches of up to rows_per_block rows and
    block_bytes of prepared inputs (one row alone where a row is bigger: a video's frames), so a big
    shard never sits in memory whole. only: --retry-failed's stage (ledger.OnlyKeys, by the URLs the
    driver knows): in its shards only the samples to retry are read on. node_inputs:
    engines/ray_files.NodeInputs (the scorers' model files where this node lacks them: a tokenizer's
    config); node: the engine's name of the node it runs on (its SHARD_END_ROW says who read the
    shard)."""
    from ..stream.pipeline import sample_pipeline

    if node_inputs is not None:
        node_inputs.apply(scorers)
    stage = cfg.scoring_stage_config(scorers)
    bounds = cfg.row_bounds
    paths = batch["path"] if "path" in batch else batch["shard"]
    for url, path in zip(list(batch["shard"]), list(paths)):  # rows carry the URL; the worker opens `path`
        tally = Tally(0, 0, name="wdsfilter score (batches)")
        before = [only.opened_as(url, path)] if only is not None and url in only.keys else []
        pipeline = sample_pipeline([path], stage, tally, extra=[Prepare(scorers, stage)], before_decode=before,
                                   shard_stages=[s.reader() for s in before])
        rows: List[dict] = []
        index = held = 0
        end = None
        for item in pipeline:
            if item.get(MARKER) == SHARD_END:
                end = ShardEnd.of(item).to_dict()
                continue
            row = item_row(item, index, scorers, bounds)
            row["shard"] = url  # the URL as the driver knows it (the worker opened `path`)
            for f in LEDGER_FIELDS:  # every row has them: Ray's blocks share one schema
                row[f] = row.get(f) or ""
            row[PAYLOAD], row[PAYLOAD_META] = EMPTY, b""
            if row["status"] is None:
                row["status"] = PENDING
                row[PAYLOAD], row[PAYLOAD_META] = pack_payload((item["inputs"], item["errors"]))
            rows.append(row)
            held += row[PAYLOAD].nbytes + len(row[PAYLOAD_META])
            index += 1
            if len(rows) >= rows_per_block or held >= block_bytes:
                yield _columns(rows)
                rows, held = [], 0
        if end is None:  # no end marker: the shard could not be opened (counted as unreadable_shard)
            examples = tally.examples.get("unreadable_shard", [])
            end = {"error": examples[0].message if examples else "could not be opened", "members": 0,
                   "unopened": True}
        end.update(rows=index, dropped=dict(tally.dropped), notes=dict(tally.notes), node=node())
        rows.append(dict(new_row("", url, -1, SHARD_END_ROW, message=json.dumps(end)),
                         **{PAYLOAD: EMPTY, PAYLOAD_META: b"", **dict.fromkeys(LEDGER_FIELDS, "")}))
        yield _columns(rows)


def _columns(rows: List[dict]) -> Dict[str, list]:
    names = list(rows[0])
    for r in rows[1:]:
        names += [n for n in r if n not in names]
    return {n: [r.get(n) for r in rows] for n in names}


# -- model side: one actor per GPU or CPU slot -----------------------------------------------------
class BatchScorer:
    """The local engine's ModelRunner over column batches (in a Ray actor: engines/ray_workers.py):
    loads the scorers once on its device, scores the pending rows of each batch with the engine's
    back-off (halve and retry on out-of-memory; no row lost or scored twice) and returns the rows
    complete, without their payload. node: the name of the node it runs on, in each row it scored."""

    def __init__(self, cfg, scorers, columns: Sequence[str], batch_size: int, device: str,
                 scorer_batch: Optional[Dict[str, int]] = None, min_free_host: Optional[int] = None,
                 node_inputs=None, scored_before: int = 0, node: str = ""):
        self.cfg, self.columns, self.scorers = cfg, list(columns), scorers
        self.bounds = cfg.row_bounds
        self.batch_size = batch_size
        self.min_free_host = min_free_host or default_min_free_host(cfg, host_status()["total"])
        # No plan ran (the user set the batch size and the actors): batch_size is in samples, as on the
        # local engine; the scorers' sub-batches in frames are set on the first inputs (size_by_samples).
        self.unsized = scorer_batch is None
        self.node = node
        if node_inputs is not None:  # the model files where this node lacks them (engines/ray_files.py)
            node_inputs.apply(scorers)
        self.runner = ModelRunner(scorers, device)
        self.runner.load()
        self.scored_before = scored_before
        self.runner.configure(batch_size, scorer_batch=scorer_batch, min_free_host=self.min_free_host,
                              scored_before=scored_before)

    def size_by_samples(self, inputs: List[dict]) -> None:
        """Each scorer's sub-batch: batch_size samples in frames, by the frames per sample of these
        inputs, as the local planner does with the probe's (planner.frames_of_samples). A scorer
        with no input among them keeps batch_size frames."""
        sizes = {}
        for s in self.scorers:
            count = getattr(s, "frame_count", lambda _: 1)
            frames = [max(1, int(count(x[s.name]))) for x in inputs if s.name in x]
            sizes[s.name] = frames_of_samples(self.batch_size, sum(frames) / len(frames) if frames else 1.0)
        self.runner.configure(self.batch_size, scorer_batch=sizes, min_free_host=self.min_free_host,
                              scored_before=self.scored_before)
        self.unsized = False

    def __call__(self, batch):
        n = len(batch["key"])
        rows = [{f: plain(batch[f][i]) for f in BASE_FIELDS} for i in range(n)]
        pending = [i for i in range(n) if rows[i]["status"] == PENDING]
        # (inputs, prepare errors), arrays as views of one copy of the row's tensor column
        loaded = {i: unpack_payload(batch[PAYLOAD][i], batch[PAYLOAD_META][i]) for i in pending}
        if self.unsized and pending:
            self.size_by_samples([loaded[i][0] for i in pending])
        for i, scores, errors in self.runner.score([(i, loaded[i][0]) for i in pending]):
            rows[i]["status"] = None
            complete_row(rows[i], self.scorers, scores, {**loaded[i][1], **errors}, self.bounds)
        out = {f: [r[f] for r in rows] for f in BASE_FIELDS}
        for f in LEDGER_FIELDS:  # where a rejected row was dropped, for the failure ledger
            out[f] = [plain(v) or "" for v in batch[f]] if f in batch else [""] * n
        out[EMBEDDINGS] = [pickle.dumps(r.get(EMBEDDINGS)) for r in rows]  # --save-embeddings (else None)
        scored = set(pending)
        out[NODE] = [self.node if i in scored else "" for i in range(n)]
        for c in self.columns:  # every batch has every column, so Ray's blocks share one schema
            out[c] = [json.dumps(r.get(c), default=json_value) for r in rows]
        return out


def plain(v):
    """numpy scalars from an engine's batches -> Python values; the NaN that a missing text becomes
    on its way through Arrow and numpy -> None."""
    v = v.item() if hasattr(v, "item") and not isinstance(v, (bytes, str)) else v
    return None if isinstance(v, float) and v != v else v


# -- driver side: rows in, finished shards out -----------------------------------------------------
class ShardCollector:
    """Driver side: rows arrive from the model workers in any order; a shard is complete when its
    SHARD_END_ROW row has come and every row index it announced. Rows are kept by index, so a row
    that a retried task (Ray's) sends twice is counted once."""

    def __init__(self, columns: Sequence[str]):
        self.columns = list(columns)
        self.rows: Dict[str, Dict[int, dict]] = {}
        self.ends: Dict[str, dict] = {}

    def add(self, batch) -> List[tuple]:
        """Rows of one batch in; (url, rows, end) of every shard this batch completed out."""
        complete = []
        for i in range(len(batch["key"])):
            row = {f: plain(batch[f][i]) for f in (*BASE_FIELDS, *LEDGER_FIELDS, NODE)}
            url = row["shard"]
            if row["status"] == SHARD_END_ROW:
                self.ends[url] = json.loads(row["message"])
            else:
                row.update({c: plain(batch[c][i]) for c in self.columns})
                row[EMBEDDINGS] = pickle.loads(batch[EMBEDDINGS][i])
                self.rows.setdefault(url, {})[row["index"]] = row
            end = self.ends.get(url)
            if end is not None and len(self.rows.get(url, ())) == end["rows"]:
                complete.append((url, list(self.rows.pop(url, {}).values()), self.ends.pop(url)))
        return complete


def write_finished(url: str, rows: List[dict], end: dict, cfg, state, columns: Sequence[str],
                   path: Optional[str] = None, retry: Optional[Dict[int, dict]] = None, *, engine: str) -> dict:
    """On the driver: the score values back from JSON, rows in shard order, then rows.write_shard
    (score file, embeddings, filtered shard from `path`, completion marker) as the local engine
    does, with the engine and the nodes that read and scored the shard in its marker; with `retry`
    (--retry-failed: the shard's samples read again), retry.write_retried."""
    for row in rows:
        for c in columns:
            row[c] = json.loads(row[c])
    rows.sort(key=lambda r: r["index"])
    nodes = {"read": end.get("node"), "scored": sorted({r[NODE] for r in rows if r.get(NODE)})}
    if retry is not None:
        failed = write_retried(url, rows, end, cfg, state, columns, retry, source=path, engine=engine, nodes=nodes)
    else:
        failed = write_shard(url, rows, end, cfg, state, columns, source=path, engine=engine, nodes=nodes)
    return {"shard": url, "rows": len(rows), **({"failed": failed} if failed else {})}


# -- before planning: one task measures -----------------------------------------------------------
def measure(cfg, scorers, model_scorers, urls: Sequence[str], device: str, only: Sequence = (),
            node_inputs=None, collected=None) -> dict:
    """A task (on one GPU, or a CPU slot): what the local engine measures before planning:
    the scorers loaded on `device` (free memory, footprints) and the probe of a few prepared
    samples (activation memory per frame and scorer, speeds), and the node's host numbers.
    collected: the probe's samples, already read (collect_probe) where this node cannot read
    the shards; node_inputs: engines/ray_files.NodeInputs (the model files where this node lacks them)."""

    if node_inputs is not None:
        node_inputs.apply([*scorers, *model_scorers])
    tally = Tally()
    if collected is None:
        collected = collect_probe(list(urls), cfg.scoring_stage_config(scorers), scorers, cfg.probe_samples,
                                  cfg.probe_scan, cfg.probe_seconds, only, tally)
    inputs, prep_seconds, scanned = collected
    runner = ModelRunner(model_scorers, device)
    report = runner.load()
    try:
        probe = ProbeReport.measured(inputs, scanned, prep_seconds, runner.probe)
    finally:
        runner.unload()
    report.worker = 0
    return {"report": report, "probe": probe, "host": host_status(),
            "remote_retries": tally.notes.get("remote_retries", 0)}  # the run's summary counts them

