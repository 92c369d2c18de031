"""The memory planner: from measured numbers to batch size, model replicas per GPU, decode workers.

The numbers (probe.py): per device, its free memory before loading, each model's footprint and
what another process costs; per scorer, activation bytes per frame and a fixed part (a video of
k frames is k frames, an image one); speeds and the size of a prepared sample; the host's
available RAM and CPU cores, which bound decode workers x prefetch and model processes per GPU.

The plan (plan.py) is data: per device, the model processes (replicas), each scorer's own batch in
frames (DevicePlan.scorer_batch: CLIP's is not held down to OCR's) and the batch of samples sent to
a model process at a time (DevicePlan.batch_size, the largest scorer batch; each scorer scores it
in sub-batches of its own size). Scorers run one after another in a model process, so a process
needs its models plus the largest of the scorers' working memories at their batches.

make_plan() is a pure function of these numbers and the user's settings, so each rule is tested
on exact inputs; every choice carries the reason printed by `--dry-run`. A user setting that
cannot fit is refused with the numbers (fit="refuse") or clamped with a warning (fit="clamp").
The Ray runner calls the same make_plan() with numbers measured in one Ray task.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ..core.errors import ConfigError
from ..core.units import format_size as fs
from .backoff import GROW_AFTER
from .config import ScoreConfig
from .plan import DevicePlan, Plan
from .probe import ProbeReport, input_lines

if TYPE_CHECKING:
    from .modelrunner import LoadReport

# RAM a decode worker holds besides its prefetched samples (interpreter, imports, one shard's
# tar buffer and a decoded image). An estimate, shown as one in the plan.
WORKER_BASE_BYTES = 256 * 2**20
# Batches queued per model worker: one being scored, one waiting, so the model never idles.
QUEUE_DEPTH = 2
# Samples per DataLoader transfer: big enough to amortise inter-process overhead, small enough
# that workers x prefetch x chunk prepared samples stay modest.
MAX_CHUNK = 64
# Model processes per GPU chosen automatically: two overlap one's host-side work (transfers,
# Python, OCR's polygon geometry) with the other's GPU work; more is not measured to pay here
# (set replicas=N for more).
AUTO_MAX_REPLICAS = 2
# An extra process per GPU is added only while every scorer keeps a batch of at least this many
# frames (or its whole one-process batch, if that is smaller): beyond that, halving a batch costs
# more GPU efficiency than the overlap gains.
REPLICA_MIN_BATCH = 32
# Cores per GPU model process when counting what the cores allow: its 2 threads, and as many left
# for the decode workers that feed it: n_gpus x replicas x CORES_PER_GPU_PROCESS <= cpus.
CORES_PER_GPU_PROCESS = 4
# Prepared samples queued for the model processes may take at most this share of the host budget;
# the dispatched batch is made smaller where the largest scorer batch would take more.
QUEUE_SHARE = 4


def frames_of_samples(samples: int, frames_per_sample: float) -> int:
    """A batch of `samples` samples in frames (a scorer's sub-batch unit): a batch_size set by the
    user means samples on both engines, whatever their frames."""
    return max(1, int(math.ceil(samples * frames_per_sample)))


def _round_batch(b: int) -> int:
    """Multiples of 8 above 16 (tensor-core friendly); exact below."""
    return b if b < 16 else b - b % 8


class _Planner:
    def __init__(self, cfg: ScoreConfig, reports: List[LoadReport], probe: ProbeReport, host: dict, n_shards: int):
        self.cfg = cfg
        self.reports = reports
        self.probe = probe
        self.host = host
        self.n_shards = max(1, n_shards)
        # The measured numbers come first in the plan's text, then each decision appends its own.
        self.lines, self.warnings = input_lines(reports, probe)
        self.acts = probe.scorer_activations()
        self.one_by_one: Dict[str, int] = {}  # CPU scorers that score one sample at a time (small_batches)

    def too_big(self, message: str, clamped_to: Optional[str] = None) -> None:
        """Refuse (ConfigError with the numbers) or warn and go on with the clamped value."""
        if self.cfg.fit == "refuse" or clamped_to is None:
            hint = " Lower the setting, leave it on auto, or pass --fit clamp to clamp it." if clamped_to else ""
            raise ConfigError(f"this cannot fit: {message}.{hint}")
        self.warnings.append(f"{message}; clamped to {clamped_to}")

    # -- per-scorer numbers ------------------------------------------------------------------------
    def names(self, report: LoadReport) -> List[str]:
        """The scorers of a model process (those it loaded), else those the probe measured."""
        return list(report.footprints or {}) or list(self.acts) or ["model"]

    def act(self, name: str) -> Tuple[int, int]:
        """(fixed bytes, bytes per frame) of a scorer; (0, 0) where the probe could not measure it."""
        return self.acts.get(name, (0, 0))

    def unit(self, name: str) -> str:
        """What a scorer's batch counts: frames where the probe saw samples of several frames."""
        return "frames" if self.probe.frames_per_sample(name) != 1.0 else "samples"

    def user_batch(self, name: str, samples: int) -> int:
        """A batch_size set by the user is in samples: in frames, as many as that many samples had
        in the probe (a 3-frame video takes 3)."""
        return frames_of_samples(samples, self.probe.frames_per_sample(name))

    @staticmethod
    def work(acts: Dict[str, Tuple[int, int]], B: Dict[str, int]) -> int:
        """Working memory of one model process: its scorers run one after another, so the largest."""
        return max((f + p * B[n] for n, (f, p) in acts.items()), default=0)

    def batch_lines(self, where: str, B: Dict[str, int], reasons: Dict[str, str]) -> None:
        if len(B) == 1:
            (n, b), = B.items()
            self.lines.append((f"{where} batch size", str(b), reasons[n]))
            return
        for n, b in B.items():
            self.lines.append((f"{where} {n} batch", f"{b} {self.unit(n)}", reasons[n]))

    # -- GPU-like devices ----------------------------------------------------------------------
    def plan_gpu(self, r: dict, n_gpus: int, host_budget: int) -> DevicePlan:
        cfg, dev = self.cfg, r.device
        budget, why = r.free_before, f"free {fs(r.free_before)} of {fs(r.total)} before loading"
        if cfg.max_memory and cfg.max_memory < budget:
            budget, why = cfg.max_memory, why + f", capped by max_memory={fs(cfg.max_memory)}"
        keep = int(budget * cfg.headroom)
        usable = budget - keep
        retained = sum(self.probe.retained.values())
        F, O = r.footprint + retained, r.overhead
        names = self.names(r)
        acts = {n: self.act(n) for n in names}
        self.lines.append((f"{dev} budget", fs(usable), f"{why}; {fs(keep)} ({cfg.headroom:.0%}) kept as headroom"))

        def need(R: int, B: Dict[str, int]) -> int:
            return R * (F + self.work(acts, B)) + (R - 1) * O

        def fit(R: int) -> Dict[str, float]:
            """Each scorer's largest batch (frames) with R processes, before the max_batch cap."""
            room = (usable - (R - 1) * O) / R - F
            out = {}
            for n, (fixed, per) in acts.items():
                left = room - fixed
                out[n] = 0 if left < per or left < 0 else (math.inf if per == 0 else left // per)
            return out

        def formula(R: int, B: Dict[str, int]) -> str:
            if len(acts) == 1:
                (n, (fixed, per)), = acts.items()
                work = f"{fs(fixed)} + {fs(per)} x {B[n]} {self.unit(n)}"
            else:
                work = "max(" + ", ".join(f"{n} {fs(f)} + {fs(p)} x {B[n]} {self.unit(n)}"
                                          for n, (f, p) in acts.items()) + ")"
            return (f"{R} x ({fs(F)} model + {work})"
                    + (f" + {R - 1} x {fs(O)} per extra process" + (" (estimated)" if r.overhead_estimated else "")
                       if R > 1 else "") + f" = {fs(need(R, B))}")

        cap, ones = cfg.max_batch, {n: 1 for n in names}

        def capped(limits: Dict[str, float]) -> Dict[str, int]:
            return {n: _round_batch(int(min(b, cap))) for n, b in limits.items()}

        if cfg.replicas == "auto":
            R, reason = self.auto_replicas(r, n_gpus, host_budget, fit, capped, formula, usable)
            self.lines.append((f"{dev} replicas", str(R), reason))
        else:
            R = cfg.replicas
            if need(R, ones) > usable:
                fitting = max((k for k in range(1, R) if need(k, ones) <= usable), default=0)
                self.too_big(f"replicas={R} on {dev}: {formula(R, ones)} > {fs(usable)} usable",
                             str(fitting) if fitting else None)
                R = fitting
            self.lines.append((f"{dev} replicas", str(R), "set by the user" + (" (clamped)" if R != cfg.replicas else "")))
        limit = fit(R)
        if min(limit.values()) < 1:
            raise ConfigError(f"this cannot fit: one sample on {dev} needs {formula(R, ones)} but {fs(usable)} is usable "
                              f"({why}). Free the GPU, raise max_memory, or use a smaller model.")
        reasons: Dict[str, str] = {}
        if cfg.batch_size == "auto":
            B = capped(limit)
            for n in names:
                if limit[n] > cap:
                    reasons[n] = (f"capped at max_batch={cap}; memory would allow "
                                  + ("any" if limit[n] == math.inf else f"{int(limit[n])}"))
                else:
                    reasons[n] = f"largest that fits: {formula(R, B)} <= {fs(usable)}"
        else:
            B = {n: self.user_batch(n, cfg.batch_size) for n in names}
            reasons = {n: "set by the user" for n in names}
            if any(B[n] > limit[n] for n in names):
                clamp = {n: min(B[n], _round_batch(int(limit[n]))) for n in names}
                self.too_big(f"batch_size={cfg.batch_size} on {dev}: {formula(R, B)} > {fs(usable)} usable",
                             ", ".join(f"{n} {b}" for n, b in clamp.items()) if len(clamp) > 1
                             else str(next(iter(clamp.values()))))
                B = clamp
                reasons = {n: f"clamped: {formula(R, B)} fits" for n in names}
        self.batch_lines(dev, B, reasons)
        return DevicePlan(dev, r.kind, R, max(B.values()), None, usable, need(R, B), dict(B))

    def auto_replicas(self, r, n_gpus, host_budget, fit, capped, formula, usable) -> Tuple[int, str]:
        """How many whole model processes (models + the largest scorer working memory) fit the
        device, each scorer keeping a useful batch, within what the cores and host RAM allow."""
        one = fit(1)
        if r.kind == "host" or min(one.values()) < 1:
            return 1, "one model process per device"
        if r.in_process:
            return 1, "the model runs in the main process (one simulated device): no process to add"
        want = {n: max(1, min(capped({n: b})[n], REPLICA_MIN_BATCH)) for n, b in one.items()}
        cpus = self.host["cpus"]
        R, reason = 1, ""
        for k in range(2, AUTO_MAX_REPLICAS + 1):
            if n_gpus * k * CORES_PER_GPU_PROCESS > cpus:
                reason = (f"{cpus} cores: {n_gpus * k} GPU model process(es) x {CORES_PER_GPU_PROCESS} cores "
                          f"(2 threads each and the decode workers feeding it) would be more than the host has")
                break
            extra_rss = n_gpus * (k - 1) * r.rss
            if extra_rss > host_budget // 2:
                reason = (f"host RAM: {n_gpus * (k - 1)} more process(es) of {fs(r.rss)} would take over half "
                          f"of the {fs(host_budget)} host budget")
                break
            got = fit(k)
            short = [n for n in got if got[n] < want[n]]
            if short:
                reason = (f"a process more would leave {', '.join(short)} a batch under "
                          f"{', '.join(str(want[n]) for n in short)}: {formula(k, want)} > {fs(usable)}")
                break
            R = k
        if R == 1:
            return 1, reason or "one model process"
        B = capped(fit(R))
        text = (f"{R} whole model processes fit, each scorer keeping a batch of at least "
                f"{', '.join(f'{n} {b}' for n, b in want.items())}: {formula(R, B)} <= {fs(usable)}; "
                f"each overlaps its host-side work with the others' GPU work")
        if reason:
            text += f"; no more: {reason}"
        elif R == AUTO_MAX_REPLICAS:
            text += f"; at most {AUTO_MAX_REPLICAS} automatically (replicas=N for more)"
        return R, text

    def small_batches(self, B: Dict[str, int]) -> Dict[str, int]:
        """On the CPU a bigger batch is not always faster: a convolutional detector on 2 cores ran
        at 72 frames/s one frame at a time and 38 at 32 (cache-bound). A scorer whose probe ran
        clearly faster per sample at the small size scores one sample at a time; the others keep B."""
        small: Dict[str, int] = {}
        for name, (t1, tn) in ((k, t) for k, t in self.probe.timings.items() if len(t) == 2):
            b, n = B.get(name, 1), self.probe.sizes.get(name, (1, 0))[1]
            if b > 1 and t1 < 0.8 * tn:
                small[name] = 1
                self.lines.append((f"{name} batch on cpu", "1",
                                   f"probe: the same {n} samples took {t1 * 1000:.2f} ms/sample one at a time, "
                                   f"{tn * 1000:.2f} in one batch: batching does not pay here; the batch of {b} "
                                   f"is scored one by one by {name}"))
        return small

    # -- the host -------------------------------------------------------------------------------
    def host_budget(self, cpu_reports: List[LoadReport]) -> int:
        """Host RAM the run may use: available minus headroom, capped by max_memory on the CPU."""
        cfg, host = self.cfg, self.host
        available = host["available"]
        budget = int(available * (1 - cfg.headroom))
        why = f"psutil: {fs(available)} available of {fs(host['total'])}, {cfg.headroom:.0%} kept as headroom"
        if cpu_reports and cfg.max_memory:
            # The model processes' RSS, and this process's where the models run in others (it has
            # imported torch too): max_memory bounds the whole process tree.
            loaded = sum(r.rss for r in cpu_reports)
            if not any(r.in_process for r in cpu_reports):
                loaded += host.get("rss", 0)
            if cfg.max_memory - loaded < budget:
                budget = max(0, cfg.max_memory - loaded)
                why += f", capped by max_memory={fs(cfg.max_memory)} minus {fs(loaded)} already loaded"
        self.lines.append(("host RAM budget", fs(budget), why))
        return budget

    def cpu_replicas(self, cpu_reports: List[LoadReport], room: int, acts: Dict[str, Tuple[int, int]]) -> int:
        """Model processes on the CPU: one per CPU device the user listed, or, for `--device cpu
        --replicas N`, as many of the N as the host budget holds. One process was started and
        measured before planning; each more costs its whole RSS again (the seed's problem: a copy of
        EasyOCR's model in every process exhausted RAM) and its working memory at a batch of one."""
        cfg = self.cfg
        if len(cpu_reports) > 1 or not isinstance(cfg.replicas, int) or cfg.replicas <= 1:
            return len(cpu_reports)
        r, want = cpu_reports[0], cfg.replicas
        one = self.work(acts, {n: 1 for n in acts})

        def need(k: int) -> int:
            return (k - 1) * r.rss + k * one

        formula = (f"{want - 1} more x {fs(r.rss)} (a process's RSS with its models, measured) + {want} x "
                   f"{fs(one)} (a batch of one) = {fs(need(want))}")
        if r.in_process:
            self.too_big(f"replicas={want} on the CPU, but the model runs in this process", "1")
            return 1
        if need(want) <= room:
            self.lines.append(("cpu replicas", str(want), f"set by the user: {formula} <= {fs(room)} of host RAM"))
            return want
        fitting = max((k for k in range(1, want) if need(k) <= room), default=1)
        self.too_big(f"replicas={want} on the CPU: {formula} > {fs(room)} of host RAM", str(fitting))
        self.lines.append(("cpu replicas", str(fitting), f"clamped from {want}: {fitting - 1} more x {fs(r.rss)} + "
                                                          f"{fitting} x {fs(one)} = {fs(need(fitting))} <= {fs(room)}"))
        return fitting

    def plan_cpu(self, cpu_reports: List[LoadReport], host_budget: int) -> List[DevicePlan]:
        """One DevicePlan per CPU device: its model processes (cpu_replicas) and each scorer's
        batch that fits host RAM (or the user's)."""
        cfg = self.cfg
        room = host_budget - WORKER_BASE_BYTES  # leave room for one decode worker
        names = self.names(cpu_reports[0])
        acts = {n: self.act(n) for n in names}
        R = self.cpu_replicas(cpu_reports, room, acts)
        extra = (R - len(cpu_reports)) * cpu_reports[0].rss  # processes not started yet
        limit = {n: math.inf if p == 0 else max(0, ((room - extra) / R - f) // p) for n, (f, p) in acts.items()}
        cap = cfg.cpu_max_batch

        def formula(B: Dict[str, int]) -> str:
            parts = [f"{fs(f)} + {fs(p)} x {B[n]}" for n, (f, p) in acts.items()]
            return f"{R} x " + (f"({parts[0]})" if len(parts) == 1 else "max(" + ", ".join(
                f"{n} {x}" for n, x in zip(acts, parts)) + ")")

        reasons: Dict[str, str] = {}
        if cfg.batch_size == "auto":
            if min(limit.values()) < 1:
                worst = min(limit, key=lambda n: limit[n])
                f, p = acts[worst]
                self.too_big(f"one sample needs {fs(f + p)} of activations on the CPU but "
                             f"{fs(room - extra)} of host RAM is left", None)
            B = {n: max(1, _round_batch(int(min(b, cap)))) for n, b in limit.items()}
            for n in names:
                reasons[n] = (f"capped at cpu_max_batch={cap} (bigger CPU batches are not faster)" if limit[n] >= cap
                              else f"host RAM: {formula(B)} fits {fs(room - extra)}")
        else:
            B = {n: self.user_batch(n, cfg.batch_size) for n in names}
            reasons = {n: "set by the user" for n in names}
            if any(B[n] > limit[n] for n in names):
                clamp = {n: max(1, min(B[n], _round_batch(int(limit[n])))) for n in names}
                need = R * self.work(acts, B)
                self.too_big(f"batch_size={cfg.batch_size} on the CPU: {formula(B)} = {fs(need)} > "
                             f"{fs(room - extra)} of host RAM", ", ".join(f"{n} {b}" for n, b in clamp.items())
                             if len(clamp) > 1 else str(next(iter(clamp.values()))))
                B = clamp
                reasons = {n: "clamped to the host RAM" for n in names}
        self.batch_lines("cpu", B, reasons)
        if cfg.batch_size == "auto":
            self.one_by_one = self.small_batches(B)
            B.update(self.one_by_one)
        need = R * self.work(acts, B) + extra
        per_device = R if len(cpu_reports) == 1 else 1
        return [DevicePlan(r.device, "host", per_device, max(B.values()), None, host_budget, need, dict(B))
                for r in cpu_reports]

    def decode_cores(self, cpu_reports: List[LoadReport], small: Dict[str, int],
                     model_procs: int) -> Tuple[int, str, Optional[float]]:
        """Decode workers the cores allow, why, and the cores decode keeps busy where measured: on
        the CPU the cores are split between decode and model by their measured costs; with GPUs,
        the cores the model processes leave."""
        probe, cpus = self.probe, self.host["cpus"]
        if not cpu_reports:
            return (max(1, cpus - model_procs - 1),
                    f"{cpus} cores minus {model_procs} model process(es) minus the dispatcher", None)
        # Model cost per sample at the batch sizes chosen (a scorer scoring one by one is faster).
        saved = sum(probe.timings[n][1] - probe.timings[n][0] for n in small)
        p, m1 = probe.prepare_seconds, max(0.0, probe.seconds_per_sample - saved) * max(1, probe.threads)
        if cpus <= 1:
            return 0, "one core: decode in the main process", None
        if p > 0 and m1 > 0:
            share = p / (p + m1)
            return (min(max(1, round(cpus * share)), max(1, cpus - model_procs)),
                    f"{cpus} cores split by cost: decode {p * 1000:.1f} ms vs model {m1 * 1000:.1f} core-ms per sample",
                    cpus * share)
        return max(1, cpus - model_procs), f"{cpus} cores minus {model_procs} model process(es)", None

    def decode_workers(self, w_cpu: int, cpu_why: str, left: int, chunk: int) -> Tuple[int, int]:
        """(decode workers, prefetch): cores, shards, then host RAM x prefetch."""
        cfg, probe = self.cfg, self.probe

        def per_worker(prefetch: int) -> int:
            return WORKER_BASE_BYTES + prefetch * chunk * probe.prepared_bytes

        prefetch = 2 if cfg.prefetch == "auto" else cfg.prefetch
        w_ram = max(0, left // per_worker(prefetch))
        if cfg.prefetch == "auto" and w_ram < min(w_cpu, self.n_shards) and left // per_worker(1) > w_ram:
            prefetch, w_ram = 1, max(0, left // per_worker(1))
        if cfg.workers == "auto":
            workers = min(w_cpu, self.n_shards, w_ram)
            why = [cpu_why]
            if workers == self.n_shards and self.n_shards < w_cpu:
                why.append(f"only {self.n_shards} shard(s) to read, one worker each")
            if workers == w_ram and w_ram < w_cpu:
                why.append(f"host RAM allows {w_ram}")
            self.lines.append(("decode workers", str(workers), "; ".join(why)))
        else:
            workers = cfg.workers
            if workers > w_ram:
                self.too_big(f"workers={workers}: {workers} x {fs(per_worker(prefetch))} "
                             f"({fs(WORKER_BASE_BYTES)} estimated base + {prefetch} x {chunk} x "
                             f"{fs(probe.prepared_bytes)} prefetched) = {fs(workers * per_worker(prefetch))} > "
                             f"{fs(left)} of host RAM left", str(w_ram))
                workers = w_ram
            if workers > self.n_shards:
                self.warnings.append(f"workers={workers} but only {self.n_shards} shard(s) to read: each worker "
                                     f"reads whole shards, so {workers - self.n_shards} would idle; using {self.n_shards}")
                workers = self.n_shards
            self.lines.append(("decode workers", str(workers), "set by the user" + (
                " (clamped)" if workers != cfg.workers else "")))
        self.lines.append(("prefetch", f"{prefetch} x {chunk} samples per worker",
                           f"{fs(per_worker(prefetch))} per worker ({fs(WORKER_BASE_BYTES)} estimated base); "
                           f"{fs(workers * per_worker(prefetch))} of {fs(left)} left in the host budget"))
        return workers, prefetch

    def model_threads(self, devices: List[DevicePlan], n_cpu_models: int, workers: int,
                      decode_load: Optional[float]) -> None:
        """On the CPU the model gets the cores the decode workers leave: those they keep busy by
        the measured split (a worker decoding 1% of the time leaves its core to the model: OCR's
        detector, 465 core-ms a sample against 3.6 ms of decode, ran 1.7x faster on 2 threads than
        on 1 beside its one decode worker); a GPU model process gets 2."""
        cpus = self.host["cpus"]
        if n_cpu_models:
            busy = min(workers, decode_load) if decode_load is not None else workers
            threads = max(1, int(round(cpus - busy)) // n_cpu_models)
            for d in devices:
                if d.kind == "host":
                    d.threads = threads
            used = f"{workers} decode worker(s)" if busy == workers else \
                f"the {busy:.2f} core(s) its {workers} decode worker(s) keep busy"
            self.lines.append(("model threads", str(threads), f"{cpus} cores minus {used}"
                               + (f", split over {n_cpu_models} model processes" if n_cpu_models > 1 else "")))
        else:
            for d in devices:
                d.threads = 2  # host-side work of a GPU model process: transfers, Python

    def plan(self) -> Plan:
        """After the measured numbers (input_lines): host RAM, GPUs, CPU batch, queues, decode workers,
        threads, back-off: each step appends its decision and reason to self.lines."""
        probe = self.probe
        gpu_reports = [r for r in self.reports if r.kind != "host"]
        cpu_reports = [r for r in self.reports if r.kind == "host"]
        host_budget = self.host_budget(cpu_reports)
        devices = [self.plan_gpu(r, len(gpu_reports), host_budget) for r in gpu_reports]
        # Extra GPU replicas are new processes: each costs what the first one's RSS shows.
        spent = sum((d.replicas - 1) * r.rss for d, r in zip(devices, gpu_reports) if d.replicas > 1)
        if cpu_reports:
            cpu_devices = self.plan_cpu(cpu_reports, host_budget)
            spent += cpu_devices[0].need
            devices += cpu_devices
        model_procs = sum(d.replicas for d in devices)
        self.queue_share(devices, host_budget, model_procs)
        chunk = max(1, min(max(d.batch_size for d in devices), MAX_CHUNK))
        queued = QUEUE_DEPTH * sum(d.replicas * d.batch_size for d in devices) * probe.prepared_bytes
        spent += queued
        self.lines.append(("model queues", f"{QUEUE_DEPTH} batches per model process",
                           f"{fs(queued)} of prepared samples at most"))
        w_cpu, cpu_why, decode_load = self.decode_cores(cpu_reports, self.one_by_one, model_procs)
        workers, prefetch = self.decode_workers(w_cpu, cpu_why, host_budget - spent, chunk)
        self.model_threads(devices, sum(d.replicas for d in devices if d.kind == "host"), workers, decode_load)
        min_free_host = default_min_free_host(self.cfg, self.host["total"])
        self.lines.append(("back-off", f"halve the batch under {fs(min_free_host)} free host RAM",
                           f"and on every out-of-memory error, only the scorer that ran out; double it again "
                           f"after {GROW_AFTER} sub-batches in a row that fit, up to the plan"))
        return Plan(devices, int(workers), prefetch, chunk, QUEUE_DEPTH, min_free_host, self.lines, self.warnings)

    def queue_share(self, devices: List[DevicePlan], host_budget: int, model_procs: int) -> None:
        """The dispatched batch (samples) is the largest scorer batch, unless the samples queued for
        the model processes at that size would take more than 1/QUEUE_SHARE of the host budget
        (3-frame 720p videos for OCR are ~8 MiB each): then it is cut to what fits that share."""
        per = self.probe.prepared_bytes
        if not per or not model_procs:
            return
        most = max(1, host_budget // QUEUE_SHARE // (QUEUE_DEPTH * model_procs * per))
        for d in devices:
            if d.batch_size > most:
                self.lines.append((f"{d.device} dispatch", f"{_round_batch(int(most))} samples",
                                   f"{QUEUE_DEPTH} x {model_procs} queued batches of the largest scorer batch "
                                   f"({d.batch_size}) x {fs(per)} would take over 1/{QUEUE_SHARE} of the host budget; "
                                   f"scorer batches larger than this many samples' frames are not filled"))
                d.batch_size = _round_batch(int(most))


def default_min_free_host(cfg, host_total: int) -> int:
    """Free host RAM under which the back-off halves batches: the user's, else 3% (>= 256 MiB)."""
    return cfg.min_free_host or max(256 * 2**20, int(0.03 * host_total))


def make_plan(cfg: ScoreConfig, reports: List[LoadReport], probe: ProbeReport, host: dict, n_shards: int) -> Plan:
    """See the module docstring. `host`: {"total", "available", "cpus"} (memory.host_status())."""
    return _Planner(cfg, reports, probe, host, n_shards).plan()
