"""Gateway configuration: ``hermes.toml`` + ``HERMES_*`` environment variables + overrides.

Precedence (last wins): the defaults below, the TOML file, environment variables, keyword
overrides from the CLI. Every key and its default is documented in
``hermes/data/hermes.example.toml`` (``hermes example-config`` prints it).

Environment variables: ``HERMES_<SECTION>__<KEY>`` (e.g. ``HERMES_SCHEDULER__POLICY=vllm``)
or, for keys whose name is unique across sections, ``HERMES_<KEY>`` (e.g. ``HERMES_PORT=9000``,
``HERMES_TIME_SCALE=20``). Values are parsed as JSON when they parse (numbers, booleans,
lists), else taken as strings.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hermes.protocol import DEFAULT_SCHEDULER_ADDRESS

#: the node socket of a gateway without an embedded node (``scheduler.bind`` left empty)
DEFAULT_NODE_BIND = DEFAULT_SCHEDULER_ADDRESS


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerConfig(_Section):
    """HTTP listener."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_level: str = "info"
    #: a connection whose request line and headers are not complete this many seconds after
    #: it opened (or after its previous request) is closed (slow-header clients)
    header_timeout_s: float = Field(default=10.0, gt=0.0)
    #: a request body not complete this many seconds after its headers gets 408 and its
    #: connection is closed (slow-body clients: a byte every few seconds)
    body_timeout_s: float = Field(default=30.0, gt=0.0)
    #: open connections at most (more are answered 503 and closed); 0: three quarters of
    #: the process's file-descriptor limit, so that connections never exhaust it
    max_connections: int = Field(default=0, ge=0)
    #: proxies whose X-Forwarded-For (and -Proto) name the client (addresses or networks,
    #: e.g. ["127.0.0.1"] behind a proxy on this host); empty: the peer address, always
    trusted_proxies: list[str] = Field(default_factory=list)


class SchedulerConfig(_Section):
    """The live scheduler (decision core driver)."""

    policy: str = "hermes"

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        """An unknown policy is refused with the config (naming the file and key, or the
        variable or flag), not later by the scheduler."""
        from hermes.core.policies import policy_names

        if name not in policy_names():
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(policy_names())}")
        return name
    #: fair share across tenants (hermes/core/policies/fair_share.py): a tenant served a
    #: quantum of tokens more than another goes a band behind it, whatever the policy says,
    #: so one tenant's long generations cannot hold another's short requests; "auto": on
    #: with authentication on (tenants are then real), off without
    fair_share: Literal["auto", "on", "off"] = "auto"
    #: the band width, in tokens served (divided by the tenant's weight)
    fair_share_quantum_tokens: float = Field(default=2048.0, gt=0.0)
    #: tenant -> weight of its share (default 1; 2: served twice as much before falling back)
    tenant_weights: dict[str, float] = Field(default_factory=dict)
    k: float = Field(default=0.5, ge=0.0, le=1.0)
    #: engine choice among the engines serving a model (hermes.core.routing):
    #: least-loaded | prefix | session | hermes
    router: Literal["least-loaded", "prefix", "session", "hermes"] = "least-loaded"
    #: prompt tokens the router's approximate prefix index keeps per engine
    router_index_tokens: int = Field(default=200_000, ge=1)
    #: prewarm strategy: hermes (planner with K) | epwq | lru | none
    prewarm: str = "hermes"
    #: how the planner's start time follows from K: late (p_s P(t_c <= t_s + t_p) = K: a lower
    #: K also starts earlier, a monotone knob) | ready (p_s P(t_c > t_s + t_p) = K, as first
    #: specified)
    prewarm_timing: Literal["ready", "late"] = "late"
    #: a KV-prefix prewarm is not sent when a unit whose requests carried that prefix ended
    #: less than this many seconds ago (wall clock): the engine still holds its blocks, at
    #: the recent end of its prefix cache's LRU; a prefill would only cost the engine and the
    #: gateway a request. 0: send it anyway (only a running unit's prefix is held)
    prewarm_kv_recent_s: float = Field(default=1.0, ge=0.0)
    #: the planner's timer fires on a grid of this many wall seconds: prewarms due within one
    #: tick start (or are released) together, at most this late; 0: at each one's own time
    #: (one event-loop wake-up each, ~2 per agent request once its app has a graph)
    prewarm_tick_s: float = Field(default=0.005, ge=0.0, le=1.0)
    seed: int = 0
    #: ZeroMQ ROUTER address that external HermesLets connect to (``--bind``); "" (default):
    #: none while the embedded node serves, ``tcp://127.0.0.1:5557`` without it
    bind: str = ""
    #: run one HermesLet inside the gateway process (linked directly: hermes.inproc)
    embedded_node: bool = True
    #: cost model used to turn tokens into service seconds (estimator, attained service)
    cost_model: str = "llama2-7b-a100"
    n_walks: int = Field(default=1000, ge=1)
    refine: bool = True
    min_match: int = Field(default=20, ge=1)
    #: the simulated engine and the scheduler clock run this many times faster than wall time
    time_scale: float = Field(default=1.0, gt=0.0)
    #: how often (wall seconds) every queued request's key is recomputed and changes resent
    rekey_interval_s: float = Field(default=0.5, gt=0.0)
    #: resubmissions of a request whose node reported a retryable failure
    max_retries: int = Field(default=2, ge=0)
    #: a client-driven run with nothing in flight for this long (wall s) is finished
    run_idle_timeout_s: float = Field(default=600.0, gt=0.0)
    #: model used for requests/hosted-app steps naming a model no engine serves ("" = the
    #: first engine's model); OpenAI requests naming an unknown model get 404 unless
    #: ``route_unknown_models``
    default_model: str = ""
    route_unknown_models: bool = False
    #: finished runs kept in memory for GET /v1/runs/{id}
    keep_finished_runs: int = Field(default=10_000, ge=1)
    #: wall s a request may take in all (a streamed one: between two chunks) before it is
    #: cancelled at its node and fails
    request_timeout_s: float = Field(default=600.0, gt=0.0)

    @model_validator(mode="after")
    def _node_socket(self) -> SchedulerConfig:
        """Remote nodes only (no embedded node) need the TCP node socket: bind the default."""
        if not self.embedded_node and not self.bind:
            self.bind = DEFAULT_NODE_BIND
        return self


