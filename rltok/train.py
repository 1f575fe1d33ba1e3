"""The training loop: one path for one process and for ``torchrun`` (nanoGPT-style).

Per optimizer step: for each accumulation micro-step, build the batch for this rank from the step
number (see data/loader.py), run the method's loss under autocast, backpropagate; then clip, check
that the loss and gradient are finite (a non-finite step is skipped, counted and logged), step
AdamW with the byte-based warmup + cosine learning rate. Metrics go to RUN/metrics.jsonl;
checkpoints are written atomically; SIGINT/SIGTERM stop at the next step boundary with a
checkpoint (exit 130/143; under torchrun the ranks vote every step and stop together, and a
worker whose agent died stops too); a second SIGINT aborts at once. Resuming takes the newest
checkpoint that verifies and loads. docs/robustness.md lists what survives what.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import checkpoint as ckpt
from .metrics import MetricsLog
from .schema import RunConfig
from .data import load_splits
from .data.corpus import Splits
from .data.loader import SequenceDataset
from .distributed import DistInfo, StopVote, init_distributed, launched_by_torchrun
from .errors import NonFiniteError, RltokError
from .evaluate import evaluate_corpus
from .objectives import ratios, training_loss
from .precision import DtypeChoice, autocast_for, resolve_dtype, warning_once
from .run import CONFIG, METRICS, MODEL, SUMMARY, RunLock, build_model, check_weights, is_run, read_config, write_config
from .rates import off_policy, requested_rate, schedule_of
from .threads import describe_current

from .signals import EXIT_SIGINT, EXIT_SIGTERM  # noqa: F401  (documented exit statuses)
from .signals import StopRequest as _StopRequest
from .flops import format_flops, training_flops_per_byte
from .methods import get_method


def lr_at(bytes_seen: float, cfg: RunConfig, total_bytes: float) -> float:
    """Linear warmup from warmup_start_ratio * lr to lr, then cosine to min_lr_ratio * lr."""
    t = cfg.train
    warm = min(t.warmup_bytes, total_bytes)
    if bytes_seen < warm:
        return t.lr * (t.warmup_start_ratio + (1 - t.warmup_start_ratio) * bytes_seen / warm)
    progress = min(1.0, (bytes_seen - warm) / max(1.0, total_bytes - warm))
    return t.lr * (t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def StopRequest() -> _StopRequest:
    """First SIGINT/SIGTERM: stop at the next step boundary. Second SIGINT: abort now."""
    return _StopRequest(
        first="stopping after this step (press Ctrl-C again to abort without a checkpoint)",
        second="aborting now, without a final checkpoint (--resume continues from the newest one on disk)")


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    bytes_seen: int
    exit_code: int = 0
    summary: dict[str, Any] = field(default_factory=dict)


def _round(x: float) -> float:
    return float(f"{x:.6g}") if math.isfinite(x) else x


def prepare_run_dir(cfg: RunConfig, out: Path, resume: bool) -> RunConfig:
    """Create RUN or open it for resuming. Returns the config to use."""
    if resume:
        if not is_run(out):
            raise RltokError(f"--resume: {out} is not a run (no {CONFIG})")
        saved = read_config(out)
        # the training length may be extended on resume; everything else comes from the run
        saved.train.total_bytes = cfg.train.total_bytes
        saved.train.max_steps = cfg.train.max_steps
        # so may how it executes (not what it computes): e.g. resume a DDP run under FSDP
        for k in ("device", "parallel", "compile", "fullgraph"):
            setattr(saved.train, k, getattr(cfg.train, k))
        return saved.validate()
    if is_run(out):
        raise RltokError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    return cfg


@dataclass
class Layout:
    """How the global batch is cut: per rank, per micro-step."""

    per_rank: int
    micro: int
    accum: int


def batch_layout(cfg: RunConfig, world: int) -> Layout:
    t = cfg.train
    if t.batch_size % world:
        raise RltokError(f"train.batch_size={t.batch_size} must be divisible by the number of processes ({world})")
    per_rank = t.batch_size // world
    micro = t.micro_batch or per_rank
    if per_rank % micro:
        raise RltokError(f"train.micro_batch={micro} must divide the per-process batch ({per_rank} = "
                         f"train.batch_size {t.batch_size} / {world} processes)")
    return Layout(per_rank=per_rank, micro=micro, accum=per_rank // micro)


def make_optimizer(model: nn.Module, cfg: RunConfig) -> torch.optim.Optimizer:
    """AdamW, fused where the device supports it: one kernel for all parameters, and a
    non-finite step is skipped on the device (``found_inf``) without a host round trip."""
    t = cfg.train
    kw = dict(lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, weight_decay=t.weight_decay)
    params = [p for p in model.parameters() if p.requires_grad]  # not a frozen entropy model
    try:
        return torch.optim.AdamW(params, fused=True, **kw)
    except (RuntimeError, TypeError, ValueError):  # a device without the fused kernel
        return torch.optim.AdamW(params, **kw)


@dataclass
class TrainStepOutput:
    loss: torch.Tensor  # mean training loss over this rank's micro-steps (device scalar)
    grad_norm: torch.Tensor  # global gradient norm before clipping
    skipped: torch.Tensor  # 1.0 if the update was skipped (non-finite on any rank), else 0.0
    stats: list[dict[str, torch.Tensor]]  # per micro-step statistics (device tensors)


def train_dtype(cfg: RunConfig, info: DistInfo) -> DtypeChoice:
    """train.dtype with ``auto`` resolved on this machine; processes of one run agree (fp32 if
    any of them found fp32 the faster)."""
    choice = resolve_dtype(info.device, cfg.train.dtype, cfg.model.d_model)
    if info.enabled and cfg.train.dtype == "auto" and info.device.type == "cpu":
        if info.any(choice.dtype == "fp32") and choice.dtype == "bf16":
            choice = replace(choice, dtype="fp32", reason="another process of this run found fp32 the faster")
    return choice


class TrainStep:
    """One optimizer step: forward/backward over the accumulation micro-steps of this rank's
    slice of the global batch, gradient clipping, a finite check and AdamW. Shared by the
    training loop and ``rltok bench``.

    Host-device synchronisation (rltok/syncs.py counts it): with static chunk shapes (the
    accelerator path, rltok/model/static.py) one per optimizer step, which reads whether a
    micro-batch exceeded the chunk caps (then the update is skipped on the device and the step
    repeated with larger caps). With dynamic shapes (the CPU) the model reads the longest chunk
    count per micro-step instead (``chunk_indices``). The finite check stays on the device: a
    fused AdamW skips the update when ``found_inf`` is set; the loop reads the flags at log
    intervals. (An optimizer without the fused kernel needs the one sync for it.)
    """

    def __init__(self, model: nn.Module, fwd: nn.Module, opt: torch.optim.Optimizer, cfg: RunConfig,
                 info: DistInfo, dataset: SequenceDataset, layout: Layout, dtype: DtypeChoice | None = None):
        self.model, self.fwd, self.opt, self.cfg, self.info = model, fwd, opt, cfg, info
        self.dataset, self.layout = dataset, layout
        self.dtype = dtype or train_dtype(cfg, info)  # train.dtype with auto resolved (precision.py)
        self.amp = autocast_for(info.device, self.dtype.dtype, cfg.model.d_model)
        self.device_skip = bool(getattr(opt, "_step_supports_amp_scaling", False))
        self.rates = schedule_of(model)  # rate conditioning or curriculum: each step's rate (rates.py)
        self.loss = training_loss
        if cfg.train.fullgraph:  # one graph for the whole loss (static chunk shapes: no break)
            # the model class's own loss, resolved here: singledispatch's cache would recompile
            self.loss = torch.compile(training_loss.dispatch(type(model)), fullgraph=True, dynamic=False)
        self.total_bytes = (cfg.train.max_steps * cfg.bytes_per_step if cfg.train.max_steps
                            else cfg.train.total_bytes)

    def indices(self, step: int):
        return self.dataset.step_indices(step, self.cfg.train.batch_size, self.info.rank, self.info.world)

    def __call__(self, step: int, lr: float) -> TrainStepOutput:
        cfg, info = self.cfg, self.info
        for g in self.opt.param_groups:
            g["lr"] = lr
        rate, seen = None, step * cfg.bytes_per_step
        if self.rates is not None and self.rates.varies:
            rate = self.rates.at(step, seen, cfg.train.seed, self.total_bytes)
        with requested_rate(self.model, rate, check=False), off_policy(self.model, seen):
            loss_sum, stats = self._accumulate(self.indices(step))
        grad_norm = _grad_norm(self.model, cfg.train.grad_clip)
        bad = (~(torch.isfinite(loss_sum) & torch.isfinite(grad_norm))).float()
        fills = [st.pop("chunk_fill") for st in stats if "chunk_fill" in st]
        # [non-finite, chunk caps exceeded, longest row, most chunks]: every rank skips together
        flags = torch.stack([bad, *torch.stack(fills).amax(0)]) if fills else bad[None]
        flags = info.all_reduce_max(flags)
        skip = flags[:2].amax()
        host = None
        if fills or not self.device_skip:
            host = flags.tolist()  # the step's one host sync (none with dynamic chunks and fused AdamW)
        if self.device_skip:
            self.opt.found_inf = skip
            self.opt.step()
        elif not max(host[:2]):
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if fills and host[1]:  # a micro-batch had more chunks than the static caps: grow, repeat
            self.model.chunk_caps.grow(host[2], host[3])
            return self(step, lr)
        return TrainStepOutput(loss=loss_sum, grad_norm=grad_norm, skipped=skip, stats=stats)

    def _accumulate(self, indices) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        """Forward and backward over this rank's micro-batches; gradients sync on the last."""
        from .parallel import grad_sync

        cfg, info, L = self.cfg, self.info, self.layout
        loss_sum = torch.zeros((), device=info.device)
        stats = []
        for j in range(L.accum):
            batch = self.dataset.batch(indices[j * L.micro:(j + 1) * L.micro]).to(info.device)
            with grad_sync(self.fwd, self.model, enabled=(j == L.accum - 1), info=info):
                with self.amp:
                    sl = self.loss(self.model, batch, cfg, reduce_mean=info.reduce_mean,
                                   all_reduce_sum=info.all_reduce_sum, forward=self.fwd)
                (sl.loss / L.accum).backward()
            loss_sum += sl.loss.detach() / L.accum
            stats.append(sl.stats)
        return loss_sum, stats


