"""Tables and the plot of issue 38's frontier, from results/rates/frontier.json (frontier.py).

    python results/rates/frontier_report.py [--record results/rates/frontier.json] [--out results/rates]

Writes frontier_tables.md (per budget: each point's bits/byte, rate, training FLOPs per byte (at
the rate it trained at: what it cost) and FLOPs per byte at its test rate, mean ± SE over seeds; the five options against rl at 0.2, paired over seeds; the best rl rate per
budget and every other rl rate paired against it, with the rates that stay unresolved from it
(Holm-adjusted: the best is picked from the same means); the same at equal training compute, once
rl's rates span two budgets) and frontier.png (bits/byte
against training FLOPs per byte, seed error bars both ways; and rl at each rate against total
training compute through its budgets).
Every number comes from the record."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FAMILIES = ("rl", "uniform", "cond")  # drawn as lines through their rates
# a BPE-token LM scores far below every byte-level row (1.78 against 2.27-2.38 at 8 MB); drawn to
# scale it squeezes the byte models' differences into a band, so the axis is set by the byte
# models and an off-scale point is an arrow at the panel's edge labelled with its value
OFF_SCALE = ("bpe-lm",)


# the best rate is chosen by the same means it is tested with, against all other rates at once
HOLM = "p (Holm): adjusted over the comparisons with the best, which is itself picked from these means"


def mean_se(xs: list[float]) -> tuple[float, float]:
    """Mean and SE over seeds (nan SE below two), values that are missing or nan left out."""
    from rltok.evaluate import standard_error

    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return float("nan"), float("nan")
    return sum(xs) / len(xs), standard_error(xs)


def family(tag: str) -> str:
    return tag.split("_r")[0] if "_r" in tag and not tag.startswith("opt_") else tag


def points(rows: list[dict]) -> dict:
    """(bytes, tag, requested rate) -> {seed: row}."""
    out: dict = defaultdict(dict)
    for r in rows:
        out[(r["bytes"], r["tag"], r["requested_rate"])][r["seed"]] = r
    return out


def paired(a: dict, b: dict) -> dict:
    sys.path.insert(0, str(ROOT / "tools"))
    from study import paired_test  # the studies' paired t over seeds

    common = sorted(set(a) & set(b))
    t = paired_test([a[s]["bpb"] for s in common], [b[s]["bpb"] for s in common])
    return {**t, "seeds": common}


def _fmt(m: float, s: float, nd: int = 4) -> str:
    if not math.isfinite(m):
        return "—"
    return f"{m:.{nd}f}" + (f" ± {s:.{nd}f}" if math.isfinite(s) else "")


def _se(se: float) -> str:
    return f"{se:.4f}" if math.isfinite(se) else "—"  # one seed: no SE


def holm(ps: dict) -> dict:
    """Holm's step-down adjustment of a family of p-values (key -> p, None for no test): the k-th
    smallest of m is multiplied by m - k + 1, kept monotone, capped at 1; None stays None."""
    known = sorted((p, k) for k, p in ps.items() if p is not None)
    out, run = dict.fromkeys(ps), 0.0
    for i, (p, k) in enumerate(known):
        run = max(run, min(1.0, (len(known) - i) * p))
        out[k] = run
    return out


def with_holm(tests: dict) -> dict:
    """Each paired test of one family (key -> paired()) with its Holm-adjusted p as ``p_holm``."""
    for k, p in holm({k: t.get("p") for k, t in tests.items()}).items():
        tests[k]["p_holm"] = p
    return tests


def _test_row(key, t: dict) -> str:
    """A table row of one adjusted paired test: key, seeds, Δ bpb, SE, p, p (Holm)."""
    return (f"| {key} | {len(t['seeds'])} | {t['mean']:+.4f} | {_se(t['se'])} | {_p(t.get('p'))} | "
            f"{_p(t['p_holm'])} |")


def against_best(by_rate: dict) -> tuple:
    """rate -> {seed: row with bpb}: the rate with the lowest mean over the seeds every rate has
    (None if there is none: means over different seeds would rank seeds, not rates), every rate's
    mean ± SE over its own seeds, each other rate paired against the best over seeds (in rate
    order, each test with ``p_holm``), and the rates that test cannot tell from the best
    (Holm-adjusted p >= 0.05, or no p).
    Why Holm: the best is picked from the same means it is then tested with, and it is tested
    against every other rate at once; unadjusted, three seeds and four rates call a difference
    resolved far more often than one time in twenty when all rates are equal."""
    mean = {r: mean_se([x["bpb"] for x in seeds.values()]) for r, seeds in by_rate.items()}
    shared = set.intersection(*(set(seeds) for seeds in by_rate.values()))
    if not shared:
        return None, mean, {}, []
    best = min(by_rate, key=lambda r: mean_se([by_rate[r][s]["bpb"] for s in shared])[0])
    tests = with_holm({r: paired(by_rate[r], by_rate[best]) for r in sorted(by_rate) if r != best})
    tied = [r for r, t in tests.items() if t["p_holm"] is None or t["p_holm"] >= 0.05]
    return best, mean, tests, tied


def _picked(by_rate: dict) -> str:
    """Where the rates' seed sets differ: which seeds the best was picked by (``against_best``)."""
    shared = sorted(set.intersection(*(set(v) for v in by_rate.values())))
    if all(sorted(v) == shared for v in by_rate.values()):
        return ""
    return f"; picked by the means over seed{'s' * (len(shared) > 1)} {', '.join(map(str, shared))}, which every rate has"


