"""Split roles, the pure parts: the edge <-> scheduler wire (msgspec), the edge's fencing
of scheduler messages by epoch, its reports of settled calls, and the configuration
refusals. The processes themselves: tests/gateway/test_edge_split.py (slow tier)."""

from __future__ import annotations

import asyncio
import shutil
import time

import msgspec
import pytest

from hermes import protocol as P
from hermes.gateway.config import ConfigError, load_config
from hermes.gateway.edge import wire

ELECTION = "redis://127.0.0.1:1/0"  # never dialled by these tests


def _call(**kw: object) -> wire.Call:
    base: dict = dict(rid="req-1", reply_to="tcp://127.0.0.1:7001", model="m", endpoint="chat",
                      body={"messages": [{"role": "user", "content": "hi"}]}, prompt_tokens=1)
    return wire.Call(**{**base, **kw})  # type: ignore[arg-type]


def test_wire_round_trips_and_refuses_what_is_not_a_message() -> None:
    c = _call(settled=[wire.Settled("req-0", "n0", "e0", 0.01, 0.2)])
    back = wire.decode_edge(wire.encode(c))
    assert back == c and back.direct
    assert not _call(run="run-1").direct and not _call(app="factool_kbqa").direct
    pong = wire.decode_scheduler(wire.encode(wire.Pong(epoch=7)))
    assert pong == wire.Pong(epoch=7)
    with pytest.raises(msgspec.ValidationError):
        wire.decode_edge(msgspec.msgpack.encode({"type": "call", "rid": "x"}))  # fields missing
    with pytest.raises(msgspec.ValidationError):
        wire.decode_edge(wire.encode(wire.Pong(epoch=1)))  # a scheduler message, not an edge's
    with pytest.raises(msgspec.DecodeError):
        wire.decode_edge(b"\xc1 not msgpack")


def test_wire_embeddings_and_native_calls() -> None:
    """An embeddings call needs an embedding engine; Anthropic's request as sent travels
    beside its chat body only when given (nothing on the wire otherwise)."""
    emb = _call(endpoint="embeddings", body={"input": "x"})
    assert wire.decode_edge(wire.encode(emb)) == emb and emb.task == "embed"
    assert _call().task == "generate"
    native = {"endpoint": "messages", "body": {"max_tokens": 8, "messages": []}}
    c = _call(native=native)
    assert wire.decode_edge(wire.encode(c)) == c
    assert b"native" not in wire.encode(_call()) and b"native" in wire.encode(c)
    with pytest.raises(msgspec.ValidationError):
        wire.decode_edge(wire.encode(_call(endpoint="responses")))  # not an endpoint


def test_submit_reply_fields_are_additive() -> None:
    old = P.decode(P.encode(P.Submit(request_id="r", run_id="r", unit="u", model="m",
                                     endpoint="chat", key=[0.0])))
    assert isinstance(old, P.Submit) and old.reply_to is None and not old.reply_only
    new = P.decode(b'{"type": "submit", "request_id": "r", "run_id": "r", "unit": "u", '
                   b'"model": "m", "endpoint": "chat", "key": [0], "reply_to": "tcp://e:1", '
                   b'"reply_only": true}')
    assert isinstance(new, P.Submit) and new.reply_to == "tcp://e:1" and new.reply_only


