"""Generation with learned boundaries: batched, KV-cached incremental decoding.

    >>> import rltok
    >>> from rltok.generate import generate
    >>> model = rltok.load("runs/tiny")
    >>> res = generate(model, ["The city council", "Once upon"], 64, temperature=0.8, seed=0)
    >>> res.texts                          # the continuations (str, invalid UTF-8 replaced)
    >>> res[0].chunks()                    # prompt + continuation cut at the decoded boundaries
    >>> model.generate(["Hello"], 32)      # the same, as a method of the U-Net

What is cached, per sequence of the batch (:class:`InferenceState`):

* encoder and decoder byte layers: a ring of the last ``window`` keys/values per layer (the
  sliding window sees nothing older), so their memory does not grow with the byte count;
* main network: keys/values of every chunk so far (full causal attention over chunks), ragged
  across the batch (each row has its own chunk count) and grown by doubling;
* the boundary method's own state (the rl policy with w > 1: its last w-1 decisions);
* the pending chunk output: zhat of the most recent chunk, added to every byte until the next
  chunk closes (u_t = h_t + zhat_{c_up(t)}).

One step consumes one byte per row at its own position: encoder layers -> the method decides
whether this byte ends a chunk -> only the rows that close a chunk run the main network, for
that one chunk (RoPE at the byte position, as in training) -> the new zhat becomes pending ->
decoder layers -> next-byte logits. The prompt is BOS + prompt bytes; BOS (position 0) is a
forced boundary. Training also forces a boundary at a sequence's last position; while decoding
there is no last position, so the prefill appends one padding column to each row (counted as
valid) to carry that forced boundary and every real position is decided by the method, exactly as
mid-sequence.

Randomness: row r of a call with seed s draws its boundary uniforms (one per position, the
``noise`` the full forward pass would read) and its byte-sampling uniforms from
``numpy.random.default_rng([s, 7, r, 0 or 1])``, so a row's output does not depend on the other rows or
on the batch size, and the same seed reproduces the same text.

Methods whose boundaries depend only on the past decode from caches (``BoundaryModule.step``).
Others (and any method with ``cache=False``) decode by re-running the full forward pass for every
byte, which is also the reference the benchmark compares against.
"""

from __future__ import annotations

import codecs
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from .schema import BOS, PAD
from .errors import RltokError
from .model.inference import DecodeStep, InferenceState, PrefillOutput  # noqa: F401  (the decoding types)
from .model.inference import _fit, _pad_rows, _with_end_column
from .evaluate import model_width
from .precision import autocast_for
from .text import chunks_of, to_bytes

STOP_REASONS = ("eos", "stop", "length")  # end of document predicted, stop string, max_new_bytes


# ------------------------------------------------------------------------------------------------
# Prefill and step: the model's own (ByteUNet.prefill / .step); these names are kept for callers


def prefill(model: nn.Module, seqs: Sequence[Sequence[int]], **kw) -> PrefillOutput:
    """:meth:`rltok.model.unet.ByteUNet.prefill` (the model owns its decoding)."""
    return model.prefill(seqs, **kw)


def step(model: nn.Module, state: InferenceState, ids: Tensor, **kw) -> DecodeStep:
    """:meth:`rltok.model.unet.ByteUNet.step`."""
    return model.step(state, ids, **kw)


# ------------------------------------------------------------------------------------------------
# Sampling