def _p(p) -> str:
    return "—" if p is None else f"{p:.3g}"


def same_rate(size: str, keys: list, pts: dict, summary: dict) -> list[str]:
    """Uniform chunks and the one conditioned model against rl at the same requested rate, paired
    over seeds: does learning the boundaries help at every rate, and what does one model for all
    rates cost against a model per rate? Holm over each table's rates (five tests per family)."""
    rl_at = {k[2]: pts[k] for k in keys if family(k[1]) == "rl" and k[2] is not None}
    lines = []
    for fam in ("uniform", "cond"):
        rows = {k[2]: pts[k] for k in keys if family(k[1]) == fam and k[2] in rl_at}
        if not rows:
            continue
        tests = with_holm({r: paired(v, rl_at[r]) for r, v in sorted(rows.items())})
        lines += ["", f"{fam} − rl at the same requested rate ({size}; paired over seeds, two-sided t, n − 1 df; "
                  "p (Holm): adjusted over this table's rates):", "",
                  "| rate | seeds | Δ bpb | SE | p | p (Holm) |", "|---|---|---|---|---|---|"]
        for r, t in tests.items():
            summary[f"{size}:{fam}:{r}:vs_rl"] = t
            lines.append(_test_row(r, t))
    return lines


def tables(rec: dict) -> tuple[str, dict]:
    pts = points(rec["rows"])
    lines, summary = [], {}
    for size in sorted({k[0] for k in pts}, key=lambda s: float(s[:-1])):
        lines += [f"### {size} bytes per run", "",
                  "| row | requested rate | seeds | test bpb | rate on test | train FLOPs/byte | FLOPs/byte at the test rate "
                  "| whitespace recall | enrichment |",
                  "|---|---|---|---|---|---|---|---|---|"]
        keys = sorted((k for k in pts if k[0] == size), key=lambda k: (k[1].split("_")[0], k[2] or 0, k[1]))
        for k in keys:
            seeds = pts[k]
            cell = {f: mean_se([r.get(f) for r in seeds.values()]) for f in
                    ("bpb", "rate", "flops_per_byte_train", "flops_per_byte", "whitespace_recall",
                     "boundary_enrichment")}
            summary[f"{size}:{k[1]}:{k[2]}"] = {f: {"mean": m, "se": s} for f, (m, s) in cell.items()} | {
                "seeds": sorted(seeds)}
            lines.append(f"| {k[1]} | {'' if k[2] is None else k[2]} | {len(seeds)} | {_fmt(*cell['bpb'])} | "
                         f"{_fmt(*cell['rate'], 3)} | {cell['flops_per_byte_train'][0] / 1e6:.2f}M"
                         f"{' ~' if any('train_compute_from' in r for r in seeds.values()) else ''} | "
                         f"{cell['flops_per_byte'][0] / 1e6:.2f}M | {_fmt(*cell['whitespace_recall'], 3)} | "
                         f"{_fmt(*cell['boundary_enrichment'], 2)} |")
        base = pts.get((size, "rl_r0.2", 0.2))
        opts = [k for k in keys if k[1].startswith("opt_")]
        if base and opts:
            lines += ["", f"Options against rl at 0.2 ({size}; paired over seeds, two-sided t, n − 1 df; p (Holm): "
                      "adjusted over the options, five tests against one baseline):", "",
                      "| option | seeds | Δ bpb | SE | p | p (Holm) |", "|---|---|---|---|---|---|"]
            for tag, t in with_holm({k[1]: paired(pts[k], base) for k in opts}).items():
                summary[f"{size}:{tag}:vs_rl"] = t
                lines.append(_test_row(tag, t))
        lines += same_rate(size, keys, pts, summary)
        rl = {k[2]: pts[k] for k in keys if family(k[1]) == "rl"}
        best = None
        if len(rl) > 1:
            best, mean, tests, tied = against_best(rl)
        if len(rl) == 1:
            (only,) = rl
            summary[f"{size}:best_rl_rate"] = None
            lines += ["", f"Best rl rate at {size}: not yet asked (only rate {only} measured)."]
        elif rl and best is None:
            summary[f"{size}:best_rl_rate"] = None
            lines += ["", f"Best rl rate at {size}: not yet asked (no seed has every rate)."]
        elif rl:
            lines += ["", f"Best rl rate at {size}: {best} ({_fmt(*mean[best])} bits/byte{_picked(rl)}). Each other rate against it "
                      f"(paired over seeds, two-sided t; {HOLM}):", "",
                      "| rate | seeds | Δ bpb | SE | p | p (Holm) |", "|---|---|---|---|---|---|"]
            for r, t in tests.items():
                lines.append(_test_row(r, t))
            summary[f"{size}:best_rl_rate"] = best
            summary[f"{size}:rl_rates_not_resolved_from_best"] = tied
            lines += ["", f"Not resolved from the best at Holm-adjusted p < 0.05: {', '.join(map(str, tied)) or 'none'}."]
        lines.append("")
    if any("train_compute_from" in r for r in rec["rows"]):
        lines += ["~: for at least one seed the run's records were gone before its training FLOPs were "
                  "recorded; they are its settings' FLOPs per byte at the requested rate.", ""]
    more, extra = equal_compute(rec)
    return "\n".join(lines + more), summary | extra


