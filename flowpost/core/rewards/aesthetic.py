"""LAION aesthetic predictor ``aesthetic``: an MLP on L2-normalised CLIP image embeddings (DDPO, Flow-GRPO).

The MLP of the improved aesthetic predictor maps an embedding through linear layers of 1024, 128, 64
and 16 units to one score (about 1-10 for the released ``sac+logos+ava1-l14-linearMSE`` weights on
CLIP ViT-L/14), with dropout after the first three and no activations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from flowpost.core.rewards.clip import ClipSimilarity
from flowpost.errors import FlowpostError

HIDDEN = (1024, 128, 64, 16)
DROPOUT = (0.2, 0.2, 0.1, 0.0)


def aesthetic_mlp(embedding_dim: int) -> nn.Sequential:
    """The predictor's layers; state-dict keys ``{0,2,4,6,7}.weight/bias`` (``layers.`` in the released file)."""
    layers: list[nn.Module] = []
    width = embedding_dim
    for hidden, dropout in zip(HIDDEN, DROPOUT, strict=True):
        layers.append(nn.Linear(width, hidden))
        if dropout:
            layers.append(nn.Dropout(dropout))
        width = hidden
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


def load_state_dict(path: Path) -> dict[str, Tensor]:
    """Tensors of a ``.safetensors`` file, or of a torch file holding a plain state dict (no pickled code)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not all(isinstance(value, Tensor) for value in state.values()):
        raise TypeError("not a state dict of tensors")
    return state


class AestheticScore(ClipSimilarity):
    """The LAION aesthetic score of each image: ``mlp(e / |e|)`` with ``e`` its CLIP image embedding.

    ``weights`` is a local file holding the MLP's state dict (the released ``.pth`` or a
    ``.safetensors``); ``model`` the CLIP model the MLP was trained on (a folder or hub id, by default
    ``openai/clip-vit-large-patch14``). ``processor``, ``device``, ``dtype`` and ``batch_size`` are as for
    ``clip_score``; the MLP runs in float32. Prompts are not used.
    """

    name = "aesthetic"

    def __init__(
        self,
        weights: str,
        *,
        model: str = "openai/clip-vit-large-patch14",
        processor: str | None = None,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int = 32,
    ) -> None:
        if not isinstance(weights, str | Path) or not Path(weights).expanduser().is_file():
            raise FlowpostError(
                f"no file at {weights!r}; give the aesthetic MLP's weights (e.g. sac+logos+ava1-l14-linearMSE.pth)",
                where="options.weights",
            )
        super().__init__(model, processor=processor, device=device, dtype=dtype, batch_size=batch_size)
        embedding_dim = int(self.model.config.projection_dim)
        self.mlp = aesthetic_mlp(embedding_dim)
        path = Path(weights).expanduser()
        try:
            state = load_state_dict(path)
        except Exception as exc:  # any unreadable file: pickle, safetensors and zip errors differ
            raise FlowpostError(f"cannot read {str(path)!r} ({exc})", where="options.weights") from None
        state = {key.removeprefix("layers."): value for key, value in state.items()}
        expected = {key: tuple(value.shape) for key, value in self.mlp.state_dict().items()}
        found = {key: tuple(value.shape) for key, value in state.items()}
        if found != expected:
            raise FlowpostError(
                f"{str(path)!r} does not hold an aesthetic MLP for {embedding_dim}-dimensional CLIP embeddings; "
                f"expected tensors {expected}, found {found}",
                where="options.weights",
            )
        self.mlp.load_state_dict(state)
        self.mlp.eval().requires_grad_(False)

    @torch.no_grad()
    def embeddings(self, media: Tensor) -> Tensor:
        """[B, D] float32 L2-normalised CLIP image embeddings, on the scoring device."""
        device = self.device or media.device
        self.model.to(device)
        embeds = []
        for start in range(0, media.shape[0], self.batch_size):
            pixels = self.pixel_values(media[start : start + self.batch_size].to(device)).to(self.dtype)
            embeds.append(self.model.visual_projection(self.model.vision_model(pixel_values=pixels).pooler_output))
        if not embeds:
            return torch.zeros(0, self.mlp[0].in_features, device=device)
        return F.normalize(torch.cat(embeds).float(), dim=-1)

    @torch.no_grad()
    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        embeds = self.embeddings(media)
        self.mlp.to(embeds.device)
        return self.mlp(embeds).squeeze(-1).to(media.device)
