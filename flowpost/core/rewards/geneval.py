"""``geneval``: GenEval's compositional checks (objects, counts, colours, relative positions) on each image,
from its prompt's GenEval metadata (``tag``, ``include``, ``exclude``).

Objects come from a transformers object detector (``AutoModelForObjectDetection`` with its image processor;
class names from its ``id2label``, matched to GenEval's COCO names); colours from a CLIP model classifying
each object's crop among GenEval's ten colours. The score is Flow-GRPO's partial score, or GenEval's 0/1
verdict with ``strict: true`` (``geneval_checks``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from flowpost.core.rewards.clip import ClipSimilarity, load_pretrained
from flowpost.core.rewards.geneval_checks import (
    Box,
    ColourClassifier,
    Thresholds,
    class_detections,
    geneval_correct,
    kept_objects,
    partial_score,
)
from flowpost.core.rewards.geneval_metadata import COCO_CLASSES, COLORS, FIELDS, GenevalSpec, parse_geneval
from flowpost.core.rewards.model_options import scoring_options
from flowpost.errors import FlowpostError

ALIASES = {"mouse": "computer mouse", "remote": "tv remote", "keyboard": "computer keyboard"}  # COCO's own names
CLIP_OPTIONS = {"options.model": "options.clip", "options.processor": "options.clip_processor"}
COLOUR_TEMPLATES = ("a photo of a {c} {name}", "a photo of a {c}-colored {name}", "a photo of a {c} object")


def coco_names(id2label: dict[int, str]) -> dict[int, str]:
    """The detector's class ids whose labels are GenEval class names (matched case-insensitively, with COCO's
    ``mouse``, ``remote`` and ``keyboard`` read as GenEval's longer names)."""
    names = {}
    for index, label in id2label.items():
        name = str(label).strip().lower()
        name = ALIASES.get(name, name)
        if name in COCO_CLASSES:
            names[int(index)] = name
    return names


