"""The options every model-based reward shares, checked as the stage builds its rewards, and its weights file."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from flowpost.errors import FlowpostError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def scoring_device(device: str | None) -> torch.device | None:
    """The ``device`` option as a torch device; ``None`` scores on the device of the media."""
    try:
        return torch.device(device) if device is not None else None
    except (RuntimeError, TypeError):
        raise FlowpostError(
            f"device must be a torch device such as 'cpu' or 'cuda:0', got {device!r}", where="options.device"
        ) from None


def scoring_dtype(dtype: str) -> torch.dtype:
    """The ``dtype`` option: float32, float16 or bfloat16."""
    if dtype not in DTYPES:
        raise FlowpostError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}", where="options.dtype")
    return DTYPES[dtype]


def batch_size_option(batch_size: int) -> int:
    """The ``batch_size`` option: samples per forward pass, a positive integer."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise FlowpostError(f"batch_size must be a positive integer, got {batch_size!r}", where="options.batch_size")
    return batch_size


def scoring_options(device: str | None, dtype: str, batch_size: int) -> tuple[torch.device | None, torch.dtype, int]:
    """A scorer's ``device``, ``dtype`` and ``batch_size`` options, each checked."""
    return scoring_device(device), scoring_dtype(dtype), batch_size_option(batch_size)


def read_checkpoint(path: str, *, what: str) -> dict[str, Tensor]:
    """The tensors of the local file ``path`` (the ``checkpoint`` option), ``what`` describing it in errors.

    A ``.safetensors`` file, or a torch file holding a state dict, itself or under the key ``state_dict``
    (as training scripts save it); torch files are read as plain tensors, never unpickling code.
    """
    file = Path(path).expanduser() if isinstance(path, str | Path) else None
    if file is None or not file.is_file():
        raise FlowpostError(f"no file at {path!r}; give {what}, a local file", where="options.checkpoint")
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(file))
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle, zip and safetensors errors differ
        raise FlowpostError(f"cannot read {str(file)!r} ({exc})", where="options.checkpoint") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not state or not all(isinstance(value, Tensor) for value in state.values()):
        raise FlowpostError(f"{str(file)!r} does not hold a state dict of tensors", where="options.checkpoint")
    return state