def train(cfg: RunConfig, out: str | Path, *, resume: bool = False, progress: bool = True,
          splits: Splits | None = None, stop_at_step: int | None = None) -> TrainResult:
    """Train (or resume) the run in ``out``. ``stop_at_step`` behaves like a SIGINT arriving
    during that step (for tests of interruption and resume)."""
    out = Path(out)
    info = init_distributed(cfg.train.device)
    lock = RunLock(out)
    log = MetricsLog(out / METRICS, info.is_main)
    try:
        if info.is_main:
            # lock before looking at RUN: a second training of the same run is refused
            if not resume:
                try:
                    out.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise RltokError(f"--out {out}: cannot create the run directory: {e.strerror or e}") from None
            if out.is_dir():
                lock.acquire()
                ckpt.remove_stale_temporaries(out)  # what a killed writer left behind
        cfg = prepare_run_dir(cfg, out, resume)
        info.barrier()  # every rank has looked at RUN before rank 0 writes into it
        return _train(cfg, out, info, log, resume=resume, progress=progress, splits=splits,
                      stop_at_step=stop_at_step)
    finally:
        log.close()
        lock.release()


@dataclass
class LoopState:
    """What the training loop carries from step to step. The checkpoint saves it (``saved``) and
    resuming restores it (``from_saved``); ``last_saved`` is the newest checkpoint's step on disk.
    ``train_seconds`` adds this process's training time to what earlier processes spent up to the
    checkpoint it resumed, so a resumed run reports its whole training time, not the last leg's."""

    step: int = 0
    bytes_seen: int = 0
    bad_total: int = 0  # non-finite steps skipped in all
    consecutive_bad: int = 0  # ... in a row, up to the last one checked
    last_saved: int = -1
    seconds_before: float = 0.0  # training seconds of earlier processes, up to the resumed checkpoint
    clock: float | None = None  # perf_counter when this process began training

    def start_clock(self) -> float:
        self.clock = time.perf_counter()
        return self.clock

    def train_seconds(self) -> float:
        return self.seconds_before + (time.perf_counter() - self.clock if self.clock is not None else 0.0)

    def saved(self) -> dict[str, Any]:
        return {"step": self.step, "bytes_seen": self.bytes_seen, "bad_steps": self.bad_total,
                "consecutive_bad_steps": self.consecutive_bad, "train_seconds": _round(self.train_seconds())}

    @classmethod
    def from_saved(cls, state: dict[str, Any]) -> "LoopState":
        return cls(step=state["step"], bytes_seen=state["bytes_seen"], bad_total=int(state.get("bad_steps", 0)),
                   consecutive_bad=int(state.get("consecutive_bad_steps", 0)), last_saved=state["step"],
                   seconds_before=float(state.get("train_seconds", 0.0)))


