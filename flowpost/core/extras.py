"""Optional dependencies (pip extras): how to install each, and whether it is installed."""

from __future__ import annotations

import importlib.util

DEEPSPEED_INSTALL = "DS_BUILD_OPS=0 pip install --no-build-isolation 'flowpost[deepspeed]'"


def deepspeed_installed() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


TORCHAO_INSTALL = "pip install 'flowpost[torchao]'"


def torchao_installed() -> bool:
    return importlib.util.find_spec("torchao") is not None
