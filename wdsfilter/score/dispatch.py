"""The main process of a local run: it gives every stream item its row, forms batches for the
model workers, completes rows as results come back and writes each shard's outputs as soon as
the shard is complete (rows.write_shard).

    chunks from the DataLoader ─ Dispatcher.take ─ pending (ref, inputs, chunk buffer) ─ pool.submit
    pool.poll ─ Dispatcher.collect ─ rows.complete_row ─ shard complete? ─ rows.write_shard

Keys and rows, not pixels: a chunk's tensors and arrays stay in the shared buffer the decode
worker wrote them to; the pending inputs hold TensorSlots into it, and a batch sent to a model
worker carries the slots and the buffers' handles (transport.Batch), never a copy of the pixels.

Memory is bounded: at most two batches of pending samples wait here (take blocks on collect when
every model worker is busy), each worker queue holds at most its planned depth of batches, and
only the rows of shards still open are held. The chunk buffers alive are those the DataLoader
prefetched and those pending samples or queued batches point into (transport.py: Lifetime);
the dispatcher drops its references to a batch's samples as soon as the batch is submitted.
"""
from __future__ import annotations

import gc
import time
from typing import Callable, Dict, Iterable, List, Optional

from ..core.markers import MARKER, SHARD_END, ShardEnd
from .faults import dead_decode_worker
from .retry import write_retried
from .rows import ShardRows, complete_row, write_shard
from .runner import Run
from .transport import Batch, open_chunk
from ..core.progress import Progress
from ..storage.shardstats import sizes_samples


