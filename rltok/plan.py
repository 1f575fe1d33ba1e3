"""A memory and time model of a training run, before any GPU is rented (``rltok plan``).

Memory per GPU, in four parts:

* **state**: fp32 parameters, fp32 gradients and AdamW's two fp32 moments, 16 bytes per
  parameter; FSDP2 shards all of it across the GPUs, DDP keeps a full copy on each;
* **autocast copies**: under bf16 autocast each weight is cast once per forward and the copy is
  kept for the backward, 2 bytes per matmul parameter (sharded state is gathered layer by
  layer, so with FSDP2 this is one layer's, not the model's);
* **activations**: every tensor the backward pass keeps, counted by running the real forward
  and loss of one micro-batch on the ``meta`` device (shapes only, no memory, no time) with
  ``saved_tensors_hooks``: the count follows the code as it is, not a formula about it;
* **transient**: the largest single tensor the loss makes (the 257-way logits and their
  softmax, twice: final and early exit), counted from the config.

Time: training FLOPs per byte (rltok.flops, at the target rate) times the run's bytes, over the
GPUs' dense peak at a given MFU. The model is checked against measured peaks: the CPU's at two
sizes (``benchmarks/readiness.py``) and a GPU's (``benchmarks/gpu_check.sh``);
``results/scaling/readiness.json`` holds both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .config import build_config
from .flops import training_flops_per_byte
from .schema import RunConfig

from .presets import GPUS  # plain data: the command line lists the kinds without torch
MFUS = (0.35, 0.45)


@dataclass
class MemoryPlan:
    params: int
    matmul_params: int
    micro_batch: int
    seq_len: int
    dtype: str
    gpus: int
    parallel: str  # ddp or fsdp
    state_bytes: int  # per GPU
    autocast_copy_bytes: int
    activation_bytes: int  # one micro-batch
    transient_bytes: int
    peak_bytes: int  # per GPU
    saved_tensors: int = 0
    by_dtype: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TimePlan:
    gpu: str
    gpus: int
    flops_per_byte: float
    total_bytes: float
    bytes_per_step: int
    hours: dict[str, float]  # "mfu=0.35": hours for the whole run
    step_seconds: dict[str, float]
    fits: bool  # predicted peak below the GPU's memory

    def to_dict(self) -> dict:
        return asdict(self)


def _storage_key(t: torch.Tensor):
    return t.untyped_storage()._cdata


class _FusedAttention(torch.autograd.Function):
    """Attention as the fused kernels keep it for the backward (FlashAttention, memory-efficient
    and the CPU's flash kernel save q, k, v, the output and a log-sum-exp per query), where
    SDPA's math fallback, which the meta device runs, would keep the whole score matrix."""

    @staticmethod
    def forward(ctx, q, k, v, kwargs):
        with torch.no_grad():
            out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - the plan never runs a backward
        raise NotImplementedError


class _Trace(TorchFunctionMode):
    """The kernels of a GPU's training step, for the meta device: fused attention
    (:class:`_FusedAttention`) and, with ``autocast``, bf16 autocast as CUDA applies it (the
    meta device has none): the inputs of matmuls and attention are cast to bf16 before autograd
    sees them, so the backward keeps bf16 copies, while everything else (the residual stream,
    norms, losses) stays fp32. The casts of parameters are remembered in ``copies``: they are
    autocast's weight copies, not activations."""

    LOW = {F.linear, torch.matmul, torch.mm, torch.bmm, torch.addmm, torch.baddbmm, torch.einsum,
           F.scaled_dot_product_attention, torch.Tensor.matmul, torch.Tensor.__matmul__}

    def __init__(self, params: set, autocast: bool):
        super().__init__()
        self.params, self.autocast, self.copies = params, autocast, set()

    def _cast(self, x):
        if isinstance(x, torch.Tensor) and x.dtype == torch.float32:
            y = x.to(torch.bfloat16)
            if _storage_key(x) in self.params:
                self.copies.add(_storage_key(y))
            return y
        if isinstance(x, (list, tuple)):
            return type(x)(self._cast(v) for v in x)
        return x

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.autocast and func in self.LOW:
            args = tuple(self._cast(a) for a in args)
            kwargs = {k: self._cast(v) for k, v in kwargs.items()}
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            return _FusedAttention.apply(q, k, v, kwargs)
        return func(*args, **kwargs)


def activation_bytes(cfg: RunConfig, micro_batch: int, dtype: str = "bf16") -> tuple[int, int, dict[str, int]]:
    """(bytes the backward keeps, number of tensors, bytes by dtype) for one micro-batch of the
    training loss, traced on the meta device with the static chunk shapes a GPU uses (the caps
    at their starting size). Parameters (and, under bf16, autocast's copies of them) saved for
    the backward are not activations and are not counted; ``dtype`` bf16 traces under
    :class:`_Trace`'s autocast."""
    from .methods import get_method
    from .objectives import training_loss
    from .data.loader import Batch
    from .syncs import force_accelerator_path

    import copy

    cfg = copy.deepcopy(cfg)
    cfg.model.static_chunks = "on"
    with torch.device("meta"):
        model = get_method(cfg.method).build(cfg, None)
    model.train()
    params = {_storage_key(p) for p in model.parameters()}
    cast = _Trace(params, autocast=dtype == "bf16")
    seen: dict = {}

    def pack(t: torch.Tensor):
        key = _storage_key(t)
        if key not in params and key not in seen and key not in cast.copies:
            seen[key] = (t.untyped_storage().nbytes(), str(t.dtype).replace("torch.", ""))
        return t

    B, S = micro_batch, cfg.model.seq_len
    with torch.device("meta"):
        ids = torch.randint(0, 256, (B, S))
        batch = Batch(ids=ids, targets=torch.randint(0, 257, (B, S)), noise=torch.rand(B, S),
                      index=torch.arange(B))
    with force_accelerator_path(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), cast:
        training_loss(model, batch, cfg)
    by: dict[str, int] = {}
    for n, dt in seen.values():
        by[dt] = by.get(dt, 0) + n
    return sum(by.values()), len(seen), by


def memory_plan(cfg: RunConfig, gpus: int = 1, parallel: str | None = None, micro_batch: int | None = None,
                dtype: str = "bf16") -> MemoryPlan:
    from .methods import get_method

    parallel = parallel or ("fsdp" if gpus > 1 else "ddp")
    micro = micro_batch or cfg.train.micro_batch or cfg.train.batch_size
    with torch.device("meta"):
        model = get_method(cfg.method).build(cfg, None)
    P = sum(p.numel() for p in model.parameters())
    mm = sum(p.numel() for p in model.parameters() if p.dim() >= 2)
    shard = gpus if parallel == "fsdp" else 1
    state = 16 * P // shard
    if dtype != "bf16":
        copies = 0
    elif parallel == "fsdp":  # gathered and cast one block at a time: the largest block's copy
        copies = 2 * max(sum(p.numel() for p in m.parameters() if p.dim() >= 2)
                         for m in model.modules() if m.__class__.__name__ == "Block")
    else:
        copies = 2 * mm
    act, n, by = activation_bytes(cfg, micro, dtype)
    S = cfg.model.seq_len
    transient = 2 * micro * S * 257 * 4 * 2  # fp32 logits and softmax, final and early exit
    return MemoryPlan(params=P, matmul_params=mm, micro_batch=micro, seq_len=S, dtype=dtype, gpus=gpus,
                      parallel=parallel, state_bytes=state, autocast_copy_bytes=copies, activation_bytes=act,
                      transient_bytes=transient, peak_bytes=state + copies + act + transient, saved_tensors=n,
                      by_dtype=by)


def time_plan(cfg: RunConfig, gpu: str, gpus: int, peak_bytes: int | None = None) -> TimePlan:
    from .methods import get_method

    mem, peak = GPUS[gpu]
    with torch.device("meta"):
        model = get_method(cfg.method).build(cfg, None)
    fpb = training_flops_per_byte(model, cfg).per_byte
    total = float(cfg.train.total_bytes or cfg.train.max_steps * cfg.bytes_per_step)
    hours, step = {}, {}
    for mfu in MFUS:
        rate = gpus * peak * mfu  # FLOP/s
        hours[f"mfu={mfu}"] = fpb * total / rate / 3600
        step[f"mfu={mfu}"] = fpb * cfg.bytes_per_step / rate
    return TimePlan(gpu=gpu, gpus=gpus, flops_per_byte=fpb, total_bytes=total, bytes_per_step=cfg.bytes_per_step,
                    hours=hours, step_seconds=step, fits=peak_bytes is None or peak_bytes < mem)


def plan(method: str | None = None, preset: str | None = None, recipe: str = "", gpus: int = 8,
         gpu: str = "h100", overrides: dict | None = None, micro_batch: int | None = None) -> dict:
    cfg = build_config(method, preset, recipe=recipe, overrides=overrides)
    m = memory_plan(cfg, gpus=gpus, micro_batch=micro_batch)
    out = {"method": cfg.method, "preset": cfg.preset, "recipe": recipe, "memory": m.to_dict(), "time": {}}
    for kind in GPUS if gpu == "all" else [gpu]:
        out["time"][kind] = time_plan(cfg, kind, gpus, m.peak_bytes).to_dict()
    return out


def format_plan(p: dict) -> str:
    m = p["memory"]
    gib = 2**30
    lines = [
        f"{p['recipe'] or p['method']} ({p['preset']}): {m['params'] / 1e6:.1f}M parameters, micro-batch "
        f"{m['micro_batch']} x {m['seq_len']} bytes, {m['dtype']}, {m['gpus']} GPU(s) with {m['parallel']}",
        "memory per GPU (GiB):",
        f"  parameters, gradients, AdamW state  {m['state_bytes'] / gib:8.2f}",
        f"  bf16 weight copies (autocast)       {m['autocast_copy_bytes'] / gib:8.2f}",
        f"  activations kept for the backward   {m['activation_bytes'] / gib:8.2f}  ({m['saved_tensors']} tensors)",
        f"  logits and softmax (transient)      {m['transient_bytes'] / gib:8.2f}",
        f"  predicted peak                      {m['peak_bytes'] / gib:8.2f}",
    ]
    for kind, t in p["time"].items():
        mem = GPUS[kind][0]
        fit = "fits" if t["fits"] else f"DOES NOT FIT in {mem / gib:.0f} GiB: lower --micro-batch"
        runs = ", ".join(f"{h:.2f} h at MFU {k.split('=')[1]}" for k, h in t["hours"].items())
        steps = ", ".join(f"{s:.2f} s" for s in t["step_seconds"].values())
        lines.append(f"{t['gpus']} x {kind.upper()}: {fit}; the run's {t['total_bytes']:.3g} bytes: {runs} "
                     f"(a step of {t['bytes_per_step']:,} bytes: {steps})")
    return "\n".join(lines)
