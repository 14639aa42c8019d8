"""``hermes bench soak --minutes M --rate R``: a steady load on a real gateway, loopback only.

The gateway is started as its own process (``hermes serve`` on 127.0.0.1, a fresh state
directory, the built-in engine time-scaled) unless ``--url`` names one on loopback (then
``--pid`` lets its memory be sampled). Arrivals are open-loop at ``R`` per second, round-robin
over three kinds of work:

- ``completion``: an OpenAI completion (a one-request run);
- ``stream``: the same with ``stream: true``, read to ``[DONE]``;
- ``hosted``: a hosted benchmark app run (``POST /v1/runs`` with an input), polled until it
  ends: it must have finished (its latency is its completion time).

Reported: requests, errors (non-2xx, exceptions, hosted runs not finished, requests still
outstanding at the end), p50/p99 latency per kind, and the gateway's resident memory (from
``/proc/PID/status``) sampled every few seconds: after warm-up (while caches and the
finished-run window fill; ``--warmup``, default half the run), at the end, the ratio
end/warm-up and the slope of a least-squares line through the samples after warm-up (MiB per
minute). Bounded: at most 60 minutes, 200 requests a second, 2000 requests outstanding.

``--agents N`` instead: header-less agent traffic (:mod:`hermes.bench.agents`: ``--apps``
programs, new and continuing conversations, ``--concurrency`` agents each waiting for its
last reply), ``N`` requests, the gateway's memory sampled every ``--sample-every`` requests:
what the resolver, the learner and the sample memo keep as they learn ever more runs.
Reported: the memory at each quarter, and over the last half the ratio of its highest to its
lowest sample (``last_half_max_over_min``: 1.10 is 10%) and its slope per 10,000 requests;
beside each memory sample, the sizes of the gateway's bounded structures from its
``/metrics`` (:data:`SIZES`: the resolver's index and passages, its open and recently closed
runs, the values the learner holds, the bytes of memoized walks), and per structure its size
at the half and at the end and the requests after which it stayed within 2% of its last
size (``levelled_at``): which bounds the memory has reached, and which still fill.
Bounded: at most 1,000,000 requests and 256 agents.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from hermes.procs import free_port, stop_group, wait_http

MAX_MINUTES = 60.0
MAX_RATE = 200.0
MAX_OUTSTANDING = 2000
KINDS = ("completion", "stream", "hosted")
MAX_AGENT_REQUESTS = 1_000_000
MAX_AGENTS = 256
#: the bounded structures sampled with the memory: (metric family, ``structure`` label or
#: None) -> the name in the rows
SIZES: dict[tuple[str, str | None], str] = {
    ("hermes_identity_size", "index_entries"): "index_entries",
    ("hermes_identity_size", "passage_entries"): "passage_entries",
    ("hermes_identity_size", "open_runs"): "open_runs",
    ("hermes_identity_size", "recently_closed"): "recently_closed",
    ("hermes_learner_size", "apps"): "learned_apps",
    ("hermes_learner_size", "held_samples"): "learner_values",
    ("hermes_sample_cache_bytes", None): "sample_cache_bytes",
}


def rss_mib(pid: int) -> float | None:
    """Resident set size of ``pid`` in MiB (Linux ``/proc``), or None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        return None
    return None


def _loopback_url(url: str) -> str:
    host = urlparse(url).hostname or ""
    from hermes.gateway.auth import is_loopback

    if not is_loopback(host):
        raise ValueError(f"hermes bench soak sends traffic to loopback only, not {host!r}")
    return url.rstrip("/")


@dataclass
class SoakResult:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    errors: dict[str, int] = field(default_factory=dict)
    sent: int = 0
    memory: list[tuple[float, float]] = field(default_factory=list)  # (elapsed s, MiB)

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


