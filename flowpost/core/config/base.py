"""The strict pydantic bases every config section uses, and the check of free-form options."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer


class StrictModel(BaseModel):
    """Rejects unknown keys and non-finite floats (``.inf``, ``.nan``); validates defaults and assignments."""

    model_config = ConfigDict(extra="forbid", validate_default=True, populate_by_name=True, allow_inf_nan=False)


class OmittingModel(StrictModel):
    """A section whose dump (``params.yaml``, fingerprints) leaves out what its results do not depend on:
    the ``OMITTED_AT_DEFAULT`` fields while they hold their default (fields added after configs without them
    existed, whose params and fingerprints must not change) and the fields ``inapplicable`` names."""

    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ()

    def inapplicable(self) -> tuple[str, ...]:
        """The fields that another field's value leaves unread (none by default)."""
        return ()

    @model_serializer(mode="wrap")
    def _omit_defaults_and_inapplicable(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        fields = type(self).model_fields
        for name in self.OMITTED_AT_DEFAULT:
            if getattr(self, name) == fields[name].get_default(call_default_factory=True):
                data.pop(name, None)
        for name in self.inapplicable():
            data.pop(name, None)
        return data


def non_finite_keys(value: Any, prefix: str = "") -> list[str]:
    """Dotted keys under ``value`` (nested mappings and lists) that hold ``inf`` or ``nan``."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [prefix]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [key for name, item in items for key in non_finite_keys(item, f"{prefix}.{name}" if prefix else str(name))]


def _all_finite(value: dict[str, Any]) -> dict[str, Any]:
    if bad := non_finite_keys(value):
        raise ValueError(f"{', '.join(bad)} is not a finite number; give a finite value")
    return value


FiniteOptions = Annotated[dict[str, Any], AfterValidator(_all_finite)]  # free-form options, no inf or nan inside
