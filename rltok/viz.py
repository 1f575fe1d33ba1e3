"""Seeing boundaries and training curves: terminal text, self-contained HTML, PNG (matplotlib).

Bytes are shown as characters: a character's shade is the probability that one of its bytes ends
a chunk (1 - prod(1 - p) over its bytes; p itself for ASCII), and a chunk delimiter is drawn after
the character holding a chunk end (a boundary inside a multi-byte character is shown at the end of
that character). Invalid UTF-8 bytes are shown as U+FFFD, one per byte.

Fonts for the PNG: DejaVu Sans (matplotlib's own) for what it covers, then, per character it lacks,
the first installed font that has the glyph (Noto Sans CJK, Droid Sans Fallback, other Noto
fonts, ...; ``$RLTOK_FONT`` = font files to try first, separated by ``os.pathsep``). A character no
font covers is drawn as a box, with one warning naming what to install (Debian: ``fonts-noto-cjk``,
``fonts-noto-core``). matplotlib lays out glyph by glyph without shaping, so scripts that need
shaping (Arabic joining, Indic conjuncts) are legible but not typeset well in the PNG; the HTML
leaves layout to the browser, which shapes them.
"""

from __future__ import annotations

import html as htmllib
import math
import os
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np
from .errors import RltokError
from .metrics import read_metrics as read

PREFERRED_FONTS = ("DejaVu Sans", "Noto Sans", "Noto Sans CJK JP", "Noto Sans CJK SC", "Noto Sans JP",
                   "Droid Sans Fallback", "Noto Sans Arabic", "Noto Sans Hebrew", "Noto Sans Devanagari",
                   "Noto Sans Bengali", "Noto Sans Tamil", "Noto Sans Telugu", "Noto Sans Thai",
                   "Noto Sans Khmer", "Noto Sans Myanmar", "Noto Sans Ethiopic", "Noto Sans Georgian",
                   "Noto Sans Armenian")


# -- characters of a byte string -----------------------------------------------------------------

@dataclass
class Cell:
    text: str  # one character (U+FFFD for an invalid byte)
    start: int  # byte span [start, end)
    end: int


def char_cells(data: bytes) -> list[Cell]:
    cells, i, n = [], 0, len(data)
    while i < n:
        c = data[i]
        need = 1 if c < 0x80 else 2 if c >> 5 == 0b110 else 3 if c >> 4 == 0b1110 else 4 if c >> 3 == 0b11110 else 0
        if need:
            try:
                cells.append(Cell(data[i:i + need].decode("utf-8"), i, i + need))
                i += need
                continue
            except UnicodeDecodeError:
                pass
        cells.append(Cell("\ufffd", i, i + 1))
        i += 1
    return cells


@dataclass
class CellView:
    text: str
    prob: float  # probability that the character holds a chunk end
    end: bool  # a chunk ends in this character


def cell_views(data: bytes, boundaries: np.ndarray, probs: np.ndarray | None = None) -> list[CellView]:
    b = np.asarray(boundaries, bool)
    p = np.asarray(probs, float) if probs is not None else b.astype(float)
    out = []
    for c in char_cells(data):
        pb = p[c.start:c.end]
        out.append(CellView(c.text, float(1 - np.prod(1 - np.clip(pb, 0, 1))) if len(pb) else 0.0,
                            bool(b[c.start:c.end].any())))
    return out


# -- terminal and HTML ---------------------------------------------------------------------------

def render_terminal(data: bytes, boundaries: np.ndarray, sep: str = "|", inner: np.ndarray | None = None,
                    inner_sep: str = "‖") -> str:
    """The text with ``sep`` after each chunk; with ``inner`` (two stages: the bytes that end an
    inner chunk), ``inner_sep`` after each inner chunk instead."""
    parts = []
    ends2 = None if inner is None else cell_views(data, inner)
    for i, v in enumerate(cell_views(data, boundaries)):
        mark = (inner_sep if ends2 is not None and ends2[i].end else sep) if v.end else ""
        parts.append(v.text + mark)
    return "".join(parts)