class StoresConfig(_Section):
    """Knowledge base and local state."""

    #: PDGraph knowledge base: "shipped" (the PDGraphs shipped with Hermes), a directory of
    #: PDGraph JSON files, or redis://HOST:PORT/DB
    kb: str = "shipped"
    #: where run records (records.jsonl) are appended
    #: "" (default): the user data directory (platformdirs: ~/.local/share/hermes on Linux)
    state_dir: str = ""
    #: write the learned PDGraph back to the knowledge base once an app has N new finished
    #: runs (0: never write back; the estimator is updated anyway)
    kb_write_every: int = Field(default=1, ge=0)
    #: how often (wall s) learned PDGraphs are rebuilt for the estimator and written back;
    #: also how long the request path reuses a knowledge-base read of an app this process
    #: has not learned (found or not: ``Learner.serving_graph``)
    learn_interval_s: float = Field(default=1.0, gt=0.0)
    #: an app's graph is rebuilt by the learning loop once its new finished runs reach this
    #: fraction of the runs it was last built from (every run while it has fewer than
    #: ``learn_every_run_below``), at most ``learn_max_new_runs`` apart: a version costs a
    #: rebuild, a new estimator and its walks drawn again, so an app with a long history
    #: changes version ever more rarely (its sample lists hold the last 1000 runs anyway)
    learn_growth: float = Field(default=0.5, ge=0.0)
    learn_every_run_below: int = Field(default=8, ge=1)
    learn_max_new_runs: int = Field(default=5000, ge=1)
    #: a busy app is learned from a random sample of its runs: once this process has learned
    #: ``learn_sample_after`` runs of it (1000: its profiler's sample lists are full), about
    #: ``learn_runs_per_s`` of its finished runs per (wall) second are recorded and profiled,
    #: each kept with probability ``learn_runs_per_s`` / the app's run-end rate over the last
    #: second; the others are counted (``hermes_runs_sampled_out_total``) and not recorded. A
    #: graph is built from the last 1000 runs learned, versions up to ``learn_max_new_runs``
    #: runs apart: most runs of an app ending hundreds a second were overwritten before any
    #: graph read them, and learning each cost the HA scheduler ~15% of its CPU at 625 runs
    #: a second (2,500 calls in runs of 4; docs/ha.md). 0: learn every run
    learn_runs_per_s: float = Field(default=50.0, ge=0.0)
    learn_sample_after: int = Field(default=1000, ge=0)
    #: apps whose profiler, learned graph and estimator stay in memory (least recently
    #: learned out past it; its graph stays in the knowledge base, and is loaded again when
    #: a run of it finishes)
    max_learned_apps: int = Field(default=2000, ge=1)
    #: memoized demand samples of all apps together (MiB). 128: 50 learned apps of agent
    #: traffic keep ~95 MiB of walks hot after 50,000 requests; at 64 the memo evicted and
    #: redrew ~40 states per 1,000 requests (~0.1 ms of CPU per request), at 128 ~4
    #: (docs/performance.md)
    sample_cache_mb: float = Field(default=128.0, gt=0.0)


class EngineConfig(_Section):
    """One engine of the embedded HermesLet."""

    name: str = "sim0"
    kind: Literal["sim", "openai", "vllm"] = "sim"
    model: str = "llama-2-7b"
    #: cost model of a ``sim`` engine
    cost_model: str = "llama2-7b-a100"
    #: ``sim``: KV capacity in GB of one block pool for running requests and cached prefixes
    #: (``hermeslet run --kv-cache-gb``); 0: the LRU of whole prefixes
    kv_cache_gb: float = Field(default=0.0, ge=0)
    #: ``sim`` with ``kv_cache_gb``: host-memory tier for evicted prefixes, GB
    cpu_cache_gb: float = Field(default=0.0, ge=0)
    #: URL of an ``openai``/``vllm`` engine server
    url: str = ""
    max_inflight: int = Field(default=32, ge=1)
    #: hold a request in the node's queue until its whole prompt fits in the engine's KV
    #: beside the prompts already released (hermes/core/kv_gate.py)
    kv_gate: bool = False
    #: the gate's budget in tokens; 0: the engine's KV capacity (a ``sim`` engine's; a vLLM
    #: server's from its ``/metrics`` ``vllm:cache_config_info``, once read)
    kv_gate_tokens: int = Field(default=0, ge=0)
    loras: list[str] = Field(default_factory=list)
    #: ``generate`` (chat and text completions) or ``embed`` (``/v1/embeddings``; a ``sim``
    #: engine then serves the built-in deterministic embedding model)
    task: Literal["generate", "embed"] = "generate"
    #: Anthropic's ``/v1/messages``: ``translate`` it to chat completions for this engine, or
    #: pass it ``native`` (an ``openai``/``vllm`` server that serves ``/v1/messages``, as vLLM
    #: does); a ``sim`` engine always translates
    messages_api: Literal["translate", "native"] = "translate"

    @model_validator(mode="after")
    def _native_needs_a_server(self) -> EngineConfig:
        if self.messages_api == "native" and self.kind == "sim":
            raise ValueError(f"engine {self.name!r}: messages_api = \"native\" needs an "
                             "openai or vllm engine (a sim engine answers /v1/messages "
                             "translated)")
        return self


