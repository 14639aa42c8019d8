"""Protocol: every message round-trips; malformed frames are rejected with a clear error."""

from __future__ import annotations

import json

import pytest

from hermes import protocol as P

MESSAGES = [
    P.Hello(node="n1", engines=[P.EngineInfo(name="sim", model="m", kind="sim", loras=["a"],
                                             max_inflight=4)], tools=["subprocess"]),
    P.Heartbeat(node="n1", engines={"sim": P.EngineLoad(queued=3, inflight=1, kv_usage=0.5)},
                time=12.5),
    P.Token(request_id="r", text=" the", n_tokens=1),
    P.Done(request_id="r", input_tokens=10, output_tokens=5, text="x", finish_reason="length",
           engine="sim", queue_s=0.1, service_s=0.2),
    P.Failed(request_id="r", error="boom", retryable=True),
    P.ToolDone(request_id="t", exit_code=0, stdout="o", stderr="", duration_s=0.1, cold=False,
               timed_out=False),
    P.UnitEvent(run_id="run", unit="u", event="start", time=1.0),
    P.PrewarmAck(backend="docker:x", action="start", ok=True),
    P.Submit(request_id="r", run_id="run", unit="u", model="m", endpoint="chat",
             body={"messages": [{"role": "user", "content": "hi"}]}, key=[1.5, 2.0]),
    P.Rekey(keys={"r": [0.5, 1.0]}),
    P.Cancel(request_ids=["r", "s"]),
    P.Tool(request_id="t", run_id="run", unit="u", backend="docker:python", code="print(1)",
           timeout_s=3, key=[1.0]),
    P.Prewarm(backend="llm:m@lora", action="release"),
    P.Resync(),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: m.type)
def test_round_trip(msg):
    back = P.decode(P.encode(msg))
    assert type(back) is type(msg)
    assert back == msg


@pytest.mark.parametrize(
    "frame, fragment",
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"type": "launch_missiles"}', "launch_missiles"),
        (b'{"node": "n"}', "no type"),
        (b'{"type": "submit", "request_id": "r"}', "submit"),  # missing fields
        (b'{"type": "token", "request_id": "r", "text": "x", "n_tokens": -1}', "token"),
        (b'{"type": "rekey", "keys": {"r": "high"}}', "rekey"),
        (b'{"type": "tool", "request_id": "t", "run_id": "r", "unit": "u", "backend": "b",'
         b' "code": "x", "command": ["ls"], "key": [1]}', "exactly one"),
        (b'{"type": "tool", "request_id": "t", "run_id": "r", "unit": "u", "backend": "b",'
         b' "key": [1]}', "exactly one"),
        (b'{"type": "submit", "request_id": "r", "run_id": "x", "unit": "u", "model": "m",'
         b' "endpoint": "images", "key": [1]}', "endpoint"),
    ],
)
def test_rejects_bad_frames(frame, fragment):
    with pytest.raises(P.ProtocolError) as ei:
        P.decode(frame)
    assert fragment in str(ei.value)


def test_infinite_keys_survive_the_wire():
    msg = P.Rekey(keys={"r": [float("inf"), 1.0], "s": [float("-inf")]})
    back = P.decode(P.encode(msg))
    assert back.keys["r"][0] == float("inf") and back.keys["s"] == [float("-inf")]


def test_unknown_fields_are_ignored_for_forward_compatibility():
    frame = json.dumps({"type": "cancel", "request_ids": ["a"], "reason": "newer peer"})
    msg = P.decode(frame)
    assert isinstance(msg, P.Cancel) and msg.request_ids == ["a"]


def test_key_to_priority_preserves_order_of_first_component():
    keys = [[-3.0], [0.0], [0.0004], [0.0016], [2.5, 9.0], [1e30], [float("inf")]]
    prios = [P.key_to_priority(k) for k in keys]
    assert prios == sorted(prios)
    assert P.key_to_priority([0.0016]) > P.key_to_priority([0.0004])
    assert P.key_to_priority([float("nan")]) == P.key_to_priority([float("inf")])
    assert all(isinstance(p, int) for p in prios)
