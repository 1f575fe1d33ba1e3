"""Training throughput: bytes/s, model FLOP/s, MFU and peak memory of the real training step.

A :class:`Bench` builds a model exactly as ``rltok train`` does (preset, method, overrides, real
data through the stateless loader) and times :class:`rltok.train.TrainStep`, the same step the
training loop runs. Model FLOPs are counted analytically (:mod:`rltok.flops`) at the achieved
boundary rate; MFU divides the achieved model FLOP/s by a peak:

* on CPU: dense matmuls at the model's own shapes (the byte layers' projections at the
  micro-batch's byte count), measured in the same process in the dtype the step runs in (bf16
  or fp32, ``auto`` resolved by :mod:`rltok.precision`); an MFU is never above 100%: where the
  measured peak is below the achieved rate the table says the measurement failed instead;
* on a GPU: the data-sheet dense bf16 (or fp32) peak of known devices, with the measured matmul
  peak reported beside it.

Several methods are measured side by side with :func:`run_interleaved`: their steps alternate,
so machine noise hits all of them alike, and the step-time ratio is a paired comparison.
"""

from __future__ import annotations

import math
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .schema import RunConfig
from .config import build_config
from .distributed import DistInfo, resolve_device
from .errors import RltokError
from .flops import training_flops_per_byte
from .data import load_splits
from .data.loader import SequenceDataset
from .run import build_model, load_model, read_config
from .train import TrainStep, batch_layout, make_optimizer
from .syncs import SyncCounter, force_accelerator_path

# Dense (no sparsity) tensor-core peaks from the vendors' data sheets, FLOP/s: (bf16, fp32).
# Matched as substrings of torch.cuda.get_device_name(), first match wins.
DATASHEET_PEAKS: tuple[tuple[str, float, float], ...] = (
    ("H200 NVL", 835e12, 60e12),
    ("H200", 989.4e12, 67e12),
    ("H100 NVL", 835e12, 60e12),
    ("H100 PCIe", 756e12, 51e12),
    ("H100", 989.4e12, 67e12),  # SXM
    ("GH200", 989.4e12, 67e12),
    ("B200", 2250e12, 80e12),
    ("A100", 312e12, 19.5e12),
    ("L40S", 362e12, 91.6e12),
    ("L4", 121e12, 30.3e12),
    ("A10", 125e12, 31.2e12),
    ("RTX A6000", 154.8e12, 38.7e12),
    ("RTX 4090", 165.2e12, 82.6e12),
    ("RTX 3090", 71e12, 35.6e12),
)


def datasheet_peak(device: torch.device, dtype: str) -> tuple[float | None, str]:
    """(peak FLOP/s, device name) for a known GPU; (None, name) otherwise."""
    if device.type != "cuda":
        return None, "cpu"
    name = torch.cuda.get_device_name(device)
    for key, bf16, fp32 in DATASHEET_PEAKS:
        if key in name:
            return (bf16 if dtype == "bf16" else fp32), name
    return None, name


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_matmul_shapes(cfg: RunConfig) -> list[tuple[int, int, int]]:
    """(rows, k, n) of the byte layers' matmuls in one micro-step: attention projections and the
    feed-forward pair at the micro-batch's byte count (capped at 8,192 rows: the rate per row is
    flat beyond that, and an emulated bf16 matmul should not take minutes)."""
    d = cfg.model.d_model
    micro = cfg.train.micro_batch or cfg.train.batch_size
    rows = min(8192, micro * cfg.model.seq_len)
    return [(rows, d, 3 * d), (rows, d, 4 * d), (rows, 4 * d, d)]


def measure_matmul_peak(device: torch.device, dtype: str = "bf16", seconds: float = 1.0,
                        n: int | None = None, shapes: list[tuple[int, int, int]] | None = None) -> float:
    """Dense matmul FLOP/s in ``dtype`` on ``device``: the best over ``shapes`` ((rows, k, n);
    default one square ``n``) of repeated timings, ``seconds`` in all."""
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    n = n or (8192 if device.type == "cuda" else 1024)
    shapes = shapes or [(n, n, n)]
    g = torch.Generator(device="cpu").manual_seed(0)
    rate = 0.0
    for rows, k, cols in shapes:
        a = torch.randn(rows, k, generator=g).to(device=device, dtype=tdtype)
        b = torch.randn(k, cols, generator=g).to(device=device, dtype=tdtype)
        flop = 2.0 * rows * k * cols
        for _ in range(2):  # warm-up (kernel selection, clocks)
            a @ b
        _sync(device)
        best = math.inf
        t_end = time.perf_counter() + seconds / len(shapes)
        while time.perf_counter() < t_end or best == math.inf:
            reps = 10 if device.type == "cuda" else 1
            t0 = time.perf_counter()
            for _ in range(reps):
                a @ b
            _sync(device)
            best = min(best, (time.perf_counter() - t0) / reps)
        rate = max(rate, flop / best)
    return rate


