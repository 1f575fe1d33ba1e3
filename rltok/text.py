"""Text to bytes, for text that may not be valid Unicode; bytes cut into chunks; which bytes are whitespace."""

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


def chunks_of(data: bytes, ends) -> list[bytes]:
    """``data`` cut after every byte whose entry of ``ends`` (a sequence of bools, at least as
    long as ``data``, or shorter: the rest is one open piece) is set."""
    out, start = [], 0
    for i, e in enumerate(ends[: len(data)]):
        if e:
            out.append(data[start:i + 1])
            start = i + 1
    if start < len(data):
        out.append(data[start:])
    return out


WHITESPACE = (9, 10, 11, 12, 13, 32)  # tab, newline, vertical tab, form feed, carriage return, space


def whitespace_mask(ids):
    """(B, S) bool: the byte ids (a tensor) that are ASCII whitespace."""
    ws = ids == WHITESPACE[0]
    for c in WHITESPACE[1:]:
        ws = ws | (ids == c)
    return ws
