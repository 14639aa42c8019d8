"""The run resolver (issue 17): which tenant, app, run and unit a request belongs to.

Hermes ranks whole application runs, but most agents send plain OpenAI traffic with no Hermes
headers. This package finds the runs, apps and units in that traffic itself, as one pure
component between the HTTP edge and the runs registry: no FastAPI, no I/O, no clock reads
(``now`` is passed in), every structure bounded. One concept per module:

- :mod:`~hermes.gateway.resolve.resolver`: :class:`Resolver` (the evidence ladder,
  ``resolve`` / ``answered`` / ``abandoned`` / ``sweep`` / ``forget``) and :class:`Identity`;
- :class:`~hermes.gateway.config.IdentityConfig`: its settings, the ``[identity]`` section of the gateway config;
- :mod:`~hermes.gateway.resolve.evidence`: what one request says of itself (its chat form,
  session and weak ids, history, tool calls asked);
- :mod:`~hermes.gateway.resolve.canon`: canonical messages, rolling conversation digests;
- :mod:`~hermes.gateway.resolve.index`: the bounded, expiring, per-tenant evidence index;
- :mod:`~hermes.gateway.resolve.templates`: masking, instruction templates, turn skeletons;
- :mod:`~hermes.gateway.resolve.units`: drain3 over turn skeletons, unit names;
- :mod:`~hermes.gateway.resolve.apps`: app fingerprints, names, :class:`AppNames`
  (rename/merge mapping for the knowledge base);
- :mod:`~hermes.gateway.resolve.runend`: :func:`idle_close_s`, the run-end rule;
- :mod:`~hermes.gateway.resolve.fanout`: :class:`FanoutBook`, bursts of independent
  prompts grouped by arrival;
- :mod:`~hermes.gateway.resolve.dataflow`: passages of replies, found again in the prompts of
  a program's next stage;
- :mod:`~hermes.gateway.resolve.replies`: :class:`ChatReplies`, a streamed reply's messages;
- :mod:`~hermes.gateway.resolve.bench`: :func:`bench`, the resolver's CPU per request.

Evidence, strongest first, and where each comes from:

1. Hermes headers: ``X-Hermes-Run: ID`` passes through unchanged, ``X-Hermes-Run: none``
   opts out (a one-request run, nothing remembered), ``X-Hermes-App`` / ``X-Hermes-Unit``
   name the app / unit whenever present (the run is then still inferred).
2. ``previous_response_id`` (OpenAI Responses API): the run of the response it continues.
3. Session ids, first present wins (``IdentityConfig.session_headers`` / ``session_fields`` /
   ``metadata_keys``; sources as found in each tool's docs or code):

   - ``x-session-id``: OpenRouter (LangChain's ``ChatOpenRouter.session_id`` doc: "equivalent
     to setting the x-session-id HTTP header"; openrouter.ai/docs/guides/features/broadcast),
     opencode (anomalyco/opencode PR 12932), LLM Gateway (docs.llmgateway.io/features/sessions);
   - ``x-opencode-session`` (OpenCode Zen/Go: opencode.ai/docs/go; PRs in
     maximhq/bifrost 6818, osaurus-ai/osaurus 2666) and ``x-session-affinity`` (opencode with
     other providers: coder/coder PR 26140, Wei-Shaw/sub2api PR 1578; LLM Gateway docs);
   - ``session_id`` (and ``conversation_id`` in older releases): OpenAI Codex CLI's Responses
     requests (``codex-rs`` client: ``.header("session_id", ...)``; sub2api PR 1578);
   - ``x-claude-code-session-id``: Claude Code (griffinmartin/opencode-claude-auth PR 109:
     "stable UUID per process lifetime"), and Claude Code's ``metadata.user_id``
     ``user_<hash>_account_<uuid>_session_<uuid>`` (``user_session_marker``; wire format
     captured at qntx.sbvh.nl/research/claude-api-wire-format; claude-code-hub docs);
   - ``helicone-session-id``: Helicone sessions (docs.helicone.ai, observability/sessions);
   - ``x-portkey-trace-id``: Portkey traces (portkey.ai/docs/product/observability/traces);
   - ``x-cagent-session-id``: Docker cagent's models gateway (docker/docker-agent PR 2631);
   - ``x-conversation-id`` / ``x-thread-id``: generic, as other relays accept them (gephyr);
   - body ``litellm_session_id``: LiteLLM proxy session logs
     (docs.litellm.ai/docs/proxy/ui_logs_sessions); body ``session_id``: OpenRouter;
     body ``conversation``: the Responses API's conversation (``"conv_..."`` or ``{"id"}``);
   - ``metadata`` keys ``session_id`` / ``sessionId`` / ``litellm_session_id`` /
     ``conversation_id`` / ``thread_id`` / ``trace_id`` / ``run_id``: LiteLLM's metadata
     (forwarded to Langfuse as its session and trace ids: docs.litellm.ai,
     observability/langfuse_integration; Langfuse sessions: langfuse.com/docs/sessions).
   A session id names the session's current run; after that run closed, a new run of it.
4. Conversation continuation: the request's messages begin with a conversation Hermes
   answered (its messages plus the reply Hermes returned), then tool results or a new user
   turn. Indexed by rolling digests of message prefixes (:mod:`~hermes.gateway.resolve.canon`):
   O(messages) per request, independent of the number of open runs.
   Then **tool-call ids**: every id of a tool call Hermes returned names the run that got
   it; a request quoting one (``tool_calls[].id``, ``tool_call_id``, or the text of a user or
   assistant message matching ``IdentityConfig.call_id_pattern``) joins that run, the most
   recently quoted known id deciding. Then a **history rewritten as text**: the request
   begins with a request Hermes answered with tool calls, followed by an assistant message
   without structured calls (smolagents sends calls as ``Calling tools: [...]`` text and
   results as user ``Observation:`` turns), or its last user turn cut at a line break is
   such a request (a client merging consecutive turns of one role: smolagents appends a
   failed step's ``Error:`` to the task turn).
5. Dataflow: the request's text holds lines of replies Hermes answered to the same tenant
   (a program's next stage works on its earlier outputs: a score prompt holds what it
   scores, a reduce prompt the summaries): the run most of them came from
   (:mod:`~hermes.gateway.resolve.dataflow`).
6. Weak ids: ``user`` (OpenAI: an end-user id), ``safety_identifier`` (its successor),
   ``prompt_cache_key`` (a cache partition: Codex sets it per conversation, many clients per
   app). They name a person or a cache bucket, not a run, so they are used after continuation
   and only for a request that carries history nothing else matched (e.g. a client that
   rewrote its history); a first turn is always a new run.
7. Fan-outs: a first turn of a program of independent prompts (no conversation continuation
   seen; a dataflow continuation or one-shot runs seen) arriving within
   ``fanout_window_s`` of the last request of that app's open fan-out, same tenant and weak
   id: that run (:mod:`~hermes.gateway.resolve.fanout`).
8. Otherwise a new run.

Apps are fingerprints of the instructions template, the tool set (names and schemas), the
model and the tenant (a request with neither instructions nor tools: of its API, its
structured-output schema and its first user turn's template instead); units are (instructions template, last turn's template) mined with
drain3; runs close when idle past ``p99(gaps) x margin`` of their app (a run whose last
answer called tools too: its app's gaps are what its tools took). Inferred runs do not count
against a tenant's active-run quota (:meth:`hermes.gateway.runs.RunRegistry.count_active`).
"""

from __future__ import annotations

from hermes.gateway.config import IdentityConfig
from hermes.gateway.resolve.apps import AppInfo, AppNames, app_fingerprint, tool_signature
from hermes.gateway.resolve.evidence import request_messages
from hermes.gateway.resolve.replies import ChatReplies
from hermes.gateway.resolve.resolver import ClosedRun, Identity, Resolver
from hermes.gateway.resolve.runend import idle_close_s

__all__ = ["AppInfo", "AppNames", "ChatReplies", "ClosedRun", "Identity", "IdentityConfig", "Resolver",
           "app_fingerprint", "idle_close_s", "request_messages", "tool_signature"]
