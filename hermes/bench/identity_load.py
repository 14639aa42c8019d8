"""``hermes load --identity headers|infer|none``: can the gateway find runs, apps and units in
plain traffic (issue 17)?

The benchmark apps' runs (the arrivals of ``hermes load``: :func:`hermes.bench.sched.build_arrivals`)
are sent in the same request bodies in every mode, shaped as the real programs send them
(:mod:`hermes.bench.identity_bodies`: conversations for ReAct, plan-and-execute, code
generation and reasoning; independent prompts for FacTool, map-reduce and GoT), through the
OpenAI SDK (``with_raw_response``, to read the answer headers), with ``ignore_eos`` and
``max_tokens`` = the step's output tokens. Modes:

- ``headers``: today's clients: ``POST /v1/runs``, ``X-Hermes-Run`` / ``X-Hermes-Unit`` on
  every call, tool steps reported as unit events around a client-side wait, ``finish``;
- ``infer``: no Hermes header and no runs API at all, only OpenAI calls; a tool step is a
  client-side wait. The gateway must find the runs (and closes them itself when idle);
- ``none``: ``infer`` plus ``X-Hermes-Run: none`` on every call: one-request runs of app
  ``default``, the per-request baseline.

ACT is measured by the client the same way in every mode, in model seconds (wall x
``time_scale``): from the run's arrival (its first request is sent then: no app waits before
its first step) to the last answer it receives. A tool step after the last answer (ALFWorld's
last ``env_step``) is not in it: a plain client's run ends, for the gateway, at its last
answer.

Scoring (``infer``; :mod:`hermes.bench.identity_score`): each request's truth (the arrival's
index, its unit, its app) against the ``X-Hermes-Run`` / ``-Unit`` answer headers and the
run's app from ``GET /v1/runs/{id}`` (the ``X-Hermes-App`` answer header if the run is gone).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hermes.bench.identity_bodies import CONVERSATION, Message, RunBodies
from hermes.bench.identity_score import Placed, score

IDENTITY_MODES = ("headers", "infer", "none")


@dataclass(slots=True)
class Answer:
    """One call's answer: the reply message as returned, its usage, its answer headers."""

    message: Message
    prompt_tokens: int
    completion_tokens: int
    headers: dict[str, str]


@dataclass(slots=True)
class Outcome:
    """One run of the experiment: its ACT (model seconds), requests and token demand."""

    app: str
    act_s: float | None = None
    error: str | None = None
    requests: list[Placed] = field(default_factory=list)
    prompt_tokens: int = 0  # the engine's count of what the driver sent
    model_input_tokens: int = 0  # what the app model asked for
    completion_tokens: int = 0
    model_output_tokens: int = 0
    runs_not_inferred: int = 0  # ``infer``: runs the gateway did not mark inferred
    runs_not_found: int = 0  # ``infer``: runs GET /v1/runs/{id} no longer had


