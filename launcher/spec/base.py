"""The base of every spec section."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Base for spec sections: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)