class Dispatcher:
    def __init__(self, run: Run, pool, batch_size_of: Dict[int, int], n_todo: int, progress=None):
        self.run, self.pool = run, pool
        self.cfg, self.scorers = run.cfg, run.scorers
        self.bounds = run.cfg.row_bounds
        self.batch_size_of = batch_size_of  # model worker -> its planned batch size
        self.n_todo = n_todo
        self.progress = progress
        self.shards: Dict[str, ShardRows] = {}
        # ((url, index), inputs with slots, chunk buffer) not yet sent to a model worker
        self.pending: List[tuple] = []
        self.batch_id = 0
        self.completed = 0
        self.rows_done = 0
        self.failed: List[dict] = []  # complete shards whose outputs could not be written
        self.seconds = 0.0

    def run_loader(self, loader: Iterable, then: Optional[Callable[[], None]] = None) -> None:
        """Score everything the loader yields; returns when every row is complete. `then` runs
        once the loader's iterator exists: its decode workers are forked, so it may start threads."""
        started = time.perf_counter()
        # The heap so far (torch, the scorers' modules) is never garbage: collections skip it, so
        # a full one costs milliseconds, not a pause per few hundred rows; forked decode workers
        # share those pages untouched.
        frozen = gc.get_freeze_count() == 0  # a caller that froze the heap itself keeps it so
        if frozen:
            gc.freeze()
        chunks = None
        try:
            chunks = iter(loader)  # forks the decode workers
            if then is not None:
                then()
            for chunk in chunks:
                items, buffer = open_chunk(chunk)
                del chunk
                for item in items:
                    self.take(item, buffer)
                del items, buffer  # the pending samples keep the buffer alive while they need it
                self.dispatch()
                self.collect(0.0)
            self.dispatch(final=True)
            while self.pool.in_flight():
                self.collect(0.5)
            self.collect(0.0)
        except Exception as e:  # not Ctrl-C or SIGTERM: a group-wide one kills the workers too, and it is still the user's stop
            died = dead_decode_worker(getattr(chunks, "_workers", ()), e)  # torch's worker processes
            if died is not None:
                raise died from e
            raise
        finally:
            # Stop the decode workers now, not when the iterator is collected: that also takes them
            # off torch's SIGCHLD handler, which otherwise raises about a dead one at every later
            # child exit, wherever the main thread is (while the error is being reported).
            shutdown = getattr(chunks, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            if frozen:
                gc.unfreeze()
            self.seconds = time.perf_counter() - started

    # -- rows in ------------------------------------------------------------------------------------
    def _shard(self, url: str) -> ShardRows:
        s = self.shards.get(url)
        if s is None:
            s = self.shards[url] = ShardRows(url)
        return s

    def _row_done(self, n: int = 1) -> None:
        self.rows_done += n
        if self.progress is not None:
            self.progress.update(n)

    def take(self, item: dict, buffer=None) -> None:
        """One stream item: a shard end, or a row (final, or pending for the models). `buffer`:
        the shared buffer of the item's chunk, which its inputs' TensorSlots point into."""
        url = item.get("__url__", "")
        s = self._shard(url)
        if item.get(MARKER) == SHARD_END:
            s.end(item)
            self._maybe_finish(s)
            return
        index = s.add(item, self.scorers, self.bounds)
        if index is None:
            self._row_done()
        else:
            self.pending.append(((url, index), item["inputs"], buffer))

    # -- batches out and results back ------------------------------------------------------------
    def collect(self, timeout: float) -> None:
        self.run.check_lease()  # a folder another run took over: stop scoring at once
        for _batch_id, _worker, results in self.pool.poll(timeout):
            touched = set()
            for (url, index), scores, errors in results:
                s = self.shards[url]
                errors = {**s.prep_errors.pop(index, {}), **errors}
                complete_row(s.rows[index], self.scorers, scores, errors, self.bounds)
                s.pending -= 1
                touched.add(url)
            self._row_done(len(results))
            for url in touched:
                self._maybe_finish(self.shards[url])

    def dispatch(self, final: bool = False) -> None:
        """Send full batches to free workers; block while too much is pending; with final, send
        the rest."""
        pool = self.pool
        while self.pending:
            worker = pool.idle_worker()
            if worker is None:
                if len(self.pending) < 2 * max(self.batch_size_of.values()) and not final:
                    return
                self.collect(0.5)  # bounded memory: wait for a model worker
                continue
            size = self.batch_size_of[worker]
            idle_model = not pool.in_process and pool.in_flight() == 0
            if len(self.pending) < size and not final and not idle_model:
                return
            batch, self.pending = Batch.of(self.pending[:size]), self.pending[size:]
            self.batch_id += 1
            pool.submit(worker, self.batch_id, batch)
            del batch  # the model worker's queue holds it now (by handle), not the dispatcher
            self.collect(0.0)

    # -- shards out -----------------------------------------------------------------------------------
    def _maybe_finish(self, s: ShardRows) -> None:
        if not s.complete:
            return
        end = ShardEnd(members=s.members, error=s.error, failed=s.failed, not_a_tar=s.not_a_tar)
        plan = self.run.retry.get(s.url)  # --retry-failed: these rows go in place of failed ones
        if plan is not None:
            failed = write_retried(s.url, s.rows, end, self.cfg, self.run.state, self.run.columns, plan)
        else:
            failed = write_shard(s.url, s.rows, end, self.cfg, self.run.state, self.run.columns)
        del self.shards[s.url]
        if self.progress is not None:
            self.progress.part_done()
        if failed:
            self.failed.append({"url": s.url, "reason": failed})
            return
        self.completed += 1
        self.run.shard_written(s.url)

    def unfinished(self) -> List[dict]:
        """Shards still open when the stream ended (a shard end never came, or rows are missing)."""
        return [{"url": url, "reason": s.error or "shard did not finish"} for url, s in self.shards.items()]


def open_progress(enabled: bool, todo: List[str]):
    """The progress line of the shards `todo`: in samples where sizes.json beside them counts
    them, else by shards done (wdsfilter/core/progress.py)."""
    if not enabled:
        return None
    return Progress("scoring", "samples", total=sizes_samples(todo), parts=len(todo))

