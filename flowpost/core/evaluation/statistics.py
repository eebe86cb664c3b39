"""Image statistics that expose reward hacking: brightness, saturation, dark pixels, high frequencies,
duplicates. Each takes images [N, 1 or 3, H, W] in [0, 1]; per-image ones return [N] on their device."""

from __future__ import annotations

import torch
from torch import Tensor

LUMA_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R BT.601, the weights of PIL's "L" conversion


def _checked(images: Tensor) -> Tensor:
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"images must be [N, 1 or 3, H, W], got {tuple(images.shape)}")
    return images.detach()


def luma(images: Tensor) -> Tensor:
    """[N, H, W] luma: the single channel, or the BT.601 weighted sum of R, G, B."""
    images = _checked(images)
    if images.shape[1] == 1:
        return images[:, 0]
    weights = torch.tensor(LUMA_WEIGHTS, device=images.device, dtype=images.dtype).view(1, 3, 1, 1)
    return (images * weights).sum(dim=1)


def brightness(images: Tensor) -> Tensor:
    """[N] mean luma of each image."""
    return luma(images).mean(dim=(1, 2))


def saturation(images: Tensor) -> Tensor:
    """[N] mean HSV saturation ``(max - min) / max`` over each image's pixels (0 for black and grey pixels)."""
    images = _checked(images)
    if images.shape[1] == 1:
        return torch.zeros(images.shape[0], device=images.device, dtype=images.dtype)
    high, low = images.amax(dim=1), images.amin(dim=1)
    ratio = torch.where(high > 0, (high - low) / high.clamp_min(torch.finfo(images.dtype).tiny), 0.0)
    return ratio.mean(dim=(1, 2))


def dark_fraction(images: Tensor, *, threshold: float) -> Tensor:
    """[N] fraction of each image's pixels whose luma is below ``threshold``."""
    return (luma(images) < threshold).to(images.dtype).mean(dim=(1, 2))


def high_frequency_energy(images: Tensor, *, cutoff: float) -> Tensor:
    """[N] share of each image's spectral power (luma, mean removed) at radial frequencies above ``cutoff``
    cycles per pixel (at most 0.5 per axis); 0 for a flat image."""
    values = luma(images)
    values = values - values.mean(dim=(1, 2), keepdim=True)
    power = torch.fft.fft2(values).abs().square()
    rows = torch.fft.fftfreq(values.shape[1], device=values.device, dtype=values.dtype)
    cols = torch.fft.fftfreq(values.shape[2], device=values.device, dtype=values.dtype)
    radius = torch.sqrt(rows[:, None].square() + cols[None, :].square())
    total = power.sum(dim=(1, 2))
    high = (power * (radius > cutoff)).sum(dim=(1, 2))
    return torch.where(total > 0, high / total.clamp_min(torch.finfo(values.dtype).tiny), 0.0)


def duplicate_rate(images: Tensor, groups: list[list[int]], *, threshold: float) -> float:
    """Fraction of the images that duplicate an earlier image of their group: mean absolute pixel
    difference below ``threshold``. ``groups`` lists the image indices of each prompt."""
    images = _checked(images)
    duplicates = 0
    for members in groups:
        flat = images[members].flatten(1)
        distance = torch.cdist(flat[None], flat[None], p=1)[0] / flat.shape[1]
        earlier = torch.tril(distance < threshold, diagonal=-1)
        duplicates += int(earlier.any(dim=1).sum())
    return duplicates / max(1, images.shape[0])
