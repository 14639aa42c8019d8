"""Run documents are written by msgspec where that gives the values ``json.dumps(doc,
default=str)`` gave, and by json otherwise (:func:`hermes.gateway.state.encode_doc`): what is
stored (the run store) and served (the finished runs) reads back the same."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import math
from typing import Any

import msgspec
import numpy as np
import pytest

from hermes.core.state import RunState
from hermes.gateway.durable import _inv_doc, run_doc
from hermes.gateway.finished import FinishedRuns
from hermes.gateway.state import (
    LiveRun,
    PendingRequest,
    UnitInvocation,
    encode_doc,
    encode_plain_doc,
    encode_run_doc,
)
from hermes.protocol import Done


def _old(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), default=str).encode()


def _same(a: bytes, b: bytes) -> bool:
    """Equal once read back (NaN read back equals NaN here: compared by its JSON text)."""
    return json.dumps(json.loads(a), sort_keys=True) == json.dumps(json.loads(b), sort_keys=True)


def _run(key: tuple[float, ...]) -> LiveRun:
    run = LiveRun(state=RunState(run_id="run-1", app="default.syn", tenant="t", submitted=5.0))
    run.status = "finished"
    run.state.finished = 7.5
    for i in range(3):
        inv = UnitInvocation(unit=f"step{i}", backend="llm:m", started=5.0 + i,
                             explicit=False, finished=5.5 + i, closed=True)
        req = PendingRequest(request_id=f"r{i}", run=run, inv=inv, kind="llm", key=key,
                             msg=None, view=None, future=None,  # type: ignore[arg-type]
                             node="n1", engine="e0", sent_at=5.0 + i, finished_at=5.4 + i)
        req.result = Done(request_id=f"r{i}", input_tokens=3, output_tokens=4, text="héllo",
                          engine="e0", queue_s=0.0, service_s=0.01)
        inv.requests.append(req)
        run.units.append(inv)
    return run


def test_a_run_document_is_msgspec_s_and_reads_back_the_same() -> None:
    run = _run((0.25, 5.0, 1.0))
    for doc in (run.to_json(8.0), run_doc(run), _inv_doc(run.units[0])):
        out = encode_doc(doc)
        assert out == msgspec.json.encode(doc)  # the fast path was taken
        assert json.loads(out) == json.loads(_old(doc)) == doc


class Color(enum.Enum):
    RED = "red"


class Level(enum.StrEnum):
    HIGH = "high"


@dataclasses.dataclass
class Point:
    x: int


@pytest.mark.parametrize("value", [
    math.inf, -math.inf, math.nan, (1, 2), {1, 2}, frozenset(), Point(1), b"raw",
    datetime.datetime(2026, 1, 2, 3, 4, 5), datetime.date(2026, 1, 2), Color.RED, Level.HIGH,
    np.int64(7), np.float64(0.5), {1: "int key"}, 2 ** 70, "\ud800", [1, [2.5, {"a": None}]],
])
def test_what_is_not_plain_json_is_written_as_json_wrote_it(value: Any) -> None:
    doc = {"run_id": "r", "result": value, "units": [{"key": [value]}]}
    assert _same(encode_doc(doc), _old(doc)), value


def test_a_non_finite_rank_in_a_served_document_is_as_before() -> None:
    run = _run((math.inf, 5.0))  # keys may be infinite: to_json writes them as null
    run.input = {"score": math.nan, "when": datetime.date(2026, 1, 2)}  # a hosted app's input
    fin = FinishedRuns(keep=10)
    fin.add_run(run, 8.0)
    got = fin.get("run-1")
    assert got is not None
    served = got.to_json(9.0)
    expected = json.loads(_old(run.to_json(8.0)))
    assert math.isnan(served["input"]["score"]) and served["input"]["when"] == "2026-01-02"
    served["input"]["score"] = expected["input"]["score"] = None
    assert served == expected
    assert served["units"][0]["requests"][0]["key"] == [None, 5.0]


def test_a_unit_document_is_written_without_the_read_back_and_reads_back_the_same() -> None:
    run = _run((0.25, 5.0, 1.0))
    for inv in run.units:
        doc = _inv_doc(inv)
        out = encode_plain_doc(doc)
        assert out == encode_doc(doc)  # the same bytes as the checked path
        assert json.loads(out) == doc
    # what msgspec refuses is json's: a lone surrogate in an answer's text
    run.units[0].requests[0].result.text = "bad \ud800"
    doc = _inv_doc(run.units[0])
    assert encode_plain_doc(doc) == _old(doc)
    # the one difference, by design: a non-finite float is written null (json: Infinity)
    run.units[1].finished = math.inf
    assert json.loads(encode_plain_doc(_inv_doc(run.units[1])))["finished"] is None


class _CountingDecoder:
    """The module's decoder, counting what it is asked to read back."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sizes: list[int] = []

    def decode(self, data: bytes) -> Any:
        self.sizes.append(len(data))
        return self.inner.decode(data)


def test_a_run_document_is_read_back_only_where_a_client_s_value_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes.gateway import state
    counting = _CountingDecoder(state._DOC_DECODER)
    monkeypatch.setattr(state, "_DOC_DECODER", counting)
    run = _run((0.25, 5.0, 1.0))
    for doc in (run.to_json(8.0), run_doc(run)):
        out = encode_run_doc(doc)
        assert out == msgspec.json.encode(doc)
        assert json.loads(out) == json.loads(_old(doc)) == doc
    assert counting.sizes == []  # an agent's run: no client value, nothing read back
    run.input = {"question": "what is 2 + 2?", "k": [1, 2.5, None]}  # a hosted run's input
    run.idempotency = {"key": "idem-1", "body": "abc"}
    for doc in (run.to_json(8.0), run_doc(run)):
        counting.sizes.clear()
        out = encode_run_doc(doc)
        assert out == msgspec.json.encode(doc) and json.loads(out) == doc
        whole = len(out)
        assert counting.sizes and all(n < whole / 2 for n in counting.sizes), counting.sizes


@pytest.mark.parametrize("value", [
    math.inf, math.nan, (1, 2), {1, 2}, Point(1), b"raw", datetime.date(2026, 1, 2),
    Color.RED, Level.HIGH, np.float64(0.5), {1: "int key"}, 2 ** 70, "\ud800",
    {"nested": [1, {"deep": math.nan}]}, [datetime.datetime(2026, 1, 2, 3, 4, 5)],
])
@pytest.mark.parametrize("key", ["input", "result", "error", "idempotency"])
def test_a_client_s_value_that_is_not_plain_json_is_written_as_json_wrote_it(
        key: str, value: Any) -> None:
    run = _run((0.25, 5.0, 1.0))
    for doc in (run.to_json(8.0), run_doc(run)):
        doc[key] = value
        assert _same(encode_run_doc(doc), _old(doc)), (key, value)


def test_the_scheduler_s_own_non_finite_float_is_written_null() -> None:
    run = _run((0.25, 5.0, 1.0))
    run.state.deadline = math.inf
    doc = run_doc(run)
    assert json.loads(encode_run_doc(doc))["deadline"] is None
    assert json.loads(encode_doc(doc))["deadline"] == math.inf  # (json's Infinity, before)
