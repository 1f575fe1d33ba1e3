"""The compute dtype: bf16 or fp32, chosen by what this machine runs faster.

``train.dtype = "auto"`` (the default) means bf16 autocast on a GPU and, on a CPU, whichever of
bf16 and fp32 multiplies the model's own matrix shapes faster here. The answer differs by a
factor of 100 between CPUs: an AMX Xeon or an AVX-512-BF16 EPYC runs bf16 matmuls 1.6x faster than
fp32, while a CPU without bf16 instructions (AVX2 only: most laptops, many cloud and CI runners)
emulates them and ran the ``tiny`` step 8.5x slower in bf16 (24.95 s against 2.94 s). So the
choice is measured, not guessed from the preset:

* a probe times ``x @ W`` at the shape of the model's feed-forward layer (rows x d -> 4d, rows
  chosen so one repetition is ~25 MFLOP), a few repetitions in fp32 and in bf16, in well under a
  second, and stops the bf16 timing early once it is clearly the slower;
* bf16 is chosen only when it is at least ``BF16_MARGIN`` faster (fp32 is the more exact of two
  near-equal options);
* the answer is cached per machine (CPU model, instruction-set flags, torch version, threads and
  shape) in ``$RLTOK_CACHE/dtype-probe.json``, and per process in memory.

An explicit ``bf16`` or ``fp32`` is always kept; :func:`explicit_warning` says in one line when
the kept one is the slower here. Every entry point (train, eval, tasks, generate, bench, compare,
the API) resolves ``auto`` through :func:`resolve_dtype`, usually via
:func:`autocast_for`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

DTYPES = ("auto", "bf16", "fp32")
BF16_MARGIN = 1.1  # bf16 must be this many times faster than fp32 to be chosen on a CPU
PROBE_FILE = "dtype-probe.json"
# what ``auto`` picks on a CPU, without a probe: for work that must run in one dtype on every
# machine (the test suite pins fp32 so its numbers do not depend on the CPU it gets)
PIN_ENV = "RLTOK_CPU_DTYPE"
DEFAULT_D_MODEL = 256  # the probe's width when the caller does not know the model's


@dataclass(frozen=True)
class DtypeChoice:
    dtype: str  # "bf16" or "fp32": what runs
    requested: str  # "auto", "bf16" or "fp32"
    reason: str  # why, in a few words
    bf16_flops: float | None = None  # measured matmul FLOP/s at the model's shapes (CPU probe)
    fp32_flops: float | None = None

    @property
    def faster(self) -> str | None:
        """The dtype the probe found faster, or None where nothing was measured."""
        if self.bf16_flops is None or self.fp32_flops is None:
            return None
        return "bf16" if self.bf16_flops >= BF16_MARGIN * self.fp32_flops else "fp32"

    def describe(self) -> str:
        """The start-up line, e.g. ``dtype: fp32 (bf16 matmul 0.001 TFLOP/s, fp32 0.06: ...)``."""
        if self.bf16_flops is None or self.fp32_flops is None:
            return f"dtype: {self.dtype} ({self.reason})"
        rates = f"bf16 matmul {_tflops(self.bf16_flops)} TFLOP/s, fp32 {_tflops(self.fp32_flops)}"
        return f"dtype: {self.dtype} ({rates}: {self.reason})"


def _tflops(x: float) -> str:
    return f"{x / 1e12:.3g}"


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]] | None:
    """(model name, flags) of the first CPU in /proc/cpuinfo, read once per process (the probe's
    cache key is computed on every autocast, i.e. per evaluation batch); None where unreadable."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    model = ""
    for line in text.splitlines():
        if line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            return model, frozenset(line.split(":", 1)[1].split())
    return None


def cpu_has_bf16_instructions() -> bool | None:
    """True where the CPU advertises native bf16 arithmetic (AVX-512-BF16 or AMX-BF16), False
    where it does not, None where the flags cannot be read (not Linux x86)."""
    info = _cpuinfo()
    return None if info is None else bool(info[1] & {"avx512_bf16", "amx_bf16"})


