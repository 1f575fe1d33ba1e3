"""The built-in multilingual corpora: roff and HTML conversion per script family, the cache, the
offline errors (and, marked slow, the real fetch)."""

import shutil
from pathlib import Path

import pytest

from rltok.data import multilingual as ml
from rltok.errors import RltokError

# real page openings from Debian's manpages-{de,ru,ja,el} (coreutils, netatalk, bison), as roff
ROFF = {
    "Latin": (".TH LS 1 \"September 2022\" \"GNU coreutils 9.1\" \"Dienstprogramme für Benutzer\"\n"
              ".SH BEZEICHNUNG\nls \\- Verzeichnisinhalte auflisten\n.SH BESCHREIBUNG\n.PP\n"
              "Auflistung von Informationen über die DATEIen (Standardvorgabe ist das\n"
              "aktuelle Verzeichnis). Die Einträge werden \\fBalphabetisch\\fP sortiert.\n",
              ["ls - Verzeichnisinhalte auflisten", "Die Einträge werden alphabetisch sortiert."]),
    "Cyrillic": (".TH CAT 1\n.SH ИМЯ\ncat \\- объединяет файлы и направляет их на стандартный вывод\n"
                 ".SH СИНТАКСИС\n\\fBcat\\fP [\\fIПАРАМЕТР\\fP]... [\\fIФАЙЛ\\fP]...\n",
                 ["ИМЯ", "cat - объединяет файлы и направляет их на стандартный вывод", "cat [ПАРАМЕТР]... [ФАЙЛ]..."]),
    "CJK": (".TH ACHFILE 1\n.SH 名前\nachfile \\- Apple Macintosh ファイルのタイプとクリエータを変更する\n",
            ["名前", "achfile - Apple Macintosh ファイルのタイプとクリエータを変更する"]),
    "Greek": (".TH BISON 1\n.SH ΟΝΟΜΑ\nbison \\- GNU Project parser generator\n.SH ΠΕΡΙΓΡΑΦΗ\n"
              "Ο \\fBbison\\fP είναι ένας γεννήτορας συντακτικών αναλυτών.\n",
              ["ΟΝΟΜΑ", "ΠΕΡΙΓΡΑΦΗ", "Ο bison είναι ένας γεννήτορας συντακτικών αναλυτών."]),
}


@pytest.mark.parametrize("script", sorted(ROFF))
def test_roff_pages_become_plain_text(script):
    if shutil.which("groff") is None:
        pytest.skip("groff is not installed")
    roff, want = ROFF[script]
    text = ml.roff_to_text(roff.encode())
    lines = [ln.strip() for ln in text.splitlines()]
    for w in want:
        assert w in lines, (w, text)
    assert "\\f" not in text and ".SH" not in text and "\x08" not in text and "\x1b" not in text
    assert "  " not in text.strip().replace("\n       ", "\n")  # no justification spaces


def test_docbook_html_becomes_text_without_navigation():
    page = """<html><head><title>Kapitel 3</title><style>p {}</style></head><body>
    <div class="navheader"><table><tr><th>Kapitel 3. Navigation</th></tr></table></div>
    <div class="chapter"><h1 class="title">Kapitel 3. Die Systeminitialisierung</h1>
    <p>Es ist  klug, <a href="x">grob</a> zu wissen,
       wie das System startet.</p><pre>$ ls  -l
  eingerückt</pre><script>var x = 1;</script></div>
    <div class="navfooter"><p>Zurück</p></div></body></html>"""
    text = ml.html_to_text(page)
    assert text.splitlines()[0] == "Kapitel 3. Die Systeminitialisierung"
    assert "Es ist klug, grob zu wissen, wie das System startet." in text.splitlines()
    assert "$ ls  -l\n  eingerückt" in text.replace("\n\n", "\n")  # preformatted text kept as it is
    assert "Navigation" not in text and "Zurück" not in text and "var x" not in text and "p {}" not in text


def test_the_cache_is_read_without_fetching(tmp_path, monkeypatch):
    monkeypatch.setenv("RLTOK_CACHE", str(tmp_path))
    root = tmp_path / ml.VERSION
    ml.write_cached(root / "multilingual", [("de", "Grüße".encode()), ("ja", "名前".encode())])
    ml.write_cached(root / "multilingual-heldout", [("en", b"Chapter 3.")])
    monkeypatch.setattr(ml, "fetch", lambda dest: pytest.fail("fetched although cached"))
    from rltok.data.builtin import load_builtin

    assert load_builtin("multilingual") == ["Grüße".encode(), "名前".encode()]
    assert ml.languages("multilingual") == ["de", "ja"] and load_builtin("multilingual-heldout") == [b"Chapter 3."]
    (root / "multilingual" / "data.npy").write_bytes(b"broken")
    with pytest.raises(RltokError, match="damaged cache"):
        ml.docs("multilingual")


