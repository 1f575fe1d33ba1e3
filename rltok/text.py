"""Text to bytes, for text that may not be valid Unicode."""

from __future__ import annotations


def to_bytes(text: str | bytes) -> bytes:
    """UTF-8 bytes of ``text`` (bytes pass through). Bytes are bytes: a command-line argument that
    was not valid UTF-8 reaches Python as lone surrogates (``surrogateescape``), which become the
    original bytes again; any other lone surrogate is encoded as is (``surrogatepass``)."""
    if not isinstance(text, str):
        return bytes(text)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return text.encode("utf-8", "surrogatepass")


def printable(text: str | bytes) -> str:
    """``text`` as a str that any UTF-8 stream can write (invalid bytes shown as U+FFFD)."""
    return to_bytes(text).decode("utf-8", errors="replace")
