"""Does the rate controller's windup cost rl its word boundaries as the budget grows? (issue 36)

The v2 study (technical docs, results/study/) found rl's test whitespace recall per seed 0.896 /
0.778 / 0.578 at 8 MB but 0.934 / 0.240 / 0.364 at 32 MB, while its integral controller's offset
drifted to -9.5 ... -17.3 (v2 had no anti-windup). This reads the training metrics both studies
commit (RUN/metrics.jsonl: the controller's offset, whitespace and word-start recall on each
training batch, and the validation recalls at each evaluation) and writes, beside this file:

* windup.md: per study, rung, row and seed: the offset and the recalls at 1/5 of training and at the
  end (with three seeds per row, no correlation is computed: the table is descriptive);
* windup.png: offset and whitespace recall against training bytes, one line per seed.

    python results/study-prose/windup.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
STUDIES = {"v2 (technical docs)": HERE.parent / "study" / "runs", "prose": HERE / "runs"}
ROWS = ("rl", "rl-penalty", "rl-bpe-rate")  # rl-bpe-rate: the same anti-windup controller, at bpe's rate


def trajectory(run: Path) -> dict | None:
    """Training-batch offset and recalls, and the validation recalls, of one run's metrics."""
    p = run / "metrics.jsonl"
    if not p.is_file():
        return None
    train, val = [], []
    for line in p.read_text().splitlines():
        r = json.loads(line)
        if r.get("event") == "eval" and "val_whitespace_recall" in r:
            val.append((r["bytes"], r["val_whitespace_recall"], r.get("val_word_start_recall", float("nan"))))
        elif "whitespace_recall" in r and "event" not in r:
            train.append((r["bytes"], r.get("rate_offset", 0.0), r["whitespace_recall"],
                          r.get("word_start_recall", float("nan"))))
    if not train:
        return None
    return {"train": np.array(train, dtype=float), "val": np.array(val, dtype=float)}


def _smooth(x: np.ndarray, k: int = 9) -> np.ndarray:
    """Mean over the last k logged batches (a batch's recall is noisy)."""
    c = np.cumsum(np.insert(x, 0, 0.0))
    out = np.empty_like(x)
    for i in range(len(x)):
        lo = max(0, i + 1 - k)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def collect() -> list[dict]:
    out = []
    for study, root in STUDIES.items():
        for rung in ("2M", "8M", "32M"):
            for tag in ROWS:
                for run in sorted((root / rung).glob(f"{tag}_s*")):
                    t = trajectory(run)
                    if t is None:
                        continue
                    tr = t["train"]
                    ws, wst = _smooth(tr[:, 2]), _smooth(tr[:, 3])
                    fifth = int(np.searchsorted(tr[:, 0], tr[-1, 0] / 5))
                    out.append({"study": study, "rung": rung, "tag": tag, "seed": int(run.name.rsplit("_s", 1)[1]),
                                "bytes": float(tr[-1, 0]), "offset_fifth": float(tr[fifth, 1]),
                                "offset_end": float(tr[-1, 1]), "offset_min": float(tr[:, 1].min()),
                                "ws_fifth": float(ws[fifth]), "ws_end": float(ws[-1]), "wst_end": float(wst[-1]),
                                "val_ws_end": float(t["val"][-1, 1]) if len(t["val"]) else float("nan"),
                                "traj": t})
    return out


def table(rows: list[dict]) -> str:
    lines = ["| study | rung | row | seed | offset at 1/5 | offset at end (min) | ws recall at 1/5 | ws recall at end "
             "| word-start recall at end | validation ws recall at end |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['study']} | {r['rung']} | {r['tag']} | {r['seed']} | {r['offset_fifth']:+.2f} "
                     f"| {r['offset_end']:+.2f} ({r['offset_min']:+.2f}) | {r['ws_fifth']:.2f} | {r['ws_end']:.2f} "
                     f"| {r['wst_end']:.2f} | {r['val_ws_end']:.2f} |")
    lines += ["", "Recalls on training batches are means over the last 9 logged batches; the offset is the "
              "integral controller's logit offset (0 for rl-penalty, which has none)."]
    return "\n".join(lines)


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(s, rung) for s in STUDIES for rung in ("8M", "32M")
              if any(r["study"] == s and r["rung"] == rung for r in rows)]
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 6.5), squeeze=False, sharey="row")
    colors = {1: "C0", 2: "C1", 3: "C2", 4: "C3", 5: "C4"}
    for j, (s, rung) in enumerate(panels):
        for r in rows:
            if r["study"] != s or r["rung"] != rung:
                continue
            tr = r["traj"]["train"]
            ls = {"rl": "-", "rl-penalty": ":"}.get(r["tag"], "--")
            lab = f"{r['tag']} s{r['seed']}"
            axes[0, j].plot(tr[:, 0] / 1e6, tr[:, 1], ls, color=colors.get(r["seed"], "k"), label=lab, lw=1)
            axes[1, j].plot(tr[:, 0] / 1e6, _smooth(tr[:, 2]), ls, color=colors.get(r["seed"], "k"), label=lab, lw=1)
        axes[0, j].set_title(f"{s}, {rung}", fontsize=9)
        axes[1, j].set_xlabel("training bytes (MB)")
        axes[1, j].set_ylim(0, 1)
        for ax in axes[:, j]:
            ax.grid(alpha=0.3)
        axes[1, j].legend(fontsize=7)
    axes[0, 0].set_ylabel("controller offset (logit)")
    axes[1, 0].set_ylabel("whitespace recall (training batches)")
    fig.suptitle("rl's integral controller: offset and whitespace recall over training (solid: rl, dotted: rl-penalty, dashed: rl-bpe-rate)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> int:
    rows = collect()
    (HERE / "windup.md").write_text("# The controller's windup and whitespace recall (generated by windup.py)\n\n"
                                    + table(rows) + "\n")
    plot(rows, HERE / "windup.png")
    print(f"wrote {HERE / 'windup.md'} and windup.png ({len(rows)} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
