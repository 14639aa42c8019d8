"""``hermes bench quota``: is a tenant's limit exact with several gateway processes?

Starts a real ``redis-server`` on a free loopback port (or uses ``--redis URL``), then
``--edges`` ``hermes serve`` processes (each all-in-one, with its own embedded node) that share
it as their ``[cluster] store`` and as their API-key store; creates one tenant key whose limit
is ``--rpm`` requests a minute; fires ``--requests`` chat completions at once, spread round
robin over the gateways, and counts the admitted (200) and refused (429) answers. With
``--baseline`` the same is done with the gateways each keeping their limits in memory (the
behaviour without a shared store): N times the limit gets through. Loopback only; everything
it starts is stopped by PID when it ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from hermes.procs import free_port, stop_group, wait_http

MODEL = "llama-2-7b"


def start_redis(workdir: Path) -> tuple[subprocess.Popen[Any], str]:
    """A real ``redis-server`` on a free loopback port, persistence off."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise OSError("redis-server not found on PATH (apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    import redis

    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise OSError("redis-server did not start") from None
            time.sleep(0.05)
    client.close()
    return proc, f"redis://127.0.0.1:{port}/0"


def start_edges(n: int, redis_url: str, workdir: Path, *, shared: bool,
                prefix: str) -> list[tuple[subprocess.Popen[Any], str]]:
    """``n`` gateways; ``shared``: admission in the shared store, else in memory."""
    out = []
    for i in range(n):
        port = free_port()
        state = workdir / f"edge{i}"
        state.mkdir(parents=True, exist_ok=True)
        # a generous store timeout: the burst measures the limit, not how fast a loaded
        # machine answers 400 requests at once
        # and no cap on one tenant's bodies being read at once (security.tenant_max_uploads,
        # 64 by default): the burst sends 100 at once to each gateway, and only the per-minute
        # limit is measured
        env = {**os.environ, "HERMES_LOG_LEVEL": "warning", "HERMES_TIME_SCALE": "50",
               "HERMES_SECURITY__AUTH_REDIS": redis_url, "HERMES_CLUSTER__STORE_TIMEOUT_S": "5",
               "HERMES_SECURITY__TENANT_MAX_UPLOADS": "0"}
        if shared:
            env["HERMES_CLUSTER__STORE"] = redis_url
            env["HERMES_CLUSTER__STORE_PREFIX"] = prefix
        proc = subprocess.Popen(
            [sys.executable, "-m", "hermes.cli", "serve", "--host", "127.0.0.1", "--port",
             str(port), "--bind", "", "--state-dir", str(state), "--kb", str(state / "kb")],
            stdout=(state / "gateway.log").open("ab"), stderr=subprocess.STDOUT, env=env,
            start_new_session=True)
        out.append((proc, f"http://127.0.0.1:{port}"))
    for proc, url in out:
        wait_http(url + "/healthz", proc, timeout=120)
    return out


async def fire(urls: list[str], key: str, n: int) -> tuple[Counter[str], float]:
    """``n`` chat completions at once, round robin over ``urls``: answers by outcome
    (``admitted``, or the error code: ``rate_limited`` is the tenant's limit), and the
    seconds from the first sent to the last answered."""
    import httpx

    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def one(i: int) -> str:
            r = await client.post(
                f"{urls[i % len(urls)]}/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}", "X-Hermes-Run": "none"},
                json={"model": MODEL, "max_tokens": 1,
                      "messages": [{"role": "user", "content": f"q{i}"}]})
            if r.status_code == 200:
                return "admitted"
            try:
                return str(r.json()["error"]["code"])
            except (ValueError, KeyError, TypeError):
                return f"http-{r.status_code}"

        t0 = time.monotonic()
        codes = await asyncio.gather(*(one(i) for i in range(n)))
        return Counter(codes), time.monotonic() - t0


def measure(edges: int, requests: int, rpm: int, *, shared: bool, redis_url: str | None = None,
            workdir: Path | None = None) -> dict[str, Any]:
    """One measurement: a row with ``edges``, ``limit_rpm``, ``requests``, ``admitted``,
    ``refused`` (429 ``rate_limited``), ``other`` (any other answer, by code), ``seconds``
    (the burst), ``shared_store``."""
    from hermes.gateway.keys import RedisKeyStore

    tmp = Path(workdir or tempfile.mkdtemp(prefix="hermes-quota-"))
    tmp.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[Any]] = []
    try:
        if redis_url is None:
            rproc, redis_url = start_redis(tmp)
            procs.append(rproc)
        keys = RedisKeyStore(redis_url)  # the gateways' key store (its default prefix)
        tenant = f"quota-{uuid.uuid4().hex[:8]}"  # a fresh tenant: its own window
        key = keys.create(tenant)
        started = start_edges(edges, redis_url, tmp, shared=shared, prefix="hermes:")
        procs += [p for p, _ in started]
        urls = [u for _, u in started]
        # each gateway verifies the key once (scrypt) before the limit is set, so that the
        # burst measures the limit, not the key checks' own back-pressure
        warm = asyncio.run(fire(urls, key, len(urls)))[0]
        if warm["admitted"] != len(urls):
            raise OSError(f"warm-up requests failed: {dict(warm)}")
        keys.set_limits(tenant, {"rpm": rpm})
        keys.r.close()
        time.sleep(1.5)  # gateways re-read per-tenant limits at most once a second
        codes, secs = asyncio.run(fire(urls, key, requests))
    finally:
        for p in reversed(procs):
            stop_group(p, 10.0)
    return {"edges": edges, "limit_rpm": rpm, "requests": requests,
            "admitted": codes["admitted"], "refused": codes["rate_limited"],
            "other": {k: v for k, v in codes.items() if k not in ("admitted", "rate_limited")},
            "seconds": round(secs, 2), "shared_store": shared}


def cmd_quota(args: Any) -> int:
    rows = []
    for shared in ([True, False] if args.baseline else [True]):
        row = measure(args.edges, args.requests, args.rpm, shared=shared, redis_url=args.redis)
        rows.append(row)
        what = "shared store" if shared else "in memory per process (baseline)"
        print(f"{row['edges']} gateways, limit {row['limit_rpm']}/min, {what}: "
              f"{row['admitted']} of {row['requests']} admitted, {row['refused']} refused "
              f"(429 rate_limited), other {row['other'] or 'none'}, in {row['seconds']} s",
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if not any(r["other"] for r in rows) else 1


def add_quota_parser(bsub: Any) -> None:
    s = bsub.add_parser("quota", help="a tenant limit over several gateway processes sharing "
                        "Redis: admitted vs the limit")
    s.add_argument("--edges", type=int, default=4, help="gateway processes (default 4)")
    s.add_argument("--requests", type=int, default=400, help="fired at once (default 400)")
    s.add_argument("--rpm", type=int, default=100, help="the tenant's limit a minute (default 100)")
    s.add_argument("--redis", help="an already running Redis (default: start redis-server)")
    s.add_argument("--baseline", action="store_true",
                   help="also measure with limits in memory per process")
    s.add_argument("--json", help="write the rows to FILE")
    s.set_defaults(func=cmd_quota)