def total_flops(row: dict) -> float:
    """A point's training compute: its training bytes times its training FLOPs per byte."""
    from rltok.cli import parse_size

    return parse_size(row["bytes"]) * row["flops_per_byte_train"]


def rl_curves(rec: dict) -> dict:
    """rl's fixed-rate rows across budgets: rate -> seed -> [(log total FLOPs, bpb)] by compute."""
    curves: dict = defaultdict(lambda: defaultdict(list))
    for r in rec["rows"]:
        if family(r["tag"]) == "rl" and r.get("requested_rate") is not None:
            curves[r["requested_rate"]][r["seed"]].append((math.log(total_flops(r)), r["bpb"]))
    return {rate: {s: sorted(v) for s, v in seeds.items()} for rate, seeds in curves.items()}


def interp(curve: list[tuple[float, float]], x: float) -> float | None:
    """Piecewise-linear interpolation through the curve's points; None outside them (no extrapolation)."""
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None


def equal_compute(rec: dict) -> tuple[list[str], dict]:
    """The best rl rate at equal training compute, not at equal bytes: a higher rate costs more FLOPs
    per byte, so at a fixed byte budget it also buys more compute. Each rate's bits/byte, seed by
    seed, is interpolated linearly in log(total training FLOPs) between its budgets and read at
    compute levels every rate's curves span (the ends and the geometric middle of the common
    range); the rate with the lowest mean there, and each other rate paired against it over seeds."""
    curves = {r: {s: c for s, c in seeds.items() if len(c) >= 2} for r, seeds in rl_curves(rec).items()}
    curves = {r: seeds for r, seeds in curves.items() if seeds}
    if len(curves) < 2:
        return [], {}
    ends = [c for seeds in curves.values() for c in seeds.values()]
    lo, hi = max(c[0][0] for c in ends), min(c[-1][0] for c in ends)
    if lo > hi:
        return [], {}
    lines = ["### rl's rates at equal training compute", "",
             "Each rate's bits/byte, seed by seed, interpolated linearly in log(training FLOPs) between "
             "its budgets (no extrapolation), read where every rate's curves reach; each rate paired "
             f"over seeds against the best there (two-sided t, n − 1 df; {HOLM}).", ""]
    out = []
    for x in sorted({lo, (lo + hi) / 2, hi}):
        at = {r: {s: {"bpb": interp(c, x)} for s, c in seeds.items()} for r, seeds in curves.items()}
        best, mean, tests, tied = against_best(at)
        if best is None:
            continue
        lines += [f"At {math.exp(x):.3g} training FLOPs: best rate {best} ({_fmt(*mean[best])} bits/byte{_picked(at)})", "",
                  "| rate | seeds | bpb | Δ vs best | SE | p | p (Holm) |", "|---|---|---|---|---|---|---|"]
        for r in sorted(at):
            t = tests.get(r)
            lines.append(f"| {r} | {len(at[r])} | {_fmt(*mean[r])} | "
                         + ("— | — | — | — |" if t is None else
                            f"{t['mean']:+.4f} | {_se(t['se'])} | {_p(t.get('p'))} | {_p(t['p_holm'])} |"))
        lines += ["", f"Not resolved from the best at Holm-adjusted p < 0.05: {', '.join(map(str, tied)) or 'none'}.", ""]
        out.append({"flops": math.exp(x), "best_rl_rate": best, "rl_rates_not_resolved_from_best": tied})
    return lines, {"equal_compute": out}


