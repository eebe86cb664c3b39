"""The families whose LoRA stock diffusers loads back from a kohya file, each with its layout. Kept apart from
the families' own modules, so that an export's code scope holds the layouts and a training node's does not."""

from __future__ import annotations

from flowpost.core.models.flux1_kohya import FLUX1_KOHYA
from flowpost.core.models.kohya_lora import KohyaLayout, diffusers_names

KOHYA_LAYOUTS: dict[str, KohyaLayout] = {
    "flux1": FLUX1_KOHYA,
    "flux1-kontext": FLUX1_KOHYA,  # FLUX.1's transformer: diffusers' Kontext pipeline loads its kohya files alike
    # published with diffusers' module names; musubi-tuner's network module
    "qwen-image": KohyaLayout(diffusers_names, {"ss_network_module": "networks.lora_qwen_image"}),
}
