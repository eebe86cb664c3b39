"""A tiny random DETR object detector (a transformers ResNet backbone, no timm) and its image processor, saved
locally; optionally set so that every query detects one class at one box."""

from __future__ import annotations

import math
from pathlib import Path

import torch

LABELS = ("N/A", "person", "cat", "dog", "car", "mouse", "cup")  # COCO's names, 'N/A' as in DETR's checkpoints
QUERIES = 6


def build_tiny_detr(folder: Path, *, sure: tuple[str, tuple[float, float, float, float]] | None = None) -> Path:
    """Write the detector and processor to ``folder`` (seeded). With ``sure = (label, (cx, cy, w, h))`` every
    query predicts ``label`` with probability near 1 at that box (relative centre and size)."""
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
            classifier.weight.zero_()
            classifier.bias.fill_(-20.0)
            classifier.bias[LABELS.index(label)] = 20.0
            last.weight.zero_()
            last.bias.copy_(torch.tensor([math.log(v / (1 - v)) for v in box]))  # the inverse of the sigmoid
    model.save_pretrained(folder)
    DetrImageProcessor(size={"shortest_edge": 32, "longest_edge": 64}).save_pretrained(folder)
    return folder