class GenevalReward:
    """GenEval's checks on each image against its prompt's ``include``/``exclude`` metadata, a score in [0, 1].

    ``detector`` is a local folder or hub id of a transformers object detector trained on COCO classes
    (e.g. ``facebook/detr-resnet-50``), ``detector_processor`` its image processor (default: ``detector``);
    ``clip`` (and ``clip_processor``) the CLIP model classifying colours. ``strict`` scores GenEval's 0/1
    verdict instead of the partial score; the thresholds are GenEval's options with its defaults.
    ``device``, ``dtype`` and ``batch_size`` apply to both models.
    """

    name = "geneval"
    metadata_fields = FIELDS

    def __init__(
        self,
        detector: str,
        clip: str,
        *,
        detector_processor: str | None = None,
        clip_processor: str | None = None,
        strict: bool = False,
        threshold: float = 0.3,
        counting_threshold: float = 0.9,
        max_objects: int = 16,
        max_overlap: float = 1.0,
        position_threshold: float = 0.1,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int = 16,
    ) -> None:
        from transformers import AutoImageProcessor, AutoModelForObjectDetection

        self.device, self.dtype, self.batch_size = scoring_options(device, dtype, batch_size)
        if not isinstance(strict, bool):
            raise FlowpostError(f"strict must be true or false, got {strict!r}", where="options.strict")
        for option, value in [
            ("threshold", threshold),
            ("counting_threshold", counting_threshold),
            ("max_overlap", max_overlap),
            ("position_threshold", position_threshold),
        ]:
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                raise FlowpostError(f"{option} must be a number in [0, 1], got {value!r}", where=f"options.{option}")
        if isinstance(max_objects, bool) or not isinstance(max_objects, int) or max_objects < 1:
            raise FlowpostError(
                f"max_objects must be a positive integer, got {max_objects!r}", where="options.max_objects"
            )
        if not isinstance(detector, str | Path):
            raise FlowpostError(f"detector must be a folder or hub id, got {detector!r}", where="options.detector")
        self.strict = strict
        self.thresholds = Thresholds(
            float(threshold), float(counting_threshold), max_objects, float(max_overlap), float(position_threshold)
        )
        processor_option = "detector" if detector_processor is None else "detector_processor"
        self.detector = load_pretrained(AutoModelForObjectDetection, str(detector), "detector")
        self.detector.to(dtype=self.dtype).eval().requires_grad_(False)
        self.processor = load_pretrained(
            AutoImageProcessor, str(detector if detector_processor is None else detector_processor), processor_option
        )
        self.classes = coco_names(self.detector.config.id2label)
        if not self.classes:
            raise FlowpostError(
                f"the detector's classes ({', '.join(list(self.detector.config.id2label.values())[:5])}, ...) "
                "include none of GenEval's COCO class names; give a detector trained on COCO",
                where="options.detector",
            )
        try:
            self.clip = ClipSimilarity(
                clip, processor=clip_processor, device=device, dtype=dtype, batch_size=batch_size
            )
        except FlowpostError as exc:  # its model and processor are this reward's clip and clip_processor
            where = CLIP_OPTIONS.get(exc.where or "", exc.where)
            raise FlowpostError(str(exc).removeprefix(f"{exc.where}: "), where=where) from None
        self.colour_embeddings: dict[str, Tensor] = {}

    @torch.no_grad()
    def __call__(self, media: Tensor, prompts: list[str], metadata: list[dict[str, Any]]) -> Tensor:
        if media.ndim != 4 or media.shape[1] not in (1, 3):
            raise FlowpostError(
                f"geneval needs grayscale or RGB media [B, 1 or 3, H, W], got {tuple(media.shape)}", where="rewards"
            )
        if not len(prompts) == len(metadata) == media.shape[0]:
            raise FlowpostError(
                f"geneval got {media.shape[0]} images, {len(prompts)} prompts and {len(metadata)} metadata",
                where="rewards",
            )
        specs = [self._spec(prompt, meta) for prompt, meta in zip(prompts, metadata, strict=True)]
        device = self.device or media.device
        images = ((media.detach().float().clamp(0, 1) * 255).round() / 255).expand(-1, 3, -1, -1).to(device)
        self.clip.model.to(device)
        check = geneval_correct if self.strict else partial_score
        scores = []
        for start in range(0, images.shape[0], self.batch_size):
            stop = start + self.batch_size
            batch = images[start:stop]
            for image, detections, spec in zip(batch, self.detect(batch), specs[start:stop], strict=True):
                objects = kept_objects(detections, spec.tag, self.thresholds)
                classify = self.colour_classifier(image)
                scores.append(float(check(spec, objects, classify, self.thresholds.position_threshold)))
        return torch.tensor(scores, dtype=torch.float32, device=media.device)

    def _spec(self, prompt: str, metadata: dict[str, Any]) -> GenevalSpec:
        """The prompt's checks, each of whose classes the detector knows."""
        try:
            spec = parse_geneval(metadata if isinstance(metadata, dict) else {})
        except ValueError as exc:
            raise FlowpostError(
                f"prompt {prompt!r}: {exc}; geneval scores prompts with GenEval metadata (its "
                "evaluation_metadata.jsonl rows)",
                where="rewards",
            ) from None
        known = set(self.classes.values())
        if unknown := sorted({r.name for r in spec.include + spec.exclude} - known):
            raise FlowpostError(
                f"prompt {prompt!r} asks for {unknown[0]!r}, which the detector does not detect; give a detector "
                "with all 80 COCO classes",
                where="rewards",
            )
        return spec

    def detect(self, images: Tensor) -> list[dict[str, list[tuple[float, Box]]]]:
        """Per image [3, H, W] in [0, 1], the ``(score, box)`` detections of each GenEval class."""
        self.detector.to(images.device)
        pixels = (images * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
        inputs = self.processor(images=list(pixels), return_tensors="pt")
        inputs = {
            key: value.to(images.device, self.dtype if value.is_floating_point() else value.dtype)
            for key, value in inputs.items()
        }
        outputs = self.detector(**inputs)
        for key, value in outputs.items():
            if isinstance(value, Tensor) and value.is_floating_point():
                outputs[key] = value.float()
        lowest = min(self.thresholds.threshold, self.thresholds.counting_threshold)
        sizes = [tuple(images.shape[-2:])] * images.shape[0]
        results = self.processor.post_process_object_detection(outputs, threshold=lowest, target_sizes=sizes)
        return [class_detections(result, self.classes) for result in results]

    def colour_classifier(self, image: Tensor) -> ColourClassifier:
        """``classify(boxes, name)``: the colour CLIP ranks first for each box's crop of ``image`` [3, H, W]."""

        def classify(boxes: list[Box], name: str) -> list[str]:
            crops = torch.cat([self.clip.pixel_values(_crop(image, box)) for box in boxes])
            clip = self.clip.model
            features = clip.visual_projection(clip.vision_model(pixel_values=crops.to(self.clip.dtype)).pooler_output)
            features = F.normalize(features.float(), dim=-1)
            best = (features @ self.colours(name, image.device).T).argmax(-1)
            return [COLORS[int(index)] for index in best]

        return classify

    def colours(self, name: str, device: torch.device) -> Tensor:
        """[10, D] zero-shot colour embeddings for objects ``name``: each colour's normalised mean over
        GenEval's three templates of its normalised text embeddings."""
        if name not in self.colour_embeddings:
            clip = self.clip.model.to(device)
            texts = [template.format(c=c, name=name) for c in COLORS for template in COLOUR_TEMPLATES]
            inputs = {key: value.to(device) for key, value in self.clip.text_inputs(texts).items()}
            embeddings = F.normalize(clip.text_projection(clip.text_model(**inputs).pooler_output).float(), dim=-1)
            means = embeddings.view(len(COLORS), len(COLOUR_TEMPLATES), -1).mean(1)
            self.colour_embeddings[name] = F.normalize(means, dim=-1)
        return self.colour_embeddings[name].to(device)


def _crop(image: Tensor, box: Box) -> Tensor:
    """[1, 3, h, w]: ``box`` rounded to whole pixels (at least one) inside ``image`` [3, H, W]."""
    height, width = image.shape[-2:]
    x0, y0 = min(max(round(box[0]), 0), width - 1), min(max(round(box[1]), 0), height - 1)
    x1, y1 = min(max(round(box[2]), x0 + 1), width), min(max(round(box[3]), y0 + 1), height)
    return image[None, :, y0:y1, x0:x1]