class IdentityDriver:
    """One experiment's clients against a gateway at ``url`` (module docstring)."""

    def __init__(self, url: str, mode: str, *, time_scale: float = 1.0,
                 model: str | None = None, timeout_s: float = 600.0) -> None:
        if mode not in IDENTITY_MODES:
            raise ValueError(f"--identity must be one of {', '.join(IDENTITY_MODES)}, got {mode!r}")
        if time_scale <= 0:
            raise ValueError(f"--time-scale must be > 0, got {time_scale}")
        import httpx

        from hermes.extras import require

        openai = require("load")
        self.url = url.rstrip("/")
        self.mode = mode
        self.time_scale = time_scale
        self.model = model
        limits = httpx.Limits(max_connections=2000, max_keepalive_connections=500)
        self.http = httpx.AsyncClient(base_url=self.url, timeout=timeout_s, limits=limits)
        self.openai = openai.AsyncOpenAI(
            base_url=self.url + "/v1", api_key="hermes-load", max_retries=0, timeout=timeout_s,
            http_client=httpx.AsyncClient(timeout=timeout_s, limits=limits))

    async def close(self) -> None:
        await self.openai.close()
        await self.http.aclose()

    def wall(self, model_s: float) -> float:
        return model_s / self.time_scale

    async def _chat(self, messages: list[Message], max_tokens: int,
                    headers: dict[str, str]) -> Answer:
        raw = await self.openai.chat.completions.with_raw_response.create(
            model=self.model or "", messages=messages, max_tokens=max(1, max_tokens),
            extra_body={"ignore_eos": True}, extra_headers=headers or None)
        body = raw.http_response.json()  # the reply exactly as the gateway returned it
        usage = body.get("usage") or {}
        return Answer(body["choices"][0]["message"], int(usage.get("prompt_tokens", 0)),
                      int(usage.get("completion_tokens", 0)),
                      {k.lower(): v for k, v in raw.headers.items()})

    async def run_one(self, index: int, app_name: str, seed: int, arrival_s: float,
                      start_wall: float) -> Outcome:
        """Arrival ``index``: one run of ``app_name`` (workload seed ``seed``), sent
        ``arrival_s`` model seconds after ``start_wall``."""
        from hermes.workloads.registry import get_app

        out = Outcome(app=app_name)
        delay = start_wall + self.wall(arrival_s) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        t0 = last = time.monotonic()
        bodies = RunBodies(app_name, np.random.default_rng(seed + 7_919))  # text, not workload
        run_id: str | None = None
        placed: list[tuple[str, dict[str, str]]] = []
        try:
            if self.mode == "headers":
                r = await self.http.post("/v1/runs", json={"app": app_name, "tenant": app_name})
                r.raise_for_status()
                run_id = r.json()["run_id"]
            for step in get_app(app_name).steps(np.random.default_rng(seed)):
                if step.gap_s > 0:
                    await asyncio.sleep(self.wall(step.gap_s))
                if not step.is_llm:
                    await self._tool(run_id, step.unit, step.backend, float(step.duration_s or 0))
                    continue
                headers = ({"X-Hermes-Run": run_id, "X-Hermes-Unit": step.unit} if run_id
                           else {"X-Hermes-Run": "none"} if self.mode == "none" else {})
                sent = bodies.step(step.unit, [c.input_tokens for c in step.requests])
                answers = await asyncio.gather(*(
                    self._chat(msgs, c.output_tokens, headers)
                    for msgs, c in zip(sent, step.requests, strict=True)))
                last = time.monotonic()
                bodies.answered(sent, [a.message for a in answers])
                for c, a in zip(step.requests, answers, strict=True):
                    out.prompt_tokens += a.prompt_tokens
                    out.completion_tokens += a.completion_tokens
                    out.model_input_tokens += c.input_tokens
                    out.model_output_tokens += max(1, c.output_tokens)
                    placed.append((step.unit, a.headers))
            out.act_s = (last - t0) * self.time_scale
            if run_id is not None:
                (await self.http.post(f"/v1/runs/{run_id}/finish", json={})).raise_for_status()
            apps = await self._apps(out, placed) if self.mode == "infer" else {}
            out.requests = [Placed(index, app_name, unit, h.get("x-hermes-run", ""),
                                   h.get("x-hermes-unit", ""),
                                   apps.get(h.get("x-hermes-run", ""), h.get("x-hermes-app", "")))
                            for unit, h in placed]
        except Exception as e:  # a failed run is reported, not fatal to the experiment
            out.error = f"{type(e).__name__}: {e}"
        return out

    async def _apps(self, out: Outcome, placed: Sequence[tuple[str, dict[str, str]]]
                    ) -> dict[str, str]:
        """The app of each run the gateway put this run's requests in, from
        ``GET /v1/runs/{id}`` (a run no longer kept: the answer header's app)."""
        apps: dict[str, str] = {}
        for rid in dict.fromkeys(h.get("x-hermes-run", "") for _, h in placed):
            r = await self.http.get(f"/v1/runs/{rid}") if rid else None
            if r is None or r.status_code != 200:
                out.runs_not_found += 1
                continue
            doc = r.json()
            apps[rid] = str(doc.get("app", ""))
            out.runs_not_inferred += not doc.get("inferred", False)
        return apps

    async def _tool(self, run_id: str | None, unit: str, backend: str, duration_s: float) -> None:
        if run_id is not None:
            (await self.http.post(f"/v1/runs/{run_id}/events", json={
                "unit": unit, "event": "start", "backend": backend})).raise_for_status()
        await asyncio.sleep(self.wall(duration_s))
        if run_id is not None:
            (await self.http.post(f"/v1/runs/{run_id}/events", json={
                "unit": unit, "event": "finish"})).raise_for_status()

    async def settle(self, timeout_s: float = 900.0, poll_s: float = 1.0) -> float:
        """Wait until the gateway has no queued or running run (an inferred run closes by
        itself once idle past its app's gaps) and one more learning interval has passed, so
        that what the runs taught is in the apps' PDGraphs. Returns the wall seconds waited;
        raises :class:`TimeoutError` after ``timeout_s``."""
        t0 = time.monotonic()
        while True:
            active = 0
            for state in ("queued", "running"):
                r = await self.http.get("/v1/runs", params={"state": state, "limit": 1})
                r.raise_for_status()
                active += len(r.json().get("runs", []))
            if not active:
                break
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"the gateway still had active runs after {timeout_s:g} s")
            await asyncio.sleep(poll_s)
        await asyncio.sleep(2.0)  # stores.learn_interval_s (1 s) and then some
        return time.monotonic() - t0

    async def run(self, arrivals: Sequence[Any], *, progress: bool = True) -> list[Outcome]:
        """Every arrival (``hermes.sim.simulator.Arrival``) as its own client task."""
        from tqdm import tqdm  # type: ignore[import-untyped]

        if self.model is None:
            models = (await self.http.get("/v1/models")).json()
            served = [m["id"] for m in models.get("data", []) if "embed" not in m["id"]]
            if not served:
                raise OSError(f"gateway at {self.url} serves no chat model")
            self.model = served[0]
        bar = tqdm(total=len(arrivals), desc="runs", unit="run", file=sys.stderr,
                   disable=not progress)
        start = time.monotonic() + 0.2
        t0 = min((a.time for a in arrivals), default=0.0)

        async def one(i: int, a: Any) -> Outcome:
            res = await self.run_one(i, a.app, a.seed, a.time - t0, start)
            bar.update(1)
            if res.error:
                bar.write(f"run of {a.app} failed: {res.error}")
            return res

        try:
            return list(await asyncio.gather(*(one(i, a) for i, a in enumerate(arrivals))))
        finally:
            bar.close()


