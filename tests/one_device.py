"""A torch function mode that fails on any call mixing tensors of several devices."""

from __future__ import annotations

from typing import Any

from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves


class OneDevice(TorchFunctionMode):
    """Raises when a torch call gets tensors of more than one device (a move with ``.to`` is one tensor)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        devices = {leaf.device for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, Tensor)}
        if len(devices) > 1:
            raise AssertionError(f"{getattr(func, '__name__', func)} mixes tensors on {sorted(map(str, devices))}")
        return func(*args, **kwargs)
