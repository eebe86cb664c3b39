"""The tiny real families the trainer tests load: each one's loader, folder and data fixtures, rollout guidance."""

from __future__ import annotations

from tiny_flux1_kontext_pipeline import load_flux1_kontext_adapter
from tiny_flux1_pipeline import load_flux1_adapter
from tiny_flux2_pipeline import load_flux2_adapter, load_flux2_klein_adapter
from tiny_qwen_image_edit_pipeline import load_qwen_image_edit_adapter, load_qwen_image_edit_plus_adapter
from tiny_qwen_image_pipeline import load_qwen_image_adapter
from tiny_sd3_pipeline import load_sd3_adapter
from tiny_z_image_pipeline import load_z_image_adapter

PIPELINE_FAMILIES = {  # loader, pipeline folder fixture, stage data fixture, the guidance its rollouts sample with
    "sd3": (load_sd3_adapter, "sd3_pipeline_dir", "sd3_data_dirs", 4.5),
    "flux1": (load_flux1_adapter, "flux1_pipeline_dir", "flux1_data_dirs", 1.0),  # distilled guidance only
    # seeded edit conditions (4x4 source tokens); distilled guidance only
    "flux1-kontext": (load_flux1_kontext_adapter, "flux1_kontext_pipeline_dir", "flux1_kontext_data_dirs", 1.0),
    "flux2": (load_flux2_adapter, "flux2_pipeline_dir", "flux2_data_dirs", 1.0),  # distilled guidance only
    "flux2-klein": (load_flux2_klein_adapter, "flux2_klein_pipeline_dir", "flux2_klein_data_dirs", 4.0),  # base: CFG
    "qwen-image": (load_qwen_image_adapter, "qwen_image_pipeline_dir", "qwen_image_data_dirs", 4.0),
    # seeded edit conditions (4x4 source tokens); sampled without true CFG
    "qwen-image-edit": (load_qwen_image_edit_adapter, "qwen_image_edit_pipeline_dir", "qwen_image_edit_data_dirs", 1.0),
    # two seeded sources of 4x4 tokens per edit
    "qwen-image-edit-plus": (
        load_qwen_image_edit_plus_adapter,
        "qwen_image_edit_plus_pipeline_dir",
        "qwen_image_edit_plus_data_dirs",
        1.0,
    ),
    "z-image": (load_z_image_adapter, "z_image_pipeline_dir", "z_image_data_dirs", 5.0),  # guidance_scale 4
}
