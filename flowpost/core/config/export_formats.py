"""The ``export.formats`` the exported stage's model can be written in: ``kohya`` needs a LoRA stage of a family
whose kohya file diffusers loads back, training no module outside that family's layout."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flowpost.core.config.schema.pipeline import PipelineConfig

WHERE = "export.formats"


def export_format_problems(pipeline: PipelineConfig) -> list[str]:
    """Why the exported stage cannot be written as a kohya LoRA file, when ``export.formats`` asks for one."""
    from flowpost.core.models.kohya_layouts import KOHYA_LAYOUTS
    from flowpost.core.models.registry import adapter_class

    export = pipeline.export
    if export is None or "kohya" not in export.formats or export.from_stage not in pipeline.stages:
        return []
    stage, model = export.from_stage, pipeline.stages[export.from_stage].model
    layout = KOHYA_LAYOUTS.get(model.family)
    if layout is None:
        return [
            f"{WHERE}: 'kohya' writes a LoRA file in a layout stock diffusers loads back for families "
            f"{', '.join(KOHYA_LAYOUTS)}; stage {stage!r} trains {model.family!r}; remove 'kohya'"
        ]
    if model.lora is None:
        return [
            f"{WHERE}: 'kohya' writes the LoRA adapters of stage {stage!r}, which trains every weight; "
            f"set stages.{stage}.model.lora or remove 'kohya'"
        ]
    targets = model.lora.targets or getattr(adapter_class(model.family), "lora_targets", ())
    if unnamed := layout.unnamed_targets(targets):
        return [
            f"{WHERE}: stages.{stage}.model.lora.targets {', '.join(map(repr, unnamed))} train {model.family!r} "
            "modules that diffusers does not load from a kohya file (outside the transformer blocks); remove them "
            "or 'kohya'"
        ]
    return []
