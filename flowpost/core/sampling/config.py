"""How generation trainers sample: the ``sampling:`` section of a stage."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from flowpost.core.config.base import StrictModel


class SamplingConfig(StrictModel):
    """How generation trainers sample: SDE dynamics inside a window of steps, ODE elsewhere."""

    dynamics: Literal["ode", "flow-sde", "dance-sde", "cps"] = "flow-sde"
    steps: int = Field(10, ge=2, le=1000, description="sampler steps; at most the 1000 training timesteps")
    noise_level: float = Field(0.7, ge=0, description="a for flow-sde and cps, eta for dance-sde")
    guidance: float = Field(1.0, ge=0)
    window: int | None = Field(None, ge=1, description="consecutive SDE steps (Fast); default: all but the last")
    window_start: tuple[int, int] | None = Field(None, description="inclusive range the window start is drawn from")
    same_group_noise: bool = Field(False, description="one initial noise per group")

    @property
    def window_size(self) -> int:
        """Steps in one SDE window: ``window``, or all but the last step."""
        return self.window or self.steps - 1

    @property
    def window_starts(self) -> tuple[int, int]:
        """The inclusive range a window's first step is drawn from."""
        return self.window_start or (0, 0 if self.window is None else self.steps - 1 - self.window_size)

    @property
    def sde_steps(self) -> range:
        """Every step some window holds (grid step ``j`` runs ``sigmas[j] -> sigmas[j + 1]``)."""
        low, high = self.window_starts
        return range(low, high + self.window_size)

    @model_validator(mode="after")
    def _window_fits(self) -> SamplingConfig:
        size = self.window or self.steps - 1
        if size > self.steps - 1:
            raise ValueError(f"window {size} exceeds the {self.steps - 1} trainable steps (the last is never trained)")
        if self.window_start is not None:
            low, high = self.window_start
            if not 0 <= low <= high or high + size > self.steps - 1:
                raise ValueError(
                    f"window_start {self.window_start} must satisfy 0 <= low <= high <= steps - 1 - window"
                )
        return self
