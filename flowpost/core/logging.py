"""One per-module logger helper."""

from __future__ import annotations

import logging
import os

_CONFIGURED = False


def get_logger(name: str) -> logging.Logger:
    """Return the logger for module ``name``; configures the ``flowpost`` root once."""
    global _CONFIGURED
    if not _CONFIGURED:
        root = logging.getLogger("flowpost")
        if not root.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            root.addHandler(handler)
        root.setLevel(os.environ.get("FLOWPOST_LOG_LEVEL", "INFO"))
        root.propagate = False
        _CONFIGURED = True
    return logging.getLogger(name)
