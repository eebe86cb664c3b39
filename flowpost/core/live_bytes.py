"""The most bytes of tensor storage alive at once while some torch code runs: a dispatch mode that notes every
storage an operator returns and drops it when it is freed. On meta tensors it sizes a computation without
running it (a VAE's encode at a stage's batch, from its config alone)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    """``with LiveBytes() as live: ...``, then ``live.peak``: the most bytes the storages that operators created
    inside held at once (tensors made before entering, parameters included, are not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self._live = {key: entry for key, entry in self._live.items() if not entry[0].expired()}
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                storage = leaf.untyped_storage()
                self._live.setdefault(storage._cdata, (StorageWeakRef(storage), storage.nbytes()))
        self.peak = max(self.peak, sum(size for _, size in self._live.values()))
        return out


class FusedAttention(TorchFunctionMode):
    """Attention as a fused kernel sizes it (flash or memory-efficient: the output, no score matrix): meta tensors
    have no fused kernel, so ``scaled_dot_product_attention`` would decompose into its math form there."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is not F.scaled_dot_product_attention:
            return func(*args, **(kwargs or {}))
        named = {**dict(zip(("query", "key", "value"), args, strict=False)), **(kwargs or {})}
        query, value = named["query"], named["value"]
        return query.new_empty((*query.shape[:-1], value.shape[-1]))