def _setup_run(cfg: RunConfig, out: Path, info: DistInfo, resume: bool, splits: Splits | None) -> Splits:
    """The splits; on a new run, the method's setup (e.g. fitting a BPE) and RUN/config.json."""
    splits = splits or load_splits(cfg)
    if len(splits.train) == 0:
        raise RltokError(f"data source {cfg.data.source!r}: no training documents after the split")
    if info.is_main and not resume:
        spec = get_method(cfg.method)
        if spec.setup is not None:
            spec.setup(cfg, splits.train, out)
        write_config(out, cfg)
    info.barrier()
    return splits


def _resume(model: nn.Module, out: Path, log: MetricsLog, info: DistInfo, warn) -> tuple[LoopState, Any]:
    """Load the newest valid checkpoint's weights and RNG into ``model``: the loop state, and what
    the optimizer needs once it exists (None when there is no checkpoint)."""
    found = ckpt.load_latest_checkpoint(out, warn=warn)
    if found is None:
        warn(f"rltok: {out} has no valid checkpoint; starting from step 0")
        log.truncate_after(0)
        return LoopState(), None
    path, m, o, state = found
    check_weights(model, m, path)
    try:
        model.load_state_dict(m)  # full weights, before sharding: any world size
        if "torch_rng" in state:
            torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
    except (RuntimeError, ValueError, TypeError) as e:
        raise ckpt.CheckpointError(f"{path}: does not fit this run's model "
                                   f"({str(e).splitlines()[0][:200]})") from None
    loop = LoopState.from_saved(state)
    log.truncate_after(loop.step)
    world = state.get("world_size", info.world)
    warn(f"rltok: resuming {out} from {path.name} (step {loop.step}, {loop.bytes_seen:,} bytes"
         f"{'' if world == info.world else ', saved with %d processes, now %d' % (world, info.world)})")
    return loop, (o, state, path)


