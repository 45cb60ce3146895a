"""The base of every record a run writes: strict (an unknown field is an error, reading ``summary.json`` back too)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")
