"""User-facing errors.

Anything a user can cause (a bad path, a malformed file, an out-of-range option) raises
:class:`RltokError` with a one-line message that names the file, line or option. The CLI prints it
as ``error: ...`` and exits with status 2, without a traceback.
"""

from __future__ import annotations


class RltokError(Exception):
    """An error caused by input, configuration or environment, reported as one line."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class NonFiniteError(RltokError):
    """Training stopped after too many consecutive non-finite steps."""

    exit_code = 3