def honest_mfu(achieved: float, peak: float | None) -> float | None:
    """achieved / peak, or None where the peak is unknown or below what the model reached (a
    peak measurement that failed: no utilisation is above 100%)."""
    if not peak or achieved > peak:
        return None
    return achieved / peak


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA: the most memory allocated since the last reset. CPU: the process's max RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(kb * (1 if sys.platform == "darwin" else 1024))


@dataclass
class BenchResult:
    method: str
    preset: str
    device: str
    dtype: str
    compile: bool
    params: int
    bytes_per_step: int
    steps: int
    step_s: float  # median step time
    step_s_min: float
    bytes_per_s: float
    rate: float  # achieved boundaries per byte
    train_flops_per_byte: float
    model_flops_per_s: float
    peak_flops: float | None
    peak_source: str
    mfu: float | None
    matmul_peak_measured: float | None = None
    mfu_vs_measured: float | None = None
    peak_memory_bytes: int = 0
    times: list[float] = field(default_factory=list)

    def to_dict(self, times: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not times:
            d.pop("times")
        return d


class Bench:
    """One method's model, optimizer, data and training step, ready to be timed."""

    def __init__(self, method: str, preset: str, overrides: dict[str, Any] | None = None,
                 device: str = "auto", splits=None, init_from: str | None = None):
        from .parallel import compile_blocks

        over = dict(overrides or {})
        over.setdefault("train.device", device)
        self.cfg: RunConfig = build_config(method, preset, overrides=over)
        cfg = self.cfg
        self.device = resolve_device(cfg.train.device)
        info = DistInfo(device=self.device)
        torch.manual_seed(cfg.train.seed)
        self.splits = splits if splits is not None else load_splits(cfg)
        self.model = build_model(cfg, None).to(self.device)
        if init_from is not None:  # a trained run's weights: its boundaries run at the learned rate

            try:
                self.model.load_state_dict(load_model(init_from).state_dict())
            except RuntimeError:  # parameter names or shapes differ
                raise RltokError(f"--init-from {init_from}: its model does not match the {preset} "
                                 f"preset's {method} model (train it with --preset {preset})") from None
        if cfg.train.compile:
            compile_blocks(self.model)
        self.model.train()
        opt = make_optimizer(self.model, cfg)
        dataset = SequenceDataset(self.splits.train, cfg.model.seq_len, cfg.train.seed, cfg.data.packing)
        self.step_fn = TrainStep(self.model, self.model, opt, cfg, info, dataset, batch_layout(cfg, 1))
        self.next_step = 0
        self.times: list[float] = []
        self.counts: list[tuple[torch.Tensor, torch.Tensor]] = []

    def step(self, record: bool = True) -> float:
        """Run one optimizer step; returns its wall time (synchronised on CUDA)."""
        _sync(self.device)
        t0 = time.perf_counter()
        out = self.step_fn(self.next_step, self.cfg.train.lr)
        _sync(self.device)
        dt = time.perf_counter() - t0
        self.next_step += 1
        if record:
            self.times.append(dt)
            nb = sum(st["n_boundary"] for st in out.stats)
            nv = sum(st["n_valid"] for st in out.stats)
            self.counts.append((nb, nv))
        return dt

    def result(self, peak: float | None, peak_source: str, measured: float | None) -> BenchResult:
        cfg = self.cfg
        nb = float(sum(float(c[0]) for c in self.counts))
        nv = float(sum(float(c[1]) for c in self.counts))
        rate = nb / max(nv, 1.0)
        fpb = training_flops_per_byte(self.model, cfg, rate).per_byte
        med = statistics.median(self.times)
        bps = cfg.bytes_per_step / med
        achieved = fpb * bps
        return BenchResult(
            method=cfg.method, preset=cfg.preset, device=str(self.device), dtype=self.step_fn.dtype.dtype,
            compile=cfg.train.compile, params=sum(p.numel() for p in self.model.parameters()),
            bytes_per_step=cfg.bytes_per_step, steps=len(self.times), step_s=med, step_s_min=min(self.times),
            bytes_per_s=bps, rate=rate, train_flops_per_byte=fpb, model_flops_per_s=achieved,
            peak_flops=peak, peak_source=peak_source + (" (below the achieved rate: the peak measurement "
                                                        "failed, no MFU)" if peak and achieved > peak else ""),
            mfu=honest_mfu(achieved, peak),
            matmul_peak_measured=measured, mfu_vs_measured=honest_mfu(achieved, measured),
            peak_memory_bytes=peak_memory_bytes(self.device), times=list(self.times))


def run_interleaved(methods: list[str], preset: str, steps: int = 10, warmup: int = 2,
                    overrides: dict[str, Any] | None = None, device: str = "auto",
                    progress: bool = True, peak_seconds: float = 1.0,
                    init_from: list[str] | None = None) -> list[BenchResult]:
    """Time ``steps`` training steps of each method, alternating between the methods step by
    step after ``warmup`` untimed steps each. The matmul peak is measured before and after (the
    mean is used), in the same process."""
    first = build_config(methods[0], preset, overrides={**(overrides or {}), "train.device": device})
    splits = load_splits(first)  # every method reads the same documents

    runs = {read_config(r).method: r for r in (init_from or [])}
    benches = [Bench(m, preset, overrides, device, splits=splits, init_from=runs.get(m)) for m in methods]
    dev = benches[0].device
    dtype = benches[0].step_fn.dtype.dtype  # train.dtype with auto resolved (precision.py)
    shapes = model_matmul_shapes(benches[0].cfg) if dev.type == "cpu" else None
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    for b in benches:
        for _ in range(warmup):
            b.step(record=False)
    measured = [measure_matmul_peak(dev, dtype, peak_seconds, shapes=shapes)]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=steps * len(benches), desc="bench " + "/".join(methods), unit="step",
                   file=sys.stderr, dynamic_ncols=True)
    for i in range(steps):
        order = benches if i % 2 == 0 else benches[::-1]  # neither always goes first
        for b in order:
            b.step()
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    measured.append(measure_matmul_peak(dev, dtype, peak_seconds, shapes=shapes))
    mpeak = sum(measured) / len(measured)
    sheet, name = datasheet_peak(dev, dtype)
    if sheet is not None:
        peak, source = sheet, f"data sheet dense {dtype} ({name})"
    else:
        peak, source = mpeak, f"measured dense {dtype} matmul at the model's shapes ({name})"
    return [b.result(peak, source, mpeak) for b in benches]


