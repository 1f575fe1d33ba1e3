"""The built-in multilingual corpora (issue 16), fetched from the package registries like ``english``.

* ``multilingual``: Debian's translated manual pages in 25 languages (``manpages`` and
  ``manpages-{de,fr,...}``, at most ``PAGES_PER_LANGUAGE`` pages each, converted to text with
  groff) and the Debian Reference in 11 languages (``debian-reference-{en,de,...}``, one document
  per chapter, HTML converted to text), without the held-out chapters.
* ``multilingual-heldout``: the held-out chapters (``HELDOUT_CHAPTERS``) of the Debian Reference
  in every language it has: parallel text that no training run on ``multilingual`` sees.

Each document's language is recorded (``languages(name)``, in document order). Fetched once with
``apt-get download`` into ``$RLTOK_CACHE`` and cached as memory-mapped arrays; where the registry
cannot be reached, one line says so.
"""

from __future__ import annotations

import gzip
import html.parser
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..errors import RltokError
from .debs import ar_members, cache_dir, fetch_once, read_docs, write_docs

MAN_LANGUAGES = ("en", "de", "fr", "es", "it", "ja", "ru", "pl", "pt-br", "pt", "nl", "cs", "da", "el", "fi",
                 "hu", "id", "mk", "nb", "ro", "sr", "sv", "tr", "uk", "vi")
REFERENCE_LANGUAGES = ("en", "de", "es", "fr", "id", "it", "ja", "pt", "pt-br", "zh-cn", "zh-tw")
HELDOUT_CHAPTERS = ("ch03", "ch08")
PAGES_PER_LANGUAGE = 300
NAMES = ("multilingual", "multilingual-heldout")
VERSION = "multilingual-v1"


def _man_package(lang: str) -> str:
    return "manpages" if lang == "en" else f"manpages-{lang}"


def _man_dir(lang: str) -> str:
    # the package's directory under usr/share/man (English pages sit in man1.. directly)
    return {"en": "", "pt-br": "pt_BR"}.get(lang, lang)


# -- conversion ----------------------------------------------------------------------------------

_SPACES = re.compile(r"(?<=\S) {2,}")


def roff_to_text(roff: bytes) -> str:
    """A manual page's text, rendered by groff (UTF-8 input through preconv, no hyphenation, no
    overstrike or colour), with the spaces groff adds to justify lines removed, in NFC."""
    env = dict(os.environ, GROFF_NO_SGR="1")
    try:
        r = subprocess.run(["groff", "-K", "utf8", "-T", "utf8", "-man", "-rHY=0", "-rLL=100n", "-P", "-cbou"],
                           input=roff, capture_output=True, env=env, timeout=60)
    except FileNotFoundError:
        raise RltokError("built-in corpus 'multilingual': groff not found (apt-get install groff-base); "
                         "it renders the manual pages") from None
    # groff writes some precomposed letters as canonical equivalents (Greek iota with tonos as
    # U+1F77, oxia): NFC gives back the characters the page was written in
    text = unicodedata.normalize("NFC", r.stdout.decode("utf-8", errors="replace"))
    lines = [_SPACES.sub(" ", ln.rstrip()) for ln in text.splitlines()]
    # groff's running header and footer name the page, not its content
    body = lines[1:-1] if len(lines) > 2 else lines
    return re.sub(r"\n{3,}", "\n\n", "\n".join(body)).strip() + "\n"


class _HtmlText(html.parser.HTMLParser):
    """Text of a DocBook HTML page: block elements become line breaks; navigation, scripts and
    styles are dropped."""

    BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "dt", "dd", "table",
             "blockquote", "title"}
    SKIP_CLASSES = {"navheader", "navfooter", "toc"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.skip = 0  # depth inside a skipped element
        self.stack: list[bool] = []  # per open div: is it skipped
        self.pre = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "style", "head"):
            self.skip += 1
        if tag == "div":
            skipped = bool(set((a.get("class") or "").split()) & self.SKIP_CLASSES)
            self.stack.append(skipped)
            self.skip += skipped
        if tag == "pre":
            self.pre += 1
        if tag in self.BLOCK:
            self.out.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style", "head"):
            self.skip = max(0, self.skip - 1)
        if tag == "div" and self.stack:
            self.skip -= self.stack.pop()
        if tag == "pre":
            self.pre = max(0, self.pre - 1)
        if tag in self.BLOCK:
            self.out.append("\n")

    def handle_data(self, data):
        if self.skip:
            return
        # preformatted text is protected from the line stripping of html_to_text
        self.out.append(data.replace(" ", "\x02").replace("\n", "\x01") if self.pre else re.sub(r"\s+", " ", data))