def start_gateway(time_scale: float, state_dir: Path, keep_runs: int) -> tuple[subprocess.Popen, str]:
    """``hermes serve`` on a free loopback port; returns the process and its URL."""
    port = free_port()
    env = {**os.environ, "HERMES_LOG_LEVEL": "warning", "HERMES_KEEP_FINISHED_RUNS": str(keep_runs)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--bind", "", "--time-scale", str(time_scale), "--state-dir", str(state_dir),
         "--kb", str(state_dir / "kb")],
        stdout=(state_dir / "gateway.log").open("ab"), stderr=subprocess.STDOUT, env=env,
        start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


async def run_soak(url: str, pid: int | None, minutes: float, rate: float, *, app: str,
                   model: str, max_tokens: int, sample_s: float = 5.0,
                   progress: bool = True) -> SoakResult:
    """Drive the load; see the module docstring."""
    import httpx
    from tqdm import tqdm

    res = SoakResult()
    duration = minutes * 60.0
    n_total = int(duration * rate)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    outstanding: set[asyncio.Task] = set()
    t0 = time.monotonic()
    body = {"model": model, "prompt": "soak " * 16, "max_tokens": max_tokens, "ignore_eos": True}

    async with httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits) as http:
        async def one(i: int) -> None:
            kind = KINDS[i % len(KINDS)]
            t = time.monotonic()
            try:
                if kind == "completion":
                    r = await http.post("/v1/completions", json=body)
                    ok = r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0
                elif kind == "stream":
                    async with http.stream("POST", "/v1/completions",
                                           json={**body, "stream": True}) as r:
                        last = ""
                        async for line in r.aiter_lines():
                            if line:
                                last = line
                    ok = r.status_code == 200 and last == "data: [DONE]"
                else:  # a hosted run, followed to its end: latency = its completion time
                    r = await http.post("/v1/runs", json={"app": app, "input": {"seed": i}})
                    ok = r.status_code == 201
                    if ok:
                        rid = r.json()["run_id"]
                        state = "queued"
                        while state in ("queued", "running"):
                            await asyncio.sleep(0.25)
                            r = await http.get(f"/v1/runs/{rid}")
                            state = r.json().get("state") if r.status_code == 200 else None
                        ok = state == "finished"
            except (httpx.HTTPError, ValueError, KeyError) as e:
                res.error(f"{kind}: {type(e).__name__}")
                return
            if ok:
                res.latencies[kind].append(time.monotonic() - t)
            else:
                res.error(f"{kind}: HTTP {r.status_code}")

        async def sampler() -> None:
            while True:
                if pid is not None:
                    m = rss_mib(pid)
                    if m is not None:
                        res.memory.append((time.monotonic() - t0, m))
                await asyncio.sleep(sample_s)

        sampling = asyncio.create_task(sampler())
        bar = tqdm(total=n_total, desc="soak", unit="req", disable=not progress, file=sys.stderr)
        for i in range(n_total):
            due = t0 + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(outstanding) >= MAX_OUTSTANDING:
                res.error("overload: too many outstanding")
                continue
            task = asyncio.create_task(one(i))
            outstanding.add(task)
            task.add_done_callback(outstanding.discard)
            res.sent += 1
            bar.update(1)
        bar.close()
        if outstanding:
            done, pending = await asyncio.wait(outstanding, timeout=120)
            for t in pending:
                t.cancel()
                res.error("timeout: outstanding at the end")
        if pid is not None:
            m = rss_mib(pid)
            if m is not None:
                res.memory.append((time.monotonic() - t0, m))
        sampling.cancel()
    return res