def _load_optimizer(model: nn.Module, opt, found, sharded: bool) -> None:
    from .parallel import load_full_optimizer_state

    o, state, path = found
    try:
        load_full_optimizer_state(model, opt, o, state["optimizer"], sharded)
    except (RuntimeError, ValueError, TypeError, KeyError, IndexError) as e:
        raise ckpt.CheckpointError(f"{path}: optimizer state does not fit this run "
                                   f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})") from None


@dataclass
class Saver:
    """Checkpoints of the loop: every rank takes part (gathering sharded weights is collective),
    rank 0 writes; a step already on disk is never written twice."""

    model: nn.Module
    opt: torch.optim.Optimizer
    cfg: RunConfig
    info: DistInfo
    out: Path
    sharded: bool

    def save(self, loop: LoopState) -> Path | None:
        from .parallel import full_optimizer_state, full_state_dict

        if loop.step == loop.last_saved:  # e.g. resumed at the end
            return ckpt.checkpoint_dir(self.out) / f"step_{loop.step:08d}" if self.info.is_main else None
        weights = full_state_dict(self.model)
        optim = full_optimizer_state(self.model, self.opt, self.sharded)
        path = None
        if self.info.is_main:
            state = {**loop.saved(), "world_size": self.info.world, "torch_rng": torch.get_rng_state().tolist(),
                     "config": self.cfg.to_dict()}
            path = ckpt.save_checkpoint(self.out, loop.step, weights, optim, state, self.cfg.train.keep_checkpoints)
        self.info.barrier()
        loop.last_saved = loop.step
        return path


