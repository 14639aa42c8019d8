"""The run count of the compatibility matrix: every agent run of a client, sent with no Hermes
header, must be found as ONE inferred run of the gateway, a different one per agent run.

:class:`RunLog` records the ``X-Hermes-Run`` answer header of every model call through httpx
event hooks (the framework's own client sends what it always sends); :func:`assert_runs`
checks the calls of each agent run against the gateway's runs API. Client subprocesses (the
frameworks with a venv of their own) record the same header and print it back."""

from __future__ import annotations

from collections.abc import Sequence

import httpx

RUN_HEADER = "x-hermes-run"


class RunLog:
    """``X-Hermes-Run`` of every model call, grouped by agent run (:meth:`next_run`)."""

    def __init__(self) -> None:
        self.per_run: list[list[str]] = [[]]

    def next_run(self) -> None:
        """The calls from now on belong to the next agent run."""
        if self.per_run[-1]:
            self.per_run.append([])

    def hook(self, response: httpx.Response) -> None:
        if RUN_HEADER in response.headers:
            self.per_run[-1].append(response.headers[RUN_HEADER])

    async def ahook(self, response: httpx.Response) -> None:
        self.hook(response)

    def client(self) -> httpx.Client:
        return httpx.Client(event_hooks={"response": [self.hook]}, timeout=60)

    def aclient(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(event_hooks={"response": [self.ahook]}, timeout=60)


def assert_runs(base_url: str, per_run: Sequence[Sequence[str]], *, agent_runs: int) -> None:
    """``agent_runs`` agent runs made model calls, each found as exactly one inferred run of
    the gateway (every call of it answered with the same run), no two sharing a run; the
    gateway's record of each run holds one unit invocation per call."""
    per_run = [list(r) for r in per_run if r]
    assert len(per_run) == agent_runs, per_run
    found = [set(r) for r in per_run]
    assert all(len(f) == 1 for f in found), f"an agent run was split: {per_run}"
    ids = [next(iter(f)) for f in found]
    assert len(set(ids)) == agent_runs, f"agent runs were merged: {per_run}"
    gateway = base_url.removesuffix("/v1")
    with httpx.Client(base_url=gateway, timeout=10) as http:
        for rid, calls in zip(ids, per_run, strict=True):
            run = http.get(f"/v1/runs/{rid}").json()
            assert run["inferred"] is True, run
            assert len(run["units"]) == len(calls), (run["units"], calls)