def test_a_submit_with_an_encoded_body_reaches_the_node_as_the_same_message() -> None:
    """The scheduler forwards an edge's body as the JSON text it came as: the frame decodes
    to the submit the object form gives (escapes, non-ASCII, numbers alike); what reads the
    body at the scheduler decodes it once; copies keep it encoded; an in-process node gets
    the object."""
    from hermes.inproc import InprocLink

    body = {"messages": [{"role": "system", "content": 'Be "exact".\n\u2028 é 😀'},
                         {"role": "user", "content": "x" * 300}],
            "max_tokens": 7, "temperature": 0.1, "stop": None, "n": 1}
    fields = dict(request_id="r", run_id="run", unit="u", model="m", endpoint="chat",
                  key=[0.5, 1.0], prompt_tokens=80, reply_to="tcp://e:1")
    plain = P.Submit(body=body, **fields)  # type: ignore[arg-type]
    enc = P.Submit.with_json_body(msgspec.json.encode(body), **fields)
    assert enc.body == {} and P.decode(P.encode(enc)) == P.decode(P.encode(plain))
    assert P.decode(P.encode(enc)).body == body  # type: ignore[union-attr]
    copy = enc.model_copy()
    assert copy.encoded_body == enc.encoded_body is not None and copy.body == {}
    assert enc.engine_body() == body and enc.encoded_body is None
    assert P.encode(enc) == P.encode(plain)  # decoded: encoded as any submit
    link = InprocLink(b"n", lambda _i, _m: None)
    link.deliver(copy)
    (given,) = link._inbox
    assert isinstance(given, P.Submit) and given.body == body
    assert wire.decode_edge(wire.encode(_call(body={}, body_json=b'{"a":1}', prefix="p",
                                              max_tokens=3))).engine_body() == \
        P.EncodedBody(b'{"a":1}', "p", 3)


def _link():  # noqa: ANN202
    import zmq.asyncio

    from hermes.gateway.edge.front import SchedulerLink

    cfg = load_config(None, environ={}, **{"ha.role": "edge", "ha.election": ELECTION,
                                           "scheduler.bind": "tcp://127.0.0.1:7001"})
    return SchedulerLink(cfg, zmq.asyncio.Context(), "edge-t", "tcp://127.0.0.1:7001")


def test_an_edge_drops_a_stale_epochs_messages() -> None:
    from hermes.gateway.edge.front import CallFailedError, EdgeCall

    async def go() -> None:
        link = _link()
        link.leader = {"epoch": 5}
        link.apply(wire.Pong(epoch=5))
        assert link.last_pong is not None and link.gate.epoch == 5
        call = EdgeCall(_call())
        link.calls["req-1"] = call
        # a deposed scheduler (epoch 4) says the call failed: not believed
        link.apply(wire.CallFailed(rid="req-1", epoch=4, status=503, code="x", message="old"))
        assert not call.future.done() and link.gate.stale_rejected == 1
        link.last_pong = None
        followed: list[wire.Names] = []
        link.on_names = followed.append
        old = wire.Names("0123456789abcdef", {"a1": "old-name"}, {})
        link.apply(wire.Pong(epoch=4, names=old))
        assert link.last_pong is None  # nor does its pong make the edge ready
        assert followed == []  # nor are its app names followed
        link.apply(wire.Pong(epoch=5, names=old))
        assert followed == [old] and link.last_pong is not None
        link.apply(wire.CallFailed(rid="req-1", epoch=5, status=404, code="model_not_found",
                                   message="no such model"))
        with pytest.raises(CallFailedError) as e:
            await call.future
        assert e.value.status == 404 and link.gate.stale_rejected == 2

    asyncio.run(go())