def _evaluate(model: nn.Module, splits: Splits, cfg: RunConfig, info: DistInfo, log: MetricsLog,
              sharded: bool, batch_size: int, loop: LoopState, tag: str) -> dict[str, Any]:
    """Validation bits-per-byte and boundary statistics, logged as event ``tag``."""
    t, res = cfg.train, {}
    # sharded weights: every rank runs the (identical) evaluation, since each forward gathers
    if (info.is_main or sharded) and t.eval_docs > 0 and len(splits.val):
        r = evaluate_corpus(model, splits.val, cfg.model.seq_len, docs=t.eval_docs,
                            dtype=resolve_dtype(info.device, t.dtype, cfg.model.d_model).dtype,
                            seed=0, batch_size=batch_size)
        res = {"val_bpb": r.bpb, "val_bpb_se": r.bpb_se, "val_rate": r.rate,
               "val_whitespace_recall": r.whitespace_recall, "val_whitespace_precision": r.whitespace_precision,
               "val_word_start_recall": r.word_start_recall, "val_docs": r.docs}
        log.write({"event": tag, "step": loop.step, "bytes": loop.bytes_seen,
                   **{k: _round(v) if isinstance(v, float) else v for k, v in res.items()}})
    info.barrier()
    return res


class StepLog:
    """Training statistics summed between log lines, and the throughput since the last one."""

    def __init__(self, loop: LoopState):
        self.acc: dict[str, torch.Tensor] = {}
        self.n = 0
        self.t_log = loop.start_clock()
        self.bytes_log = loop.bytes_seen

    def add(self, so: "TrainStepOutput", accum: int) -> None:
        for st in so.stats:
            for k, v in st.items():
                self.acc[k] = self.acc.get(k, 0) + v
            self.n += 1
        self.acc["loss"] = self.acc.get("loss", 0) + so.loss * accum
        self.acc["grad_norm"] = self.acc.get("grad_norm", 0) + so.grad_norm * accum

    def record(self, loop: LoopState, lr: float, info: DistInfo) -> dict[str, Any]:
        rec = _reduce_stats(self.acc, self.n, info)
        now = time.perf_counter()
        rec.update(step=loop.step, bytes=loop.bytes_seen, lr=_round(lr),
                   bytes_per_s=_round((loop.bytes_seen - self.bytes_log) / max(now - self.t_log, 1e-9)),
                   elapsed_s=_round(loop.train_seconds()))
        self.acc, self.n = {}, 0
        self.t_log, self.bytes_log = now, loop.bytes_seen
        return rec


class SkippedSteps:
    """Which steps the finite check skipped. The flags stay on the device until a log or
    checkpoint interval, then one host read counts them into the loop state and logs each."""

    def __init__(self, runner: "TrainStep", cfg: RunConfig, log: MetricsLog, warn):
        self.runner, self.cfg, self.log, self.warn = runner, cfg, log, warn
        self.pending: list[tuple[int, TrainStepOutput]] = []

    def add(self, step: int, so: "TrainStepOutput") -> None:
        self.pending.append((step, so))

    def flush(self, loop: LoopState) -> None:
        flags = torch.stack([p.skipped for _, p in self.pending]).tolist() if self.pending else []
        for (s, p), f in zip(self.pending, flags):
            if not f:
                loop.consecutive_bad = 0
                continue
            loop.consecutive_bad += 1
            loop.bad_total += 1
            idx = self.runner.indices(s)
            self.log.write({"event": "nonfinite", "step": s, "bytes": (s + 1) * self.cfg.bytes_per_step,
                            "data_index": [int(idx[0]), int(idx[-1])], "loss": float(p.loss),
                            "grad_norm": float(p.grad_norm), "consecutive": loop.consecutive_bad,
                            "total": loop.bad_total})
            self.warn(f"rltok: non-finite loss or gradient at step {s} (sequences {int(idx[0])}..{int(idx[-1])}): "
                      f"step skipped ({loop.consecutive_bad} in a row, {loop.bad_total} in all)")
        self.pending = []


