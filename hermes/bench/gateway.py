"""``hermes bench gateway``: what the gateway adds on top of the engine server it fronts.

In one run, against the same engine server process (``hermeslet sim-engine``, time-scaled so
far that its service time is ~0 and the overhead is what is left):

- **direct**: ``requests`` completions straight to the engine server;
- **gateway**: the same requests through a ``hermes serve`` process (its own process: the
  FastAPI app, the scheduler and the embedded HermesLet with an ``openai`` engine adapter
  pointing at the engine server), as each ``identity`` mode binds them: ``infer`` (no Hermes
  header: the run resolver hashes the request and places it, here in a new run of an
  inferred app, as nothing it sends continues an answered conversation) and ``none``
  (``X-Hermes-Run: none``: a one-unit run of app ``default``, the gateway without the
  resolver; the default, as every table before the resolver was taken); each run created,
  ranked, dispatched, recorded and learned from. With ``--identity none,infer`` the two modes alternate in the same gateway at each level: the
  resolver's cost per request is the difference of their ``gateway_cpu_ms``.
  ``--messages N`` sends N-message chat requests (an agent's later turns: what the resolver
  hashes) instead of one-line completions.

Tracing (``--tracing off,on``): one gateway per mode and policy, measured in turn in the same
run: ``off`` (no ``[tracing]``: what every row before it measured) and ``on`` (a trace per
run, exported over OTLP/HTTP to a receiver in the benchmark's own process that takes and
discards every batch, :class:`_OtlpSink`: the gateway pays for the spans, the batching and
the encoding and sending, as with a real receiver; ``export_cpu_ms``: the CPU per request
of the gateway's trace export process, where the SDK makes and sends the spans, apart from
``gateway_cpu_ms``). ``--baseline-src DIR`` adds the rows of a
gateway run from another Hermes source tree (e.g. a checkout of the code before a change,
``tracing`` column ``base``): before and after in one run, on one busy machine.

Both phases use the same client (aiohttp by default, ``--client httpx`` as before; ``concurrency``
requests in flight, keep-alive) on the same event loop (:mod:`hermes.evloop`).
Each concurrency level (``--concurrency 1,32`` by default: the latency added to a lone request,
and what one gateway process sustains under load) gets a direct row and a row per policy.
Rows: ``{path, policy, identity, concurrency, history, requests, errors, p50_ms, p99_ms, max_ms,
max_pause_ms, max_gc_ms, max_pause_cpu_ms, max_busy_ms, req_per_s, client_cpu_ms, gateway_cpu_ms,
gateway_loop_cpu_ms, engine_cpu_ms, added_p50_ms, added_p99_ms}``; ``added_*`` = gateway minus
direct, measured in the same run; ``*_cpu_ms`` = CPU milliseconds (user + system, from
``/proc``) per request of the benchmark client, the gateway process and the engine server over
the measured phase; ``gateway_loop_cpu_ms``: the gateway's main thread alone, its event loop
(the rest of ``gateway_cpu_ms`` is its worker threads': the learner's rebuilds, mostly). On a shared
machine wall-clock req/s is noisy; CPU per request is what one process can sustain:
``1000 / cpu_ms`` req/s per core.

Tail (issue 16): ``max_ms`` is the slowest request of the row; ``max_pause_ms`` the longest
event-loop stall of the gateway process while the row's requests ran, measured inside the
gateway (:mod:`hermes.gateway.looplag`, ``GET /admin/loop``, read and reset right before
and right after the row) and ``max_gc_ms`` the longest garbage collection in it (both 0
for direct rows: no gateway). ``max_pause_cpu_ms``: the CPU the gateway process (all its
threads) used during that longest stall (far below the stall: the process was waiting,
preempted by the client and the engine on a busy machine); ``max_busy_ms``: the longest the
loop's thread itself ran between two wake-ups of the monitor, the part of a stall the
gateway's own work makes. ``history``: finished runs the gateway keeps (for
``GET /v1/runs/{id}``) when the row starts; every request through it is a one-run app, so
the history grows with the rows. ``fill_history`` (``--fill-history N``, default
``keep_finished_runs``' default 10,000; 0: none) adds one more row per policy at the
highest concurrency level: the gateway is given ``keep_finished_runs = N`` and first sent
requests until it keeps N finished runs (full, evicting the oldest as it goes), then
measured; a plain row of that level in the same gateway precedes it.

``--floor`` adds the ``floor`` rows (below) and, to every row through the gateway,
``cpu_over_floor``: its ``gateway_cpu_ms`` over the floor row's of the same concurrency and
traffic (:func:`over_floor`), a figure that does not move with the machine's speed.

Warm history (``--warm-history N``): the case agents live in. Rows with ``history_kind``
``"inferred"`` measure header-less agent traffic (:mod:`hermes.bench.agents`: many programs,
new and continuing conversations, each a run the resolver infers), at every concurrency
level: first in the fresh gateway (``history`` 0), then after ``N`` such requests went
through the resolver and the learner (``history`` N: the inferred apps have learned PDGraphs
and their runs are ranked from them), in the same gateway, in one run. ``--warm-history
10000,20000,50000`` measures after each of those histories in turn, in the same gateway:
whether what a request costs grows with what the gateway has learned. Their ``added_*`` are
against direct rows of the same agent traffic (``path`` ``direct``, ``history_kind``
``"inferred"``). The other rows have ``history_kind`` ``"finished"`` (``history``: finished
runs kept, as above).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from hermes import evloop
from hermes.bench.agents import AgentMix, Conversations, drive_agents
from hermes.procs import free_port, stop_group, wait_http

MODEL = "sim-bench"
CLIENTS = ("aiohttp", "httpx")
#: how the gateway binds the benchmark's requests: ``infer`` (no Hermes header: the run
#: resolver places each, issue 17) or ``none`` (``X-Hermes-Run: none``: one-request runs, the
#: gateway's behaviour before the resolver)
IDENTITIES = ("infer", "none")
IDENTITY_HEADERS: dict[str, dict[str, str] | None] = {"infer": None,
                                                      "none": {"X-Hermes-Run": "none"}}


def _cpu_s(pid: int, *, main_thread: bool = False) -> float:
    """CPU seconds (user + system) a process has used so far, from ``/proc/PID/stat``;
    ``main_thread``: its main thread's alone (``/proc/PID/task/PID/stat``: the gateway's
    event loop, without the learner's and other worker threads)."""
    path = f"/proc/{pid}/task/{pid}/stat" if main_thread else f"/proc/{pid}/stat"
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux ``/proc``; none where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


