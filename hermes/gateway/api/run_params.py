"""The per-run parameters a client may set, defined once for every way they come in.

``POST /v1/runs`` takes them as ``k`` and ``deadline_s`` in its JSON body, the OpenAI API as
the ``X-Hermes-K`` and ``X-Hermes-Deadline-S`` headers of a request that creates its run, and
``PUT /admin/knobs`` sets a default, app or tenant K; all validate with these types, so that a
value one accepts the others accept too.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, TypeAdapter, ValidationError

#: the prewarming knob K of a run: a probability (the planner's threshold on p_s); strict:
#: a boolean is not a number
Knob = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False, strict=True)]
#: a run's deadline, seconds after its submission
DeadlineS = Annotated[float, Field(gt=0.0, allow_inf_nan=False, strict=True)]

_KNOB = TypeAdapter(Knob)
_DEADLINE = TypeAdapter(DeadlineS)


def parse_knob(raw: str) -> float:
    """K from text (a header); :class:`ValueError` saying what is wrong with it."""
    return _parse(_KNOB, raw)


def parse_deadline_s(raw: str) -> float:
    """A deadline in seconds from text (a header); :class:`ValueError` as :func:`parse_knob`."""
    return _parse(_DEADLINE, raw)


def _parse(adapter: TypeAdapter[float], raw: str) -> float:
    try:
        return float(adapter.validate_strings(raw))
    except ValidationError as e:
        raise ValueError(e.errors()[0]["msg"].lower()) from None