class AppsConfig(_Section):
    """Hosted applications."""

    #: Python modules defining hosted apps (``--apps MODULE``)
    modules: list[str] = Field(default_factory=list)
    #: load hosted apps from the ``hermes.apps`` entry-point group
    entry_points: bool = True
    #: host the ten benchmark apps (input: {"seed": int})
    benchmark: bool = True


class ToolsConfig(_Section):
    """Tool calls of hosted benchmark apps."""

    #: "simulate": docker/dnn/api steps sleep their duration; "runner": docker steps are sent
    #: to a HermesLet tool runner (needs a node that announces a tool runner)
    docker_steps: Literal["simulate", "runner"] = "simulate"
    #: default timeout of a tool call (s)
    timeout_s: float = Field(default=30.0, gt=0.0)
    #: UNSAFE, local development only: without a sandbox (bubblewrap or Docker) the embedded
    #: node runs tool code as a plain subprocess of the gateway (its user, files, network);
    #: refused with a host other than loopback (``--unsafe-unsandboxed-tools``)
    unsafe_unsandboxed: bool = False
    #: where the embedded node makes one cgroup per tool call (memory and process limits
    #: of the whole call, enforced by the kernel): "auto" (detect: cgroup v2, then v1), a
    #: delegated cgroup v2 directory, or "off" (per-process rlimits only: a loud fallback)
    cgroup_root: str = "auto"
    #: memory (bytes, all processes of a call together) and processes per tool call
    memory_bytes: int = Field(default=1 << 30, ge=16 << 20)
    max_processes: int = Field(default=64, ge=4)


class SecurityConfig(_Section):
    """Authentication, admission limits and ZeroMQ CURVE (see ``hermes/gateway/auth.py``)."""

    #: JSON auth file with hashed API keys (``hermes keys create``); "" = no file
    auth_file: str = ""
    #: Redis URL holding the hashed API keys instead of a file
    auth_redis: str = ""
    #: with an auth file (or Redis) that holds no key yet: create one API key for this tenant
    #: at start and print it once on stdout ("" = never). The container image sets it, so its
    #: first start serves with authentication and says which key to use
    first_key_tenant: str = ""
    #: request bodies over this many bytes get 413
    max_body_bytes: int = Field(default=4 << 20, ge=1024)
    #: default per-tenant limits (the auth file's ``tenants`` override them); 0 = unlimited
    tenant_rate: float = Field(default=0.0, ge=0)
    tenant_burst: float = Field(default=0.0, ge=0)
    tenant_max_concurrent: int = Field(default=0, ge=0)
    #: default per-tenant requests in any 60 s (a sliding window, exact); 0 = unlimited
    tenant_rpm: int = Field(default=0, ge=0)
    tenant_max_active_runs: int = Field(default=0, ge=0)
    #: request bodies of one tenant being read at once (more: 429 before reading), so that
    #: slow bodies of one tenant cannot hold the gateway's connections; 0 = unlimited
    tenant_max_uploads: int = Field(default=64, ge=0)
    #: directory from ``hermes keys curve``: HermesLets (and, split, edges) must
    #: authenticate with CURVE (hermes/security/curve.py)
    curve_dir: str = ""
    #: ``--role edge`` with CURVE: this edge's certificate (``DIR/edges/NAME.key_secret``,
    #: ``hermes keys curve --dir DIR --edge NAME``)
    curve_key: str = ""
    #: bearer token ``GET /metrics`` requires (``Authorization: Bearer TOKEN``); "" = open
    #: with authentication off, and the admin token's alone with it on
    metrics_token: str = ""
    #: with authentication on, loopback clients may use ``/admin`` without the admin token
    #: (off: the admin token, always; behind a reverse proxy on the same host every client
    #: is loopback, so leave it off there)
    admin_loopback: bool = False
    #: with authentication on, ``/metrics`` labels series with tenant names (off: every
    #: tenant is ``other``, so that a scrape does not list the tenants)
    metrics_tenants: bool = False


class TracingConfig(_Section):
    """OpenTelemetry traces of runs (:mod:`hermes.gateway.tracing`; the ``tracing`` extra).
    Also on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set; the
    other ``OTEL_*`` variables (headers, ``OTEL_BSP_*`` queue and batch sizes,
    ``OTEL_SERVICE_NAME``) apply as the SDK reads them."""

    enabled: bool = False
    #: ``otlp`` (to ``endpoint``), ``memory`` (kept in the process: tests), ``none`` (spans
    #: made, then dropped: what tracing costs the gateway without a receiver)
    exporter: Literal["otlp", "memory", "none"] = "otlp"
    #: the OTLP receiver, e.g. ``http://127.0.0.1:4318`` (empty: the ``OTEL_EXPORTER_OTLP_*``
    #: variables, else the SDK's default ``http://localhost:4318``)
    endpoint: str = ""
    #: ``http/protobuf`` or ``grpc`` (empty: ``OTEL_EXPORTER_OTLP_PROTOCOL``, else HTTP)
    protocol: Literal["", "http/protobuf", "grpc"] = ""
    service_name: str = "hermes-gateway"
    #: export prompts, completions, tool code and output (off: never exported)
    capture_content: bool = False
    #: make and export the spans in a process of their own (the SDK's CPU off the gateway's);
    #: false: in a thread of the gateway (the ``memory`` exporter always is)
    process: bool = True