def format_table(results: list[BenchResult]) -> str:
    head = ("method", "step s", "bytes/s", "rate", "MFLOP/B", "TFLOP/s", "MFU", "mem MB")
    rows = []
    for r in results:
        rows.append((r.method, f"{r.step_s:.4f}", f"{r.bytes_per_s:,.0f}", f"{r.rate:.3f}",
                     f"{r.train_flops_per_byte / 1e6:.1f}", f"{r.model_flops_per_s / 1e12:.3f}",
                     f"{100 * r.mfu:.1f}%" if r.mfu is not None else "-",
                     f"{r.peak_memory_bytes / 2**20:,.0f}"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]
    r0 = results[0]
    out.append(f"preset {r0.preset}, {r0.device}, {r0.dtype}{', compiled' if r0.compile else ''}, "
               f"{r0.bytes_per_step:,} bytes/step, median of {r0.steps} steps; peak "
               f"{r0.peak_flops / 1e12:.2f} TFLOP/s ({r0.peak_source})"
               + (f"; measured matmul {r0.matmul_peak_measured / 1e12:.2f} TFLOP/s"
                  if r0.matmul_peak_measured and "measured" not in r0.peak_source else ""))
    if len(results) > 1:
        base = results[-1]
        for r in results[:-1]:
            ratio = statistics.median(a / b for a, b in zip(r.times, base.times))
            out.append(f"step time {r.method} / {base.method}: {ratio:.3f} (median of paired steps)")
    return "\n".join(out)


# -- host syncs of one step (rltok/syncs.py counts them) ---------------------------------------

@dataclass
class StepSyncs:
    method: str
    preset: str
    syncs: int
    sites: dict[str, int] = field(default_factory=dict)


def count_step_syncs(method: str, preset: str, overrides: dict | None = None, *, device: str = "cpu",
                     accelerator: bool = True, warmup: int = 1, splits=None) -> StepSyncs:
    """Syncs in one optimizer step of ``method`` at ``preset`` (after ``warmup`` steps), with the
    CPU taking the accelerator's branches when ``accelerator``."""
    with force_accelerator_path(accelerator):
        bench = Bench(method, preset, overrides, device, splits=splits)
        for _ in range(warmup):
            bench.step(record=False)
        with SyncCounter() as sc:
            bench.step_fn(bench.next_step, bench.cfg.train.lr)
    return StepSyncs(method, preset, len(sc.events), sc.by_site())
