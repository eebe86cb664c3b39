"""The per-GPU estimate with offloaded snapshots and VAE: they leave the device total and count as host memory."""

from __future__ import annotations

from flowpost.core.memory import SNAPSHOT_ITEMSIZE, estimate_memory
from flowpost.core.models.footprint import ModelFootprint

LORA = ModelFootprint(
    parameters=1100, trainable=100, weight_bytes=2400, trainable_bytes=400,
    blocks=3, hidden=8, image_tokens=10, checkpointed=0,
)  # fmt: skip
SETTINGS = {"world_size": 1, "backend": "ddp", "micro_batch": 1, "text_tokens": 6, "activation_itemsize": 2}


def test_hosted_snapshots_and_codec_move_from_the_device_total_to_the_host() -> None:
    resident = estimate_memory(LORA, snapshots=2, codec_bytes=5000, **SETTINGS)  # type: ignore[arg-type]
    hosted = estimate_memory(
        LORA,
        snapshots=1,
        hosted_snapshots=1,
        codec_bytes=5000,
        hosted_codec=True,
        **SETTINGS,  # type: ignore[arg-type]
    )
    assert resident.host == 0 and hosted.snapshots == 100 * SNAPSHOT_ITEMSIZE and hosted.codec == 0
    assert hosted.host == 100 * SNAPSHOT_ITEMSIZE + 5000 == resident.total - hosted.total