class PlacementConfig(_Section):
    """The gateway re-places its models on its nodes' GPUs by itself (issue 22;
    :mod:`hermes.gateway.placer`): SeaLLM's adaptive re-placement fed by the PDGraph forecast."""

    #: re-place by itself: forecast, place, send the plan to the nodes that accept plans
    #: (the embedded node does with this on; ``hermeslet run --accept-placement``)
    auto: bool = False
    #: GPUs of each node and their type (``hermes plan placement --gpus/--device``)
    gpus: int = Field(default=8, ge=1, le=1024)
    device: str = "A100-80"
    #: first interval between re-placements (scheduler s); it then adapts (SeaLLM, beta)
    interval_s: float = Field(default=300.0, gt=0.0)
    min_interval_s: float = Field(default=30.0, gt=0.0)
    max_interval_s: float = Field(default=3600.0, gt=0.0)
    beta: float = Field(default=0.1, gt=0.0, lt=1.0)
    #: the forecast's horizon and the window of the apps' arrival rates (scheduler s)
    horizon_s: float = Field(default=60.0, gt=0.0, le=86_400.0)
    window_s: float = Field(default=300.0, gt=0.0, le=86_400.0)
    #: the planner's model for a served model name where the two differ
    model_map: dict[str, str] = Field(default_factory=dict)
    #: tensor-parallel sizes tried, and services sharing one GPU group at most
    tps: list[int] = Field(default_factory=lambda: [1, 2, 4], min_length=1)
    max_per_group: int = Field(default=2, ge=1)
    #: a new plan replaces the one in force only when it scores this fraction better (a
    #: re-placement pauses the groups that change and drops their KV; 0: the paper's rule)
    min_gain: float = Field(default=0.1, ge=0.0, lt=1.0)
    #: candidate plans are scored on the mean over this many simulated request streams (the
    #: search runs in a separate process; its time grows with this)
    draws: int = Field(default=8, ge=1, le=64)
    #: how long the embedded node waits for a drained engine's requests before failing them
    #: (retryable unless tokens were streamed) and going on (``hermeslet run --drain-timeout``)
    drain_timeout_s: float = Field(default=300.0, gt=0.0)

    @model_validator(mode="after")
    def _check(self) -> PlacementConfig:
        from hermes.core.cluster.devices import get_device

        get_device(self.device)  # ValueError naming the known devices
        if self.min_interval_s > self.max_interval_s:
            raise ValueError("min_interval_s must be <= max_interval_s")
        if any(t < 1 or t & (t - 1) for t in self.tps):
            raise ValueError(f"tps must be powers of two, got {self.tps}")
        return self


class DurabilityConfig(_Section):
    """Durable run state (``hermes/gateway/durable.py``)."""

    #: keep accepted runs and their progress across restarts
    durable: bool = True
    #: Redis URL for run state (default: SQLite in the state directory)
    state_redis: str = ""
    #: after a restart, how long (wall s) to wait for HermesLets to report what they hold
    recovery_grace_s: float = Field(default=5.0, ge=0.0)
    #: how long (s) the writes of ended one-request and inferred runs (their answers have
    #: left) and, without ``[cluster] store``, the creation of inferred runs are gathered
    #: into one transaction or round trip; 0 = those of one event-loop iteration. A crash
    #: loses at most this window of them (history entries, not accepted work: without a
    #: shared store the resolver's index is lost in a crash, so an inferred run's next turn
    #: starts a new run either way); other active runs' writes are never delayed by it
    batch_s: float = Field(default=0.01, ge=0.0, le=1.0)


class ClusterConfig(_Section):
    """``[cluster]``: state that must be exact across several gateway processes (edges),
    kept in a shared store (:mod:`hermes.gateway.shared`): per-tenant admission (rate,
    per-minute and in-flight limits), idempotency keys, stored Responses and the run
    resolver's evidence index. Empty ``store``: one process, everything in memory."""

    #: the shared store, ``redis://HOST:PORT/DB``; "" = none (single process, in memory)
    store: str = ""
    #: key prefix in the shared store (several clusters may share one Redis)
    store_prefix: str = "hermes:"
    #: what an edge does when the shared store does not answer: ``refuse`` (503
    #: ``store_unavailable``) or ``admit-local`` (admit by this process's own in-memory
    #: limits, per instance); either way it is counted in
    #: ``hermes_shared_store_unavailable_total`` and logged
    store_unavailable: Literal["refuse", "admit-local"] = "refuse"
    #: socket timeout of a shared-store command (s): a store that answers slower is
    #: unavailable for that request (and, after 3 such in a row, down for a second)
    store_timeout_s: float = Field(default=1.0, gt=0.0, le=30.0)
    #: an edge (``--role edge``) without ``store`` enforces tenant admission limits
    #: (``security.tenant_rate``/``tenant_rpm``/``tenant_max_concurrent``, a key store's
    #: ``tenants``) in its own memory: N edges admit N times each limit. It refuses to
    #: start so unless this is true (one edge, or limits meant as approximate): then it
    #: starts, logs a WARNING and exports ``hermes_edge_per_instance_limits 1``. No effect
    #: on the all-in-one process, a scheduler, or with ``store`` set
    per_edge_limits: bool = False

    @field_validator("store")
    @classmethod
    def _redis_url(cls, v: str) -> str:
        if v and not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"expected a redis://, rediss:// or unix:// URL, got {v!r}")
        return v