def test_unreachable_registry_is_one_line(tmp_path, monkeypatch, capsys):
    """A registry that cannot be reached: apt-get fails (a stand-in on PATH that fails as apt-get
    does offline), and without apt-get at all; `rltok train` says so in one line."""
    monkeypatch.setenv("RLTOK_CACHE", str(tmp_path / "cache"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apt-get"
    fake.write_text("#!/bin/sh\necho 'E: Failed to fetch http://deb.debian.org/ Temporary failure resolving' >&2\nexit 100\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    with pytest.raises(RltokError, match="apt-get download failed .*Temporary failure resolving"):
        ml.docs("multilingual")
    fake.unlink()
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(RltokError, match="apt-get not found"):
        ml.docs("multilingual")
    from rltok.cli import main

    assert main(["train", "--preset", "smoke", "--data", "multilingual", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: built-in corpus 'multilingual': apt-get not found")


@pytest.mark.slow
def test_the_real_corpus_has_every_language_and_held_out_parallel_chapters():
    train, held = ml.docs("multilingual"), ml.docs("multilingual-heldout")
    langs, held_langs = ml.languages("multilingual"), ml.languages("multilingual-heldout")
    assert len(langs) == len(train) and len(held_langs) == len(held)
    assert set(ml.MAN_LANGUAGES) | {"zh-cn", "zh-tw"} <= set(langs)
    assert sorted(held_langs) == sorted(list(ml.REFERENCE_LANGUAGES) * len(ml.HELDOUT_CHAPTERS))
    assert not set(held) & set(train)  # the held-out chapters are no training document
    for lang, marker in (("ru", "ИМЯ"), ("ja", "名前"), ("el", "ΟΝΟΜΑ"), ("de", "BEZEICHNUNG")):
        assert any(marker in d.decode() for d, lg in zip(train, langs) if lg == lang), lang


# -- FLORES-200 (issue 39) -------------------------------------------------------------------------

def _flores_dir(tmp_path, langs=("eng_Latn", "fra_Latn"), n=1012):
    for lang in langs:
        (tmp_path / f"{lang}.devtest").write_text("".join(f"{lang} sentence {i}\n" for i in range(n)), encoding="utf-8")
    return tmp_path


def test_read_flores_halves_are_disjoint_and_grouped(tmp_path):
    from rltok.analysis import read_flores
    d = _flores_dir(tmp_path)
    cal = read_flores(d, "calibrate", group=4)
    score = read_flores(d, "score", group=4)
    assert [t.key for t in score] == ["eng_Latn", "fra_Latn"] and score[0].script == "Latn"
    sents = lambda ts: [s for p in ts[0].paragraphs for s in p.split("\n")]  # noqa: E731
    assert sents(cal)[0] == "eng_Latn sentence 0" and sents(cal)[-1] == "eng_Latn sentence 505"
    assert sents(score)[0] == "eng_Latn sentence 506" and sents(score)[-1] == "eng_Latn sentence 1011"
    assert not set(sents(cal)) & set(sents(score))
    assert len(score[0].paragraphs) == 127 and score[0].paragraphs[0].count("\n") == 3  # 506 / 4, rounded up
    assert [t.key for t in read_flores(d, "all", keys=["fra_Latn"])] == ["fra_Latn"]


def test_read_flores_bad_input_names_the_file(tmp_path):
    from rltok.analysis import read_flores
    from rltok.errors import RltokError
    d = _flores_dir(tmp_path, langs=("eng_Latn",), n=1000)
    with pytest.raises(RltokError, match="eng_Latn.devtest: 1000 lines"):
        read_flores(d)
    with pytest.raises(RltokError, match="no FLORES-200 devtest file for deu_Latn"):
        (tmp_path / "x").mkdir()
        read_flores(_flores_dir(tmp_path / "x"), keys=["deu_Latn"])
    with pytest.raises(RltokError, match="half"):
        read_flores(d, "test")


def test_flores_covers_every_training_language():
    from rltok.analysis import read_flores
    from rltok.data.languages import FLORES_OF
    d = Path(__file__).resolve().parents[2] / "shared" / "data" / "multilingual" / "flores200_devtest"
    if not d.is_dir():
        pytest.skip("../shared/data is absent")
    texts = read_flores(d, "score", keys=sorted(set(FLORES_OF.values())))
    assert len(texts) == len(set(FLORES_OF.values())) == 26


# -- the Debian Reference without its untranslated lines (issue 39) -------------------------------

def test_translated_only_drops_a_line_from_every_language_where_one_left_it_in_english():
    from rltok.analysis import translated_only
    docs = {"en": ["Hello world\n\n42\nInstall it"],
            "de": ["Hallo Welt\n\n42\nInstall it"],   # line 3 left in English
            "fr": ["Bonjour le monde\n\n42\nInstallez-le"]}
    texts, info = translated_only(docs, "en")
    kept = {t.key: t.paragraphs for t in texts}
    # line 3 goes from all three; the blank line and "42" (no letter) stay everywhere
    assert kept == {"en": ["Hello world\n\n42"], "de": ["Hallo Welt\n\n42"], "fr": ["Bonjour le monde\n\n42"]}
    assert info["line_positions"] == 4 and info["line_positions_removed"] == 0.25
    assert info["languages"]["de"]["lines_identical_to_reference"] == 0.25  # "Install it" (blank, 42: no letters)
    assert info["languages"]["fr"]["lines_identical_to_reference"] == 0.0
    assert info["languages"]["en"]["lines_identical_to_reference"] is None
    assert info["languages"]["fr"]["bytes_removed"] == pytest.approx(1 - 20 / 33)
    assert info["languages"]["de"]["bytes_kept"] == len("Hallo Welt\n\n42")


def test_translated_only_refuses_text_that_is_not_line_aligned():
    from rltok.analysis import translated_only
    with pytest.raises(RltokError, match="de is not line-aligned with en"):
        translated_only({"en": ["a\nb"], "de": ["a"]}, "en")
    with pytest.raises(RltokError, match="no reference language 'en'"):
        translated_only({"de": ["a"]}, "en")