class _CpuMeter:
    """CPU seconds used by this process (the client) and by server processes over a phase,
    and by the gateway's main thread (its event loop: ``gateway_loop_cpu_ms``; the rest of
    ``gateway_cpu_ms`` is its worker threads', mostly the learner's rebuilds)."""

    def __init__(self, **pids: int) -> None:
        self.pids = pids
        self.t0 = (time.process_time(), {k: _cpu_s(p) for k, p in pids.items()},
                   _cpu_s(pids["gateway"], main_thread=True) if "gateway" in pids else 0.0)

    def per_request_ms(self, n: int) -> dict[str, float]:
        """``{client_cpu_ms, <name>_cpu_ms, ..., gateway_loop_cpu_ms}``: CPU milliseconds
        per request."""
        c0, s0, loop0 = self.t0
        d = max(n, 1)
        # the thread before its process at the end (and after it at the start); /proc
        # rounds a thread's and its process's times apart, so the share may exceed the
        # whole by a clock tick
        loop1 = _cpu_s(self.pids["gateway"], main_thread=True) if "gateway" in self.pids else 0.0
        out = {"client_cpu_ms": (time.process_time() - c0) * 1e3 / d}
        for k, p in self.pids.items():
            out[f"{k}_cpu_ms"] = (_cpu_s(p) - s0[k]) * 1e3 / d
        if "gateway" in self.pids:
            out["gateway_loop_cpu_ms"] = (loop1 - loop0) * 1e3 / d
        return out


