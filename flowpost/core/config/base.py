"""The strict pydantic base every config section uses."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Rejects unknown keys, validates defaults and assignments."""

    model_config = ConfigDict(extra="forbid", validate_default=True, populate_by_name=True)
