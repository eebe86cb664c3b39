"""Small digit classifiers: the reward model and the held-out evaluation judge."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch
from safetensors import SafetensorError
from torch import Tensor, nn
from torch.nn import functional as F

from flowpost.core.io import read_json, sha256_file, write_bytes_atomic, write_json_atomic
from flowpost.core.seeding import seeded
from flowpost.errors import FlowpostError

RERUN_HINT = "re-run data acquisition to retrain the classifiers"


@dataclass(frozen=True)
class ClassifierSpec:
    """A named classifier preset: artifact name, CNN width and training seed."""

    name: str
    width: int
    seed: int


REWARD_CLASSIFIER = ClassifierSpec(name="digits-reward", width=16, seed=0)
JUDGE_CLASSIFIER = ClassifierSpec(name="digits-judge", width=24, seed=1)


class DigitClassifier(nn.Module):
    """A three-layer CNN over [B, 1, S, S] images in [0, 1] (S divisible by 4)."""

    def __init__(self, width: int = 16, feature_dim: int = 64, image_size: int = 16) -> None:
        super().__init__()
        if image_size % 4:
            raise ValueError(f"image_size must be divisible by 4, got {image_size}")
        self.width = width
        self.feature_dim = feature_dim
        self.image_size = image_size
        side = image_size // 4
        self.conv = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(2 * width, 2 * width, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(2 * width * side * side, feature_dim),
            nn.ReLU(),
        )
        self.head = nn.Linear(feature_dim, 10)

    def config(self) -> dict[str, int]:
        """The constructor arguments, as stored next to the weights."""
        return {"width": self.width, "feature_dim": self.feature_dim, "image_size": self.image_size}

    def features(self, x: Tensor) -> Tensor:
        """Penultimate activations [B, feature_dim] (for Fréchet distances)."""
        return self.conv(x)

    def forward(self, x: Tensor) -> Tensor:
        """Class logits [B, 10]."""
        return self.head(self.features(x))


def _random_shift(x: Tensor, generator: torch.Generator) -> Tensor:
    """Shift each single-channel image by up to one pixel per axis, padding with zeros."""
    b, _, h, w = x.shape
    padded = F.pad(x[:, 0], (1, 1, 1, 1))
    offsets = torch.randint(0, 3, (b, 2), generator=generator)
    rows = (offsets[:, 0, None] + torch.arange(h))[:, :, None]
    cols = (offsets[:, 1, None] + torch.arange(w))[:, None, :]
    return padded[torch.arange(b)[:, None, None], rows, cols][:, None]


def train_classifier(
    images: Tensor,
    labels: Tensor,
    *,
    width: int,
    seed: int,
    epochs: int = 30,
    batch_size: int = 128,
    lr: float = 3e-3,
) -> DigitClassifier:
    """Train a classifier on [N, 1, S, S] images; deterministic given ``seed``.

    The global RNG state is left as it was. Returns the model in eval mode.
    """
    images = images.float()
    labels = labels.long()
    with seeded(seed):
        model = DigitClassifier(width=width, image_size=int(images.shape[-1]))
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    steps = epochs * -(-len(images) // batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(images), generator=generator)
        for start in range(0, len(images), batch_size):
            rows = order[start : start + batch_size]
            batch = _random_shift(images[rows], generator)
            loss = F.cross_entropy(model(batch), labels[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
    return model.eval()


@torch.no_grad()
def accuracy(model: DigitClassifier, images: Tensor, labels: Tensor) -> float:
    """Fraction of ``images`` whose argmax prediction equals ``labels``."""
    predictions = model(images.float()).argmax(dim=1)
    return float((predictions == labels.long()).float().mean())


def save_classifier(model: DigitClassifier, directory: Path, name: str) -> None:
    """Write ``{name}.safetensors`` and ``{name}.json`` (config and weight hash) atomically."""
    directory = Path(directory)
    weights = directory / f"{name}.safetensors"
    state = {key: value.detach().contiguous() for key, value in model.state_dict().items()}
    write_bytes_atomic(weights, safetensors.torch.save(state))
    write_json_atomic(directory / f"{name}.json", {**model.config(), "sha256": sha256_file(weights)})


def load_classifier(directory: Path, name: str) -> DigitClassifier:
    """Load a classifier saved by :func:`save_classifier`, verifying its weight hash."""
    directory = Path(directory)
    meta_path = directory / f"{name}.json"
    weights = directory / f"{name}.safetensors"
    for path in (meta_path, weights):
        if not path.is_file():
            raise FlowpostError(f"classifier file is missing; {RERUN_HINT}", where=str(path))
    meta = read_json(meta_path, what="classifier metadata")
    try:
        expected = str(meta["sha256"])
        model = DigitClassifier(
            width=int(meta["width"]),
            feature_dim=int(meta["feature_dim"]),
            image_size=int(meta["image_size"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise FlowpostError(f"classifier metadata is incomplete ({exc}); {RERUN_HINT}", where=str(meta_path)) from None
    if sha256_file(weights) != expected:
        raise FlowpostError(f"classifier weights do not match the recorded sha256; {RERUN_HINT}", where=str(weights))
    try:
        model.load_state_dict(safetensors.torch.load_file(weights))
    except (SafetensorError, RuntimeError) as exc:
        raise FlowpostError(f"classifier weights cannot be loaded ({exc}); {RERUN_HINT}", where=str(weights)) from None
    return model.eval()