#: URL schemes of an election store (``[ha] election``): Redis, or etcd (the ``ha-etcd`` extra);
#: :mod:`hermes.gateway.ha.backends` maps each to its store
ELECTION_SCHEMES: tuple[str, ...] = ("redis", "rediss", "unix", "etcd", "etcds")


class HAConfig(_Section):
    """``[ha]``: several schedulers, one active, chosen by a lease (``hermes/gateway/ha``);
    off by default (one scheduler, no election)."""

    #: the store holding the lease (``--ha``): ``redis://HOST:PORT/DB`` or
    #: ``etcd://HOST:PORT`` (``etcds://`` with TLS); "": no election
    election: str = ""
    #: the lease's time to live and how often its holder renews it (wall s): a dead leader
    #: is replaced within about ``lease_ttl_s``
    lease_ttl_s: float = Field(default=1.5, gt=0.0)
    lease_renew_s: float = Field(default=0.3, gt=0.0)
    #: this scheduler's name in the leader record ("": host:pid)
    member: str = ""
    #: which part of the gateway this process runs (``hermes serve --role``): ``all`` (the
    #: HTTP edge and the scheduler in one process, the default), ``edge`` (HTTP only: calls go
    #: to the active scheduler, found in the lease record; answers come from the nodes) or
    #: ``scheduler`` (ranking, runs, dispatch, node sockets; takes calls from edges on
    #: ``edge_bind``). ``edge`` and ``scheduler`` need ``election`` (docs/ha.md)
    role: Literal["all", "edge", "scheduler"] = "all"
    #: a scheduler's ZeroMQ address for edges (``--edge-bind``, e.g. ``tcp://0.0.0.0:5560``),
    #: advertised in the lease record; "": none (edges cannot use this scheduler)
    edge_bind: str = ""
    #: the host others reach this process by, put in place of ``0.0.0.0``/``*`` in the
    #: addresses it advertises (a scheduler's ``edge_bind``, an edge's ``scheduler.bind``
    #: where nodes send answers); "": the address as bound
    advertise: str = ""

    @field_validator("election")
    @classmethod
    def _election_url(cls, v: str) -> str:
        if v and ("://" not in v or v.split("://", 1)[0] not in ELECTION_SCHEMES):
            raise ValueError(f"[ha] election must be a URL of an election store, one of "
                             f"{', '.join(s + '://' for s in ELECTION_SCHEMES)} (Redis or "
                             f"etcd), got {v!r}")
        return v

    def advertised(self, address: str) -> str:
        """``address`` as others should dial it (``advertise`` for a wildcard host)."""
        if self.advertise:
            for wild in ("//0.0.0.0:", "//*:"):
                if wild in address:
                    return address.replace(wild, f"//{self.advertise}:")
        return address


#: session headers that agent tools and gateways send, strongest first (sources: the
#: docstring of :mod:`hermes.gateway.resolve`)
DEFAULT_SESSION_HEADERS: tuple[str, ...] = (
    "x-session-id",              # OpenRouter (equivalent of its `session_id` field), opencode, LLM Gateway
    "x-opencode-session",        # OpenCode Zen / Go
    "x-session-affinity",        # opencode with other providers, LLM Gateway
    "session_id",                # OpenAI Codex CLI (Responses API)
    "conversation_id",           # OpenAI Codex CLI (older versions)
    "x-claude-code-session-id",  # Claude Code
    "helicone-session-id",       # Helicone sessions
    "x-portkey-trace-id",        # Portkey traces
    "x-cagent-session-id",       # Docker cagent models gateway
    "x-conversation-id",
    "x-thread-id",
)

#: top-level body fields naming a session
DEFAULT_SESSION_FIELDS: tuple[str, ...] = (
    "litellm_session_id",  # LiteLLM proxy session logs (extra_body)
    "session_id",          # OpenRouter broadcast / ChatOpenRouter(session_id=...)
    "conversation",        # OpenAI Responses API: "conv_..." or {"id": "conv_..."}
)

#: keys of the OpenAI ``metadata`` object naming a session
DEFAULT_METADATA_KEYS: tuple[str, ...] = (
    "session_id",          # LiteLLM -> Langfuse, claude-code-hub and others
    "sessionId",
    "litellm_session_id",
    "conversation_id",
    "thread_id",
    "trace_id",            # Langfuse / LiteLLM trace grouping
    "run_id",
)

#: body fields that name a user or a cache partition rather than a session: weak evidence,
#: used only for a request that carries a history no indexed conversation matches
DEFAULT_AFFINITY_FIELDS: tuple[str, ...] = ("user", "safety_identifier", "prompt_cache_key")


