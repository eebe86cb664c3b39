"""The trade-off between two evaluated metrics over a pipeline's scored checkpoints (``evaluate.every``): which
checkpoints no other beats on both (the Pareto front), and a plot of every stage's curve in the plane of the two."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from flowpost.core.evaluation.samples import Better
from flowpost.core.io import write_bytes_atomic

WIDTH, HEIGHT, MARGIN = 560, 400, 56
COLOURS = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14), (23, 190, 207))
MAX_METRICS = 3  # pairs among the first three metrics of the curves: three plots at most


@dataclass(frozen=True)
class Checkpoint:
    """One scored checkpoint: its stage, optimizer step and the two metrics' values."""

    stage: str
    step: int
    x: float
    y: float


def pareto_front(points: list[Checkpoint], better: tuple[Better, Better]) -> list[bool]:
    """For each point, whether no other point is at least as good on both metrics and better on one."""
    signs = tuple(1.0 if direction == "higher" else -1.0 for direction in better)
    signed = [(signs[0] * p.x, signs[1] * p.y) for p in points]
    return [not any(o[0] >= s[0] and o[1] >= s[1] and (o[0] > s[0] or o[1] > s[1]) for o in signed) for s in signed]


def metric_pairs(curves: dict[str, list[dict[str, Any]]], directions: dict[str, Better]) -> list[tuple[str, str]]:
    """The pairs of metrics to plot: among the first ``MAX_METRICS`` metrics every curve holds and whose direction
    is known, in the curves' column order."""
    columns = [key for key in next(iter(curves.values()))[0] if key != "step"]
    shared = [key for key in columns if key in directions and all(key in curve[0] for curve in curves.values())]
    return list(combinations(shared[:MAX_METRICS], 2))


def checkpoints(curves: dict[str, list[dict[str, Any]]], x: str, y: str) -> list[Checkpoint]:
    """Every curve row as a point of the ``x``-``y`` plane, stage by stage in order."""
    return [
        Checkpoint(stage, int(row["step"]), float(row[x]), float(row[y]))
        for stage, curve in curves.items()
        for row in curve
    ]


def pareto_plot(points: list[Checkpoint], x: str, y: str, better: tuple[Better, Better]) -> bytes:
    """A PNG: each stage's checkpoints joined in step order in its colour, labelled by step, the front ringed."""
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    xs, ys = [p.x for p in points], [p.y for p in points]
    x_low, x_high = _span(xs)
    y_low, y_high = _span(ys)

    def at(point: Checkpoint) -> tuple[float, float]:
        u = MARGIN + (point.x - x_low) / (x_high - x_low) * (WIDTH - 2 * MARGIN)
        v = HEIGHT - MARGIN - (point.y - y_low) / (y_high - y_low) * (HEIGHT - 2 * MARGIN)
        return u, v

    draw.rectangle((MARGIN, MARGIN, WIDTH - MARGIN, HEIGHT - MARGIN), outline="black")
    draw.text((MARGIN, HEIGHT - MARGIN + 6), f"{x_low:.4g}", fill="black")
    draw.text((WIDTH - MARGIN - 40, HEIGHT - MARGIN + 6), f"{x_high:.4g}", fill="black")
    draw.text((WIDTH // 2 - 80, HEIGHT - 22), f"{x} ({better[0]} is better)", fill="black")
    draw.text((4, HEIGHT - MARGIN - 12), f"{y_low:.4g}", fill="black")
    draw.text((4, MARGIN), f"{y_high:.4g}", fill="black")
    draw.text((4, 8), f"{y} ({better[1]} is better)", fill="black")
    front = pareto_front(points, better)
    stages = list(dict.fromkeys(p.stage for p in points))
    for index, stage in enumerate(stages):
        colour = COLOURS[index % len(COLOURS)]
        path = [at(p) for p in points if p.stage == stage]
        if len(path) > 1:
            draw.line(path, fill=colour, width=2)
        draw.text((WIDTH - MARGIN - 90, MARGIN + 6 + 14 * index), f"— {stage}", fill=colour)
    for point, on_front in zip(points, front, strict=True):
        u, v = at(point)
        colour = COLOURS[stages.index(point.stage) % len(COLOURS)]
        draw.ellipse((u - 3, v - 3, u + 3, v + 3), fill=colour)
        if on_front:
            draw.ellipse((u - 7, v - 7, u + 7, v + 7), outline="black", width=2)
        draw.text((u + 6, v - 14), str(point.step), fill=colour)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def trade_off_section(
    curves: dict[str, list[dict[str, Any]]], directions: dict[str, Better], out_dirs: list[Path]
) -> list[str]:
    """The report's section on each pair of metrics: ``pareto-<x>-<y>.png`` in every out dir, embedded, and the
    checkpoints on the front; nothing when no two metrics with a direction are scored over checkpoints."""
    pairs = metric_pairs(curves, directions) if curves else []
    if not pairs:
        return []
    lines = ["", "## Trade-offs over checkpoints", ""]
    for x, y in pairs:
        points = checkpoints(curves, x, y)
        better = (directions[x], directions[y])
        png = pareto_plot(points, x, y, better)
        name = f"pareto-{x}-{y}.png"
        for directory in out_dirs:
            write_bytes_atomic(directory / name, png)
        front = [p for p, on in zip(points, pareto_front(points, better), strict=True) if on]
        listed = ", ".join(f"{p.stage} step {p.step} ({p.x:.4g}, {p.y:.4g})" for p in front)
        data = base64.b64encode(png).decode("ascii")
        lines += [
            f"- `{x}` against `{y}` (`{name}`); no other checkpoint beats these on both: {listed}",
            "",
            f"  ![{x} against {y}](data:image/png;base64,{data})",
            "",
        ]
    return lines


def _span(values: list[float]) -> tuple[float, float]:
    """The plotted range of ``values``, padded by a tenth (a unit around a single value)."""
    low, high = min(values), max(values)
    pad = (high - low) / 10 if high > low else max(abs(low), 1.0) / 10
    return low - pad, high + pad
