"""How low BPE guidance's rate can go on the prose mix: byte-level BPEs (HF ``tokenizers``, as
``rltok.bpe.train_bpe`` trains them) fitted on the first N bytes of the prose training split (in
``rltok.bpe.fit_docs``'s order) at several vocabulary sizes, scored in tokens per byte on the first
400 documents of the validation split. The study's partner row (rl-bpe-rate) exists because this
floor is above r* + 0.01.

    python tools/bpe_floor.py [--fit-bytes 20000000,80000000] [--vocab 131072,200000,300000]

Record: results/study-prose/bpe_floor.json."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "results" / "study-prose" / "bpe_floor.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit-bytes", default="20000000,80000000")
    ap.add_argument("--vocab", default="131072,200000,300000")
    ap.add_argument("--val-docs", type=int, default=400)
    args = ap.parse_args()
    from rltok.bpe import fit_docs, tokens_per_byte, train_bpe
    from rltok.config import build_config
    from rltok.data import load_splits

    splits = load_splits(build_config("bpe", "tiny", overrides={"data.source": "prose"}))
    val = [splits.val.doc_bytes(i) for i in range(min(args.val_docs, len(splits.val)))]
    rows = []
    for fit_bytes in (int(x) for x in args.fit_bytes.split(",")):
        docs = fit_docs(splits.train, fit_bytes)
        for vocab in (int(x) for x in args.vocab.split(",")):
            t0 = time.time()
            tok = train_bpe(docs, vocab)
            rows.append({"fit_bytes": sum(map(len, docs)), "vocab_requested": vocab,
                         "vocab": tok.get_vocab_size(), "tokens_per_byte_val": tokens_per_byte(tok, val),
                         "seconds": round(time.time() - t0, 1)})
            print(json.dumps(rows[-1]), flush=True)
    rec = {"what": "byte-level BPE tokens per byte on the prose validation split (no prefix space, "
                   "min_frequency 2)", "val_docs": len(val),
           "val_bytes": sum(map(len, val)), "rows": rows,
           "floor": min(r["tokens_per_byte_val"] for r in rows)}
    OUT.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"floor {rec['floor']:.4f}; written {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