def test_an_edge_holds_the_leaders_served_models_and_greets_each_leader_once() -> None:
    """The served-model set comes in pongs (a stale epoch's is dropped), its digest goes in
    the next pings; the edge tells each new leader its apps once, at that leader's first
    pong; a request waits for a set with a node while the scheduler has none (as the
    scheduler's own requests wait for a node), up to its timeout."""
    def models(digest: str, nodes: int) -> wire.Models:
        return wire.Models(digest, {"generate": ["m"] if nodes else [], "embed": []}, "",
                           False, nodes)

    async def go() -> None:
        link = _link()
        greeted: list[object] = []
        link.on_leader = lambda: greeted.append(link.leader and link.leader["epoch"])
        link.leader = {"epoch": 5}
        assert link._ping().models == "" and link.models is None
        none_yet = models("aaaaaaaaaaaaaaaa", 0)
        link.apply(wire.Pong(epoch=5, models=none_yet))
        link.apply(wire.Pong(epoch=5))
        assert link.models == none_yet and link._ping().models == "aaaaaaaaaaaaaaaa"
        assert greeted == [5]  # once for this leader
        t0 = time.monotonic()
        assert await link.models_with_nodes(0.2) == none_yet  # none came: what it holds
        assert time.monotonic() - t0 >= 0.2
        one = models("bbbbbbbbbbbbbbbb", 1)
        asyncio.get_running_loop().call_later(0.05, link.apply, wire.Pong(epoch=5, models=one))
        assert await link.models_with_nodes(5.0) == one  # the set with a node, at once
        link.apply(wire.Pong(epoch=4, models=none_yet))  # a deposed scheduler's: dropped
        assert link.models == one
        link.leader = {"epoch": 6}
        link.apply(wire.Pong(epoch=6))
        assert greeted == [5, 6]

    asyncio.run(go())


def test_an_edge_reports_settled_direct_calls_with_its_next_call() -> None:
    from hermes.gateway.edge.front import EdgeCall

    async def go() -> None:
        link = _link()
        sent: list[wire.EdgeMessage] = []
        # what left, as the scheduler reads it (the call object is reused for a resend)
        link.send = lambda msg: sent.append(  # type: ignore[method-assign]
            wire.decode_edge(wire.encode(msg))) or True
        direct, named = EdgeCall(_call(rid="a")), EdgeCall(_call(rid="b", run="run-9"))
        link.calls.update(a=direct, b=named)
        done = dict(input_tokens=1, output_tokens=2, text="x", engine="e0", queue_s=0.0,
                    service_s=0.1)
        link.on_node_message(b"n0", P.Done(request_id="a", **done))
        link.on_node_message(b"n0", P.Done(request_id="b", **done))  # the scheduler hears it
        assert (await direct.future).text == "x" and (await named.future).text == "x"
        assert [s.rid for s in link.settled] == ["a"]
        link.send_call(_call(rid="c"))
        assert isinstance(sent[0], wire.Call) and [s.rid for s in sent[0].settled] == ["a"]
        assert link.settled == []
        # none to carry it: a report of its own within REPORT_S
        link.calls["d"] = EdgeCall(_call(rid="d"))
        link.on_node_message(b"n0", P.Done(request_id="d", **done))
        await asyncio.sleep(link.REPORT_S * 4)
        assert isinstance(sent[-1], wire.Report) and [s.rid for s in sent[-1].settled] == ["d"]

    asyncio.run(go())


def test_a_stream_is_never_stitched_from_two_nodes() -> None:
    from hermes.gateway.edge.front import CallFailedError, EdgeCall

    async def go() -> None:
        link = _link()
        call = EdgeCall(_call(stream=True))
        link.calls["req-1"] = call
        link.on_node_message(b"n0", P.Token(request_id="req-1", text="a", n_tokens=1))
        link.on_node_message(b"n1", P.Token(request_id="req-1", text="a", n_tokens=1))
        assert call.tokens is not None and call.tokens.qsize() == 1
        done = dict(request_id="req-1", input_tokens=1, output_tokens=1, text="a",
                    engine="e", queue_s=0.0, service_s=0.1)
        link.STITCH_WAIT_S = 0.05
        link.on_node_message(b"n1", P.Done(**done))  # another node's end: waits for n0's
        assert not call.future.done()
        await asyncio.sleep(0.1)  # n0 never ends (it died): the stream is failed
        with pytest.raises(CallFailedError, match="mid-stream"):
            await call.future
        # a copy that ends first while the streaming node goes on: the stream's own end wins
        call2 = EdgeCall(_call(rid="req-2", stream=True))
        link.calls["req-2"] = call2
        done["request_id"] = "req-2"
        link.on_node_message(b"n0", P.Token(request_id="req-2", text="a", n_tokens=1))
        link.on_node_message(b"n1", P.Done(**done))
        link.on_node_message(b"n0", P.Done(**{**done, "text": "mine"}))
        assert (await call2.future).text == "mine"
        await asyncio.sleep(0.1)

    asyncio.run(go())


