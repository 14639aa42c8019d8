"""Node and engine faults with real servers on loopback: engine errors retried with backoff, a
slow engine does not block the gateway's event loop, a client that disconnects mid-stream frees
its engine slot."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from sse_lines import completion_events

from hermes.gateway.server import gateway_state
from hermes.procs import free_port
from tests.sandbox import post_then_leave, processes_running, require_tool_sandbox


class FakeEngine:
    """An OpenAI-compatible server on loopback: fails the first ``fail_first`` completions
    with 503, then answers after ``delay_s`` (an asyncio sleep: a slow engine, not a stuck
    gateway)."""

    def __init__(self, fail_first: int = 0, delay_s: float = 0.0) -> None:
        self.fail_first, self.delay_s = fail_first, delay_s
        self.stall_s = 0.0
        self.calls: list[float] = []
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict:
            return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            self.calls.append(time.monotonic())
            if len(self.calls) <= self.fail_first:
                return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
            if (await request.json()).get("stream"):
                return StreamingResponse(self._broken_stream(), media_type="text/event-stream")
            await asyncio.sleep(self.delay_s)
            return JSONResponse({"id": "c", "object": "text_completion", "model": "fake-model",
                                 "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                           "total_tokens": 4}})

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="error", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def _broken_stream(self) -> AsyncIterator[bytes]:
        """Two chunks of an answer, then the connection breaks (the server process dies), or
        with ``stall_s`` nothing more for that long (a hung engine)."""
        for text in ("Hel", "lo"):
            chunk = {"id": "c", "object": "text_completion", "model": "fake-model",
                     "choices": [{"index": 0, "text": text, "finish_reason": None}]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
            await asyncio.sleep(0.05)
        if self.stall_s:
            await asyncio.sleep(self.stall_s)
        raise RuntimeError("engine died mid-stream")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeEngine:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        # a handler still sleeping (a request its gateway cancelled: uvicorn cancels nothing)
        # would hold the shutdown for the join's 5 s
        self.server.force_exit = True
        self.thread.join(5)


@pytest.fixture
def flaky() -> Iterator[FakeEngine]:
    with FakeEngine(fail_first=2) as e:
        yield e


@pytest.fixture
def slow() -> Iterator[FakeEngine]:
    with FakeEngine(delay_s=2.0) as e:
        yield e


def _engine(e: FakeEngine) -> list[dict]:
    return [{"name": "fake", "kind": "openai", "url": e.url, "model": "fake-model", "max_inflight": 8}]


def test_engine_errors_are_retried_with_backoff(make_gateway, flaky: FakeEngine) -> None:  # noqa: ANN001
    srv = make_gateway(engines=_engine(flaky), time_scale=1.0)
    r = httpx.post(srv.url + "/v1/completions", timeout=30,
                   json={"model": "fake-model", "prompt": "hi", "max_tokens": 1})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ok"
    assert len(flaky.calls) == 3  # two 503s, then the answer
    gaps = [b - a for a, b in zip(flaky.calls, flaky.calls[1:], strict=False)]
    assert gaps[0] >= 0.09 and gaps[1] >= 0.19, gaps  # 0.1 s, then 0.2 s
    # more failures than retries: a clear error, not a hang
    flaky.fail_first, flaky.calls = 10, []
    r = httpx.post(srv.url + "/v1/completions", timeout=30,
                   json={"model": "fake-model", "prompt": "hi", "max_tokens": 1})
    assert r.status_code == 502 and "503" in r.json()["error"]["message"]
    assert len(flaky.calls) == 3  # max_retries = 2


def _stream_texts(url: str) -> tuple[list[str], list[str]]:
    """The texts and error messages of a streamed completion of ``fake-model``."""
    texts: list[str] = []
    errors: list[str] = []
    with httpx.stream("POST", url + "/v1/completions", timeout=30,
                      json={"model": "fake-model", "prompt": "hi", "max_tokens": 8,
                            "stream": True}) as r:
        completion_events(r.iter_lines(), texts, errors)
    return texts, errors


def test_a_stream_cut_after_part_of_the_answer_is_not_retried(make_gateway, flaky: FakeEngine) -> None:  # noqa: ANN001
    """An engine error is retryable, but not once part of the answer went to the client: a
    resend would stream its start again (the client would read "HelloHello...")."""
    flaky.fail_first = 0
    srv = make_gateway(engines=_engine(flaky), time_scale=1.0)
    texts, errors = _stream_texts(srv.url)
    assert "".join(texts) == "Hello", texts
    assert len(flaky.calls) == 1  # not resent
    assert errors and "not retried: part of the answer was already streamed" in errors[0], errors


def test_a_stream_that_stalls_ends_at_the_request_timeout(make_gateway, flaky: FakeEngine) -> None:  # noqa: ANN001
    """An engine that stops producing mid-stream (the node alive) does not hold the client for
    ever: after ``request_timeout_s`` without a chunk the request is cancelled at its node and
    the client gets an error saying so."""
    flaky.fail_first, flaky.stall_s = 0, 60.0
    srv = make_gateway(engines=_engine(flaky), time_scale=1.0,
                       scheduler={"request_timeout_s": 1.0})
    t0 = time.monotonic()
    texts, errors = _stream_texts(srv.url)
    assert time.monotonic() - t0 < 10
    assert "".join(texts) == "Hello"
    assert errors and "no more output for 1 s" in errors[0], errors
    deadline = time.monotonic() + 5
    while httpx.get(srv.url + "/healthz").json()["requests_pending"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(srv.url + "/healthz").json()["requests_pending"] == 0


def test_a_request_that_stalls_ends_at_the_request_timeout(make_gateway, slow: FakeEngine) -> None:  # noqa: ANN001
    """A request whose answer does not come within ``request_timeout_s`` is cancelled at its
    node and answered with an error naming the timeout; nothing stays pending."""
    slow.delay_s = 60.0
    srv = make_gateway(engines=_engine(slow), time_scale=1.0,
                       scheduler={"request_timeout_s": 1.0})
    t0 = time.monotonic()
    r = httpx.post(srv.url + "/v1/completions", timeout=30,
                   json={"model": "fake-model", "prompt": "hi", "max_tokens": 1})
    assert 0.9 < time.monotonic() - t0 < 10
    assert r.status_code >= 500 and "timed out after 1.0 s" in r.json()["error"]["message"], r.text
    deadline = time.monotonic() + 5
    while httpx.get(srv.url + "/healthz").json()["requests_pending"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(srv.url + "/healthz").json()["requests_pending"] == 0


def test_a_client_gone_before_its_answer_frees_the_engine_slot(make_gateway, slow: FakeEngine,  # noqa: ANN001
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """A client that goes away while its (not streamed) request waits for the engine has the
    request cancelled at its node and its one-request run failed, quietly (nothing to answer,
    no error logged); the gateway serves on."""
    slow.delay_s = 60.0
    srv = make_gateway(engines=_engine(slow), time_scale=1.0)
    node, sched = gateway_state(srv).node, gateway_state(srv).scheduler
    uvicorn_log = logging.getLogger("uvicorn")  # (it does not propagate to the root logger)
    uvicorn_log.addHandler(caplog.handler)
    slot = next(iter(node.slots.values()))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/v1/completions", timeout=httpx.Timeout(30, read=0.5),
                   headers={"X-Hermes-Run": "none"},
                   json={"model": "fake-model", "prompt": "hi", "max_tokens": 1})
    deadline = time.monotonic() + 5
    while (slot.inflight or httpx.get(srv.url + "/healthz").json()["requests_pending"]) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not slot.inflight
    assert httpx.get(srv.url + "/healthz").json()["requests_pending"] == 0
    gone = sched.recent_runs(lambda r: r.status == "failed", 5)
    assert [r.error for r in gone] == ["client disconnected"], [(r.status, r.error) for r in gone]
    uvicorn_log.removeHandler(caplog.handler)
    assert not [r for r in caplog.records if "Exception in ASGI application" in r.getMessage()]
    # the gateway still serves: the next request is answered
    slow.delay_s = 0.0
    r = httpx.post(srv.url + "/v1/completions", timeout=30,
                   json={"model": "fake-model", "prompt": "hi", "max_tokens": 1})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ok"


def test_a_client_gone_before_its_tool_call_ends_has_the_call_killed(make_gateway) -> None:  # noqa: ANN001
    """A client of the runs API's tool call that goes away before the answer has the call
    cancelled at its node: the sandboxed process is killed then, not at the call's
    ``timeout_s``; the run goes on and takes its next call."""
    require_tool_sandbox()
    srv = make_gateway(time_scale=1.0)
    sched = gateway_state(srv).scheduler
    http = httpx.Client(base_url=srv.url, timeout=30)
    rid = http.post("/v1/runs", json={"app": "tooly"}).json()["run_id"]
    argv = ("sleep", "97.25")  # a command line of its own, to find in /proc
    post_then_leave(f"{srv.url}/v1/runs/{rid}/tools", {
        "unit": "exec", "backend": "docker:python:3.10-slim", "command": list(argv),
        "timeout_s": 120}, argv)
    deadline = time.monotonic() + 10
    while (processes_running(*argv) or sched.requests) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes_running(*argv), "the tool call's process outlived its client"
    assert not sched.requests
    r = http.post(f"/v1/runs/{rid}/tools", json={
        "unit": "exec", "backend": "docker:python:3.10-slim", "command": ["echo", "next"]})
    assert r.status_code == 200 and r.json()["stdout"] == "next\n", r.text
    assert http.get(f"/v1/runs/{rid}").json()["state"] == "running"


def test_a_slow_engine_does_not_block_the_event_loop(make_gateway, slow: FakeEngine) -> None:  # noqa: ANN001
    srv = make_gateway(engines=_engine(slow), time_scale=1.0)

    async def scenario() -> tuple[list[int], list[float]]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
            reqs = [asyncio.create_task(http.post("/v1/completions", json={
                "model": "fake-model", "prompt": "hi", "max_tokens": 1})) for _ in range(6)]
            await asyncio.sleep(0.3)
            lat = []
            for _ in range(10):
                t0 = time.monotonic()
                assert (await http.get("/healthz")).status_code == 200
                lat.append(time.monotonic() - t0)
                await asyncio.sleep(0.05)
            assert not any(t.done() for t in reqs)  # all still at the slow engine
            return [(await t).status_code for t in reqs], lat

    codes, lat = asyncio.run(scenario())
    assert codes == [200] * 6
    # a loop blocked by the engine would answer after its 2 s; a loaded machine's hiccups
    # stay well below that
    assert float(np.median(lat)) < 0.25 and max(lat) < 1.0, lat


def test_client_disconnect_mid_stream_frees_the_engine_slot(make_gateway) -> None:  # noqa: ANN001
    srv = make_gateway(time_scale=2.0)
    st = gateway_state(srv)
    sched, node = st.scheduler, st.node
    slot = next(iter(node.slots.values()))
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        # opted out of run inference: a one-request run, failed when its client goes away
        with http.stream("POST", "/v1/completions", headers={"X-Hermes-Run": "none"}, json={
                "model": "llama-2-7b", "prompt": "tell me a long story", "max_tokens": 4000, "ignore_eos": True,
                "stream": True}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(g.startswith("data: ") for g in got)
            assert len(slot.inflight) == 1 and len(sched.requests) == 1
        # the client closed the connection: the request leaves the engine
        deadline = time.monotonic() + 5
        while slot.inflight or sched.requests:
            assert time.monotonic() < deadline, (slot.inflight, sched.requests)
            time.sleep(0.05)
        run = http.get("/v1/runs").json()["runs"][0]
        assert run["state"] == "failed"
        assert "disconnected" in http.get(f"/v1/runs/{run['run_id']}").json()["error"]


def test_a_tool_call_on_a_dead_node_fails_clearly_and_is_not_rerun(make_gateway) -> None:  # noqa: ANN001
    require_tool_sandbox()
    import subprocess
    import sys

    from gw_procs import kill

    zport = free_port()
    srv = make_gateway(bind=f"tcp://127.0.0.1:{zport}", embedded_node=False, time_scale=1.0)
    sched = gateway_state(srv).scheduler
    procs = {f"t{i}": subprocess.Popen(
        [sys.executable, "-m", "hermeslet.cli", "run", "--scheduler", f"tcp://127.0.0.1:{zport}",
         "--node", f"t{i}", "--engine", "sim", "--model", "m"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for i in range(2)}
    try:
        deadline = time.monotonic() + 30
        while len(sched.nodes) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)

        async def scenario() -> httpx.Response:
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
                rid = (await http.post("/v1/runs", json={"app": "tooly"})).json()["run_id"]
                call = asyncio.create_task(http.post(f"/v1/runs/{rid}/tools", json={
                    "unit": "exec", "backend": "docker:python:3.10-slim", "timeout_s": 30,
                    "command": ["sleep", "8"]}))
                while not sched.requests:
                    assert not call.done(), call.result().text
                    await asyncio.sleep(0.05)
                await asyncio.sleep(1.5)  # running, and reported so by a heartbeat
                node = next(iter(sched.requests.values())).node
                kill(procs[node])
                t0 = time.monotonic()
                r = await call
                assert time.monotonic() - t0 < 8  # detected by the disconnect, not a timeout
                run = (await http.get(f"/v1/runs/{rid}")).json()
                return r, run, node

        r, run, node = asyncio.run(scenario())
        assert r.status_code == 502
        assert "not retried" in r.json()["error"]["message"]
        # sent once, to the node that died; never re-dispatched to the other one
        reqs = [q for u in run["units"] for q in u["requests"]]
        assert [q["state"] for q in reqs] == ["failed"]
        assert sched.requests == {} and len(sched.nodes) == 1 and node not in sched.nodes
    finally:
        for p in procs.values():
            kill(p)
