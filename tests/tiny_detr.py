"""A tiny random DETR object detector (a transformers ResNet backbone, no timm) and its image processor, saved
locally; optionally set so that every query detects one class at one box."""

from __future__ import annotations

import math
from pathlib import Path

import torch

LABELS = ("N/A", "person", "cat", "dog", "car", "mouse", "cup")  # COCO's names, 'N/A' as in DETR's checkpoints
QUERIES = 6


def build_tiny_detr(
    folder: Path,
    *,
    sure: tuple[str, tuple[float, float, float, float]] | None = None,
    gain: float | None = None,
    level: float = 0.0,
) -> Path:
    """Write the detector and processor to ``folder`` (seeded). With ``sure = (label, (cx, cy, w, h))`` every
    query predicts ``label`` at that box (relative centre and size): with probability near 1, or, with
    ``gain``, with logit ``gain * (x - level)`` against the no-object class, ``x`` the label's random
    projection of the decoder's output, so that some images show the object and others do not."""
    from transformers import DetrConfig, DetrForObjectDetection, DetrImageProcessor, ResNetConfig

    backbone = ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], out_features=["stage2"]
    )
    config = DetrConfig(
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        backbone_config=backbone,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_queries=QUERIES,
        id2label=dict(enumerate(LABELS)),
        label2id={label: index for index, label in enumerate(LABELS)},
    )
    torch.manual_seed(0)
    model = DetrForObjectDetection(config)
    if sure is not None:
        label, box = sure
        with torch.no_grad():
            classifier, last = model.class_labels_classifier, model.bbox_predictor.layers[-1]
            index = LABELS.index(label)
            row = classifier.weight[index] * (gain or 0.0)
            classifier.weight.zero_()
            classifier.bias.fill_(-20.0)
            if gain is None:
                classifier.bias[index] = 20.0
            else:
                classifier.weight[index] = row
                classifier.bias[index] = -gain * level
                classifier.bias[-1] = 0.0  # no object
            last.weight.zero_()
            last.bias.copy_(torch.tensor([math.log(v / (1 - v)) for v in box]))  # the inverse of the sigmoid
    model.save_pretrained(folder)
    DetrImageProcessor(size={"shortest_edge": 32, "longest_edge": 64}).save_pretrained(folder)
    return folder
