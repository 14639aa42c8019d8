"""``python -m hermes.bench.units``: the scheduler's per-unit work for inferred runs, in-process.

Every header-less agent call is a call of an inferred run: the scheduler creates or continues
the run, opens a unit (the policy's ``on_unit_start``, the prewarm planner), the answer
closes it (its service credited, the policy's observation) and the run's last call ends it
(the policy, the planner, the learner's record, the finished-run document, the durable
write). This drives exactly that through a real :class:`~hermes.gateway.scheduler.
LiveScheduler` (not started: no sockets, no node), with its registry, observers, policy and
learner as a serving gateway wires them, and reports the process CPU time per call.

The traffic is the one ``hermes bench ha --scale`` sends the scheduler alone
(``--inferred-turns``): runs of ``turns`` calls of one app, a run's calls ``apart`` calls
apart, units ``step0``/``step1`` alternating; each call here carries a system prompt, so the
planner also plans the next unit's KV prefix (agent traffic through the all-in-one gateway).
First ``warm`` calls teach the app's PDGraph (the learner's refresh, off the loop, as the
gateway runs it) and fill the memos, then the garbage collector is tuned as a serving gateway
tunes it, then ``calls`` calls are timed with :func:`time.process_time`.

It measures the code on ``PYTHONPATH``: to compare two versions, run it from each, alternated
(``PYTHONPATH=../before python -m hermes.bench.units``), on a quiet machine, several times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

APP = "default.syn"
MODEL = "m0"


def run(*, warm: int = 8000, calls: int = 20000, turns: int = 4, apart: int = 200,
        workdir: str | None = None) -> dict[str, Any]:
    """Drive ``warm`` then ``calls`` calls (see the module doc); the figures of the timed
    ones."""
    from hermes.core.state import RequestView
    from hermes.gateway.config import load_config
    from hermes.gateway.looplag import tune_gc
    from hermes.gateway.scheduler import LiveScheduler
    from hermes.gateway.state import PendingRequest
    from hermes.protocol import Done

    if warm < 1 or calls < 1 or turns < 1 or apart < 1:
        raise ValueError("warm, calls, turns and apart must be >= 1")
    tmp = Path(workdir or tempfile.mkdtemp(prefix="hermes-bench-units-"))
    cfg = load_config(None, environ={}, port=0, bind="", kb=str(tmp / "kb"),
                      state_dir=str(tmp / "state"), log_level="warning")
    loop = asyncio.new_event_loop()
    sched = LiveScheduler(cfg)
    reg, disp = sched.registry, sched.dispatch
    body = {"messages": [{"role": "system", "content": "You are a helpful agent."},
                         {"role": "user", "content": "next step"}], "max_tokens": 8}
    block = apart * turns

    def call(i: int) -> None:
        b, j = divmod(i, block)
        turn, k = divmod(j, apart)
        rid = f"run-{b * apart + k}"
        run = (reg.create_run(APP, run_id=rid, inferred=True, lazy_store=True) if turn == 0
               else reg.runs[rid])
        inv = reg.unit_for_request(run, f"step{turn % 2}", f"llm:{MODEL}")
        disp.prewarm.note_request(run.app, inv.unit, body, run.state.tenant)
        now = sched.ctx.now()
        q = f"q{i}"
        view = RequestView(request_id=q, run_id=rid, unit=inv.unit, arrival=now,
                           input_tokens=40)
        req = PendingRequest(request_id=q, run=run, inv=inv, kind="llm", msg=None, view=view,
                             key=(run.state.rank, 0.0, 0.0, 0.0), future=loop.create_future(),
                             model=MODEL, sent_at=now)
        disp.register(req)  # the node's answer, as Dispatcher.handle passes it on:
        disp._on_done(Done(request_id=q, input_tokens=40 + 9 * turn,
                              output_tokens=6 + (i % 7), text="", engine="e0", queue_s=0.0,
                              service_s=0.001))
        if turn == turns - 1:
            reg.finish_run(rid)

    async def go() -> dict[str, Any]:
        # whole blocks: every run of a block ends within it, none is open when timing starts
        blocks = -(-warm // block)
        for b in range(blocks):
            for i in range(b * block, (b + 1) * block):
                call(i)
            if b % 5 == 4:
                await sched.learner.refresh_off_loop()
        await sched.learner.refresh_off_loop()
        if sched.ctx.pool is None or sched.ctx.pool.get(APP) is None:
            raise RuntimeError(f"no PDGraph learned for {APP} after {warm} calls: raise warm")
        i = blocks * block
        tune_gc()  # as a serving gateway does once started
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(calls):
            call(i)
            i += 1
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        return {"calls": calls, "turns": turns, "warm_calls": blocks * block,
                "cpu_us_per_call": round(1e6 * cpu / calls, 1),
                "wall_us_per_call": round(1e6 * wall / calls, 1)}

    try:
        return loop.run_until_complete(go())
    finally:
        sched.learner.close()
        loop.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hermes.bench.units", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warm", type=int, default=8000, help="calls before timing (default 8000)")
    ap.add_argument("--calls", type=int, default=20000, help="calls timed (default 20000)")
    ap.add_argument("--turns", type=int, default=4, help="calls per run (default 4)")
    ap.add_argument("--repeat", type=int, default=1, help="runs, each in a fresh scheduler")
    args = ap.parse_args(argv)
    for _ in range(args.repeat):
        print(json.dumps(run(warm=args.warm, calls=args.calls, turns=args.turns)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