def _acts(outcomes: Sequence[Outcome]) -> dict[str, float]:
    a = np.array([o.act_s for o in outcomes], dtype=float)
    nan = float("nan")
    return {"mean_act_s": float(a.mean()) if a.size else nan,
            "p50_act_s": float(np.percentile(a, 50)) if a.size else nan,
            "p95_act_s": float(np.percentile(a, 95)) if a.size else nan,
            "p99_act_s": float(np.percentile(a, 99)) if a.size else nan}


def _tokens(outcomes: Sequence[Outcome]) -> dict[str, float]:
    """The token demand sent over the app model's (the engine's own count of the prompts)."""
    return {"prompt_tokens_over_model": (sum(o.prompt_tokens for o in outcomes)
                                         / max(1, sum(o.model_input_tokens for o in outcomes))),
            "output_tokens_over_model": (sum(o.completion_tokens for o in outcomes)
                                         / max(1, sum(o.model_output_tokens for o in outcomes)))}


def summarize(outcomes: Sequence[Outcome], mode: str, *, window_min: float, policy: str,
              wall_s: float) -> dict[str, Any]:
    """The JSON object of one ``--identity`` experiment: the ``hermes load`` row fields
    (``mean_act_s``, ``p95_act_s``, ...), the token demand against the app model's, ``apps``
    (the same per app, and whether its runs are conversations) and, for ``infer``,
    ``identity`` (:func:`hermes.bench.identity_score.score`)."""
    ok = [o for o in outcomes if o.error is None and o.act_s is not None]
    row: dict[str, Any] = {"identity_mode": mode, "window_min": window_min, "policy": policy,
                           **_acts(ok), "runs": len(ok), "failed": len(outcomes) - len(ok),
                           "requests": sum(len(o.requests) for o in ok), "wall_s": wall_s,
                           **_tokens(ok)}
    by_app: dict[str, list[Outcome]] = {}
    for o in ok:
        by_app.setdefault(o.app, []).append(o)
    row["apps"] = {a: {"conversation": a in CONVERSATION, "runs": len(os_),
                       **_acts(os_), **_tokens(os_)}
                   for a, os_ in sorted(by_app.items())}
    if mode == "infer":
        row["identity"] = score([p for o in ok for p in o.requests])
        row["runs_not_inferred"] = sum(o.runs_not_inferred for o in ok)
        row["runs_not_found"] = sum(o.runs_not_found for o in ok)
    return row


def app_rows(row: dict[str, Any]) -> list[dict[str, Any]]:
    """One table row per app (and ``all``): ACT, token demand and, for ``infer``, the
    identity figures."""
    ident = row.get("identity") or {}
    keys = ("grouping_precision", "grouping_recall", "adjusted_rand", "unit_accuracy",
            "app_accuracy")
    out = []
    for app, a in [*row["apps"].items(), ("all", row)]:
        r: dict[str, Any] = {"app": app + ("*" if a.get("conversation") else ""),
                             "runs": a["runs"], "mean_act_s": a["mean_act_s"],
                             "p95_act_s": a["p95_act_s"],
                             "prompt/model": a["prompt_tokens_over_model"],
                             "output/model": a["output_tokens_over_model"]}
        got = ident if app == "all" else ident.get("per_app", {}).get(app)
        if got:
            r.update({k: got[k] for k in keys})
            r["inferred_runs"] = got["inferred_runs"]
        out.append(r)
    return out