def request_body(messages: int = 0) -> tuple[str, dict[str, Any]]:
    """The endpoint and body every benchmark request sends: a one-line completion, or (with
    ``messages`` > 0) a chat request of that many messages (a system prompt, then user and
    assistant turns ending with a user turn), as an agent's n-th turn sends: what the run
    resolver hashes (issue 17)."""
    if messages <= 0:
        return "/v1/completions", {"model": MODEL, "prompt": "hello gateway", "max_tokens": 1}
    msgs: list[dict[str, str]] = [{"role": "system", "content": "You are a benchmark agent "
                                   "with a fixed role prompt of a few dozen words. " * 4}]
    for i in range(1, messages):
        role = "user" if i % 2 == 1 or i == messages - 1 else "assistant"
        msgs.append({"role": role, "content": f"turn {i}: " + "some words of a turn " * 12})
    if msgs[-1]["role"] != "user":
        msgs.append({"role": "user", "content": "and now?"})
    return "/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 1}


async def _drive(url: str, n: int, concurrency: int, headers: dict[str, str] | None = None,
                 progress: Any = None, client: str = "aiohttp",
                 messages: int = 0) -> tuple[np.ndarray, float, int]:
    """``n`` requests (:func:`request_body`) with ``concurrency`` in flight: (latencies s,
    wall s, errors).

    ``client``: ``aiohttp`` (default; about a quarter of httpx's CPU per request, so that the
    client does not cap what a 2-core machine can show) or ``httpx``."""
    if client not in CLIENTS:
        raise ValueError(f"--client must be one of {', '.join(CLIENTS)}, not {client!r}")
    lat: list[float] = []
    errors = 0
    path, body = request_body(messages)
    todo = iter(range(n))

    def done(dt: float, ok: bool) -> None:
        nonlocal errors
        if not ok:
            errors += 1
            return
        lat.append(dt)
        if progress is not None:
            progress.update(1)

    if client == "httpx":
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits) as http:

            async def worker() -> None:
                for _ in todo:
                    t0 = time.perf_counter()
                    r = await http.post(path, json=body, headers=headers)
                    done(time.perf_counter() - t0, r.status_code == 200)

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return np.array(lat), time.perf_counter() - t0, errors

    import aiohttp

    data = json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    conn = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(url, connector=conn, headers=hdrs,
                                     timeout=aiohttp.ClientTimeout(total=60.0)) as http:

        async def aworker() -> None:
            for _ in todo:
                t0 = time.perf_counter()
                async with http.post(path, data=data) as r:
                    await r.read()
                    done(time.perf_counter() - t0, r.status == 200)

        t0 = time.perf_counter()
        await asyncio.gather(*(aworker() for _ in range(concurrency)))
        return np.array(lat), time.perf_counter() - t0, errors


def _row(path: str, policy: str, concurrency: int, lat: np.ndarray, wall: float,
         errors: int, cpu: dict[str, float], pauses: dict[str, float] | None = None,
         history: int = 0, identity: str = "-",
         history_kind: str = "finished") -> dict[str, Any]:
    nan = float("nan")
    return {
        "path": path,
        "policy": policy,
        "identity": identity,
        "concurrency": concurrency,
        "history_kind": history_kind,
        "history": history,
        "requests": int(lat.size),
        "errors": errors,
        "p50_ms": float(np.percentile(lat, 50) * 1e3) if lat.size else nan,
        "p99_ms": float(np.percentile(lat, 99) * 1e3) if lat.size else nan,
        "max_ms": float(lat.max() * 1e3) if lat.size else nan,
        "max_pause_ms": (pauses or {}).get("max_pause_ms", 0.0),
        "max_gc_ms": (pauses or {}).get("max_gc_ms", 0.0),
        "max_pause_cpu_ms": (pauses or {}).get("max_pause_cpu_ms", 0.0),
        "max_busy_ms": (pauses or {}).get("max_busy_ms", 0.0),
        "req_per_s": float(lat.size / wall) if wall > 0 else nan,
        "client_cpu_ms": cpu["client_cpu_ms"],
        "gateway_cpu_ms": cpu.get("gateway_cpu_ms", 0.0),
        # its event loop's thread alone (the rest: worker threads, mostly learning)
        "gateway_loop_cpu_ms": cpu.get("gateway_loop_cpu_ms", 0.0),
        "engine_cpu_ms": cpu["engine_cpu_ms"],
        # the gateway's trace export process (tracing on), apart from the gateway's own
        "export_cpu_ms": cpu.get("export_cpu_ms", 0.0),
    }