class StopCheck:
    """Whether to stop after this step: a signal, ``stop_at_step``, or (under torchrun) a vote of
    the ranks or the loss of the torchrun agent. Every rank stops at the same step."""

    def __init__(self, stop, info: DistInfo, stop_at_step: int | None, warn):
        self.stop, self.info, self.stop_at_step, self.warn = stop, info, stop_at_step, warn
        self.vote = StopVote(info)
        # under torchrun, a worker whose agent died (SIGKILL, OOM killer) stops as if sent SIGTERM
        self.parent = os.getppid() if launched_by_torchrun() else None

    def __call__(self, step: int) -> bool:
        stop = self.stop
        at_limit = self.stop_at_step is not None and step >= self.stop_at_step
        if at_limit and stop.signum is None:
            stop.signum = signal.SIGINT
        if self.parent is not None and stop.signum is None and os.getppid() != self.parent:
            self.warn("rltok: the torchrun agent is gone: stopping as if sent SIGTERM")
            stop.signum = signal.SIGTERM
        # a signal may reach one rank a step before another: the ranks vote every step (an
        # asynchronous all-reduce read one step later) and stop together; stop_at_step is the
        # same step on every rank
        stopping = self.vote.step(stop.signum is not None) or at_limit
        if self.info.enabled and stopping and stop.signum is None:
            stop.signum = signal.SIGTERM
        return stopping

    def after_last_step(self) -> bool:
        """A signal after the last step's vote (the run then stops before its final evaluation)."""
        late = self.vote.finish() if self.info.enabled else self.stop.signum is not None
        if late and self.stop.signum is None:
            self.stop.signum = signal.SIGTERM
        return late


def _finish(model: nn.Module, cfg: RunConfig, info: DistInfo, out: Path, loop: LoopState, final: dict,
            seconds: float) -> dict[str, Any]:
    """RUN/model.safetensors and RUN/summary.json (the summary is returned)."""
    from .parallel import full_state_dict

    weights = full_state_dict(model)
    summary: dict[str, Any] = {}
    if info.is_main:
        ckpt.save_tensors_atomic(out / MODEL, weights, metadata={"format": "rltok-model-v1", "method": cfg.method})
        per_byte, per_chunk = _flop_params(model)
        summary = {"finished": True, "method": cfg.method, "steps": loop.step, "bytes": loop.bytes_seen,
                   "params": sum(p.numel() for p in model.parameters()),
                   "flop_params_per_byte": per_byte, "flop_params_per_chunk": per_chunk,
                   "train_seconds": _round(seconds), "bad_steps": loop.bad_total, "world_size": info.world,
                   "dtype": resolve_dtype(info.device, cfg.train.dtype, cfg.model.d_model).dtype, **final}
        ckpt.write_json_atomic(out / SUMMARY, summary)
    info.barrier()
    return summary