def summarize(res: SoakResult, minutes: float, rate: float,
              warmup: float = 0.5) -> list[dict[str, Any]]:
    """Flat rows: one per kind of work, one for memory (growth measured after the first
    ``warmup`` fraction of the run, once caches and the finished-run window have filled)."""
    rows: list[dict[str, Any]] = []

    def latency_row(row: str, lat_s: list[float], ok: int, errors: int) -> dict[str, Any]:
        lat = np.array(lat_s) * 1000.0
        # no latency (no request of the kind): None (JSON null, "-" in the table), not nan
        return {"row": row, "ok": ok, "errors": errors,
                "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
                "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
                "max_ms": float(lat.max()) if lat.size else None}

    for kind in KINDS:
        errs = sum(n for k, n in res.errors.items() if k.startswith(kind))
        rows.append(latency_row(kind, res.latencies[kind], len(res.latencies[kind]), errs))
    other = sum(n for k, n in res.errors.items() if not k.startswith(KINDS))
    total_err = sum(res.errors.values())
    every = [x for v in res.latencies.values() for x in v]
    rows.append(latency_row("all", every, sum(r["ok"] for r in rows), total_err))
    if other:
        rows[-1]["other_errors"] = other
    if res.memory:
        t = np.array([m[0] for m in res.memory])
        mib = np.array([m[1] for m in res.memory])
        warm = t >= warmup * minutes * 60.0
        base = float(mib[warm][0]) if warm.any() else float(mib[0])
        end = float(mib[-1])
        slope = float(np.polyfit(t[warm] / 60.0, mib[warm], 1)[0]) if warm.sum() >= 3 else None
        rows.append({"row": "memory", "start_mib": float(mib[0]), "warm_mib": base,
                     "end_mib": end, "peak_mib": float(mib.max()), "end_over_warm": end / base,
                     "slope_mib_per_min": slope, "warmup_min": warmup * minutes,
                     "minutes": minutes, "rate": rate, "samples": int(mib.size)})
    return rows


def sample_rows(res: SoakResult) -> list[dict[str, Any]]:
    """The raw memory samples as flat rows (for ``--json``)."""
    return [{"row": "rss", "t_s": t, "mib": m} for t, m in res.memory]


def plot(res: SoakResult, path: str) -> None:
    from hermes.extras import require

    matplotlib = require("plot")  # the `plot` extra
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    if res.memory:
        ax.plot([m[0] / 60 for m in res.memory], [m[1] for m in res.memory], label="gateway RSS")
    ax.set_xlabel("minutes")
    ax.set_ylabel("MiB")
    ax.set_title("hermes bench soak: gateway memory")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def start_fronting_gateway(state_dir: Path, keep_runs: int, model: str,
                           dataflow_ttl_s: float | None = None) -> tuple[list[subprocess.Popen], str]:
    """A ``hermeslet sim-engine`` served ~instantly (time scale 1e6) and a ``hermes serve``
    fronting it as an ``openai`` engine, its clock at wall time (so the resolver's idle
    closes and the learner's cadence are as in production): (processes, gateway URL)."""
    eport, gport = free_port(), free_port()
    log = (state_dir / "gateway.log").open("ab")
    eng = subprocess.Popen(
        [sys.executable, "-m", "hermeslet.cli", "sim-engine", "--port", str(eport), "--model",
         model, "--time-scale", "1e6", "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    cfg = state_dir / "hermes.toml"
    cfg.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = {gport}\nlog_level = "warning"\n'
        f'[scheduler]\nbind = ""\nkeep_finished_runs = {keep_runs}\n'
        f'[stores]\nstate_dir = "{state_dir}/state"\nkb = "{state_dir}/kb"\n'
        + (f'[identity]\ndataflow_ttl_s = {dataflow_ttl_s}\n' if dataflow_ttl_s else "")
        + f'[[engines]]\nname = "e0"\nkind = "openai"\nurl = "http://127.0.0.1:{eport}"\n'
        f'model = "{model}"\nmax_inflight = 512\n')
    gw = subprocess.Popen([sys.executable, "-m", "hermes.cli", "serve", "--config", str(cfg)],
                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_http(f"http://127.0.0.1:{eport}/health", eng)
    return [gw, eng], f"http://127.0.0.1:{gport}"


async def run_agent_soak(url: str, pid: int | None, requests: int, concurrency: int, apps: int,
                         *, model: str, sample_every: int,
                         progress: bool = True) -> tuple[list[dict[str, Any]], list[float], int]:
    """Header-less agent traffic in chunks of ``sample_every`` requests, the gateway's RSS
    sampled after each: (memory rows, latencies s, errors)."""
    from tqdm import tqdm

    from hermes.bench.agents import AgentMix, Conversations, drive_agents

    mix = AgentMix(apps=apps, model=model)
    source = Conversations(mix)
    bar = tqdm(total=requests, desc="agent soak", unit="req", disable=not progress,
               file=sys.stderr)
    samples: list[dict[str, Any]] = []
    lat: list[float] = []
    errors = done = 0
    t0 = time.monotonic()
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30.0)) as http:
        unread: str | None = None

        async def sizes() -> dict[str, float]:
            nonlocal unread
            got = await read_sizes(http, url)
            if isinstance(got, str):
                if unread is None:  # said once; the memory is sampled all the same
                    print(f"agent soak: no structure sizes ({got})", file=sys.stderr)
                unread = got
                return {}
            return got

        if pid is not None and (m := rss_mib(pid)) is not None:
            samples.append({"row": "rss", "requests": 0, "t_s": 0.0, "mib": m,
                            "sizes": await sizes()})
        while done < requests:
            n = min(sample_every, requests - done)
            got, _, err = await drive_agents(url, n, concurrency, mix, source=source,
                                             progress=bar)
            lat += got.tolist()
            errors += err
            done += n
            if pid is None or (m := rss_mib(pid)) is None:
                continue
            samples.append({"row": "rss", "requests": done, "t_s": time.monotonic() - t0,
                            "mib": m, "sizes": await sizes()})
            if not progress:  # a line per sample, for a long run watched from its log
                print(f"agent soak: {done} requests, {samples[-1]['t_s']:.0f} s, "
                      f"RSS {m:.1f} MiB, {errors} errors", file=sys.stderr, flush=True)
    bar.close()
    return samples, lat, errors


