"""Boundary analysis (statistics on hand-worked arrays, UDHR across languages, the command) and
seeing boundaries (terminal, HTML, PNG, curves)."""

import json
import math
import warnings

import numpy as np
import pytest

from conftest import SHARED_DATA, shared_file
from rltok.analysis import (binary_entropy_bits, boundary_stats, chunk_lengths, cross_language, prf,
                            read_udhr, udhr_table)
from rltok.bpe import train_bpe
from rltok.cli import main
from rltok.errors import RltokError
from rltok.run import load_model
from rltok.viz import cell_views, char_cells, fonts_for, render_html, render_png, render_terminal

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


pytestmark = pytest.mark.usefixtures("one_thread")

# -- statistics on hand-worked examples -----------------------------------------------------------

def test_prf_and_entropy_and_chunk_lengths():
    pred = np.array([1, 0, 1, 1, 0, 0], bool)
    ref = np.array([1, 0, 0, 1, 1, 0], bool)
    p, r, f = prf(pred, ref)  # tp 2, 3 predicted, 3 reference
    assert (p, r, f) == pytest.approx((2 / 3, 2 / 3, 2 / 3))
    assert math.isnan(prf(np.zeros(3, bool), ref[:3])[0])
    assert binary_entropy_bits(np.array([0.5, 0.0, 1.0])) == pytest.approx([1.0, 0.0, 0.0], abs=1e-9)
    assert binary_entropy_bits(np.array([0.2]))[0] == pytest.approx(0.7219, abs=1e-4)
    # ends after bytes 1, 4 and (always) the last: chunks of 2, 3, 2
    assert chunk_lengths(np.array([0, 1, 0, 0, 1, 0, 0], bool)).tolist() == [2, 3, 2]


def test_boundary_stats_on_a_run(smoke_runs):
    model = load_model(smoke_runs["uniform"])
    docs = [b"The quick brown fox jumps over the lazy dog. " * 3, "naïve café au lait, s'il vous plaît".encode()]
    tok = train_bpe(docs * 20, 300)
    st = boundary_stats(model, docs, tok)
    assert st.bytes == sum(len(d) for d in docs) and st.docs == 2
    assert sum(st.chunk_hist) == st.chunks and st.rate == pytest.approx(st.chunks / st.bytes)
    assert st.mean_chunk_bytes == pytest.approx(1 / st.rate)
    # Uniform places round(0.2 n) boundaries at random: about the target rate, entropy H(0.2)
    assert 0.1 < st.rate < 0.3
    assert st.entropy_bits == pytest.approx(0.7219, abs=1e-3)
    for x in (st.whitespace_recall, st.whitespace_precision, st.bpe_precision, st.bpe_recall, st.bpe_f1):
        assert 0 <= x <= 1
    assert 0 < st.bpb < 20


def test_udhr_reader():
    shared_file("multilingual", "udhr", "udhr_eng.xml")
    texts = read_udhr(SHARED_DATA / "multilingual" / "udhr")
    assert len(texts) == 37
    by = {t.key: t for t in texts}
    eng = by["eng"]
    assert eng.script == "Latn" and eng.name == "English"
    assert eng.paragraphs[0] == "Preamble"
    assert eng.paragraphs[1].startswith("Whereas recognition of the inherent dignity")
    assert any(p.startswith("Article 30") for p in eng.paragraphs)
    assert by["jpn"].paragraphs[1].startswith("人類社会のすべての構成員")
    # the same text: paragraph counts agree up to a few split or merged paragraphs
    assert all(abs(len(t.paragraphs) - len(eng.paragraphs)) <= 11 for t in texts)
    with pytest.raises(RltokError, match="no UDHR translation for xxx"):
        read_udhr(SHARED_DATA / "multilingual" / "udhr", ["eng", "xxx"])


def test_cross_language_rows(smoke_runs):
    shared_file("multilingual", "udhr", "udhr_eng.xml")
    texts = read_udhr(SHARED_DATA / "multilingual" / "udhr", ["eng", "jpn", "hin"])
    for t in texts:
        t.paragraphs = t.paragraphs[:4]  # keep the test fast
    tok = train_bpe([p.encode() for p in texts[1].paragraphs] * 5, 300)
    rows = cross_language(texts, {"rl": load_model(smoke_runs["rl"])}, {"bpe": tok})
    by = {r["lang"]: r for r in rows}
    eng = by["eng"]
    assert eng["bytes_rel"] == 1.0 and eng["chunks_rel:rl"] == 1.0 and eng["tokens_rel:bpe"] == 1.0
    for r in rows:
        assert r["bytes"] == sum(len(p.encode()) for p in next(t for t in texts if t.key == r["lang"]).paragraphs)
        assert r["bytes_per_chunk:rl"] == pytest.approx(r["bytes"] / r["chunks:rl"])
        assert r["tokens_per_word:bpe"] == pytest.approx(r["tokens:bpe"] / r["words"])
    # Hindi needs 3 bytes per character in UTF-8: more bytes than English for the same text
    assert by["hin"]["bytes_rel"] > 1.5
    table = udhr_table(rows, ["rl"], ["bpe"])
    assert table.count("\n") == 1 + len(rows) and "| jpn | Jpan |" in table