def _machine_key(threads: int, rows: int, d: int) -> str:
    cpu = platform.processor() or platform.machine()
    info = _cpuinfo()
    if info is not None:
        cpu += f"|{info[0]}|{' '.join(sorted(info[1]))}"
    digest = hashlib.sha1(cpu.encode()).hexdigest()[:16]
    cap = torch.backends.cpu.get_cpu_capability()
    return f"{digest}|{cap}|torch {torch.__version__}|threads {threads}|{rows}x{d}x{4 * d}"


def probe_shapes(d_model: int) -> tuple[int, int]:
    """(rows, d) of the probe: the model's width, rows chosen so one repetition stays near
    25 MFLOP (about 25 ms where bf16 is emulated at ~1 GFLOP/s)."""
    d = max(8, int(d_model))
    rows = int(max(8, min(512, 25e6 / (2 * d * 4 * d))))
    return rows, d


def measure_matmul_rates(d_model: int = DEFAULT_D_MODEL, budget_s: float = 0.4) -> tuple[float, float]:
    """(bf16, fp32) FLOP/s of the feed-forward matmuls at width ``d_model`` on this CPU: the best
    of a few repetitions each, the bf16 side cut short once it is clearly the slower."""
    rows, d = probe_shapes(d_model)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, d, generator=g)
    w = torch.randn(d, 4 * d, generator=g) / d ** 0.5
    flop = 2.0 * rows * d * 4 * d

    def best(dt: torch.dtype, reps: int, stop_after: float | None) -> float:
        a, b = x.to(dt), w.to(dt)
        a @ b  # warm-up: kernel selection, packing
        t_best, spent = float("inf"), 0.0
        for _ in range(reps):
            t0 = time.perf_counter()
            a @ b
            dt_s = time.perf_counter() - t0
            t_best, spent = min(t_best, dt_s), spent + dt_s
            if stop_after is not None and spent > stop_after:
                break
        return flop / t_best

    with torch.no_grad():
        fp32 = best(torch.float32, 8, budget_s / 2)
        # one fp32 repetition's time x 8 is plenty to tell a 1.6x gain from an 8x loss
        bf16 = best(torch.bfloat16, 8, min(budget_s / 2, 8 * flop / fp32))
    return bf16, fp32


_memo: dict[str, tuple[float, float]] = {}


def _cache_path() -> Path:
    return Path(os.environ.get("RLTOK_CACHE", Path.home() / ".cache" / "rltok")) / PROBE_FILE