def parse_sizes(text: str) -> dict[str, float]:
    """The :data:`SIZES` found in a ``/metrics`` page."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            name = SIZES.get((sample.name, sample.labels.get("structure")))
            if name is not None:
                out[name] = float(sample.value)
    return out


async def read_sizes(http: Any, url: str) -> dict[str, float] | str:
    """:func:`parse_sizes` of the gateway's ``/metrics``, or why it could not be read."""
    import aiohttp

    try:
        async with http.get(url + "/metrics") as r:
            if r.status != 200:
                return f"GET /metrics answered HTTP {r.status}"
            return parse_sizes(await r.text())
    except (TimeoutError, aiohttp.ClientError, ValueError) as e:
        return f"GET /metrics failed: {type(e).__name__}: {e}"


def size_rows(samples: list[dict[str, Any]], requests: int) -> list[dict[str, Any]]:
    """Per structure of :data:`SIZES` sampled: its size at the half and at the end, and the
    requests after which it stayed within 2% of its last size (``levelled_at``)."""
    with_sizes = [s for s in samples if s.get("sizes")]
    if not with_sizes:
        return []
    req = np.array([s["requests"] for s in with_sizes], dtype=float)
    half = int(np.argmin(np.abs(req - requests / 2)))
    rows = []
    for name in SIZES.values():
        v = np.array([s["sizes"].get(name, np.nan) for s in with_sizes], dtype=float)
        if np.isnan(v).all():
            continue
        last = v[-1]
        if np.isnan(last):
            continue
        # the samples off by more than 2% (a missing one counts as off); the last is not
        off = np.flatnonzero(~(np.abs(v - last) <= 0.02 * max(abs(last), 1.0)))
        settled = int(req[off[-1] + 1]) if off.size else int(req[0])
        rows.append({"row": "size", "structure": name, "half": float(v[half]),
                     "end": float(last), "levelled_at": settled})
    return rows