def html_to_text(page: str) -> str:
    p = _HtmlText()
    p.feed(page)
    p.close()
    lines = [ln.strip() for ln in "".join(p.out).splitlines()]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return text.replace("\x01", "\n").replace("\x02", " ") + "\n"


# -- fetching ------------------------------------------------------------------------------------

def _download(packages: list[str], where: Path) -> None:
    try:
        r = subprocess.run(["apt-get", "download", *packages], cwd=where, capture_output=True, text=True, timeout=900)
    except FileNotFoundError:
        raise RltokError("built-in corpus 'multilingual': apt-get not found; it is fetched from Debian's "
                         "package registry (or pass local files with --data)") from None
    except subprocess.TimeoutExpired:
        raise RltokError("built-in corpus 'multilingual': apt-get download timed out (no network?); pass "
                         "local files with --data") from None
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        raise RltokError(f"built-in corpus 'multilingual': apt-get download failed ({last}); the registry "
                         f"may be unreachable: pass local files with --data")


def _deb_files(deb: Path, prefix: str, suffix: tuple[str, ...]) -> list[tuple[str, bytes]]:
    found = []
    for name, data in ar_members(deb.read_bytes()):
        if not name.startswith("data.tar"):
            continue
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            for m in sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name):
                path = m.name.lstrip("./")
                if path.startswith(prefix) and path.endswith(suffix):
                    found.append((path, tar.extractfile(m).read()))
    return found


def _man_pages(deb: Path, lang: str) -> list[bytes]:
    sub = _man_dir(lang)
    prefix = f"usr/share/man/{sub + '/' if sub else ''}man"
    files = _deb_files(deb, prefix, (".gz",))[:PAGES_PER_LANGUAGE]
    roffs = [gzip.decompress(data) for _, data in files]
    roffs = [r for r in roffs if not r.lstrip().startswith(b".so ")]  # links to other pages
    with ThreadPoolExecutor(max_workers=4) as pool:
        texts = list(pool.map(roff_to_text, roffs))
    return [t.encode() for t in texts if len(t) > 200]


def _reference_chapters(deb: Path, lang: str) -> dict[str, bytes]:
    out = {}
    for path, data in _deb_files(deb, "usr/share/debian-reference/", (f".{lang}.html",)):
        name = Path(path).name.split(".")[0]  # ch03, apa, index
        if name.startswith(("ch", "ap")):
            out[name] = html_to_text(data.decode("utf-8", errors="replace")).encode()
    return out


def fetch(dest: Path) -> None:
    """Download the packages, convert them and write both corpora under ``dest``."""
    with tempfile.TemporaryDirectory(prefix="rltok-multilingual-") as tmp:
        t = Path(tmp)
        pkgs = [_man_package(lang) for lang in MAN_LANGUAGES] + [f"debian-reference-{lang}" for lang in REFERENCE_LANGUAGES]
        print(f"rltok: fetching {len(pkgs)} packages for the built-in multilingual corpus (once)", file=sys.stderr)
        _download(pkgs, t)
        train: list[tuple[str, bytes]] = []
        held: list[tuple[str, bytes]] = []
        for lang in MAN_LANGUAGES:
            debs = sorted(t.glob(f"{_man_package(lang)}_*.deb"))
            if not debs:
                raise RltokError(f"built-in corpus 'multilingual': {_man_package(lang)} was not downloaded")
            train += [(lang, d) for d in _man_pages(debs[0], lang)]
        for lang in REFERENCE_LANGUAGES:
            debs = sorted(t.glob(f"debian-reference-{lang}_*.deb"))
            if not debs:
                raise RltokError(f"built-in corpus 'multilingual': debian-reference-{lang} was not downloaded")
            for ch, text in sorted(_reference_chapters(debs[0], lang).items()):
                (held if ch in HELDOUT_CHAPTERS else train).append((lang, text))
        for name, docs in (("multilingual", train), ("multilingual-heldout", held)):
            write_cached(dest / name, docs)


def write_cached(d: Path, docs: list[tuple[str, bytes]]) -> None:
    """(language, document) pairs: the documents (``write_docs``) and ``languages.json``."""
    write_docs(d, [b for _, b in docs])
    (d / "languages.json").write_text(json.dumps([lang for lang, _ in docs]))


def ensure() -> Path:
    return fetch_once(cache_dir() / VERSION, lambda d: all((d / n / "offsets.npy").exists() for n in NAMES),
                      lambda d: fetch(d), "built-in corpus 'multilingual'")


def docs(name: str) -> list[bytes]:
    return read_docs(ensure() / name, f"the built-in corpus {name!r}")


def languages(name: str) -> list[str]:
    """The language of each document of a built-in multilingual corpus, in document order."""
    p = ensure() / name / "languages.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        raise RltokError(f"{p}: damaged cache; remove the folder to fetch it again") from None