def sample_next(logits: Tensor, u: Tensor, temperature: float = 1.0, top_p: float = 1.0,
                top_k: int = 0) -> Tensor:
    """Next ids (n,) from logits (n, V) by inverse-CDF sampling with the uniforms ``u`` (n,):
    temperature 0 is greedy (argmax); top-k, then top-p (nucleus: the smallest set of most
    likely ids whose mass reaches p) restrict the candidates."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sp, order = probs.sort(dim=-1, descending=True)
    keep = torch.ones_like(sp, dtype=torch.bool)
    if top_k > 0:
        keep[:, top_k:] = False
    if top_p < 1.0:
        keep &= (sp.cumsum(-1) - sp) < top_p  # the mass before an id is still short of p
    sp = sp * keep
    cdf = sp.cumsum(-1)
    j = torch.searchsorted(cdf, (u.to(cdf.dtype) * cdf[:, -1])[:, None], right=True)
    j = j.clamp(max=keep.sum(-1, keepdim=True) - 1)
    return order.gather(1, j)[:, 0]


# ------------------------------------------------------------------------------------------------
# Engines: the cached decoder and the reference that re-runs the full forward pass per byte


class _Engine:
    """Decodes a batch; ``rows`` maps its rows to the caller's prompt indices."""

    def __init__(self, model: nn.Module, noise: Tensor, mode: str):
        self.model, self.noise, self.mode = model, noise, mode

    def start(self, seqs: list[list[int]]) -> tuple[Tensor, list[np.ndarray]]:
        raise NotImplementedError

    def advance(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def keep(self, local: Tensor) -> None:
        raise NotImplementedError

    def cache_bytes(self) -> dict[str, int]:
        return {}


class CachedEngine(_Engine):
    def start(self, seqs):
        self.rows = torch.arange(len(seqs), device=self.noise.device)
        pre = prefill(self.model, seqs, noise=self.noise, mode=self.mode)
        self.state = pre.state
        b = pre.forward.boundary.b.cpu().numpy()
        return pre.logits, [b[r, : len(s)] for r, s in enumerate(seqs)]

    def advance(self, ids):
        pos = self.state.pos
        noise = self.noise[self.rows, pos.clamp(max=self.noise.shape[1] - 1)]
        out = step(self.model, self.state, ids, noise=noise, mode=self.mode)
        return out.logits, out.boundary.b

    def keep(self, local):
        self.rows = self.rows[local]
        self.state = self.state.select(local)

    def cache_bytes(self):
        return self.state.cache_bytes()


class RecomputeEngine(_Engine):
    """Re-runs the whole model on BOS + everything so far for every new byte (what the paper's
    reference code and BLT do). Works for every method, causal or not."""

    def _run(self):
        lengths = torch.tensor([len(s) for s in self.seqs], device=self.noise.device)
        S = int(lengths.max()) + 1  # + the padding column carrying the forced last boundary
        ids = _pad_rows(self.seqs, S, PAD, self.noise.device)
        out = self.model(ids, noise=_fit(self.noise[self.rows], S), mode=self.mode,
                         valid=_with_end_column(lengths, S))
        last = lengths - 1
        logits = out.logits.gather(1, last[:, None, None].expand(-1, 1, out.logits.shape[-1]))[:, 0]
        return logits, out.boundary.b

    def start(self, seqs):
        self.rows = torch.arange(len(seqs), device=self.noise.device)
        self.seqs = [list(s) for s in seqs]
        logits, b = self._run()
        b = b.cpu().numpy()
        return logits, [b[r, : len(s)] for r, s in enumerate(seqs)]

    def advance(self, ids):
        for s, x in zip(self.seqs, ids.tolist()):
            s.append(x)
        logits, b = self._run()
        last = torch.tensor([len(s) - 1 for s in self.seqs], device=b.device)
        return logits, b.gather(1, last[:, None])[:, 0]

    def keep(self, local):
        self.rows = self.rows[local]
        self.seqs = [self.seqs[i] for i in local.tolist()]


# ------------------------------------------------------------------------------------------------
# Results


@dataclass
class Generation:
    """One prompt's continuation."""

    prompt: bytes  # the prompt as the model saw it (after left truncation)
    output: bytes  # the continuation: stop string and end of document excluded
    stop_reason: str  # "eos" (end of document predicted), "stop" (a stop string), "length"
    sampled: list[int]  # every id sampled, in order (bytes; 256 = end of document)
    logprobs: np.ndarray  # log p(sampled[i] | ...) under the model itself (temperature 1), nats
    boundaries: np.ndarray  # bool per consumed position: BOS, prompt bytes, sampled[:-1]

    @property
    def text(self) -> str:
        return self.output.decode("utf-8", errors="replace")

    @property
    def consumed(self) -> list[int]:
        """The ids the model read: BOS, the prompt, every sampled id but the last."""
        return [BOS, *self.prompt, *self.sampled[:-1]]

    def chunks(self) -> list[bytes]:
        """Prompt + every sampled byte, cut after every byte that ends a chunk (BOS not shown;
        the last sampled byte was never read, so it ends an open piece)."""
        data = self.prompt + bytes(x for x in self.sampled if x < 256)
        return chunks_of(data, self.boundaries[1: 1 + len(data)])


@dataclass
class GenerateResult:
    sequences: list[Generation]
    seed: int
    ttfb_s: float  # time to first byte: prefill + the first sampled byte of every row
    decode_s: float  # time of all later bytes
    decode_bytes: int  # bytes sampled after the first one of each row
    cached: bool
    cache_bytes: dict[str, int] = field(default_factory=dict)  # peak over the run

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, i: int) -> Generation:
        return self.sequences[i]

    def __iter__(self) -> Iterator[Generation]:
        return iter(self.sequences)

    @property
    def texts(self) -> list[str]:
        return [g.text for g in self.sequences]

    @property
    def bytes_per_s(self) -> float:
        """Decode throughput after the first byte, summed over the batch."""
        return self.decode_bytes / self.decode_s if self.decode_s > 0 else float("nan")