def summarize_agents(samples: list[dict[str, Any]], lat: list[float], errors: int,
                     requests: int) -> list[dict[str, Any]]:
    """One latency row and one memory row (see the module docstring)."""
    ms = np.array(lat) * 1000.0
    rows: list[dict[str, Any]] = [{
        "row": "agents", "ok": int(ms.size), "errors": errors,
        "p50_ms": float(np.percentile(ms, 50)) if ms.size else float("nan"),
        "p99_ms": float(np.percentile(ms, 99)) if ms.size else float("nan"),
        "max_ms": float(ms.max()) if ms.size else float("nan")}]
    if samples:
        req = np.array([s["requests"] for s in samples], dtype=float)
        mib = np.array([s["mib"] for s in samples])

        def at(frac: float) -> float:
            return float(mib[int(np.argmin(np.abs(req - frac * requests)))])

        late = req >= requests / 2
        tail = mib[late] if late.any() else mib
        slope = (float(np.polyfit(req[late] / 1e4, mib[late], 1)[0]) if late.sum() >= 3
                 else float("nan"))
        rows.append({"row": "memory", "requests": requests, "start_mib": float(mib[0]),
                     "q1_mib": at(0.25), "half_mib": at(0.5), "q3_mib": at(0.75),
                     "end_mib": float(mib[-1]), "peak_mib": float(mib.max()),
                     "last_half_max_over_min": float(tail.max() / tail.min()),
                     "slope_mib_per_10k": slope, "samples": int(mib.size)})
    return rows


def _cmd_agent_soak(args: Any) -> int:
    from hermes.cliout import print_table, write_json

    if not 0 < args.agents <= MAX_AGENT_REQUESTS:
        raise ValueError(f"--agents must be in (0, {MAX_AGENT_REQUESTS}], got {args.agents}")
    if not 0 < args.concurrency <= MAX_AGENTS:
        raise ValueError(f"--concurrency must be in (0, {MAX_AGENTS}], got {args.concurrency}")
    if args.sample_every < 1:
        raise ValueError(f"--sample-every must be >= 1, got {args.sample_every}")
    procs: list[subprocess.Popen] = []
    tmp = None
    if args.url:
        url, pid = _loopback_url(args.url), args.pid
    else:
        tmp = tempfile.TemporaryDirectory(prefix="hermes-soak-")
        procs, url = start_fronting_gateway(Path(tmp.name), args.keep_runs, args.model,
                                            args.dataflow_ttl)
        pid = procs[0].pid
    try:
        wait_http(url + "/healthz", procs[0] if procs else None,
                  ready=lambda r: bool(r.json().get("nodes")))
        samples, lat, errors = asyncio.run(run_agent_soak(
            url, pid, args.agents, args.concurrency, args.apps, model=args.model,
            sample_every=args.sample_every, progress=not args.no_progress))
    finally:
        for p in procs:
            stop_group(p, grace_s=20.0)
        if tmp is not None:
            tmp.cleanup()
    rows = summarize_agents(samples, lat, errors, args.agents)
    print_table(rows[:1], title=f"agent soak: {args.agents} header-less requests, "
                f"{args.apps} apps, {args.concurrency} agents")
    if len(rows) > 1:
        print_table(rows[1:], title="gateway memory (RSS, MiB) by requests sent")
    sizes = size_rows(samples, args.agents)
    if sizes:
        print_table(sizes, title="bounded structures (/metrics): size at the half, at the "
                    "end, requests after which it stayed within 2% of its end")
    rows += sizes
    write_json(args.json, rows + samples)
    if args.plot:
        res = SoakResult(memory=[(s["t_s"], s["mib"]) for s in samples])
        plot(res, args.plot)
    return 0 if not errors else 1


