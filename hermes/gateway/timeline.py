"""A run's timeline: its units, requests and tool calls on one time axis, from its document.

:func:`run_timeline` reads a run's JSON document (``GET /v1/runs/{id}``: the same for an
active run and a kept finished one) and answers what ``hermes runs show RUN --timeline`` draws:
per unit invocation its start and end, and per request or tool call the times it was
**queued** (sent by the gateway to its node), **dispatched** (released by the node to the
engine or tool runner: ``queued + queue_s``), gave its **first token** (``dispatched +
ttft_s``, LLM requests) and was **done**. Waiting is queued..dispatched; serving is
dispatched..done. Times are the scheduler clock's seconds (epoch seconds at time scale 1),
plus ``t0`` (the run's submission) so that a reader can draw offsets. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _request(r: Mapping[str, Any]) -> dict[str, Any]:
    queued = _num(r.get("sent"))
    done = _num(r.get("finished"))
    queue_s = _num(r.get("queue_s"))
    ttft_s = _num(r.get("ttft_s"))
    dispatched = queued + queue_s if queued is not None and queue_s is not None else None
    first = dispatched + ttft_s if dispatched is not None and ttft_s is not None else None
    return {"request_id": r.get("request_id"), "kind": r.get("kind"), "state": r.get("state"),
            "node": r.get("node"), "engine": r.get("engine"),
            "input_tokens": r.get("input_tokens"), "output_tokens": r.get("output_tokens"),
            "queued": queued, "dispatched": dispatched, "first_token": first, "done": done}


def run_timeline(doc: Mapping[str, Any], trace_id: str | None = None) -> dict[str, Any]:
    """The timeline of the run whose document is ``doc`` (see the module docstring);
    ``trace_id``: its trace, when the gateway traced it."""
    units = []
    for u in doc.get("units") or ():
        units.append({"unit": u.get("unit"), "backend": u.get("backend"),
                      "started": _num(u.get("started")), "finished": _num(u.get("finished")),
                      "requests": [_request(r) for r in u.get("requests") or ()]})
    return {"run_id": doc.get("run_id"), "app": doc.get("app"), "state": doc.get("state"),
            "inferred": doc.get("inferred"), "t0": _num(doc.get("submitted")),
            "finished": _num(doc.get("finished")), "act_s": _num(doc.get("act_s")),
            "trace_id": trace_id, "units": units}
