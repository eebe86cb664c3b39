"""``fd_clip`` and ``fd_dinov2``: the Fréchet distance between samples and held-out real images in the
feature space of a CLIP or DINOv2 model the user names."""

from __future__ import annotations

from flowpost.core.evaluation.features import FeatureKind, ImageFeatures
from flowpost.core.evaluation.frechet import frechet_distance
from flowpost.core.evaluation.samples import EvalSamples
from flowpost.errors import FlowpostError


class FeatureFrechet:
    """FD of ``kind`` features of ``model`` (a folder or hub id) between samples and real images."""

    kind: FeatureKind
    better = "lower"
    reads_reference = True

    def __init__(self, model: str, *, device: str | None = None, batch_size: int = 64) -> None:
        self.name = f"fd_{self.kind}"
        self.features = ImageFeatures(model, kind=self.kind, device=device, batch_size=batch_size)

    def __call__(self, samples: EvalSamples) -> float:
        if samples.reference is None or samples.reference.shape[0] < 2:
            raise FlowpostError(
                f"{self.name} needs at least 2 held-out real images; evaluate on an image dataset with a "
                "held-out split (split.eval), or of a source that holds images out (builtin-digits)",
                where="evaluate.dataset",
            )
        return frechet_distance(self.features(samples.images), self.features(samples.reference))


class ClipFrechet(FeatureFrechet):
    kind = "clip"


class Dinov2Frechet(FeatureFrechet):
    kind = "dinov2"