def bench_gateway(
    requests: int = 2000,
    concurrency: int | Sequence[int] = 32,
    policies: tuple[str, ...] = ("hermes", "vllm"),
    *,
    warmup: int = 200,
    engine_time_scale: float = 1e6,
    progress: bool = True,
    client: str = "aiohttp",
    fill_history: int = 0,
    identities: tuple[str, ...] = ("none",),
    messages: int = 0,
    tracing: tuple[str, ...] = ("off",),
    baseline_src: str | None = None,
    warm_history: int | Sequence[int] = 0,
    agents: AgentMix | None = None,
    floor: bool = False,
) -> list[dict[str, Any]]:
    """Direct vs through-the-gateway latency and throughput; one gateway process per policy.

    Both phases use the same ``client`` (``aiohttp`` | ``httpx``) on the same event loop.
    ``concurrency`` may list several levels (e.g. ``(1, 32)``: the latency the gateway adds to
    a lone request, and what it sustains under load); each gateway row's ``added_*`` is
    against the direct row of its concurrency. ``fill_history`` > 0: one more row per policy
    at the highest level, with the gateway's finished-run history full (see the module
    docstring). ``warm_history`` > 0: the ``history_kind`` ``"inferred"`` rows, fresh and
    after that many header-less agent requests (``agents``: their mix); several, increasing
    (e.g. ``(10_000, 20_000, 50_000)``): rows after each, in the same gateway (the history
    grows from one to the next), to show whether the cost grows with it. ``floor``: rows with
    ``path`` ``floor`` at every level (and traffic kind), the same requests through
    :mod:`hermes.bench.floor` (the gateway's HTTP stack and engine client, nothing of
    Hermes): its ``gateway_cpu_ms`` is what those parts cost alone."""
    from tqdm import tqdm

    levels = [concurrency] if isinstance(concurrency, int) else list(concurrency)
    if requests < 1 or not levels or min(levels) < 1:
        raise ValueError("--requests and --concurrency must be >= 1")
    if fill_history < 0:
        raise ValueError("--fill-history must be >= 0")
    if client not in CLIENTS:
        raise ValueError(f"--client must be one of {', '.join(CLIENTS)}, not {client!r}")
    bad = [m for m in identities if m not in IDENTITIES]
    if bad or not identities:
        raise ValueError(f"--identity must list {' | '.join(IDENTITIES)}, got {bad or '[]'}")
    if messages < 0:
        raise ValueError("--messages must be >= 0")
    if not tracing or set(tracing) - {"off", "on"}:
        raise ValueError(f"--tracing must list off | on, got {list(tracing)}")
    if baseline_src is not None and not (Path(baseline_src) / "hermes" / "gateway").is_dir():
        raise ValueError(f"--baseline-src {baseline_src!r} is not a Hermes source tree "
                         "(no hermes/gateway in it)")
    variants: list[tuple[str, str | None]] = [(m, None) for m in tracing]
    if baseline_src is not None:
        variants.insert(0, ("base", baseline_src))
    marks = warm_marks(warm_history)
    warm_total = marks[-1] if marks else 0  # the warm requests one gateway is sent
    mix = agents or AgentMix(model=MODEL)
    py = sys.executable
    eport = free_port()
    eng = subprocess.Popen(
        [py, "-m", "hermeslet.cli", "sim-engine", "--port", str(eport), "--model", MODEL,
         "--time-scale", str(engine_time_scale), "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    rows: list[dict[str, Any]] = []
    direct: dict[tuple[int, str], dict[str, Any]] = {}
    per_gateway = len(levels) * len(identities) * (requests + warmup)
    if fill_history:
        per_gateway = max(per_gateway, fill_history) + requests * len(identities)
    if marks:
        per_gateway += warm_total + (1 + len(marks)) * len(levels) * (requests + warmup)
    per_level = (requests + warmup) * (1 + bool(marks))
    bar = tqdm(total=len(levels) * per_level * (1 + floor)
               + len(policies) * len(variants) * per_gateway,
               desc="requests", file=sys.stderr, disable=not progress)
    try:
        engine_url = f"http://127.0.0.1:{eport}"
        wait_http(engine_url + "/health", eng)
        for c in levels:
            lat, wall, err, cpu, _ = _phase(engine_url, requests, warmup, c, bar, client,
                                            engine=eng.pid, messages=messages)
            direct[(c, "finished")] = _row("direct", "-", c, lat, wall, err, cpu)
            direct[(c, "finished")]["tracing"] = "-"
            rows.append(direct[(c, "finished")])
            if marks:
                lat, wall, err, cpu = _agent_phase(engine_url, requests, warmup, c, bar, mix,
                                                   Conversations(mix), engine=eng.pid)
                direct[(c, "inferred")] = _row("direct", "-", c, lat, wall, err, cpu,
                                               history_kind="inferred")
                direct[(c, "inferred")]["tracing"] = "-"
                rows.append(direct[(c, "inferred")])
        if floor:
            rows += _floor_rows(engine_url, eng.pid, requests, warmup, levels, bar, client,
                                messages, mix if marks else None)
        for policy in policies:
            for mode, src in variants:
                got = _through_gateway(engine_url, eng.pid, policy, requests, warmup, levels,
                                       bar, client, fill_history, identities, messages,
                                       marks, mix, tracing=mode, src=src)
                for r in got:
                    r["tracing"] = mode
                rows += got
    finally:
        bar.close()
        stop_group(eng)
    floors = {(r["concurrency"], r["history_kind"]): r["gateway_cpu_ms"]
              for r in rows if r["path"] == "floor"}
    for r in rows:
        base = direct[(r["concurrency"], r["history_kind"])]
        r["added_p50_ms"] = r["p50_ms"] - base["p50_ms"]
        r["added_p99_ms"] = r["p99_ms"] - base["p99_ms"]
        if floors:
            r["cpu_over_floor"] = over_floor(r, floors)
    return rows


def over_floor(row: dict[str, Any], floors: dict[tuple[int, str], float]) -> float | None:
    """A gateway row's CPU per request over the floor's (the same HTTP stack and engine
    client with nothing of Hermes, same concurrency and traffic): the part of the cost that
    does not move with the machine's speed, where the milliseconds do (a machine twice as
    fast halves both). ``None`` for other rows, or without a floor row to divide by."""
    floor = floors.get((row["concurrency"], row["history_kind"]))
    if row["path"] != "gateway" or not floor:
        return None
    return row["gateway_cpu_ms"] / floor


def _floor_rows(engine_url: str, engine_pid: int, requests: int, warmup: int,
                levels: list[int], bar: Any, client: str, messages: int,
                mix: AgentMix | None) -> list[dict[str, Any]]:
    """The ``path`` ``floor`` rows: the direct rows' requests (and with ``mix`` the agent
    traffic's) through a :mod:`hermes.bench.floor` process, its CPU as ``gateway_cpu_ms``."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes.bench.floor", "--port", str(port), "--upstream",
         engine_url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    rows = []
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", proc)
        for c in levels:
            lat, wall, err, cpu, _ = _phase(url, requests, warmup, c, bar, client,
                                            messages=messages, gateway=proc.pid,
                                            engine=engine_pid)
            rows.append(_row("floor", "-", c, lat, wall, err, cpu))
            if mix is not None:
                lat, wall, err, cpu = _agent_phase(url, requests, warmup, c, bar, mix,
                                                   Conversations(mix), gateway=proc.pid,
                                                   engine=engine_pid)
                rows.append(_row("floor", "-", c, lat, wall, err, cpu,
                                 history_kind="inferred"))
    finally:
        stop_group(proc)
    for r in rows:
        r["tracing"] = "-"
    return rows


def _phase(url: str, requests: int, warmup: int, concurrency: int, bar: Any, client: str,
           loop: _LoopLag | None = None, *, headers: dict[str, str] | None = None,
           messages: int = 0,
           **pids: int) -> tuple[np.ndarray, float, int, dict[str, float], dict[str, float]]:
    """Warm up, then measure ``requests``: latencies, wall s, errors, CPU ms per request and
    the gateway's pauses during the measured requests (``loop``; empty without)."""
    kw: dict[str, Any] = {"progress": bar, "client": client, "headers": headers,
                          "messages": messages}
    evloop.run(_drive(url, warmup, concurrency, **kw))
    if loop is not None:
        loop.read()  # reset: the window starts now
    meter = _CpuMeter(**pids)
    lat, wall, err = evloop.run(_drive(url, requests, concurrency, **kw))
    cpu = meter.per_request_ms(requests)
    return lat, wall, err, cpu, (loop.read() if loop is not None else {})


def _agent_phase(url: str, requests: int, warmup: int, concurrency: int, bar: Any,
                 mix: AgentMix, source: Conversations,
                 **pids: int) -> tuple[np.ndarray, float, int, dict[str, float]]:
    """:func:`_phase` with header-less agent traffic (:mod:`hermes.bench.agents`)."""
    evloop.run(drive_agents(url, warmup, concurrency, mix, source=source, progress=bar))
    meter = _CpuMeter(**pids)
    lat, wall, err = evloop.run(drive_agents(url, requests, concurrency, mix, source=source,
                                             progress=bar))
    return lat, wall, err, meter.per_request_ms(requests)


class _LoopLag:
    """The gateway's event-loop stall monitor, ``GET /admin/loop?reset=true`` (the admin
    API: the gateway is on loopback; ``$HERMES_ADMIN_TOKEN`` is sent when set)."""

    def __init__(self, url: str) -> None:
        token = os.environ.get("HERMES_ADMIN_TOKEN")
        self.http = httpx.Client(base_url=url, timeout=30.0, headers={
            "Authorization": f"Bearer {token}"} if token else {})

    def read(self) -> dict[str, float]:
        """``{max_pause_ms, max_gc_ms, max_pause_cpu_ms, max_busy_ms}`` since the last read
        (NaN: no monitor there)."""
        try:
            r = self.http.get("/admin/loop", params={"reset": "true"})
            r.raise_for_status()
            got = r.json()
        except (httpx.HTTPError, ValueError):
            return dict.fromkeys(("max_pause_ms", "max_gc_ms", "max_pause_cpu_ms",
                                  "max_busy_ms"), float("nan"))
        return {"max_pause_ms": float(got["max_pause_ms"]),
                "max_gc_ms": float(max(got.get("gc", {}).get("max_ms", [0.0]))),
                "max_pause_cpu_ms": float(got.get("max_pause_process_cpu_ms", float("nan"))),
                "max_busy_ms": float(got.get("max_busy_ms", float("nan")))}

    def close(self) -> None:
        self.http.close()


def _through_gateway(engine_url: str, engine_pid: int, policy: str, requests: int, warmup: int,
                     levels: list[int], bar: Any, client: str, fill_history: int = 0,
                     identities: tuple[str, ...] = ("none",),
                     messages: int = 0, marks: tuple[int, ...] = (),
                     mix: AgentMix | None = None, *, tracing: str = "off",
                     src: str | None = None) -> list[dict[str, Any]]:
    from hermes.gateway.config import SchedulerConfig

    rows = []
    keep = fill_history or SchedulerConfig().keep_finished_runs
    sink = _OtlpSink() if tracing == "on" else None
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONUNBUFFERED"] = "1"
    if src is not None:  # the baseline's code, not this one
        env["PYTHONPATH"] = str(Path(src).resolve())
    with tempfile.TemporaryDirectory(prefix="hermes-bench-gw-") as tmp:
        cfg = Path(tmp) / "hermes.toml"
        gport = free_port()
        cfg.write_text(
            f'[server]\nhost = "127.0.0.1"\nport = {gport}\nlog_level = "warning"\n'
            f'[scheduler]\npolicy = "{policy}"\nbind = ""\nkeep_finished_runs = {keep}\n'
            f'[stores]\nstate_dir = "{tmp}/state"\nkb = "{tmp}/kb"\n'
            f'[[engines]]\nname = "e0"\nkind = "openai"\nurl = "{engine_url}"\n'
            f'model = "{MODEL}"\nmax_inflight = {max(64, 2 * max(levels))}\n'
            + (f'[tracing]\nenabled = true\nendpoint = "{sink.url}"\n' if sink else "")
        )
        gw = subprocess.Popen([sys.executable, "-m", "hermes.cli", "serve", "--config", str(cfg)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, env=env)
        loop: _LoopLag | None = None
        try:
            url = f"http://127.0.0.1:{gport}"
            wait_http(url + "/healthz", gw)
            loop = _LoopLag(url)
            # tracing on: the gateway's export process, whose CPU is its own column
            kids = _children(gw.pid)
            extra = {"export": kids[0]} if kids else {}
            sent = 0  # one-request runs so far: the gateway keeps min(sent, keep) finished
            for c in levels:
                for mode in identities:
                    lat, wall, err, cpu, pauses = _phase(
                        url, requests, warmup, c, bar, client, loop,
                        headers=IDENTITY_HEADERS[mode], messages=messages,
                        gateway=gw.pid, engine=engine_pid, **extra)
                    rows.append(_row("gateway", policy, c, lat, wall, err, cpu, pauses,
                                     history=min(sent + warmup * (mode == "none"), keep),
                                     identity=mode))
                    if mode == "none":  # inferred runs stay open until idle: not history
                        sent += warmup + requests
            if fill_history:
                c = max(levels)
                fill = max(0, fill_history - sent)
                for mode in identities:
                    lat, wall, err, cpu, pauses = _phase(
                        url, requests, fill, c, bar, client, loop,
                        headers=IDENTITY_HEADERS[mode], messages=messages,
                        gateway=gw.pid, engine=engine_pid, **extra)
                    if mode == "none":
                        sent += fill
                    rows.append(_row("gateway", policy, c, lat, wall, err, cpu, pauses,
                                     history=min(sent, keep), identity=mode))
                    if mode == "none":
                        sent += requests
                    fill = 0
            if marks:
                rows += _warm_rows(url, gw.pid, engine_pid, policy, requests, warmup, levels,
                                   bar, loop, marks, mix or AgentMix(model=MODEL), extra)
        finally:
            if loop is not None:
                loop.close()
            stop_group(gw)
            if sink is not None:
                sink.close()
    return rows


class _OtlpSink:
    """An OTLP/HTTP trace receiver on loopback that answers every export with 200 and keeps
    nothing but counts (``--tracing on``: the gateway exports as to a real receiver)."""

    def __init__(self) -> None:
        import http.server
        import threading

        sink = self
        self.batches = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                sink.batches += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def warm_marks(warm_history: int | Sequence[int]) -> tuple[int, ...]:
    """``--warm-history`` as the histories to measure after: increasing, each > 0 (``0`` or
    an empty list: none). Raises ``ValueError`` naming the option otherwise."""
    marks = (warm_history,) if isinstance(warm_history, int) else tuple(warm_history)
    if any(m < 0 for m in marks):
        raise ValueError(f"--warm-history must be >= 0, got {list(marks)}")
    marks = tuple(m for m in marks if m)
    if any(b <= a for a, b in zip(marks, marks[1:], strict=False)):
        raise ValueError(f"--warm-history must list increasing histories, got {list(marks)}")
    return marks


def _warm_rows(url: str, gateway_pid: int, engine_pid: int, policy: str, requests: int,
               warmup: int, levels: list[int], bar: Any, loop: _LoopLag,
               marks: tuple[int, ...], mix: AgentMix,
               extra: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """The ``history_kind`` ``"inferred"`` rows of one gateway: agent traffic at every level
    fresh, then for each history of ``marks`` (:func:`warm_marks`) the agent requests
    that bring it there (at the highest level, the fastest), a pause for the last runs to
    close idle and be learned, and the same levels again. The measured requests are not
    counted in ``history``: it is the warm requests sent before the row."""
    rows = []
    source = Conversations(mix)  # one seeded stream: the measured runs are of the same apps

    def measure(c: int, history: int) -> None:
        loop.read()
        lat, wall, err, cpu = _agent_phase(url, requests, warmup, c, bar, mix, source,
                                           gateway=gateway_pid, engine=engine_pid,
                                           **(extra or {}))
        rows.append(_row("gateway", policy, c, lat, wall, err, cpu, loop.read(),
                         history=history, identity="infer", history_kind="inferred"))

    for c in levels:
        measure(c, 0)
    sent = 0
    for mark in marks:
        evloop.run(drive_agents(url, mark - sent, max(levels), mix, source=source,
                                progress=bar))
        sent = mark
        time.sleep(WARM_SETTLE_S)
        for c in levels:
            measure(c, mark)
    return rows


#: after the warm history, wall seconds for its last runs to close idle (the resolver's
#: ``close_min_s``, 5 s by default, for apps with quick turns) and be learned
WARM_SETTLE_S = 8.0


def row_label(r: dict[str, Any]) -> str:
    """What a row measured, in words: ``floor``, ``floor agents``, ``hermes none``,
    ``hermes infer agents after 50000``, ... (the figure's legend)."""
    if r["path"] != "gateway":
        return r["path"] + (" agents" if r["history_kind"] == "inferred" else "")
    out = f"{r['policy']} {r['identity']}"
    if r.get("tracing", "off") not in ("off", "-"):
        out += f" tracing {r['tracing']}"
    if r["history_kind"] == "inferred":
        out += " agents" + (f" after {r['history']}" if r["history"] else " fresh")
    return out


def plot_title(rows: Sequence[dict[str, Any]]) -> str:
    """The title of :func:`plot_gateway`'s chart: it names the floor only when rows of it
    are drawn (``--floor``)."""
    if any(r["path"] == "floor" for r in rows):
        return "gateway vs floor (same HTTP stack and engine client, no Hermes)"
    return "gateway: CPU per request of the serving process"


def plot_gateway(rows: Sequence[dict[str, Any]], path: str) -> None:
    """CPU ms per request of the serving process (the floor proxy, or the gateway) at each
    concurrency level, one bar per kind of row (:func:`row_label`; direct rows have no
    serving process but the engine and are left out)."""
    from hermes.extras import require

    matplotlib = require("plot")  # the `plot` extra
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    served = [r for r in rows if r["path"] != "direct"]
    levels = list(dict.fromkeys(r["concurrency"] for r in served))
    labels = list(dict.fromkeys(row_label(r) for r in served))
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 + 0.5 * len(labels) * len(levels)), 4))
    for k, label in enumerate(labels):
        xs, ys = [], []
        for i, c in enumerate(levels):
            got = [r["gateway_cpu_ms"] for r in served
                   if r["concurrency"] == c and row_label(r) == label]
            if got:
                xs.append(i - 0.4 + width * (k + 0.5))
                ys.append(float(np.mean(got)))
        ax.bar(xs, ys, width, label=label)
    ax.set_xticks(range(len(levels)), [f"{c} client{'s' if c > 1 else ''}" for c in levels])
    ax.set_ylabel("CPU ms per request (serving process)")
    ax.set_title(plot_title(served))
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
