"""One step of a rate calibration: the rate from the encoder and the router alone
(``rltok.evaluate.corpus_rate``, what ``calibrate_rate`` now uses) against the full evaluation it
replaced (``evaluate_corpus(...).rate``), side by side in one process, alternated, same model, same
documents and draws, with the two rates compared (they must be equal).

    python benchmarks/calibrate_rate.py [--method rl] [--preset tiny] [--docs 64] [--reps 5] [--dtype auto] [--set KEY=VALUE]

The documents: FLORES-200's calibration half (English, then French, ...) where ../shared/data has it,
else the built-in sample text; every byte scored (``whole``), 16 rows per batch, as the multilingual
study calibrates.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from rltok.config import build_config
from rltok.data.corpus import Corpus
from rltok.evaluate import corpus_rate, evaluate_corpus
from rltok.run import build_model

FLORES = Path(__file__).resolve().parents[2] / "shared" / "data" / "multilingual" / "flores200_devtest"


def documents(n: int) -> list[bytes]:
    if FLORES.is_dir():
        from rltok.analysis import read_flores

        return [p.encode() for t in read_flores(FLORES, "calibrate", keys=["eng_Latn", "fra_Latn", "rus_Cyrl"])
                for p in t.paragraphs][:n]
    text = (Path(torch.__file__).parent / "nn" / "modules" / "module.py").read_bytes()
    return [text[i:i + 600] for i in range(0, 600 * n, 600)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", default="rl")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config override, e.g. boundary.threshold=2.5 (entropy: a random model's rate 1 otherwise)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    over = dict(kv.split("=", 1) for kv in a.set)
    model = build_model(build_config(a.method, a.preset, overrides=over)).eval()
    with torch.no_grad():  # a policy that reads its input (a fresh one starts at zero)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    corpus = Corpus.from_docs(documents(a.docs), "calibration")
    seq = model.cfg.seq_len
    kw = dict(whole=True, batch_size=16, dtype=a.dtype)
    times: dict[str, list[float]] = {"evaluate_corpus": [], "corpus_rate": []}
    rates = {}
    for _ in range(a.reps):
        for name, fn in (("evaluate_corpus", lambda: evaluate_corpus(model, corpus, seq, **kw).rate),
                         ("corpus_rate", lambda: corpus_rate(model, corpus, seq, **kw))):
            t = time.perf_counter()
            rates[name] = fn()
            times[name].append(time.perf_counter() - t)
    full, alone = statistics.median(times["evaluate_corpus"]), statistics.median(times["corpus_rate"])
    n_bytes = sum(len(corpus.doc_bytes(i)) for i in range(len(corpus)))
    print(f"{a.method} {a.preset}, {len(corpus)} documents ({n_bytes:,} bytes), dtype {a.dtype}, "
          f"{a.threads} thread(s), median of {a.reps}")
    print(f"  evaluate_corpus(...).rate  {full:7.3f} s   rate {rates['evaluate_corpus']:.6f}")
    print(f"  corpus_rate                {alone:7.3f} s   rate {rates['corpus_rate']:.6f}")
    print(f"  ratio full / rate alone    {full / alone:7.2f}x   rates equal: {rates['corpus_rate'] == rates['evaluate_corpus']}")


if __name__ == "__main__":
    main()