def _train(cfg: RunConfig, out: Path, info: DistInfo, log: MetricsLog, *, resume: bool, progress: bool,
           splits: Splits | None, stop_at_step: int | None) -> TrainResult:
    from .parallel import compile_blocks, wrap_data_parallel

    t = cfg.train
    layout = batch_layout(cfg, info.world)
    torch.manual_seed(t.seed)
    splits = _setup_run(cfg, out, info, resume, splits)
    model = build_model(cfg, out).to(info.device)
    warn = (lambda m: print(m, file=sys.stderr)) if info.is_main else (lambda m: None)
    dtype = train_dtype(cfg, info)
    for line in _start_lines(model, cfg, splits, info, dtype):
        warn(f"rltok: {line}")
    loop, found = _resume(model, out, log, info, warn) if resume else (LoopState(), None)
    log.open_sinks(cfg, resume)
    if t.compile:
        compile_blocks(model)
    fwd: nn.Module = wrap_data_parallel(model, cfg, info) if info.enabled else model
    sharded = info.enabled and t.parallel == "fsdp"
    opt = make_optimizer(model, cfg)  # after sharding: FSDP replaces the parameters
    if found is not None:
        _load_optimizer(model, opt, found, sharded)

    runner = TrainStep(model, fwd, opt, cfg, info, SequenceDataset(splits.train, cfg.model.seq_len, t.seed,
                                                                   cfg.data.packing), layout, dtype)
    saver = Saver(model, opt, cfg, info, out, sharded)
    total_steps = cfg.total_steps
    total_bytes = total_steps * cfg.bytes_per_step
    ckpt_every = t.ckpt_every or max(1, math.ceil(total_steps / 10))
    eval_every = t.eval_every_bytes
    next_eval = (loop.bytes_seen // eval_every + 1) * eval_every if eval_every else None
    bar = _progress_bar(cfg, total_bytes, loop.bytes_seen) if progress and info.is_main else None
    steplog, skipped = StepLog(loop), SkippedSteps(runner, cfg, log, warn)
    exit_code = 0
    model.train()
    with StopRequest() as stop:
        should_stop = StopCheck(stop, info, stop_at_step, warn)
        while loop.step < total_steps:
            lr = lr_at(loop.bytes_seen, cfg, total_bytes)
            so = runner(loop.step, lr)
            steplog.add(so, layout.accum)
            skipped.add(loop.step, so)
            loop.step += 1
            loop.bytes_seen += cfg.bytes_per_step
            if bar is not None:
                bar.update(cfg.bytes_per_step)
            at_log = loop.step % t.log_every == 0 or loop.step == total_steps
            stopping = should_stop(loop.step)
            if at_log or stopping or loop.step % ckpt_every == 0:
                skipped.flush(loop)
            if at_log:
                rec = steplog.record(loop, lr, info)
                log.write(rec)
                _show(bar, rec)
            if loop.consecutive_bad >= t.max_bad_steps:
                path = saver.save(loop)
                raise NonFiniteError(
                    f"training stopped: {loop.consecutive_bad} consecutive non-finite steps at step {loop.step} "
                    f"(train.max_bad_steps={t.max_bad_steps}); the last good weights are in "
                    f"{path or out / 'checkpoints'}")
            if next_eval is not None and loop.bytes_seen >= next_eval and loop.step < total_steps:
                _evaluate(model, splits, cfg, info, log, sharded, max(1, layout.micro), loop, "eval")
                next_eval += eval_every
            if loop.step % ckpt_every == 0 and loop.step < total_steps and not stopping:
                saver.save(loop)
            if stopping:
                path = saver.save(loop)
                exit_code = stop.exit_code
                warn(f"rltok: stopped at step {loop.step}; checkpoint {path.name if path else ''} written; "
                     f"continue with --resume")
                break
        # the last step's checkpoint holds everything; --resume writes the final weights
        if exit_code == 0 and should_stop.after_last_step():
            path = saver.save(loop)
            exit_code = stop.exit_code
            warn(f"rltok: stopped at step {loop.step} (the last); checkpoint {path.name if path else ''} written; "
                 f"--resume writes the final weights")
        if bar is not None:
            bar.close()
        # the final phase (evaluation, weights, summary) is short: a signal now lets it finish
        summary: dict[str, Any] = {}
        if exit_code == 0:
            saver.save(loop)
            final = _evaluate(model, splits, cfg, info, log, sharded, max(1, layout.micro), loop, "final_eval")
            summary = _finish(model, cfg, info, out, loop, final, loop.train_seconds())
    return TrainResult(run_dir=out, steps=loop.step, bytes_seen=loop.bytes_seen, exit_code=exit_code, summary=summary)


def _progress_bar(cfg: RunConfig, total_bytes: int, initial: int):
    from tqdm import tqdm

    return tqdm(total=total_bytes, initial=initial, unit="B", unit_scale=True, desc=f"train {cfg.method}",
                dynamic_ncols=True, smoothing=0.1)


def _show(bar, rec: dict[str, Any]) -> None:
    if bar is not None:
        bar.set_postfix(bpb=f"{rec.get('bpb', float('nan')):.3f}", rate=f"{rec.get('rate', float('nan')):.3f}",
                        ws=f"{rec.get('whitespace_recall', float('nan')):.2f}")


def _start_lines(model: nn.Module, cfg: RunConfig, splits, info, dtype: DtypeChoice) -> list[str]:
    """What a run is, said before it starts: the model's size (applied per byte and per chunk),
    the data, the device, dtype and threads, and the training FLOPs per byte at the target rate."""
    n = sum(p.numel() for p in model.parameters())
    try:
        fl = training_flops_per_byte(model, cfg)
        size = (f"model: {n / 1e6:.2f}M parameters ({fl.params_per_byte / 1e6:.2f}M matmul per byte, "
                f"{fl.params_per_chunk / 1e6:.2f}M per chunk); {format_flops(fl.per_byte)} training "
                f"FLOPs per byte at rate {fl.rate:.3g}")
    except (AttributeError, TypeError):  # a model with no FLOP count registered
        size = f"model: {n / 1e6:.2f}M parameters"
    tr, va = splits.train, splits.val
    budget = (f"{cfg.train.max_steps} steps" if cfg.train.max_steps
              else f"{cfg.train.total_bytes / 1e6:.3g} MB")
    test = f", {len(splits.test):,} test" if len(splits.test) else ""
    temp = (f" (languages sampled at temperature {cfg.data.language_temperature:g})"
            if cfg.data.language_temperature != 1.0 else "")
    lines = [f"data: {cfg.data.source}, {len(tr):,} training documents ({tr.total_bytes / 1e6:.1f} MB){temp}, "
             f"{len(va):,} validation{test}; training on {budget} ({cfg.method})",
             size,
             f"device: {info.device.type}, {info.world} process(es)", dtype.describe()]
    warning = warning_once(dtype)
    if warning:
        lines.append(warning)
    if info.device.type == "cpu":
        lines.append(describe_current())
    return lines


def _flop_params(model: nn.Module) -> tuple[int, int]:
    fn = getattr(model, "param_groups_for_flops", None)
    if fn is None:
        n = sum(p.numel() for p in model.parameters() if p.dim() >= 2)
        return n, 0
    return fn()


def _grad_norm(model: nn.Module, clip: float) -> torch.Tensor:
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return torch.zeros(())
    if clip > 0:
        n = torch.nn.utils.clip_grad_norm_(params, clip)
    else:
        n = torch.nn.utils.get_total_norm([p.grad for p in params])
    if hasattr(n, "full_tensor"):  # FSDP: a replicated DTensor
        n = n.full_tensor()
    return n.float()


def _reduce_stats(acc: dict[str, torch.Tensor], n: int, info: DistInfo) -> dict[str, Any]:
    """Average per-micro-step statistics over the log interval and the ranks; turn boundary
    counts into rate and whitespace recall/precision."""
    if not acc:
        return {}
    keys = sorted(acc)
    vec = torch.stack([torch.as_tensor(acc[k], dtype=torch.float32).to(info.device).reshape(()) for k in keys])
    vec = info.all_reduce_sum(vec)
    vals = dict(zip(keys, vec.tolist()))
    counts = {k: vals.pop(k) for k in list(vals) if k.startswith("n_")}
    out = {k: _round(v / (n * info.world)) for k, v in vals.items()}
    if counts:
        out.update({k: _round(v) for k, v in ratios(counts).items()})
    return out