def plot(rec: dict, dest: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = points(rec["rows"])
    sizes = sorted({k[0] for k in pts}, key=lambda s: float(s[:-1]))
    spans = {r for r, seeds in rl_curves(rec).items() if any(len(c) >= 2 for c in seeds.values())}
    fig, axes = plt.subplots(1, len(sizes) + bool(spans), figsize=(6.5 * (len(sizes) + bool(spans)), 6.2),
                             squeeze=False)
    if spans:  # rl at each rate through its budgets, against total training compute
        ax = axes[0][-1]
        for rate in sorted(spans):
            line = sorted(((k[0], by_seed) for k, by_seed in pts.items() if family(k[1]) == "rl" and k[2] == rate),
                          key=lambda b: float(b[0][:-1]))  # one point per budget, mean over its seeds
            xs = [mean_se([total_flops(r) for r in by_seed.values()])[0] for _, by_seed in line]
            ys = [mean_se([r["bpb"] for r in by_seed.values()]) for _, by_seed in line]
            ax.errorbar(xs, [y[0] for y in ys], yerr=[0 if math.isnan(y[1]) else y[1] for y in ys], fmt="-o",
                        capsize=3, markersize=4, label=f"rl at {rate:g}")
        ax.set_xscale("log")
        ax.set_title("rl at each rate through its budgets (mean ± SE over seeds)")
        ax.set_xlabel("training FLOPs per run (bytes × FLOPs per byte)")
        ax.set_ylabel("prose test bits/byte (whole documents)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    for ax, size in zip(axes[0], sizes):
        ax.set_prop_cycle(color=plt.cm.tab20.colors)  # more rows than the default cycle's ten colours
        series: dict = defaultdict(list)
        for k, seeds in pts.items():
            if k[0] != size:
                continue
            x = mean_se([r["flops_per_byte_train"] / 1e6 for r in seeds.values()])
            y = mean_se([r["bpb"] for r in seeds.values()])
            series[family(k[1])].append((x, y, k[2], len(seeds)))
        off = {name: series.pop(name) for name in OFF_SCALE if name in series}
        for name, ps in sorted(series.items()):
            ps.sort(key=lambda p: p[0][0])
            xs, ys = [p[0][0] for p in ps], [p[1][0] for p in ps]
            xe, ye = [0 if math.isnan(p[0][1]) else p[0][1] for p in ps], [0 if math.isnan(p[1][1]) else p[1][1] for p in ps]
            line = "-o" if name in FAMILIES else "s"
            ax.errorbar(xs, ys, xerr=xe, yerr=ye, fmt=line, capsize=3, label=name, markersize=5)
            if name in FAMILIES:
                for p in ps:
                    ax.annotate(f"{p[2]:g}", (p[0][0], p[1][0]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_title(f"{size} training bytes (mean ± SE over seeds; labels: rate)")
        ax.set_xlabel("training FLOPs per byte (millions; cond: one model, one cost)")
        ax.set_ylabel("prose test bits/byte (whole documents)")
        ax.grid(alpha=0.3)
        # absolute values on the axes, and at least 0.05 bits/byte of height, so that two nearly
        # equal points read as nearly equal rather than filling the panel behind an offset label
        ax.ticklabel_format(useOffset=False)
        lo, hi = ax.get_ylim()
        if hi - lo < 0.05:
            mid = (lo + hi) / 2
            ax.set_ylim(mid - 0.025, mid + 0.025)
        for name, ps in off.items():
            for (x, _), (y, ye), _, n in ps:
                lo, hi = ax.get_ylim()
                if lo <= y <= hi:
                    ax.plot([x], [y], "k*", markersize=8, label=name)
                    continue
                edge = lo + 0.04 * (hi - lo) if y < lo else hi - 0.04 * (hi - lo)
                ax.plot([x], [edge], "kv" if y < lo else "k^", markersize=8,
                        label=f"{name}: {y:.4f} ± {0 if math.isnan(ye) else ye:.4f} ({n} seeds), off scale")
                ax.set_ylim(lo, hi)
        # below the panel: inside, a dozen rows' legend covers points or the off-scale arrow
        ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    fig.tight_layout()
    fig.savefig(dest, dpi=130)
    return fig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", default=str(HERE / "frontier.json"))
    ap.add_argument("--out", default=str(HERE))
    args = ap.parse_args()
    rec = json.loads(Path(args.record).read_text())
    old = sorted({f"{r['bytes']} {r['tag']} s{r['seed']}" for r in rec["rows"] if "flops_per_byte_train" not in r})
    if old:
        sys.exit(f"{args.record}: rows without flops_per_byte_train ({', '.join(old)}): run "
                 "results/rates/frontier.py once to fill them in from their runs")
    text, summary = tables(rec)
    out = Path(args.out)
    (out / "frontier_tables.md").write_text("# Rate–compute frontier (generated by results/rates/frontier_report.py)\n\n"
                                            + text)
    (out / "frontier_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(rec, out / "frontier.png")
    print(f"wrote {out}/frontier_tables.md, frontier_summary.json, frontier.png ({len(rec['rows'])} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