class _Streamer:
    """Incremental UTF-8 decoding (invalid sequences become U+FFFD) that holds back bytes that
    may be the start of a stop string until they are resolved."""

    def __init__(self, callback: Callable[[int, str], None], index: int, stops: list[bytes]):
        self.cb, self.i, self.stops = callback, index, stops
        self.dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.sent = 0

    def push(self, out: bytes, final: bool = False) -> None:
        upto = len(out)
        if not final:
            for s in self.stops:  # longest suffix of out that is a proper prefix of s
                for k in range(min(len(s) - 1, len(out)), 0, -1):
                    if out.endswith(s[:k]):
                        upto = min(upto, len(out) - k)
                        break
        text = self.dec.decode(out[self.sent:upto], final=final)
        self.sent = max(self.sent, upto)
        if text:
            self.cb(self.i, text)


# ------------------------------------------------------------------------------------------------
# The generation loop


def _as_bytes(p: str | bytes) -> bytes:
    return to_bytes(p)


def _check_args(max_new_bytes: int, temperature: float, top_p: float, top_k: int, boundary_mode: str,
                stops: list[bytes]) -> None:
    if max_new_bytes < 0:
        raise RltokError(f"max_new_bytes={max_new_bytes} must be >= 0")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise RltokError(f"temperature={temperature} must be >= 0 (0 = greedy)")
    if not (0 < top_p <= 1):
        raise RltokError(f"top_p={top_p} must be in (0, 1]")
    if top_k < 0:
        raise RltokError(f"top_k={top_k} must be >= 0 (0 = off)")
    if boundary_mode not in ("sample", "greedy"):
        raise RltokError(f"boundary_mode={boundary_mode!r} must be sample or greedy")
    if any(len(s) == 0 for s in stops):
        raise RltokError("stop strings must not be empty")


