"""The package's version: a leaf the modules inside ``sim`` import it from (``sim.__version__``
re-exports it for users)."""

from __future__ import annotations

__version__ = "0.1.0"