def _rgba(p: float) -> str:
    r, g, b, _ = [int(255 * x) for x in _cmap()(0.08 + 0.8 * p)]
    return f"rgb({r},{g},{b})"


@lru_cache(maxsize=1)
def _cmap():
    import matplotlib

    return matplotlib.colormaps["YlOrRd"]


def render_html(data: bytes, boundaries: np.ndarray, probs: np.ndarray | None = None, title: str = "",
                info: str = "", inner: np.ndarray | None = None) -> str:
    """A self-contained HTML page (inline CSS, no scripts, fonts or links from elsewhere).
    ``inner`` (two stages): the bytes that end an inner chunk, drawn with a thick red bar."""
    spans = []
    ends2 = None if inner is None else cell_views(data, inner)
    for i, v in enumerate(cell_views(data, boundaries, probs)):
        end = (" e2" if ends2 is not None and ends2[i].end else " e") if v.end else ""
        if v.text == "\n":
            spans.append(f'<span class="c{end}" title="p={v.prob:.3f}" '
                         f'style="background:{_rgba(v.prob)}">\u21b5</span>\n')
            continue
        cls = "c" + end
        spans.append(f'<span class="{cls}" title="p={v.prob:.3f}" style="background:{_rgba(v.prob)}">'
                     f'{htmllib.escape(v.text)}</span>')
    legend = "".join(f'<span class="c" style="background:{_rgba(p)}">&nbsp;{p:.1f}&nbsp;</span>'
                     for p in np.linspace(0, 1, 6))
    t = htmllib.escape(title)
    inner_note = "" if inner is None else "; thick red bar: an inner (second-stage) chunk ends there too"
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{t}</title>
<style>
body {{ font-family: "DejaVu Sans", "Noto Sans", "Noto Sans CJK JP", "Noto Sans CJK SC", "Droid Sans Fallback", sans-serif;
       margin: 2em; max-width: 60em; color: #111; }}
.text {{ white-space: pre-wrap; line-height: 2.0; font-size: 17px; word-break: break-all; }}
.c {{ padding: 2px 0; }}
.e {{ border-right: 2px solid #1a3d8f; margin-right: 1px; }}
.e2 {{ border-right: 4px solid #b0161e; margin-right: 2px; }}
.info {{ color: #444; font-size: 14px; }}
</style></head>
<body>
<h3>{t}</h3>
<p class="info">{htmllib.escape(info)}</p>
<p class="info">Shade: probability that the character ends a chunk {legend}; blue bar: a chunk ends there{inner_note}. Hover a character for its probability.</p>
<div class="text">{"".join(spans)}</div>
</body></html>
"""


# -- fonts ---------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _ft(path: str):
    from matplotlib.ft2font import FT2Font

    try:
        return FT2Font(path)
    except Exception:  # an unreadable font file is skipped
        return None


def _has_glyph(path: str, ch: str) -> bool:
    f = _ft(path)
    return f is not None and f.get_char_index(ord(ch)) != 0


@lru_cache(maxsize=1)
def candidate_fonts() -> tuple[str, ...]:
    """Font files to try, best first: $RLTOK_FONT, preferred families, then every installed font."""
    from matplotlib import font_manager as fm

    env = [p for p in os.environ.get("RLTOK_FONT", "").split(os.pathsep) if p and Path(p).is_file()]
    entries = [e for e in fm.fontManager.ttflist if e.style == "normal"]
    by_name: dict[str, list] = {}
    for e in entries:
        by_name.setdefault(e.name, []).append(e)
    ordered = []
    for name in PREFERRED_FONTS:
        for e in sorted(by_name.get(name, []), key=lambda e: abs(int(e.weight if str(e.weight).isdigit() else 400) - 400)):
            ordered.append(e.fname)
    # fonts installed after matplotlib built its cache are found by a direct scan
    rest = sorted({e.fname for e in entries} | set(fm.findSystemFonts()))
    regular = [p for p in rest if "regular" in Path(p).name.lower()]
    out = []
    for p in env + ordered + regular + rest:
        # matplotlib's LastResort font "has" every code point, as a placeholder box: not a glyph
        if "lastresort" in Path(p).name.lower():
            continue
        if p not in out and p.lower().endswith((".ttf", ".otf", ".ttc")):
            out.append(p)
    return tuple(out)


def fonts_for(text: str) -> tuple[dict[str, str], set[str]]:
    """A font file per distinct character, and the characters no font has."""
    cands = candidate_fonts()
    mapping, missing = {}, set()
    for ch in set(text):
        if ch in "\n\t\r ":
            mapping[ch] = cands[0] if cands else ""
            continue
        for p in cands:
            if _has_glyph(p, ch):
                mapping[ch] = p
                break
        else:
            missing.add(ch)
            mapping[ch] = cands[0] if cands else ""
    return mapping, missing


# -- PNG -----------------------------------------------------------------------------------------

def render_png(data: bytes, boundaries: np.ndarray, probs: np.ndarray | None, out: str | Path, *,
               title: str = "", info: str = "", width_pt: float = 620, font_size: float = 13,
               dpi: int = 150) -> Path:
    """The text laid out line by line, each character on a box shaded by its boundary probability,
    a bar after each chunk end; a colour scale below."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.font_manager import FontProperties
    from matplotlib.patches import Rectangle
    from matplotlib.textpath import TextToPath

    views = cell_views(data, boundaries, probs)
    fmap, missing = fonts_for("".join(v.text for v in views) + "\u21b5")
    if missing:
        shown = "".join(sorted(missing))[:20]
        warnings.warn(f"no installed font has the glyphs {shown!r}: they are drawn as boxes (install "
                      f"fonts-noto-cjk / fonts-noto-core, or set RLTOK_FONT=/path/font.ttf)", stacklevel=2)
    ttp = TextToPath()
    props: dict[str, FontProperties] = {}

    def prop(ch: str) -> FontProperties:
        f = fmap.get(ch, "")
        if f not in props:
            props[f] = FontProperties(fname=f, size=font_size) if f else FontProperties(size=font_size)
        return props[f]

    @lru_cache(maxsize=None)
    def width(ch: str) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            w = ttp.get_text_width_height_descent(ch, prop(ch), ismath=False)[0]
        return max(w, font_size * 0.3)

    # layout: words (runs up to and including spaces) wrap as a whole; longer runs break anywhere
    line_h = font_size * 1.9
    lines: list[list[tuple[float, CellView, str]]] = [[]]
    x = 0.0
    words: list[list[CellView]] = [[]]
    for v in views:
        words[-1].append(v)
        if v.text in (" ", "\n", "\t"):
            words.append([])
    for word in words:
        ww = sum(width("\u21b5" if v.text == "\n" else v.text) for v in word)
        if x > 0 and x + ww > width_pt and ww <= width_pt:
            lines.append([])
            x = 0.0
        for v in word:
            shown = "\u21b5" if v.text == "\n" else ("\u2192" if v.text == "\t" else v.text)
            w = width(shown)
            if x + w > width_pt and x > 0:
                lines.append([])
                x = 0.0
            lines[-1].append((x, v, shown))
            x += w
            if v.text == "\n":
                lines.append([])
                x = 0.0
    margin = 18.0
    head = (font_size * 2.6 if title else 0) + (font_size * 1.6 if info else 0)
    legend_h = font_size * 3.2
    H = margin + head + len(lines) * line_h + legend_h + margin
    W = width_pt + 2 * margin
    fig = plt.figure(figsize=(W / 72, H / 72), dpi=dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, W)
    ax.set_ylim(H, 0)
    ax.axis("off")
    cmap = _cmap()
    y = margin
    if title:
        ax.text(margin, y + font_size * 1.2, title, fontsize=font_size * 1.15, fontweight="bold",
                fontproperties=None, va="baseline", ha="left")
        y += font_size * 2.6
    if info:
        ax.text(margin, y + font_size * 0.9, info, fontsize=font_size * 0.85, color="#444", va="baseline", ha="left")
        y += font_size * 1.6
    for line in lines:
        for x0, v, shown in line:
            w = width(shown)
            ax.add_patch(Rectangle((margin + x0, y), w, line_h * 0.82, facecolor=cmap(0.08 + 0.8 * v.prob),
                                   edgecolor="none"))
            if shown.strip():
                ax.text(margin + x0, y + line_h * 0.58, shown, fontproperties=prop(shown), va="baseline",
                        ha="left", color="#999" if shown in ("\u21b5", "\u2192") else "#111")
            if v.end:
                ax.plot([margin + x0 + w, margin + x0 + w], [y - 1, y + line_h * 0.82 + 1], color="#1a3d8f", lw=1.3,
                        solid_capstyle="butt")
        y += line_h
    # colour scale
    y += font_size * 0.8
    ax.text(margin, y + font_size * 0.9, "boundary probability", fontsize=font_size * 0.8, color="#333",
            va="baseline")
    x0 = margin + font_size * 9
    for k in range(50):
        ax.add_patch(Rectangle((x0 + k * 4, y), 4, font_size * 1.1, facecolor=cmap(0.08 + 0.8 * k / 49), edgecolor="none"))
    ax.text(x0 - 2, y + font_size * 2.3, "0", fontsize=font_size * 0.7, va="baseline")
    ax.text(x0 + 200 - 4, y + font_size * 2.3, "1", fontsize=font_size * 0.7, va="baseline")
    ax.plot([x0 + 230, x0 + 230], [y, y + font_size * 1.1], color="#1a3d8f", lw=1.3)
    ax.text(x0 + 236, y + font_size * 0.9, "chunk end", fontsize=font_size * 0.8, color="#333", va="baseline")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi, facecolor="white")
    plt.close(fig)
    return out


# -- charts --------------------------------------------------------------------------------------

def read_metrics(run_dir: str | Path) -> list[dict]:
    return read(run_dir, missing_ok=False)


CURVES = (  # (title, [(metric key, record kind, style)])
    ("bits per byte", [("bpb", "train", "-"), ("val_bpb", "eval", "o--")]),
    ("boundary rate (per byte)", [("rate", "train", "-"), ("val_rate", "eval", "o--")]),
    ("whitespace recall", [("whitespace_recall", "train", "-"), ("val_whitespace_recall", "eval", "o--")]),
    ("policy entropy (nats/decision)", [("entropy", "train", "-")]),
    ("advantage / return std", [("adv_std", "train", "-"), ("return_std", "train", ":")]),
    ("policy-gradient loss", [("pg_loss", "train", "-")]),
)


def focus_ylim(ax, series: Sequence[tuple[Sequence[float], Sequence[float]]], skip: float = 0.15) -> None:
    """Limit the y axis to the values after the first ``skip`` of the x range: the first steps'
    loss (8 bits/byte) would otherwise flatten the differences between methods into one line."""
    xmax = max((max(xs) for xs, _ in series if len(xs)), default=None)
    if xmax is None:
        return
    late = [float(y) for xs, ys in series for x, y in zip(xs, ys) if x >= skip * xmax and math.isfinite(y)]
    if len(late) < 2:
        return
    lo, hi = min(late), max(late)
    pad = 0.05 * (hi - lo) or 0.05 * abs(hi) or 0.1
    ax.set_ylim(lo - pad, hi + pad)


def plot_curves(run_dirs: Sequence[str | Path], out: str | Path, labels: Sequence[str] | None = None) -> Path:
    """Training curves of runs against bytes seen: train (lines) and validation (markers)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    labels = list(labels) if labels else [Path(r).name or str(r) for r in run_dirs]
    data = [read_metrics(r) for r in run_dirs]
    panels = [(t, series) for t, series in CURVES
              if any(k in rec for recs in data for rec in recs for k, _, _ in series)]
    if not panels:
        raise RltokError("no curves to plot: the metrics hold no known series")
    ncol = 3 if len(panels) > 4 else 2
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 3.6 * nrow), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, series) in zip(axes.flat, panels):
        plotted: list[tuple[tuple, tuple]] = []
        for i, (recs, lab) in enumerate(zip(data, labels)):
            for key, kind, style in series:
                pts = [(r["bytes"], r[key]) for r in recs if key in r and "bytes" in r
                       and (("event" in r) == (kind == "eval")) and r[key] is not None
                       and isinstance(r[key], (int, float)) and math.isfinite(r[key])]
                if not pts:
                    continue
                xs, ys = zip(*pts)
                plotted.append((xs, ys))
                label = (f"{lab} (val)" if kind == "eval" else lab if key != "return_std" else f"{lab} ({key})")
                ax.plot(xs, ys, style, color=colors[i % len(colors)], ms=3, lw=1.2, label=label)
        if title == "bits per byte":
            focus_ylim(ax, plotted)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("bytes seen")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, labs = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labs, loc="lower center", ncol=min(4, len(handles)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def plot_chunk_hist(stats: dict[str, "object"], out: str | Path) -> Path:
    """Chunk-length histograms (fraction of chunks per length) of several runs."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    n = max(1, len(stats))
    width = 0.8 / n
    for i, (name, st) in enumerate(stats.items()):
        h = np.asarray(st.chunk_hist, float)
        h = h / max(1, h.sum())
        xs = np.arange(1, len(h) + 1) + (i - (n - 1) / 2) * width
        ax.bar(xs, h, width=width, label=f"{name} (mean {st.mean_chunk_bytes:.2f} B)")
    k = len(next(iter(stats.values())).chunk_hist) if stats else 1
    ax.set_xticks(range(1, k + 1), [str(j) if j < k else f"{k}+" for j in range(1, k + 1)], fontsize=7)
    ax.set_xlabel("chunk length (bytes)")
    ax.set_ylabel("fraction of chunks")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def plot_udhr(rows: Sequence[dict], runs: Sequence[str], toks: Sequence[str], out: str | Path) -> Path:
    """Per language: the cost of the same text relative to English (UTF-8 bytes, BPE tokens,
    learned chunks) and bytes per chunk/token."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: r.get("bytes_rel", r["bytes"]))
    series = [("UTF-8 bytes", "bytes_rel", None)]
    series += [(f"BPE tokens: {t}", f"tokens_rel:{t}", f"bytes_per_token:{t}") for t in toks]
    series += [(f"learned chunks: {r}", f"chunks_rel:{r}", f"bytes_per_chunk:{r}") for r in runs]
    n = len(rows)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, max(6, 0.28 * n + 1.5)), sharey=True)
    k = len(series)
    h = 0.8 / k
    ys = np.arange(n)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (lab, rel, per) in enumerate(series):
        off = (i - (k - 1) / 2) * h
        a1.barh(ys + off, [r.get(rel, np.nan) for r in rows], height=h, label=lab, color=colors[i % len(colors)])
        if per is not None:
            a2.barh(ys + off, [r.get(per, np.nan) for r in rows], height=h, label=lab, color=colors[i % len(colors)])
    a1.axvline(1.0, color="#333", lw=0.8)
    a1.set_yticks(ys, [f"{r['lang']} ({r['script']})" for r in rows], fontsize=8)
    a1.set_xlabel("cost of the same text relative to English (1 = English)")
    a2.set_xlabel("bytes per token / chunk")
    a1.set_title("UDHR: tokens or chunks needed, relative to English", fontsize=10)
    a2.set_title("bytes per token / chunk", fontsize=10)
    for a in (a1, a2):
        a.grid(alpha=0.3, axis="x")
    a1.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