def row_streams(seed: int, row: int, positions: int, new_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(boundary uniforms per position, byte-sampling uniforms per new byte) of prompt ``row``."""
    # two independent streams, so that neither depends on how long the other is
    noise = np.random.default_rng([seed, 7, row, 0]).random(positions, dtype=np.float32)
    return noise, np.random.default_rng([seed, 7, row, 1]).random(max(new_bytes, 1))


@torch.no_grad()
def generate(model: nn.Module, prompts: str | bytes | Sequence[str | bytes], max_new_bytes: int = 256, *,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, boundary_mode: str = "sample",
             stop: str | bytes | Sequence[str | bytes] | None = None, seed: int | None = None,
             stream: Callable[[int, str], None] | None = None, cache: bool = True,
             max_prompt_bytes: int | None = None, dtype: str = "auto") -> GenerateResult:
    """Continue each prompt by up to ``max_new_bytes`` bytes, all prompts as one batch.

    This signature is stable: tasks call ``generate(model, prompts, max_new_bytes,
    temperature=0.0, stop=[...])`` for greedy continuations (LAMBADA, lm-eval generate_until).

    * ``temperature`` 0 = greedy bytes; ``top_p``, ``top_k`` restrict sampling.
    * ``boundary_mode``: ``sample`` draws boundaries as in training; ``greedy`` thresholds the
      boundary probability at 0.5.
    * ``stop``: strings (or bytes) that end a row's continuation; the match is removed from the
      output. A row also stops when the model predicts end of document (BOS), which is not part
      of the output, or after ``max_new_bytes``.
    * ``seed``: makes everything reproducible (None: a fresh seed, reported in the result).
    * ``stream(i, text)``: called with each new piece of prompt i's continuation as soon as it
      is known not to be part of a stop string (UTF-8 decoded incrementally, invalid bytes
      replaced).
    * ``cache=False`` re-runs the full forward pass for every byte (the reference; also the
      only way to decode a method whose boundaries look ahead).
    * Prompts longer than ``max_prompt_bytes`` (default: the model's context ``seq_len`` - 1)
      keep their last bytes. The continuation may run past the context: byte layers only see
      their window, but the main network then sees chunk positions it was not trained on.
    """
    if not callable(getattr(model, "step", None)):
        raise RltokError(f"generation supports the U-Net methods; this model is a {type(model).__name__} "
                         f"(a flat baseline has no cached decoding)")
    if isinstance(prompts, (str, bytes)):
        prompts = [prompts]
    if len(prompts) == 0:
        raise RltokError("generate needs at least one prompt")
    stops = [] if stop is None else [_as_bytes(s) for s in ([stop] if isinstance(stop, (str, bytes)) else stop)]
    _check_args(max_new_bytes, temperature, top_p, top_k, boundary_mode, stops)
    bmod = model.boundary
    name = getattr(bmod, "name", type(bmod).__name__)
    if cache and not bmod.decodable():
        raise RltokError(f"boundary method {name!r} cannot decode from caches (its boundaries are not "
                         f"decided byte by byte from the past); use cache=False (--no-cache) to re-run "
                         f"the full model for every byte")
    if not type(bmod).decode_matches_forward and boundary_mode == "sample":
        warnings.warn(f"boundary method {name!r} decodes with a causal stand-in for its training "
                      f"distribution (see its docstring)", stacklevel=2)
    seq_len = model.cfg.seq_len
    keep = seq_len - 1 if max_prompt_bytes is None else max_prompt_bytes
    raw = [_as_bytes(p) for p in prompts]
    raw = [p[len(p) - keep:] if len(p) > keep else p for p in raw] if keep >= 0 else raw
    seqs = [[BOS, *p] for p in raw]
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % (1 << 63))
    device = next(model.parameters()).device
    B = len(seqs)
    n_pos = max(len(s) for s in seqs) + max_new_bytes + 1
    streams = [row_streams(seed, r, n_pos, max_new_bytes) for r in range(B)]
    noise = torch.from_numpy(np.stack([s[0] for s in streams])).to(device)
    byte_u = torch.from_numpy(np.stack([s[1] for s in streams]))


    was_training = model.training
    model.eval()
    engine = (CachedEngine if cache else RecomputeEngine)(model, noise, boundary_mode)
    streamers = [_Streamer(stream, r, stops) if stream else None for r in range(B)]
    sampled: list[list[int]] = [[] for _ in range(B)]
    logps: list[list[float]] = [[] for _ in range(B)]
    outs = [bytearray() for _ in range(B)]
    reasons = ["length"] * B
    peak: dict[str, int] = {}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    try:
        with autocast_for(device, dtype, model_width(model)):
            t0 = time.perf_counter()
            logits, bounds = engine.start(seqs)
            ttfb = decode_s = 0.0
            decode_bytes = 0
            bounds = [list(b) for b in bounds]
            active = list(range(B))
            for k in range(max_new_bytes):
                rows = torch.tensor(active)
                nxt = sample_next(logits, byte_u[rows, k].to(logits.device), temperature, top_p, top_k)
                lp = torch.log_softmax(logits.float(), -1).gather(1, nxt[:, None])[:, 0]
                nxt_l, lp_l = nxt.tolist(), lp.tolist()
                if k == 0:
                    sync()
                    ttfb = time.perf_counter() - t0
                    t1 = time.perf_counter()
                else:
                    decode_bytes += len(active)
                still = []
                for j, r in enumerate(active):
                    x = nxt_l[j]
                    sampled[r].append(x)
                    logps[r].append(lp_l[j])
                    if x == BOS:
                        reasons[r] = "eos"
                        continue
                    outs[r].append(x)
                    hit = next((s for s in stops if outs[r].endswith(s)), None)
                    if hit is not None:
                        reasons[r] = "stop"
                        del outs[r][len(outs[r]) - len(hit):]
                        continue
                    if k + 1 < max_new_bytes:
                        still.append(j)
                        if streamers[r]:
                            streamers[r].push(bytes(outs[r]))
                for j, r in enumerate(active):  # finished rows: flush their stream
                    if j not in still and streamers[r]:
                        streamers[r].push(bytes(outs[r]), final=True)
                if not still:
                    break
                if len(still) < len(active):
                    local = torch.tensor(still, device=device)
                    engine.keep(local)
                    nxt = nxt[local]
                    active = [active[j] for j in still]
                logits, b = engine.advance(nxt.to(device))
                for r, e in zip(active, b.tolist()):
                    bounds[r].append(bool(e))
                for key, v in engine.cache_bytes().items():
                    peak[key] = max(peak.get(key, 0), v)
            if max_new_bytes > 0:
                sync()
                decode_s = time.perf_counter() - t1
    finally:
        model.train(was_training)
    gens = [Generation(prompt=raw[r], output=bytes(outs[r]), stop_reason=reasons[r], sampled=sampled[r],
                       logprobs=np.array(logps[r], dtype=np.float64),
                       boundaries=np.array(bounds[r], dtype=bool)) for r in range(B)]
    return GenerateResult(sequences=gens, seed=seed, ttfb_s=ttfb, decode_s=decode_s,
                          decode_bytes=decode_bytes, cached=cache, cache_bytes=peak)


def generate_until(model: nn.Module, requests: Sequence[tuple[str, dict]], *, batch_size: int = 16,
                   seed: int = 0, default_max_bytes: int = 256) -> list[str]:
    """lm-eval style ``generate_until``: ``requests`` are (context, gen_kwargs) with gen_kwargs
    keys ``until`` (stop strings), ``max_gen_toks`` (bytes here), ``temperature``, ``do_sample``
    (False = greedy, the lm-eval default). Requests with equal settings share batches; the
    answers come back in request order."""
    answers: list[str | None] = [None] * len(requests)
    groups: dict[tuple, list[int]] = {}
    for i, (_, kw) in enumerate(requests):
        until = kw.get("until") or []
        until = tuple([until] if isinstance(until, str) else until)
        do_sample = bool(kw.get("do_sample", False))
        temp = float(kw.get("temperature", 1.0 if do_sample else 0.0)) if do_sample else 0.0
        key = (until, int(kw.get("max_gen_toks", default_max_bytes)), temp,
               float(kw.get("top_p", 1.0)) if do_sample else 1.0)
        groups.setdefault(key, []).append(i)
    for (until, n, temp, top_p), idx in groups.items():
        for s in range(0, len(idx), batch_size):
            part = idx[s:s + batch_size]
            res = generate(model, [requests[i][0] for i in part], n, temperature=temp, top_p=top_p,
                           stop=list(until) or None, seed=seed, boundary_mode="sample")
            for i, g in zip(part, res):
                answers[i] = g.text
    return [a if a is not None else "" for a in answers]
