"""An lm-evaluation-harness model for rltok runs: ``--model rltok --model_args path=RUN``.

lm-eval (0.4.x) finds models in its registry (``lm_eval.api.registry``); it has no entry-point
group for third-party models, so the registry must see this module imported before it looks
``rltok`` up. Three ways that work:

* the command ``rltok-lm-eval`` (installed with rltok) is lm-eval's own CLI with this model
  registered: ``rltok-lm-eval --model rltok --model_args path=RUN --tasks piqa``;
  ``python -m rltok.tasks.lm_eval_adapter ...`` is the same;
* in Python: ``import rltok.tasks.lm_eval_adapter`` then ``lm_eval.simple_evaluate(model="rltok",
  model_args="path=RUN", tasks=[...])``, or pass ``RltokLM(path=RUN)`` as ``model``;
* plain ``lm_eval --model rltok`` does not import third-party code, so it cannot know the name.

Model args: ``path`` (run directory), ``samples`` (boundary samples averaged, default 1),
``seed``, ``dtype`` (default: the run's), ``checkpoint``, ``greedy_boundaries``; lm-eval's
``--batch_size`` and ``--device`` are honoured.

Scores are those of ``rltok tasks`` (the same scorer on the same (context, continuation) pairs):
``loglikelihood`` returns (sum of log-probabilities of the continuation bytes in nats, whether each
byte was the argmax). ``loglikelihood_rolling`` scores a whole text in disjoint windows.
``generate_until`` uses ``rltok.generate`` when this build has it.

Importing this module also loads lm-eval's own model table first: lm-eval only fills its
registry lazily when it is empty, and registering ``rltok`` into an empty registry would hide the
built-in models.
"""

from __future__ import annotations

import sys

try:
    import lm_eval.models  # noqa: F401  (fills the registry with lm-eval's own models first)
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as e:  # pragma: no cover - exercised only without lm-eval
    raise ImportError("the lm-eval adapter needs lm-eval: pip install 'rltok[lm-eval]'") from e

from .scoring import Request, as_bytes, model_seq_len, rolling_requests, score_requests
from ..run import load_model


def _bool(v) -> bool:
    return v if isinstance(v, bool) else str(v).strip().lower() in ("1", "true", "yes", "on")


def _device(device: str | None) -> str:
    import torch

    if device and str(device).startswith("cuda") and not torch.cuda.is_available():
        print(f"rltok: device {device!r} is not available; using cpu", file=sys.stderr)
        return "cpu"
    return device or "cpu"


@register_model("rltok")
class RltokLM(LM):
    def __init__(self, path: str | None = None, samples: int = 1, seed: int = 0, dtype: str | None = None,
                 checkpoint: str | None = None, greedy_boundaries=False, batch_size=16,
                 device: str | None = None, max_batch_size=None, model=None, **unused):
        super().__init__()

        if model is None:
            if path is None:
                raise ValueError("rltok: pass model_args path=RUN_DIRECTORY")
            model = load_model(path, device=_device(device), checkpoint=checkpoint)
        self.model = model
        cfg = getattr(model, "run_config", None)
        self.dtype = dtype or (cfg.train.dtype if cfg is not None else "fp32")
        self.samples = int(samples)
        self.seed = int(seed)
        self.mode = "greedy" if _bool(greedy_boundaries) else "sample"
        try:
            self.batch_size = int(batch_size)
        except (TypeError, ValueError):  # "auto": a fixed size is fine on a byte model
            self.batch_size = 16
        self._device = next(model.parameters()).device
        self.seq_len = model_seq_len(model)

    def get_model_info(self) -> dict:
        """lm-eval copies this into its results' ``config``: which weights were scored."""
        cfg = getattr(self.model, "run_config", None)
        w = getattr(self.model, "weights", None) or {}
        return {"rltok_method": cfg.method if cfg is not None else None,
                "rltok_run": str(getattr(self.model, "run_dir", "")) or None,
                "rltok_checkpoint": w.get("checkpoint"), "rltok_step": w.get("step"),
                "rltok_finished": w.get("finished")}

    def _score(self, reqs: list[Request], progress: bool = False):
        return score_requests(self.model, reqs, samples=self.samples, seed=self.seed, mode=self.mode,
                              batch_size=self.batch_size, dtype=self.dtype, progress=progress)

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        reqs = [Request(as_bytes(r.args[0]), as_bytes(r.args[1])) for r in requests]
        out = []
        for req, s in zip(requests, self._score(reqs, progress="loglikelihood" if not disable_tqdm else False)):
            res = (-s.nll, s.greedy > 0.5)
            out.append(res)
            self.cache_hook.add_partial("loglikelihood", req.args, res)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for i, r in enumerate(requests):
            for w in rolling_requests(as_bytes(r.args[0]), self.seq_len):
                windows.append(w)
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, s in zip(owner, self._score(windows, progress="rolling" if not disable_tqdm else False)):
            totals[i] -= s.nll
        for r, t in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", (r.args[0],), t)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        try:
            from ..generate import generate_until
        except ImportError:
            raise NotImplementedError("rltok: generate_until needs rltok.generate (generation is not "
                                      "in this build)") from None
        args = [(r.args[0], dict(r.args[1] or {})) for r in requests]
        out = generate_until(self.model, args, batch_size=self.batch_size, seed=self.seed)
        for r, text in zip(requests, out):
            self.cache_hook.add_partial("generate_until", r.args, text)
        return out


def main(argv: list[str] | None = None) -> int:
    """lm-eval's CLI with the ``rltok`` model registered (``rltok-lm-eval``)."""
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