def test_roles_refuse_what_they_cannot_work_without() -> None:
    with pytest.raises(ConfigError, match="--ha"):
        load_config(None, environ={}, **{"ha.role": "edge", "scheduler.bind": "tcp://x:1"})
    with pytest.raises(ConfigError, match="--bind"):
        load_config(None, environ={}, **{"ha.role": "edge", "ha.election": ELECTION})
    with pytest.raises(ConfigError, match="edge_bind"):
        load_config(None, environ={"HERMES_EMBEDDED_NODE": "false"},
                    **{"ha.role": "scheduler", "ha.election": ELECTION,
                       "state_redis": ELECTION})
    cfg = load_config(None, environ={})
    assert cfg.ha.role == "all"  # the default: one process, as before
    ha = load_config(None, environ={}, **{"ha.role": "edge", "ha.election": ELECTION,
                                          "scheduler.bind": "tcp://0.0.0.0:7001",
                                          "ha.advertise": "10.0.0.5"}).ha
    assert ha.advertised("tcp://0.0.0.0:7001") == "tcp://10.0.0.5:7001"
    assert ha.advertised("tcp://127.0.0.1:7001") == "tcp://127.0.0.1:7001"


def test_roles_with_curve_refuse_missing_keys_naming_the_file(tmp_path) -> None:  # noqa: ANN001
    """CURVE on split roles: each role's key files are checked at start; an error names
    every file that is missing (a standby would otherwise fail only once elected)."""
    from hermes.security.curve import create_curve_keys

    keys = tmp_path / "k"
    edge = {"ha.role": "edge", "ha.election": ELECTION, "scheduler.bind": "tcp://x:1"}
    sched = {"ha.role": "scheduler", "ha.election": ELECTION, "state_redis": ELECTION,
             "ha.edge_bind": "tcp://x:2"}
    nodes = {"HERMES_EMBEDDED_NODE": "false"}
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(None, environ={}, **edge, curve_dir=str(keys))
    create_curve_keys(keys, ["n0"], ["e0"])
    with pytest.raises(ConfigError, match="curve_key"):  # no certificate of its own named
        load_config(None, environ={}, **edge, curve_dir=str(keys))
    secret = keys / "edges" / "e0.key_secret"
    with pytest.raises(ConfigError, match="holds no secret key"):  # the public half given
        load_config(None, environ={}, **edge, curve_dir=str(keys),
                    curve_key=str(keys / "edges" / "e0.key"))
    with pytest.raises(ConfigError, match="curve_dir"):  # a key without the directory
        load_config(None, environ={}, **edge, curve_key=str(secret))
    cfg = load_config(None, environ={}, **edge, curve_dir=str(keys), curve_key=str(secret))
    assert cfg.security.curve_key == str(secret)
    load_config(None, environ=nodes, **sched, curve_dir=str(keys))
    (keys / "server.key").unlink()
    shutil.rmtree(keys / "authorized-edges")  # as in a directory made by an older version
    with pytest.raises(ConfigError, match=r"server\.key \(the scheduler's public key\)"):
        load_config(None, environ={}, **edge, curve_dir=str(keys), curve_key=str(secret))
    with pytest.raises(ConfigError, match="authorized-edges") as e:
        load_config(None, environ=nodes, **sched, curve_dir=str(keys))
    assert "--edge NAME" in str(e.value)
    # an all-in-one gateway with CURVE does not need the edges' directory
    load_config(None, environ={}, curve_dir=str(keys))
    (keys / "server.key_secret").unlink()
    with pytest.raises(ConfigError, match=r"server\.key_secret"):
        load_config(None, environ={}, curve_dir=str(keys))