def test_analyze_cli(smoke_runs, tmp_path, capsys):
    shared_file("multilingual", "udhr", "udhr_eng.xml")
    tok = train_bpe([b"The quick brown fox jumps over the lazy dog."] * 50, 300)
    tok.save(str(tmp_path / "tok.json"))
    out = tmp_path / "an"
    code = main(["analyze", str(smoke_runs["rl"]), str(smoke_runs["uniform"]), "--docs", "4",
                 "--udhr", str(SHARED_DATA / "multilingual" / "udhr"), "--langs", "eng,cmn_hans",
                 "--bpe", str(tmp_path / "tok.json"), "--no-fit-bpe", "--out", str(out), "--json"])
    res = json.loads(capsys.readouterr().out)
    assert code == 0 and set(res["runs"]) == {"rl", "uniform"} and res["tokenizers"] == ["tok"]
    assert res["runs"]["uniform"]["method"] == "uniform" and len(res["udhr"]) == 2
    for f in ("analysis.json", "udhr.md", "udhr.csv", "udhr.png", "chunk_lengths.png"):
        assert (out / f).is_file()
    assert (out / "udhr.png").read_bytes()[:8] == PNG_MAGIC
    code = main(["analyze", str(smoke_runs["rl"]), "--udhr", str(tmp_path), "--no-fit-bpe", "--docs", "2"])
    assert code == 2 and "no udhr_*.xml files" in capsys.readouterr().err


# -- seeing boundaries ----------------------------------------------------------------------------

def test_cells_and_terminal():
    data = "aé日".encode() + b"\xff"
    cells = char_cells(data)
    assert [(c.text, c.start, c.end) for c in cells] == [("a", 0, 1), ("é", 1, 3), ("日", 3, 6), ("\ufffd", 6, 7)]
    b = np.array([1, 1, 0, 0, 0, 0, 1], bool)  # a boundary inside "é" shows after "é"
    p = np.array([0.9, 0.5, 0.5, 0.0, 0.2, 0.0, 1.0])
    v = cell_views(data, b, p)
    assert [x.end for x in v] == [True, True, False, True]
    assert v[1].prob == pytest.approx(0.75) and v[2].prob == pytest.approx(0.2)
    assert render_terminal(data, b) == "a|é|日\ufffd|"
    assert render_terminal(b"ab cd", np.array([0, 0, 1, 0, 1], bool), sep="/") == "ab /cd/"


def test_html_is_self_contained_and_escaped():
    data = "if a<b & c>d: 日本\n".encode()
    b = np.zeros(len(data), bool)
    b[[4, 10, len(data) - 1]] = True
    page = render_html(data, b, np.linspace(0, 1, len(data)), title="run <x>")
    assert ">&lt;</span>" in page and ">&amp;</span>" in page and "run &lt;x&gt;" in page
    assert page.count('class="c e"') == 3
    assert "日" in page and "本" in page
    for external in ("http://", "https://", "<script", "<link", "url("):
        assert external not in page


def test_png_renders_english_and_japanese(smoke_runs, tmp_path, capsys):
    for name, text in (("en", "The city council met on Tuesday."), ("ja", "吾輩は猫である。名前はまだ無い。")):
        png = tmp_path / f"{name}.png"
        code = main(["boundaries", str(smoke_runs["rl"]), "--text", text, "--png", str(png),
                     "--html", str(tmp_path / f"{name}.html")])
        assert code == 0 and png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 2000
        import matplotlib.image as mpimg

        img = mpimg.imread(png)
        assert img.shape[1] > 800 and img.shape[0] > 150  # readable size
    capsys.readouterr()
    main(["boundaries", str(smoke_runs["rl"]), "--text", "hello world", "--sep", "#"])
    out = capsys.readouterr().out
    assert out.replace("#", "").strip() == "hello world" and out.strip().endswith("#")


def test_font_fallback_warns_for_glyphs_nobody_has(tmp_path):
    mapping, missing = fonts_for("abc")
    assert not missing and all(mapping[c] for c in "abc")
    unassigned = "\U000F0000"  # a private-use plane code point: no font has it
    _, missing = fonts_for("a" + unassigned)
    assert missing == {unassigned}
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        render_png(("x" + unassigned).encode(), np.array([0, 0, 0, 0, 1], bool), None, tmp_path / "m.png")
    assert any("no installed font has the glyphs" in str(x.message) for x in w)
    assert (tmp_path / "m.png").read_bytes()[:8] == PNG_MAGIC


def test_plot_curves(smoke_runs, tmp_path, capsys):
    out = tmp_path / "c.png"
    code = main(["plot", str(smoke_runs["rl"]), str(smoke_runs["uniform"]), "--out", str(out)])
    assert code == 0 and out.read_bytes()[:8] == PNG_MAGIC
    code = main(["plot", str(tmp_path), "--out", str(out)])
    assert code == 2 and "no metrics.jsonl" in capsys.readouterr().err


def test_focus_ylim_ignores_the_first_steps_and_non_finite_values():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rltok.viz import focus_ylim

    fig, ax = plt.subplots()
    xs = list(range(0, 101, 10))
    ys = [8.0, 5.0, 3.0, 2.9, 2.8, 2.7, 2.6, 2.5, float("nan"), 2.45, 2.4]
    focus_ylim(ax, [(xs, ys)])
    lo, hi = ax.get_ylim()
    # x >= 15: values 3.0 ... 2.4 (NaN dropped); 5% padding of the 0.6 range on each side
    assert abs(lo - (2.4 - 0.03)) < 1e-9 and abs(hi - (3.0 + 0.03)) < 1e-9
    plt.close(fig)