def cmd_soak(args: Any) -> int:
    from hermes.cliout import print_table, write_json

    if args.agents:
        return _cmd_agent_soak(args)
    if args.minutes is None or args.rate is None:
        raise ValueError("hermes bench soak needs --minutes and --rate (or --agents N)")
    if not 0 < args.minutes <= MAX_MINUTES:
        raise ValueError(f"--minutes must be in (0, {MAX_MINUTES:g}], got {args.minutes}")
    if not 0 < args.rate <= MAX_RATE:
        raise ValueError(f"--rate must be in (0, {MAX_RATE:g}], got {args.rate}")
    proc = None
    tmp = None
    if args.url:
        url, pid = _loopback_url(args.url), args.pid
    else:
        tmp = tempfile.TemporaryDirectory(prefix="hermes-soak-")
        proc, url = start_gateway(args.time_scale, Path(tmp.name), args.keep_runs)
        pid = proc.pid
    try:
        wait_http(url + "/healthz", proc, ready=lambda r: bool(r.json().get("nodes")))
        res = asyncio.run(run_soak(url, pid, args.minutes, args.rate, app=args.app,
                                   model=args.model, max_tokens=args.max_tokens,
                                   progress=not args.no_progress))
    finally:
        if proc is not None:
            stop_group(proc, grace_s=20.0)
        if tmp is not None:
            tmp.cleanup()
    rows = summarize(res, args.minutes, args.rate, args.warmup)
    print_table([r for r in rows if r["row"] != "memory"],
                 title=f"soak: {args.minutes:g} min at {args.rate:g}/s ({res.sent} requests)")
    mem = [r for r in rows if r["row"] == "memory"]
    if mem:
        print_table(mem, title="gateway memory (RSS)")
    if res.errors:
        print("errors: " + json.dumps(res.errors), file=sys.stderr)
    write_json(args.json, rows + sample_rows(res))
    if args.plot:
        plot(res, args.plot)
    return 0 if not res.errors else 1


def add_soak_parser(bsub: Any) -> None:
    s = bsub.add_parser("soak", help="steady load on a loopback gateway: errors, p99, memory growth")
    s.add_argument("--minutes", type=float, help=f"duration (<= {MAX_MINUTES:g})")
    s.add_argument("--rate", type=float, help=f"requests/s (<= {MAX_RATE:g})")
    s.add_argument("--agents", type=int, default=0, metavar="N",
                   help="instead of --minutes/--rate: N header-less agent requests (new and "
                        "continuing conversations of --apps programs), memory sampled every "
                        "--sample-every requests")
    s.add_argument("--apps", type=int, default=200, help="with --agents: programs (<= 200)")
    s.add_argument("--concurrency", type=int, default=16,
                   help="with --agents: agents in flight (default 16)")
    s.add_argument("--sample-every", dest="sample_every", type=int, default=5000,
                   help="with --agents: requests between two memory samples (default 5000)")
    s.add_argument("--url", help="an already running gateway on loopback (default: start one)")
    s.add_argument("--pid", type=int, help="with --url: the gateway's PID, to sample its memory")
    s.add_argument("--time-scale", dest="time_scale", type=float, default=20.0,
                   help="built-in engine speed-up of the self-started gateway (default 20)")
    s.add_argument("--keep-runs", dest="keep_runs", type=int, default=2000,
                   help="finished runs the self-started gateway keeps in memory (default 2000)")
    s.add_argument("--dataflow-ttl", dest="dataflow_ttl", type=float, default=None,
                   help="with --agents: identity.dataflow_ttl_s of the self-started gateway "
                        "(default: the gateway's, 900 s: the passage index fills for 15 "
                        "minutes of traffic before it levels off)")
    s.add_argument("--app", default="factool_math", help="hosted app of the 'hosted' requests")
    s.add_argument("--model", default="llama-2-7b")
    s.add_argument("--max-tokens", dest="max_tokens", type=int, default=16)
    s.add_argument("--warmup", type=float, default=0.5,
                   help="fraction of the run before memory growth is measured (default 0.5)")
    s.add_argument("--json", help="write the rows (flat) to FILE")
    s.add_argument("--plot", help="write the memory curve to FILE.png")
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=cmd_soak)
