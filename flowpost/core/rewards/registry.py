"""Static registry of reward scorers (lazy imports)."""

from __future__ import annotations

REWARDS: dict[str, str] = {
    "digit_adherence": "flowpost.core.rewards.digit_adherence:DigitAdherence",
}
