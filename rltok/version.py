"""The package version, in a module of its own so that any module can read it without importing
the package's ``__init__`` (which would close an import cycle through ``rltok.api``)."""

__version__ = "0.1.0"
