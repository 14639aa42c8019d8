"""``[identity]``: how the run resolver finds (tenant, app, run, unit) in plain traffic.

One pydantic model, shaped as the future ``[identity]`` section of ``hermes.toml`` (extra keys
are refused, as in every other section), so that wiring it into ``GatewayConfig`` is one field.
Every list is an ordered evidence list: the first name present in a request wins. Every cap
bounds memory whatever clients send (issue 17, item 4); the defaults keep the resolver's state
to a few tens of megabytes at most (the sizes are in the resolver's ``stats()``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

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


class IdentityConfig(BaseModel):
    """The run resolver's settings (``[identity]``)."""

    model_config = ConfigDict(extra="forbid")

    #: infer runs, apps and units from plain traffic; off: every request without Hermes
    #: headers is a one-request run of app ``default`` (the per-request baseline)
    infer: bool = True
    #: use the explicit ids clients send (session headers, body fields, metadata keys,
    #: ``previous_response_id``); off: only Hermes headers and conversation continuation
    explicit_ids: bool = True
    #: join a request to the run whose answered conversation it continues
    continuation: bool = True
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
    #: idle close while an app has fewer than ``close_min_gaps`` observed gaps
    close_prior_s: float = Field(default=60.0, gt=0.0)
    close_min_gaps: int = Field(default=20, ge=1)
    #: gaps kept per app (newest)
    gap_samples: int = Field(default=1000, ge=16)
    #: a request the edge never reported answered stops holding its run open after this
    max_busy_s: float = Field(default=3600.0, gt=0.0)

    @field_validator("session_headers")
    @classmethod
    def _lower(cls, v: list[str]) -> list[str]:
        return [h.lower() for h in v]

    def bounds(self) -> tuple[float, float]:
        """``(close_min_s, close_max_s)``, the max never below the min."""
        return self.close_min_s, max(self.close_min_s, self.close_max_s)
