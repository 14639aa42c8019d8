"""Run records: the data contract between drivers and the profiler (DESIGN.md).

One completed run is one JSON line::

    {"app", "run_id", "submitted", "finished", "deadline"?, "units": [
        {"unit", "backend", "started", "finished",
         "requests": [{"input_tokens", "output_tokens"}]?, "duration_s"?, "upstream"?}]}

Units are in order of start; a loop is the same unit appearing again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class RequestRecord(BaseModel):
    """One LLM request of a unit invocation."""

    model_config = ConfigDict(extra="forbid")
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)


class UnitRecord(BaseModel):
    """One invocation of a unit: its LLM requests (issued in parallel) or its tool call."""

    model_config = ConfigDict(extra="forbid")
    unit: str = Field(min_length=1)
    backend: str = Field(min_length=1)
    started: float
    finished: float
    requests: list[RequestRecord] | None = None
    duration_s: float | None = Field(default=None, ge=0)
    upstream: str | None = None

    @model_validator(mode="after")
    def _check(self) -> UnitRecord:
        if self.finished < self.started:
            raise ValueError(f"unit {self.unit!r}: finished ({self.finished}) before started ({self.started})")
        return self

    @property
    def parallelism(self) -> int:
        return len(self.requests) if self.requests else 1

    @property
    def is_llm(self) -> bool:
        return self.requests is not None


class RunRecord(BaseModel):
    """One completed run of an application."""

    model_config = ConfigDict(extra="forbid")
    app: str = Field(min_length=1)
    run_id: str = Field(min_length=1)
    submitted: float
    finished: float
    deadline: float | None = None
    units: list[UnitRecord]

    @property
    def act_s(self) -> float:
        """Application completion time: finish minus submit."""
        return self.finished - self.submitted


class RecordError(ValueError):
    """A run-record file could not be read; the message names the file, line and field."""


def read_records(path: str | Path) -> Iterator[RunRecord]:
    """Yield the run records of a JSONL file, failing with the line and field on bad input."""
    path = Path(path)
    with path.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield RunRecord.model_validate_json(line)
            except ValidationError as exc:
                err = exc.errors()[0]
                loc = ".".join(str(p) for p in err["loc"])
                raise RecordError(f"{path}:{lineno}: field {loc}: {err['msg']}") from None


def write_records(path: str | Path, records: Iterable[RunRecord]) -> int:
    """Write run records as JSONL; returns how many were written."""
    n = 0
    with Path(path).open("w") as fh:
        for rec in records:
            fh.write(json.dumps(rec.model_dump(exclude_none=True)) + "\n")
            n += 1
    return n