class IdentityConfig(_Section):
    """``[identity]``: how the run resolver (:mod:`hermes.gateway.resolve`) finds (tenant,
    app, run, unit) in plain traffic. Every list is an ordered evidence list (the first name
    present in a request wins); every cap bounds memory whatever clients send (issue 17,
    item 4): the defaults keep the resolver's state to a few tens of megabytes at most."""

    #: infer runs, apps and units from plain traffic; off: every request without Hermes
    #: headers is a one-request run of app ``default`` (the per-request baseline)
    infer: bool = True
    #: use the explicit ids clients send (session headers, body fields, metadata keys,
    #: ``previous_response_id``); off: only Hermes headers and conversation continuation
    explicit_ids: bool = True
    #: join a request to the run whose answered conversation it continues (also when its
    #: history rewrote Hermes' replies, e.g. as text: it begins with a request Hermes answered)
    continuation: bool = True
    #: join a request to the run Hermes issued the tool-call ids it quotes to (in
    #: ``tool_calls``, ``tool_call_id``, or text matching ``call_id_pattern``)
    call_ids: bool = True
    #: what a tool-call id looks like in text (OpenAI ``call_``, vLLM ``chatcmpl-tool-``,
    #: Anthropic ``toolu_``, Responses ``fc_``); read in user and assistant messages only
    call_id_pattern: str = r"\b(?:call|toolu|fc|chatcmpl-tool)[_-][A-Za-z0-9_-]{8,64}"
    #: quoted tool-call ids looked up per request (most recent first)
    max_quoted_call_ids: int = Field(default=32, ge=1, le=1024)
    #: header names (case-insensitive), first present wins
    session_headers: list[str] = Field(default_factory=lambda: list(DEFAULT_SESSION_HEADERS))
    session_fields: list[str] = Field(default_factory=lambda: list(DEFAULT_SESSION_FIELDS))
    metadata_keys: list[str] = Field(default_factory=lambda: list(DEFAULT_METADATA_KEYS))
    affinity_fields: list[str] = Field(default_factory=lambda: list(DEFAULT_AFFINITY_FIELDS))
    #: a ``user`` / ``metadata.user_id`` value containing this marker carries a session id
    #: after it (Claude Code's ``user_<hash>_account_<uuid>_session_<uuid>``); "" = off
    user_session_marker: str = "_session_"
    #: ids longer than this (characters) are ignored, as are empty ones
    max_id_len: int = Field(default=256, ge=8, le=4096)

    # ---- the evidence index (answered conversations, response ids, sessions)
    #: entries kept for all tenants together (oldest tenant's oldest entry out first); about
    #: 270 bytes each (measured), so the default holds ~27 MB at most
    index_max_entries: int = Field(default=100_000, ge=16)
    #: entries kept for one tenant (its oldest out first)
    index_max_per_tenant: int = Field(default=50_000, ge=16)
    #: an entry older than this (clock seconds) is forgotten
    index_ttl_s: float = Field(default=3600.0, gt=0.0)
    #: open inferred runs tracked; past it the least recently active is closed
    max_open_runs: int = Field(default=50_000, ge=16)

    # ---- apps and units
    #: apps remembered (fingerprint -> name); past it the least recently seen is forgotten
    max_apps: int = Field(default=10_000, ge=16)
    #: with authentication on, shared apps (names without a ``TENANT.`` part) learn from
    #: tenants' runs too; off (default): only from the admin's, so one tenant cannot skew
    #: the demand model that ranks every tenant's runs (a tenant's own apps learn from it)
    learn_shared_from_tenants: bool = False
    #: units remembered for all apps together
    max_units: int = Field(default=100_000, ge=16)
    #: characters of a user turn looked at for its template (its head)
    template_max_chars: int = Field(default=2000, ge=64)
    #: lines of a user turn looked at for its template
    template_max_lines: int = Field(default=8, ge=1, le=64)
    #: drain3: similarity threshold, tree depth, children per node, clusters per tenant
    drain_sim_th: float = Field(default=0.5, gt=0.0, le=1.0)
    drain_depth: int = Field(default=4, ge=3, le=8)
    drain_max_children: int = Field(default=16, ge=2, le=1000)
    drain_max_clusters: int = Field(default=1000, ge=16)
    #: tenants with a template miner of their own (least recently used dropped past it)
    max_miner_tenants: int = Field(default=1000, ge=1)

    # ---- run end (idle close) for inferred runs
    #: close an inferred run idle for p99(gaps) x margin, within [min, max]
    close_margin: float = Field(default=2.0, ge=1.0)
    close_min_s: float = Field(default=5.0, gt=0.0)
    close_max_s: float = Field(default=600.0, gt=0.0)
    #: idle close while an app has fewer than ``close_min_gaps`` observed gaps (never sooner
    #: than ``close_margin`` x the longest gap already seen)
    close_prior_s: float = Field(default=60.0, gt=0.0)
    close_min_gaps: int = Field(default=20, ge=1)
    #: gaps kept per app (newest)
    gap_samples: int = Field(default=1000, ge=16)
    #: after this many closed runs of an app without one continuation (one-shot traffic),
    #: its runs close ``close_min_s`` after their answer instead of waiting for gaps
    one_shot_runs: int = Field(default=20, ge=1)
    #: a request the edge never reported answered stops holding its run open after this
    max_busy_s: float = Field(default=3600.0, gt=0.0)
    #: fan-outs: a first-turn request of a program of independent prompts (an app whose runs
    #: have shown no conversation continuation, and a dataflow continuation or
    #: ``one_shot_runs`` one-request runs) joins the open fan-out run of the same app and
    #: tenant whose last request came at most this many clock seconds before it (a program
    #: sending independent prompts at once, e.g. a map step); 0: off. Requests of
    #: *different* users of such an app that co-arrive this closely are grouped too, unless
    #: their ``user`` / ``safety_identifier`` / ``prompt_cache_key`` differ
    fanout_window_s: float = Field(default=0.05, ge=0.0)
    #: a fan-out run takes at most this many requests, over at most ``fanout_max_age_s``
    #: from its first
    fanout_max_requests: int = Field(default=64, ge=2)
    fanout_max_age_s: float = Field(default=1.0, gt=0.0)

    # ---- dataflow: a prompt holding a passage of a reply continues that reply's run
    #: on/off (:mod:`hermes.gateway.resolve.dataflow`)
    dataflow: bool = True
    #: a reply line shorter than this (characters, whitespace collapsed) is not a passage:
    #: short lines ("Sure:", "7") are common to unrelated runs
    dataflow_min_chars: int = Field(default=40, ge=8)
    #: a passage longer than this is also indexed by its head (an output cut to fit a prompt)
    dataflow_head_chars: int = Field(default=256, ge=16)
    #: passages indexed per reply at most (its first ones)
    dataflow_max_passages: int = Field(default=16, ge=1, le=1024)
    #: characters of a request's text scanned for passages at most
    dataflow_max_scan_chars: int = Field(default=65_536, ge=256)
    #: the passage index, apart from the evidence index (so that passages never evict a
    #: conversation's digests): entries in all, per tenant, and their lifetime (a program's
    #: next stage follows its outputs within seconds to minutes)
    dataflow_max_entries: int = Field(default=100_000, ge=16)
    dataflow_max_per_tenant: int = Field(default=50_000, ge=16)
    dataflow_ttl_s: float = Field(default=900.0, gt=0.0)

    @field_validator("session_headers")
    @classmethod
    def _lower(cls, v: list[str]) -> list[str]:
        return [h.lower() for h in v]

    @field_validator("call_id_pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"not a regular expression: {e}") from None
        return v

    def bounds(self) -> tuple[float, float]:
        """``(close_min_s, close_max_s)``, the max never below the min."""
        return self.close_min_s, max(self.close_min_s, self.close_max_s)


class GatewayConfig(_Section):
    """Everything ``hermes serve`` needs."""

    server: ServerConfig = Field(default_factory=ServerConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    stores: StoresConfig = Field(default_factory=StoresConfig)
    #: the embedded default: the built-in engine playing LLaMA-2-7B, and a built-in
    #: embedding model beside it
    engines: list[EngineConfig] = Field(default_factory=lambda: [
        EngineConfig(), EngineConfig(name="embed0", model="sim-embed", task="embed")])
    apps: AppsConfig = Field(default_factory=AppsConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    durability: DurabilityConfig = Field(default_factory=DurabilityConfig)
    identity: IdentityConfig = Field(default_factory=IdentityConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    ha: HAConfig = Field(default_factory=HAConfig)

    @model_validator(mode="after")
    def _ha_needs_shared_state(self) -> GatewayConfig:
        """Elected schedulers share their runs through Redis and serve remote nodes: a
        standby that takes over must find the accepted runs and the nodes' work."""
        role = self.ha.role
        if role != "all" and not self.ha.election:
            raise ValueError(f"[ha] role = {role!r} needs the election store (--ha URL, "
                             "Redis or etcd): edges find the active scheduler in its lease record")
        if role == "scheduler" and not self.ha.edge_bind:
            raise ValueError("[ha] role = 'scheduler' needs [ha] edge_bind (--edge-bind "
                             "tcp://HOST:PORT): the address edges send their calls to")
        if role == "edge":
            if not self.scheduler.bind:
                raise ValueError("[ha] role = 'edge' needs --bind tcp://HOST:PORT: the address "
                                 "nodes send this edge's answers to")
            self._curve_keys_present()
            return self
        self._curve_keys_present()
        if self.ha.election:
            if self.scheduler.embedded_node:
                raise ValueError("[ha] election needs remote HermesLets (scheduler.embedded_node"
                                 " = false, HERMES_EMBEDDED_NODE=false): an embedded node dies "
                                 "with its scheduler")
            if not self.durability.state_redis:
                raise ValueError("[ha] election needs the run state in Redis (--redis URL): "
                                 "the standby that takes over restores the accepted runs")
            if not self.durability.durable:
                raise ValueError("[ha] election needs durability.durable = true")
            from hermes.core.lease import LeaseTerms

            LeaseTerms(ttl_s=self.ha.lease_ttl_s, renew_s=self.ha.lease_renew_s)
        return self

    def _curve_keys_present(self) -> None:
        """With CURVE, the files this role's sockets need exist: refused at start, naming
        each missing file (a standby would otherwise fail only when it is elected)."""
        sec = self.security
        if not sec.curve_dir:
            if sec.curve_key:
                raise ValueError("[security] curve_key (--curve-key) needs curve_dir "
                                 "(--curve-dir): the scheduler's public key and the nodes "
                                 "allowed in are there")
            return
        from hermes.security.curve import edge_key_problems, scheduler_key_problems

        role = self.ha.role
        problems = (edge_key_problems(sec.curve_dir, sec.curve_key) if role == "edge" else
                    scheduler_key_problems(sec.curve_dir, edges=role == "scheduler"))
        if problems:
            raise ValueError(f"CURVE ([security] curve_dir = {sec.curve_dir!r}, role "
                             f"{role!r}): " + "; ".join(problems))

    @model_validator(mode="after")
    def _placement_keeps_real_engines(self) -> GatewayConfig:
        """``placement.auto`` makes the embedded node re-place its models with built-in
        simulated engines (the planner's costs): an ``openai`` or ``vllm`` generation engine
        configured for it would be drained and replaced by a simulation, answers and all.
        Refused, naming the engine; real engines take plans through ``hermeslet run
        --accept-placement --placement-engine vllm``."""
        if self.placement.auto and self.scheduler.embedded_node:
            real = [f"{e.name} ({e.kind})" for e in self.engines
                    if e.task == "generate" and e.kind != "sim"]
            if real:
                raise ValueError(
                    "placement.auto with the embedded node re-places its models with built-in "
                    f"simulated engines, which would replace {', '.join(real)}; serve real "
                    "engines from `hermeslet run --accept-placement --placement-engine vllm` "
                    "(scheduler.embedded_node = false), or leave placement.auto off")
        return self


class ConfigError(ValueError):
    """The configuration is invalid; the message names the source and the key."""


_SECTIONS: dict[str, type[_Section]] = {
    "server": ServerConfig,
    "scheduler": SchedulerConfig,
    "stores": StoresConfig,
    "apps": AppsConfig,
    "tools": ToolsConfig,
    "security": SecurityConfig,
    "durability": DurabilityConfig,
    "identity": IdentityConfig,
    "placement": PlacementConfig,
    "cluster": ClusterConfig,
    "tracing": TracingConfig,
    "ha": HAConfig,
}


def _unique_keys() -> dict[str, str]:
    """Key name -> section, for keys that appear in exactly one section."""
    seen: dict[str, list[str]] = {}
    for sec, model in _SECTIONS.items():
        for key in model.model_fields:
            seen.setdefault(key, []).append(sec)
    return {k: v[0] for k, v in seen.items() if len(v) == 1}


def _parse_env_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _deep_merge(base: dict, extra: Mapping) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _place(flat: Mapping[str, Any], source: str) -> dict:
    """Turn ``{key|section.key|section: {...}: value}`` into the nested config layout."""
    unique = _unique_keys()
    out: dict[str, Any] = {}
    for raw_key, value in flat.items():
        key = raw_key.lower()
        if key == "apps" and isinstance(value, list | tuple):  # CLI: --apps MODULE (repeatable)
            out = _deep_merge(out, {"apps": {"modules": list(value)}})
        elif key in _SECTIONS or key == "engines":
            out = _deep_merge(out, {key: value})
        elif "." in key:
            sec, sub = key.split(".", 1)
            out = _deep_merge(out, {sec: {sub: value}})
        elif key in unique:
            out = _deep_merge(out, {unique[key]: {key: value}})
        else:
            raise ConfigError(f"{source}: unknown or ambiguous key {raw_key!r}")
    return out


def _env_layer(environ: Mapping[str, str], origin: dict[str, str] | None = None) -> dict:
    """The ``HERMES_*`` variables that are configuration keys (``HERMES_SECTION__KEY``, or
    ``HERMES_KEY`` for a key that is in one section only), in the nested layout; ``origin``
    gets ``section.key -> "environment variable NAME"``. A ``HERMES_X__Y`` whose section is
    not one is refused, naming it (a misspelled variable was silently ignored)."""
    flat: dict[str, Any] = {}
    unique = _unique_keys()
    for name, text in environ.items():
        if not name.startswith("HERMES_"):
            continue
        rest = name[len("HERMES_") :].lower()
        if "__" in rest:
            sec, key = rest.split("__", 1)
            if sec not in _SECTIONS:
                raise ConfigError(
                    f"environment variable {name}: no config section {sec!r} (sections: "
                    f"{', '.join(_SECTIONS)}; the form is HERMES_SECTION__KEY)")
            flat[f"{sec}.{key}"] = _parse_env_value(text)
            where = f"{sec}.{key}"
        elif rest in unique:
            flat[rest] = _parse_env_value(text)
            where = f"{unique[rest]}.{rest}"
        elif rest == "engines":
            flat["engines"] = _parse_env_value(text)
            where = "engines"
        else:
            continue
        if origin is not None:
            origin[where] = f"environment variable {name}"
    return _place(flat, "environment") if flat else {}


def load_config(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> GatewayConfig:
    """Build the gateway configuration.

    ``path``: a ``hermes.toml`` (None: defaults only). ``environ``: the environment to read
    ``HERMES_*`` variables from (default ``os.environ``). ``overrides``: CLI values by key name
    (``port=9000``, ``policy="vllm"``, ``time_scale=20``, ``apps=["my.apps"]`` for hosted-app
    modules) or by
    section (``scheduler={"k": 0.3}``); ``None`` values are ignored so CLI defaults can be
    passed straight through.
    """
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        source = str(p)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{p}: no such config file") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: {e}") from None
        unknown = set(data) - set(_SECTIONS) - {"engines"}
        if unknown:
            raise ConfigError(f"{p}: unknown section(s) {sorted(unknown)}")
    # where each key's value came from (the file, an environment variable, a flag): an
    # invalid value's error names it
    origin: dict[str, str] = {}
    for sec, values in data.items():
        origin[sec] = source
        if isinstance(values, Mapping):
            origin.update({f"{sec}.{key}": source for key in values})
    from hermes.kb import check_kb_environment

    env = os.environ if environ is None else environ
    try:
        check_kb_environment(env)  # HERMES_PDGRAPHS is now HERMES_KB
    except ValueError as e:
        raise ConfigError(f"environment: {e}") from None
    data = _deep_merge(data, _env_layer(env, origin))
    clean = {k: v for k, v in overrides.items() if v is not None}
    if clean:
        flags = _place(clean, "overrides")
        for sec, values in flags.items():
            origin[sec] = "command line"
            if isinstance(values, Mapping):
                origin.update({f"{sec}.{key}": "command line" for key in values})
        data = _deep_merge(data, flags)
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts = [str(p) for p in err["loc"]]
        loc = ".".join(parts)
        if not loc:
            raise ConfigError(f"{source}: {msg}") from None
        where = origin.get(".".join(parts[:2])) or origin.get(parts[0]) or "defaults"
        raise ConfigError(f"{where}: key {loc}: {msg}") from None


def resolve_state_dir(state_dir: str) -> Path:
    """The durable state directory: ``state_dir`` when set, else the user's data directory
    for Hermes (``platformdirs.user_data_dir("hermes")``, e.g. ``~/.local/share/hermes``),
    so that state survives wherever ``hermes serve`` is started from."""
    if state_dir:
        return Path(state_dir).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("hermes", appauthor=False))
