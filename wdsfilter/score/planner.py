"""The memory planner: from measured numbers to batch size, model replicas per GPU, decode workers.

Inputs, all measured before planning:
  * per device (the report dict of modelworker.ModelRunner.load, from the model worker that
    loaded the scorers there): its free memory before loading (torch.cuda.mem_get_info on GPUs,
    psutil on the host), each model's footprint (memory_allocated after load minus before) and
    what another process costs there;
  * the activation probe (ProbeReport): peak memory above the loaded model for probe batches of
    two sizes (max_memory_allocated), giving bytes per sample and a fixed part, plus the model's
    and the decode side's seconds per sample and the size of one prepared sample;
  * the host (psutil): available RAM and CPU cores, which bound decode workers x prefetch.

make_plan() is a pure function of these numbers and the user's settings, so each rule is tested
on exact inputs; every choice carries the reason printed by `--dry-run`. A user setting that
cannot fit is refused with the numbers (fit="refuse") or clamped with a warning (fit="clamp").
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

from ..errors import ConfigError
from .config import ScoreConfig, format_size as fs

# RAM a decode worker holds besides its prefetched samples (interpreter, imports, one shard's
# tar buffer and a decoded image). An estimate, shown as one in the plan.
WORKER_BASE_BYTES = 256 * 2**20
# Batches queued per model worker: one being scored, one waiting, so the model never idles.
QUEUE_DEPTH = 2
# Samples per DataLoader transfer: big enough to amortise inter-process overhead, small enough
# that workers x prefetch x chunk prepared samples stay modest.
MAX_CHUNK = 64


@dataclass
class ProbeReport:
    samples: int = 0  # prepared samples the probe had (0: none could be prepared)
    scanned: int = 0  # samples read to find them
    sizes: Tuple[int, int] = (0, 0)
    peaks: Dict[str, List[int]] = field(default_factory=dict)  # scorer -> bytes above the model at each size
    # scorer -> bytes its first batch left allocated on the device (workspaces, arenas): model memory
    retained: Dict[str, int] = field(default_factory=dict)
    seconds_per_sample: float = 0.0  # model time at the larger size, all scorers
    # scorer -> seconds/sample on the CPU for the larger probe's inputs: one at a time, then together
    timings: Dict[str, List[float]] = field(default_factory=dict)
    threads: int = 1  # torch threads during that measurement
    prepared_bytes: int = 0  # host bytes of one prepared sample (all scorers)
    prepare_seconds: float = 0.0  # read + decode + prepare per sample, one process
    oom_at: Optional[int] = None
    errors: Dict[str, str] = field(default_factory=dict)  # scorer -> error raised on probe samples

    def activation(self) -> Tuple[int, int]:
        """(fixed bytes, bytes per sample): the line through the two probe points of each scorer;
        scorers run one after the other, so the plan takes the largest of each."""
        fixed = per = 0.0
        s1, s2 = self.sizes
        for points in self.peaks.values():
            if len(points) == 2 and s2 > s1:
                slope = max(0.0, (points[1] - points[0]) / (s2 - s1))
                base = max(0.0, points[0] - slope * s1)
            elif points:  # the larger probe ran out of memory: assume it all scales
                slope, base = points[0] / max(s1, 1), 0.0
            else:
                continue
            fixed, per = max(fixed, base), max(per, slope)
        return int(fixed), int(math.ceil(per))


@dataclass
class DevicePlan:
    device: str
    kind: str
    replicas: int
    batch_size: int
    threads: Optional[int]
    budget: int  # bytes the run may use on this device (after headroom)
    need: int  # bytes the replicas need at this batch size
    # Scorers that run the batch in smaller sub-batches (on the CPU, where the probe found those faster)
    scorer_batch: Dict[str, int] = field(default_factory=dict)


@dataclass
class Plan:
    devices: List[DevicePlan]  # model workers: replicas and batch size per device
    workers: int  # decode workers (DataLoader processes)
    prefetch: int
    chunk: int
    queue_depth: int
    min_free_host: int
    lines: List[Tuple[str, str, str]] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    def describe(self) -> str:
        width = max((len(w) for w, _, _ in self.lines), default=10)
        out = ["plan:"]
        for what, value, why in self.lines:
            out.append(f"  {what:<{width}}  {value}" + (f"  ({why})" if why else ""))
        for w in self.warnings:
            out.append(f"  warning: {w}")
        return "\n".join(out)

    def to_dict(self) -> dict:
        return {"devices": [asdict(d) for d in self.devices], "workers": self.workers, "prefetch": self.prefetch,
                "chunk": self.chunk, "queue_depth": self.queue_depth, "min_free_host": self.min_free_host,
                "lines": [list(line) for line in self.lines], "warnings": list(self.warnings)}


def _round_batch(b: int) -> int:
    """Multiples of 8 above 16 (tensor-core friendly); exact below."""
    return b if b < 16 else b - b % 8


class _Planner:
    def __init__(self, cfg: ScoreConfig, reports: List[dict], probe: ProbeReport, host: dict, n_shards: int):
        self.cfg = cfg
        self.reports = reports
        self.probe = probe
        self.host = host
        self.n_shards = max(1, n_shards)
        self.lines: List[Tuple[str, str, str]] = []
        self.warnings: List[str] = []
        self.fixed, self.per = probe.activation()

    def too_big(self, message: str, clamped_to: Optional[str] = None) -> None:
        """Refuse (ConfigError with the numbers) or warn and go on with the clamped value."""
        if self.cfg.fit == "refuse" or clamped_to is None:
            hint = " Lower the setting, leave it on auto, or pass --fit clamp to clamp it." if clamped_to else ""
            raise ConfigError(f"this cannot fit: {message}.{hint}")
        self.warnings.append(f"{message}; clamped to {clamped_to}")

    # -- models and activations -------------------------------------------------------------
    def describe_inputs(self) -> None:
        seen = set()
        for r in self.reports:
            if r["device"] in seen:
                continue
            seen.add(r["device"])
            parts = ", ".join(f"{n} {fs(b)}" for n, b in r["footprints"].items())
            self.lines.append((f"model on {r['device']}", fs(r["footprint"]),
                               f"measured: memory allocated after loading minus before; {parts}"))
        p = self.probe
        if p.samples:
            self.lines.append(("activations", f"{fs(self.per)}/sample + {fs(self.fixed)}",
                               f"peak memory above the loaded model for probe batches of {p.sizes[0]} and "
                               f"{p.sizes[1]} samples" + ("; the larger ran out of memory" if p.oom_at else "")))
            self.lines.append(("model speed", f"{p.seconds_per_sample * 1000:.2f} ms/sample",
                               f"probe batch of {p.sizes[1]} with {p.threads} thread(s)"))
            self.lines.append(("decode speed", f"{p.prepare_seconds * 1000:.2f} ms/sample",
                               f"read + decode + prepare in one process, over {p.scanned} samples"))
            self.lines.append(("prepared sample", fs(p.prepared_bytes), "host memory of one prepared model input"))
            retained = {n: b for n, b in p.retained.items() if b}
            if retained and any(r["kind"] != "host" for r in self.reports):
                self.lines.append(("warm-up memory", fs(sum(retained.values())),
                                   "left on the device by the first batch (" + ", ".join(
                                       f"{n} {fs(b)}" for n, b in retained.items()) + "; workspaces, arenas): "
                                   "counted with the model"))
            for name, error in p.errors.items():
                self.warnings.append(f"the {name} probe failed ({error}); its activation memory is not measured "
                                     f"and the back-off will handle what does not fit")
        else:
            self.warnings.append(f"none of the first {p.scanned} samples could be prepared, so activation memory "
                                 f"was not measured; the batch size is not memory-checked and the back-off "
                                 f"will halve it on out-of-memory")

    # -- GPU-like devices ----------------------------------------------------------------------
    def plan_gpu(self, r: dict) -> DevicePlan:
        cfg, dev = self.cfg, r["device"]
        budget, why = r["free_before"], f"free {fs(r['free_before'])} of {fs(r['total'])} before loading"
        if cfg.max_memory and cfg.max_memory < budget:
            budget, why = cfg.max_memory, why + f", capped by max_memory={fs(cfg.max_memory)}"
        keep = int(budget * cfg.headroom)
        usable = budget - keep
        retained = sum(self.probe.retained.values())
        F, O, fixed, per = r["footprint"] + retained, r["overhead"], self.fixed, self.per
        self.lines.append((f"{dev} budget", fs(usable), f"{why}; {fs(keep)} ({cfg.headroom:.0%}) kept as headroom"))

        def need(R: int, B: int) -> int:
            return R * (F + fixed + per * B) + (R - 1) * O

        def fit_batch(R: int) -> float:
            room = (usable - (R - 1) * O) / R - F - fixed
            if room < per or room < 0:
                return 0
            return math.inf if per == 0 else room // per

        def formula(R: int, B: int) -> str:
            return (f"{R} x ({fs(F)} model + {fs(fixed)} + {fs(per)} x {B} samples)"
                    + (f" + {R - 1} x {fs(O)} per extra process" + (" (estimated)" if r['overhead_estimated'] else "")
                       if R > 1 else "") + f" = {fs(need(R, B))}")

        cap = cfg.max_batch
        if cfg.replicas == "auto":
            R = 1
            if r["kind"] != "cuda":
                self.lines.append((f"{dev} replicas", "1", "one model process per device"))
            elif fit_batch(1) >= 1 and need(2, cap) <= usable:
                R = 2
                self.lines.append((f"{dev} replicas", "2", f"two model processes overlap one's host-side work with "
                                   f"the other's GPU work, and both fit at batch {cap}: {formula(2, cap)}"))
            else:
                self.lines.append((f"{dev} replicas", "1", "a second model process would not fit at batch "
                                   f"{cap}: {formula(2, cap)} > {fs(usable)}"))
        else:
            R = cfg.replicas
            if need(R, 1) > usable:
                fitting = max((k for k in range(1, R) if need(k, 1) <= usable), default=0)
                self.too_big(f"replicas={R} on {dev}: {formula(R, 1)} > {fs(usable)} usable",
                             str(fitting) if fitting else None)
                R = fitting
            self.lines.append((f"{dev} replicas", str(R), "set by the user" + (" (clamped)" if R != cfg.replicas else "")))
        limit = fit_batch(R)
        if limit < 1:
            raise ConfigError(f"this cannot fit: one sample on {dev} needs {formula(R, 1)} but {fs(usable)} is usable "
                              f"({why}). Free the GPU, raise max_memory, or use a smaller model.")
        if cfg.batch_size == "auto":
            B = _round_batch(int(min(limit, cap)))
            if limit > cap:
                reason = f"capped at max_batch={cap}; memory would allow " + ("any" if limit == math.inf else f"{int(limit)}")
            else:
                reason = f"largest that fits: {formula(R, B)} <= {fs(usable)}"
        else:
            B = cfg.batch_size
            reason = "set by the user"
            if B > limit:
                self.too_big(f"batch_size={B} on {dev}: {formula(R, B)} > {fs(usable)} usable",
                             str(_round_batch(int(limit))))
                B, reason = _round_batch(int(limit)), f"clamped: {formula(R, _round_batch(int(limit)))} fits"
        self.lines.append((f"{dev} batch size", str(B), reason))
        return DevicePlan(dev, r["kind"], R, B, None, usable, need(R, B))

    def small_batches(self, B: int) -> Dict[str, int]:
        """On the CPU a bigger batch is not always faster: a convolutional detector on 2 cores ran
        at 72 frames/s one frame at a time and 38 at 32 (cache-bound). A scorer whose probe ran
        clearly faster per sample at the small size keeps that size; the others use B."""
        small: Dict[str, int] = {}
        n = self.probe.sizes[1]
        for name, (t1, tn) in ((k, t) for k, t in self.probe.timings.items() if len(t) == 2):
            if B > 1 and t1 < 0.8 * tn:
                small[name] = 1
                self.lines.append((f"{name} batch on cpu", "1",
                                   f"probe: the same {n} samples took {t1 * 1000:.2f} ms/sample one at a time, "
                                   f"{tn * 1000:.2f} in one batch: batching does not pay here; the batch of {B} "
                                   f"is scored one by one by {name}"))
        return small

    # -- the host -------------------------------------------------------------------------------
    def host_budget(self, cpu_reports: List[dict]) -> int:
        """Host RAM the run may use: available minus headroom, capped by max_memory on the CPU."""
        cfg, host = self.cfg, self.host
        available = host["available"]
        budget = int(available * (1 - cfg.headroom))
        why = f"psutil: {fs(available)} available of {fs(host['total'])}, {cfg.headroom:.0%} kept as headroom"
        if cpu_reports and cfg.max_memory:
            loaded = sum(r["rss"] for r in cpu_reports)
            if cfg.max_memory - loaded < budget:
                budget = max(0, cfg.max_memory - loaded)
                why += f", capped by max_memory={fs(cfg.max_memory)} minus {fs(loaded)} already loaded"
        self.lines.append(("host RAM budget", fs(budget), why))
        return budget

    def plan_cpu(self, cpu_reports: List[dict], host_budget: int) -> List[DevicePlan]:
        """One DevicePlan per CPU model worker: the batch that fits host RAM (or the user's)."""
        cfg = self.cfg
        R = len(cpu_reports)
        room = host_budget - WORKER_BASE_BYTES  # leave room for one decode worker
        limit = math.inf if self.per == 0 else max(0, (room / R - self.fixed) // self.per)
        cap = cfg.cpu_max_batch
        if cfg.batch_size == "auto":
            B = max(1, _round_batch(int(min(limit, cap))))
            reason = (f"capped at cpu_max_batch={cap} (bigger CPU batches are not faster)" if limit >= cap
                      else f"host RAM: {R} x ({fs(self.fixed)} + {fs(self.per)} x {B}) fits {fs(room)}")
            if limit < 1:
                self.too_big(f"one sample needs {fs(self.fixed + self.per)} of activations on the CPU but "
                             f"{fs(room)} of host RAM is left", None)
        else:
            B, reason = cfg.batch_size, "set by the user"
            if B > limit:
                clamp = max(1, _round_batch(int(limit)))
                self.too_big(f"batch_size={B} on the CPU: {R} x ({fs(self.fixed)} + {fs(self.per)} x {B}) = "
                             f"{fs(R * (self.fixed + self.per * B))} > {fs(room)} of host RAM", str(clamp))
                B, reason = clamp, "clamped to the host RAM"
        self.lines.append(("cpu batch size", str(B), reason))
        small = self.small_batches(B) if cfg.batch_size == "auto" else {}
        need = R * (self.fixed + self.per * B)
        return [DevicePlan(r["device"], "host", 1, B, None, host_budget, need, dict(small)) for r in cpu_reports]

    def decode_cores(self, cpu_reports: List[dict], small: Dict[str, int], model_procs: int) -> Tuple[int, str]:
        """Decode workers the cores allow, and why: on the CPU the cores are split between decode
        and model by their measured costs; with GPUs, the cores the model processes leave."""
        probe, cpus = self.probe, self.host["cpus"]
        if not cpu_reports:
            return (max(1, cpus - model_procs - 1),
                    f"{cpus} cores minus {model_procs} model process(es) minus the dispatcher")
        # Model cost per sample at the batch sizes chosen (a scorer scoring one by one is faster).
        saved = sum(probe.timings[n][1] - probe.timings[n][0] for n in small)
        p, m1 = probe.prepare_seconds, max(0.0, probe.seconds_per_sample - saved) * max(1, probe.threads)
        if cpus <= 1:
            return 0, "one core: decode in the main process"
        if p > 0 and m1 > 0:
            share = p / (p + m1)
            return (min(max(1, round(cpus * share)), max(1, cpus - model_procs)),
                    f"{cpus} cores split by cost: decode {p * 1000:.1f} ms vs model {m1 * 1000:.1f} core-ms per sample")
        return max(1, cpus - model_procs), f"{cpus} cores minus {model_procs} model process(es)"

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

    def model_threads(self, devices: List[DevicePlan], n_cpu_models: int, workers: int) -> None:
        """On the CPU the model gets the cores the decode workers leave; a GPU model process 2."""
        cpus = self.host["cpus"]
        if n_cpu_models:
            threads = max(1, (cpus - workers) // n_cpu_models)
            for d in devices:
                if d.kind == "host":
                    d.threads = threads
            self.lines.append(("model threads", str(threads), f"{cpus} cores minus {workers} decode worker(s)"
                               + (f", split over {n_cpu_models} model processes" if n_cpu_models > 1 else "")))
        else:
            for d in devices:
                d.threads = 2  # host-side work of a GPU model process: transfers, Python

    def plan(self) -> Plan:
        """Models and activations, GPUs, host RAM, CPU batch, queues, decode workers, threads,
        back-off: each step appends its decision and reason to self.lines."""
        probe = self.probe
        self.describe_inputs()
        gpu_reports = [r for r in self.reports if r["kind"] != "host"]
        cpu_reports = [r for r in self.reports if r["kind"] == "host"]
        devices = [self.plan_gpu(r) for r in gpu_reports]
        host_budget = self.host_budget(cpu_reports)
        # Extra GPU replicas are new processes: each costs what the first one's RSS shows.
        spent = sum((d.replicas - 1) * r["rss"] for d, r in zip(devices, gpu_reports) if d.replicas > 1)
        small: Dict[str, int] = {}
        if cpu_reports:
            cpu_devices = self.plan_cpu(cpu_reports, host_budget)
            small = cpu_devices[0].scorer_batch
            spent += cpu_devices[0].need
            devices += cpu_devices
        model_procs = sum(d.replicas for d in devices)
        chunk = max(1, min(max(d.batch_size for d in devices), MAX_CHUNK))
        queued = QUEUE_DEPTH * sum(d.replicas * d.batch_size for d in devices) * probe.prepared_bytes
        spent += queued
        self.lines.append(("model queues", f"{QUEUE_DEPTH} batches per model process",
                           f"{fs(queued)} of prepared samples at most"))
        w_cpu, cpu_why = self.decode_cores(cpu_reports, small, model_procs)
        workers, prefetch = self.decode_workers(w_cpu, cpu_why, host_budget - spent, chunk)
        self.model_threads(devices, len(cpu_reports), workers)
        min_free_host = default_min_free_host(self.cfg, self.host["total"])
        self.lines.append(("back-off", f"halve the batch under {fs(min_free_host)} free host RAM",
                           "and on every out-of-memory error"))
        return Plan(devices, int(workers), prefetch, chunk, QUEUE_DEPTH, min_free_host, self.lines, self.warnings)


def default_min_free_host(cfg, host_total: int) -> int:
    """Free host RAM under which the back-off halves batches: the user's, else 3% (>= 256 MiB)."""
    return cfg.min_free_host or max(256 * 2**20, int(0.03 * host_total))


def make_plan(cfg: ScoreConfig, reports: List[dict], probe: ProbeReport, host: dict, n_shards: int) -> Plan:
    """See the module docstring. `host`: {"total", "available", "cpus"} (memory.host_status())."""
    return _Planner(cfg, reports, probe, host, n_shards).plan()