def cpu_matmul_rates(d_model: int = DEFAULT_D_MODEL) -> tuple[float, float]:
    """(bf16, fp32) FLOP/s at the model's shapes, from the per-process memo, else the machine's
    cache file, else a fresh measurement (then written to both)."""
    key = _machine_key(torch.get_num_threads(), *probe_shapes(d_model))
    if key in _memo:
        return _memo[key]
    path = _cache_path()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if not isinstance(cached, dict):
        cached = {}
    hit = cached.get(key)
    if isinstance(hit, dict) and hit.get("bf16", 0) > 0 and hit.get("fp32", 0) > 0:
        _memo[key] = (float(hit["bf16"]), float(hit["fp32"]))
        return _memo[key]
    bf16, fp32 = measure_matmul_rates(d_model)
    _memo[key] = (bf16, fp32)
    cached[key] = {"bf16": bf16, "fp32": fp32, "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:  # a cache that cannot be written costs one probe per process, nothing else
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cached, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass
    return bf16, fp32


def _why(bf16: float, fp32: float, chosen: str) -> str:
    native = cpu_has_bf16_instructions()
    if chosen == "fp32":
        if native is False:
            return "this CPU has no bf16 instructions"
        return f"fp32 is the faster here (bf16 needs {BF16_MARGIN:g}x to be chosen)"
    return f"bf16 is {bf16 / fp32:.2g}x faster here" + (" (native bf16 instructions)" if native else "")


def resolve_dtype(device: torch.device | str, requested: str = "auto",
                  d_model: int = DEFAULT_D_MODEL) -> DtypeChoice:
    """The dtype to run in. ``auto``: bf16 on CUDA (fp32 where the GPU has no bf16), fp32 on
    other accelerators, and on a CPU the faster of bf16 and fp32 at the model's width. An
    explicit ``bf16``/``fp32`` is kept (with the probe's rates on a CPU, for the warning)."""
    if requested not in DTYPES:
        from .errors import RltokError

        raise RltokError(f"dtype {requested!r}: choose one of {', '.join(DTYPES)}")
    dev = torch.device(device)
    if dev.type == "cuda":
        if requested != "auto":
            return DtypeChoice(requested, requested, "as requested")
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return DtypeChoice("bf16" if ok else "fp32", "auto", "GPU" + ("" if ok else " without bf16"))
    if dev.type != "cpu":
        return DtypeChoice("fp32" if requested == "auto" else requested, requested,
                           "as requested" if requested != "auto" else f"{dev.type}: fp32")
    pinned = os.environ.get(PIN_ENV, "").strip()
    if pinned:
        if pinned not in ("bf16", "fp32"):
            from .errors import RltokError

            raise RltokError(f"{PIN_ENV}={pinned!r}: set it to bf16 or fp32, or unset it")
        if requested == "auto":
            return DtypeChoice(pinned, "auto", f"{PIN_ENV}={pinned}")
        return DtypeChoice(requested, requested, "as requested")
    bf16, fp32 = cpu_matmul_rates(d_model)
    if requested != "auto":
        return DtypeChoice(requested, requested, "as requested", bf16, fp32)
    chosen = "bf16" if bf16 >= BF16_MARGIN * fp32 else "fp32"
    return DtypeChoice(chosen, "auto", _why(bf16, fp32, chosen), bf16, fp32)


def explicit_warning(choice: DtypeChoice) -> str | None:
    """One line where an explicitly requested dtype is the slower one here, else None."""
    if choice.requested == "auto" or choice.faster is None or choice.faster == choice.dtype:
        return None
    slow, fast = ((choice.bf16_flops, choice.fp32_flops) if choice.dtype == "bf16"
                  else (choice.fp32_flops, choice.bf16_flops))
    return (f"warning: dtype {choice.dtype} was requested, but {choice.faster} multiplies this model's "
            f"matrices {fast / slow:.2g}x faster here (bf16 {_tflops(choice.bf16_flops)} TFLOP/s, fp32 "
            f"{_tflops(choice.fp32_flops)}); train.dtype=auto picks the faster")


_warned: set[str] = set()


def warning_once(choice: DtypeChoice) -> str | None:
    """:func:`explicit_warning`, the first time in this process for that dtype; else None."""
    warning = explicit_warning(choice)
    if warning is None or choice.dtype in _warned:
        return None
    _warned.add(choice.dtype)
    return warning


def autocast_for(device: torch.device, dtype: str, d_model: int | None = None):
    """Autocast context for ``dtype`` on ``device`` (``auto``: the faster of bf16 and fp32 here, for
    a model of width ``d_model``, default :data:`DEFAULT_D_MODEL`). An explicit bf16 that is the
    slower on this CPU (e.g. an older run's config) runs as asked, with one line on stderr per
    process."""
    device = torch.device(device)
    d_model = d_model or DEFAULT_D_MODEL
    if dtype == "auto":
        dtype = resolve_dtype(device, "auto", d_model).dtype
    elif dtype == "bf16" and device.type == "cpu" and "bf16" not in _warned:
        warning = warning_once(resolve_dtype(device, "bf16", d_model))
        if warning:
            print(f"rltok: {warning}", file=sys.stderr)
    if dtype == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()


def as_record(choice: DtypeChoice) -> dict:
    return asdict(choice)


autocast = autocast_for  # the name tests and older callers use
