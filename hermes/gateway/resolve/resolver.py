"""The run resolver: (tenant, app, run, unit) of every request, from the strongest evidence.

Pure: no I/O, no clock (every call takes ``now``, in the caller's clock seconds), no
randomness (run keys come from ``new_run_id``). The edge calls:

- :meth:`Resolver.resolve` when a request arrives, before it is queued: the
  :class:`Identity` says which run it joins (or that a new run must be created, with the key
  the resolver chose) and its app and unit;
- :meth:`Resolver.answered` when Hermes has returned the reply (every choice of ``n > 1``;
  the Responses API's response id), or :meth:`Resolver.abandoned` when the request failed;
- :meth:`Resolver.sweep` periodically (e.g. every second): the inferred runs it closes, for
  the edge to finish (write the record, learn from it);
- :meth:`Resolver.forget` when a run ended by other means (finished through the runs API).

The evidence ladder (first that applies wins; details in :mod:`hermes.gateway.resolve`):

1. ``X-Hermes-Run: none``: opt-out, a one-request run, nothing remembered;
   ``X-Hermes-Run: ID``: that run, unchanged (``X-Hermes-App`` / ``X-Hermes-Unit`` are
   passed through whenever present);
2. ``previous_response_id`` of a response Hermes answered: that response's run;
3. a session id (headers, body fields, ``metadata`` keys, the configured lists): the
   session's current run (a new one on its first request);
4. conversation continuation: the longest proper prefix of the request's messages that is a
   conversation Hermes answered (messages + reply): that conversation's run;
   then the run Hermes issued the tool-call ids the request quotes to (structured or in
   text), then a history rewritten as text that begins with a request Hermes answered with
   tool calls (:func:`~hermes.gateway.resolve.canon.conversation_prefixes`);
5. dataflow: the request's text holds passages (lines) of replies Hermes answered: the run
   most of them were answered in (:mod:`hermes.gateway.resolve.dataflow`: a program's next
   stage works on its earlier outputs, a score prompt holds what it scores);
6. a weak id (``user``, ``safety_identifier``, ``prompt_cache_key``): the run last seen with
   it, only for a request that carries history (an assistant or tool message) that nothing
   above matched: a first turn with a known ``user`` is a new run, not that user's last one;
7. a fan-out: a first turn of a program of independent prompts (an app whose runs have
   shown no conversation continuation, and either a dataflow continuation or
   ``one_shot_runs`` runs of one request) arriving within ``fanout_window_s`` of the last
   request of an open run of the same app and tenant, whose weak id (if any) matches: that
   run (a program's burst of prompts sent at once, ranked together as the one job it is; at
   most ``fanout_max_requests`` over ``fanout_max_age_s``);
8. a new run.

A run found closed (idle past its app's gaps, :mod:`hermes.gateway.resolve.runend`) gives a
new run of the same app, whose ``follows`` names the closed one; the gap that continuation
shows is added to its app's gaps, so that the app's idle-close figure grows to cover, e.g.,
its long tool calls instead of splitting every run at them.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any, NamedTuple

from hermes.gateway.config import IdentityConfig
from hermes.gateway.resolve.apps import AppBook, AppInfo, AppNames, app_fingerprint, tool_signature
from hermes.gateway.resolve.canon import (
    INSTRUCTION_ROLES,
    answered_digest,
    asked_digest,
    conversation_prefixes,
    key_digest,
)
from hermes.gateway.resolve.dataflow import AMBIGUOUS, prompt_digests, reply_digests, vote
from hermes.gateway.resolve.evidence import (
    affinity_of,
    asks_tools,
    has_history,
    quoted_call_ids,
    reply_call_ids,
    request_messages,
    session_of,
)
from hermes.gateway.resolve.fanout import FanoutBook
from hermes.gateway.resolve.index import EvidenceIndex, KeyIndex
from hermes.gateway.resolve.runend import GapBook
from hermes.gateway.resolve.templates import InstructionTemplates, instructions_of, turn_skeleton
from hermes.gateway.resolve.units import TurnTemplates, UnitBook, unit_key

RUN_HEADER = "x-hermes-run"
APP_HEADER = "x-hermes-app"
UNIT_HEADER = "x-hermes-unit"
OPT_OUT = "none"
DEFAULT_APP = "default"
DEFAULT_UNIT = "default"
#: the format of :meth:`Resolver.snapshot`
SNAPSHOT_VERSION = 1
#: evidence of identities the resolver keeps nothing about
UNTRACKED = frozenset(("header", "opt-out", "off"))


@dataclass(slots=True)
class Identity:
    """Who a request belongs to.

    ``run``: the run key ("" for an opt-out or inference off: the edge makes a one-request run
    as before). ``new_run``: the edge must create the run, with key ``run``, app ``app``.
    ``inferred``: the run was not named by the client's Hermes headers. ``evidence``: what
    decided (``header``, ``opt-out``, ``off``, ``previous_response_id``,
    ``session:<source>``, ``continuation``, ``tool_call_id``, ``rewritten``, ``dataflow``,
    ``affinity:<field>``, ``fanout``, ``new``). ``follows``: the closed run a late continuation would have joined. ``app`` is
    "" for an ``X-Hermes-Run`` passthrough that names no app (the run's own app applies).
    """

    tenant: str
    app: str
    run: str
    unit: str
    inferred: bool
    evidence: str
    new_run: bool = False
    app_id: str = ""
    unit_template: str = ""
    follows: str | None = None
    #: the request's conversation hasher, extended with the reply by :meth:`Resolver.answered`
    conversation: Any = field(default=None, repr=False, compare=False)


@dataclass(slots=True)
class ClosedRun:
    """An inferred run the resolver closed: ``reason`` ``idle`` (past its app's idle-close
    figure) or ``evicted`` (``max_open_runs`` reached)."""

    run: str
    tenant: str
    app: str
    reason: str
    idle_s: float
    requests: int


@dataclass(slots=True)
class _Run:
    key: str
    tenant: str
    app: str
    app_id: str
    last: float
    busy: int = 0
    requests: int = 0
    #: requests that joined as a fan-out (rule 7), not as a continuation
    fanout: int = 0
    #: requests that joined by dataflow (rule 5), not as a conversation's next turn
    dataflow: int = 0


class _AppKey(NamedTuple):
    """The app of a request that starts a run: ``app_id`` (after merges); ``named``: the
    client's ``X-Hermes-App`` ("" when fingerprinted); else its fingerprint and parts."""

    app_id: str
    named: str
    fingerprint: str
    model: str
    tools: list[tuple[str, str]]


def _counter_ids() -> Callable[[], str]:
    n = 0

    def new_id() -> str:
        nonlocal n
        n += 1
        return f"run-i{n:011x}"

    return new_id


class Resolver:
    """Maps requests to (tenant, app, run, unit); bounded state (module docstring)."""

    def __init__(self, config: IdentityConfig | None = None, *, names: AppNames | None = None,
                 new_run_id: Callable[[], str] | None = None,
                 index: EvidenceIndex | None = None,
                 adopt: Callable[[str], tuple[str, str, str] | None] | None = None) -> None:
        """``index``: the evidence index (default: in memory; a shared one lets evidence left
        by another edge, or by a scheduler before a failover, lead here). ``adopt(run_key)``:
        ``(tenant, app, app_id)`` of a run the evidence names that this resolver does not
        track but the run registry still has active (it then joins it and tracks it), or
        None (the request starts a new run that ``follows`` it)."""
        cfg = self.config = config or IdentityConfig()
        self.names = names or AppNames()
        self.new_run_id = new_run_id or _counter_ids()
        self.adopt = adopt
        self.index: EvidenceIndex = index if index is not None else KeyIndex(
            max_entries=cfg.index_max_entries, max_per_tenant=cfg.index_max_per_tenant,
            ttl_s=cfg.index_ttl_s)
        #: reply passages (dataflow), apart so that they never evict conversation evidence
        self.passages = KeyIndex(max_entries=cfg.dataflow_max_entries,
                                 max_per_tenant=cfg.dataflow_max_per_tenant,
                                 ttl_s=cfg.dataflow_ttl_s)
        self.instructions = InstructionTemplates()
        self.turns = TurnTemplates(sim_th=cfg.drain_sim_th, depth=cfg.drain_depth,
                                   max_children=cfg.drain_max_children,
                                   max_clusters=cfg.drain_max_clusters,
                                   max_tenants=cfg.max_miner_tenants)
        self.units = UnitBook(cfg.max_units)
        self.apps = AppBook(cfg.max_apps)
        lo, hi = cfg.bounds()
        self.gaps = GapBook(samples=cfg.gap_samples, max_apps=cfg.max_apps,
                            margin=cfg.close_margin, min_s=lo, max_s=hi,
                            prior_s=cfg.close_prior_s, min_gaps=cfg.close_min_gaps,
                            one_shot_runs=cfg.one_shot_runs)
        #: open inferred runs, least recently active first (eviction order)
        self._open: OrderedDict[str, _Run] = OrderedDict()
        #: app id -> its open runs, least recently active first
        self._by_app: dict[str, OrderedDict[str, None]] = {}
        self._closed: list[ClosedRun] = []
        #: runs closed for idleness: key -> (app id, last activity), oldest first
        self._recently_closed: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.fanouts = FanoutBook(window_s=cfg.fanout_window_s, max_age_s=cfg.fanout_max_age_s,
                                  max_requests=cfg.fanout_max_requests, max_apps=cfg.max_apps)
        self._call_id_re = re.compile(cfg.call_id_pattern)

    # ------------------------------------------------------------------ per request
    def resolve(self, tenant: str, body: Mapping[str, Any], headers: Mapping[str, str],
                now: float, *, messages: Sequence[Any] | None = None) -> Identity:
        """The identity of a request (module docstring). ``messages``: the chat form of the
        request when the edge has it (a Responses request with its stored history);
        default: :func:`request_messages` of ``body``."""
        hl = {k.lower(): v for k, v in headers.items()}
        run_h = hl.get(RUN_HEADER, "").strip()
        app_h = hl.get(APP_HEADER, "").strip()
        unit_h = hl.get(UNIT_HEADER, "").strip()
        if run_h:
            if run_h.lower() == OPT_OUT:
                return Identity(tenant, app_h or DEFAULT_APP, "", unit_h or DEFAULT_UNIT,
                                False, "opt-out", new_run=True)
            return Identity(tenant, app_h, run_h, unit_h or DEFAULT_UNIT, False, "header")
        cfg = self.config
        if not cfg.infer:
            return Identity(tenant, app_h or DEFAULT_APP, "", unit_h or DEFAULT_UNIT, False,
                            "off", new_run=True)
        msgs = request_messages(body) if messages is None else messages
        index = self.index
        if cfg.continuation and msgs:
            hasher, candidates, asked = conversation_prefixes(tenant, msgs)
        else:
            hasher, candidates, asked = None, [], []

        run_key: str | None = None
        evidence = "new"
        bind: list[bytes] = []
        akey: bytes | None = None
        #: a session id names its run: a new session is a new run, never a dataflow or
        #: fan-out join
        has_session = False
        if cfg.explicit_ids:
            prev = body.get("previous_response_id")
            if isinstance(prev, str) and prev:
                run_key = index.get(tenant, key_digest(tenant, "resp", prev), now)
                if run_key is not None:
                    evidence = "previous_response_id"
            session = session_of(body, hl, cfg)
            if session is not None:
                has_session = True
                skey = key_digest(tenant, "session", session[1])
                bind.append(skey)
                if run_key is None:
                    run_key = index.get(tenant, skey, now)
                    evidence = f"session:{session[0]}"
        if run_key is None and candidates:
            hit = index.get_first(tenant, candidates[::-1], now)
            if hit is not None:
                run_key, evidence = hit[1], "continuation"
        if run_key is None and cfg.call_ids and msgs:
            quoted = [key_digest(tenant, "call", cid)
                      for cid in quoted_call_ids(msgs, self._call_id_re,
                                                 max_ids=cfg.max_quoted_call_ids,
                                                 max_chars=cfg.dataflow_max_scan_chars)]
            hit = index.get_first(tenant, quoted, now) if quoted else None
            if hit is not None:
                run_key, evidence = hit[1], "tool_call_id"
        if run_key is None and asked:
            hit = index.get_first(tenant, asked[::-1], now)
            if hit is not None:
                run_key, evidence = hit[1], "rewritten"
        if run_key is None and cfg.dataflow and msgs and not has_session:
            passages = self.passages
            run_key = vote([passages.get(tenant, d, now) for d in prompt_digests(
                tenant, msgs, min_chars=cfg.dataflow_min_chars,
                head_chars=cfg.dataflow_head_chars, max_chars=cfg.dataflow_max_scan_chars)])
            if run_key is not None:
                evidence = "dataflow"
        first_turn = not has_history(msgs, body)
        if cfg.explicit_ids:
            affinity = affinity_of(body, cfg)
            if affinity is not None:
                akey = key_digest(tenant, "affinity", *affinity)
                bind.append(akey)
                if run_key is None and evidence == "new" and not first_turn:
                    run_key = index.get(tenant, akey, now)
                    if run_key is not None:
                        evidence = f"affinity:{affinity[0]}"

        instr = self.instructions.get(instructions_of(msgs))
        fanout = None
        app: _AppKey | None = None  # the app a new run would get, computed once
        if run_key is None and self.fanouts.enabled and first_turn and not has_session:
            app = self._app_key(tenant, body, msgs, instr, app_h)
            fanout = self.fanouts.join(app.app_id, akey, now, self._open.__contains__)
            if fanout is not None:
                run_key, evidence = fanout, "fanout"
        run = self._open.get(run_key) if run_key is not None else None
        adopted = False  # its last activity was elsewhere: no gap to learn from here
        if run is None and run_key is not None and self.adopt is not None:
            run = self._adopt(run_key, now)
            adopted = run is not None
        follows = run_key if run is None else None
        if follows is not None:
            late = self._recently_closed.pop(follows, None)
            if late is not None:  # a continuation after the close: its gap was too short
                self.gaps.add(late[0], now - late[1], conversation=evidence != "dataflow")
        if run is not None:
            if fanout is not None:  # joined with its first request: no gap, no continuation
                run.fanout += 1
            else:
                if evidence == "dataflow":
                    run.dataflow += 1
                if run.busy == 0 and not adopted:
                    self.gaps.add(run.app_id, now - run.last,
                                  conversation=evidence != "dataflow")
            self._by_app[run.app_id].move_to_end(run.key)
            self._open.move_to_end(run.key)
        else:
            run = self._new_run(tenant, app or self._app_key(tenant, body, msgs, instr, app_h),
                                instr, now)
            if (self.fanouts.enabled and first_turn and not has_session
                    and self.gaps.fans_out(run.app_id)):
                self.fanouts.start(run.app_id, run.key, akey, now)
        run.busy += 1
        run.requests += 1
        run.last = now
        for key in bind:
            index.put(tenant, key, run.key, now)

        if unit_h:
            unit, template = unit_h, ""
        else:
            unit, template = self._unit(tenant, run.app_id, instr, msgs)
        return Identity(tenant, run.app, run.key, unit, True, evidence,
                        new_run=run.requests == 1, app_id=run.app_id, unit_template=template,
                        follows=follows, conversation=hasher)

    def answered(self, identity: Identity, replies: Any, now: float, *,
                 response_id: str | None = None) -> None:
        """Hermes returned ``replies`` (an assistant message, or one per choice) for the request
        ``identity`` resolved: index the conversation each reply completes, the reply's
        passages (dataflow; a passage already answered in another run becomes ambiguous) and
        the response id of a Responses request, under the request's run."""
        if identity.evidence in UNTRACKED or not identity.run:
            return
        self._release(identity.run, now)
        answers = (replies if isinstance(replies, list) else [replies]) if replies else []
        tenant = identity.tenant
        hasher = identity.conversation
        cfg = self.config
        passages = self.passages
        run = identity.run
        puts: list[tuple[bytes, str]] = []  # written together (a shared index: one round trip)
        asked = False
        for reply in answers:
            if hasher is not None:
                puts.append((answered_digest(hasher, reply), run))
            if asks_tools(reply):
                if hasher is not None and not asked:
                    # what was asked: a client that rewrites tool calls as text still sends it
                    puts.append((asked_digest(hasher), run))
                    asked = True
                if cfg.call_ids:
                    for cid in reply_call_ids(reply)[:cfg.max_quoted_call_ids]:
                        puts.append((key_digest(tenant, "call", cid), run))
            if cfg.dataflow:
                for d in reply_digests(tenant, reply, min_chars=cfg.dataflow_min_chars,
                                       head_chars=cfg.dataflow_head_chars,
                                       max_passages=cfg.dataflow_max_passages):
                    have = passages.get(tenant, d, now)
                    passages.put(tenant, d, identity.run if have is None or have == identity.run
                                 else AMBIGUOUS, now)
        if response_id:
            puts.append((key_digest(tenant, "resp", response_id), run))
        self.index.put_many(tenant, puts, now)
        identity.conversation = None

    def abandoned(self, identity: Identity, now: float) -> None:
        """The request failed or was cancelled: it no longer holds its run open."""
        if identity.evidence not in UNTRACKED and identity.run:
            self._release(identity.run, now)
        identity.conversation = None

    # ------------------------------------------------------------------ run ends
    def sweep(self, now: float) -> list[ClosedRun]:
        """Close the inferred runs idle past their app's figure
        (:func:`hermes.gateway.resolve.runend.idle_close_s`; a run with a request in flight
        only after ``max_busy_s``), drop expired index entries, and return the runs closed
        since the last sweep (also those evicted by ``max_open_runs``)."""
        closed, self._closed = self._closed, []
        max_busy = self.config.max_busy_s
        for app_id in list(self._by_app):
            order = self._by_app[app_id]
            limit = self.gaps.close_after(app_id)
            done: list[_Run] = []
            for key in order:
                run = self._open[key]
                idle = now - run.last
                if idle <= limit:
                    break
                if run.busy and idle <= max_busy:
                    continue
                done.append(run)
            for run in done:
                self._drop(run)
                self.gaps.closed(run.app_id, run.requests - run.fanout - run.dataflow > 1)
                self._remember_closed(run)
                closed.append(ClosedRun(run.key, run.tenant, run.app, "idle", now - run.last,
                                        run.requests))
        self.index.sweep(now)
        self.passages.sweep(now)
        return closed

    def forget(self, run_key: str) -> None:
        """The run ended by other means (e.g. finished through the runs API)."""
        run = self._open.get(run_key)
        if run is not None:
            self._drop(run)

    def open_runs(self) -> int:
        return len(self._open)

    def held(self, now: float) -> list[tuple[str, float, float]]:
        """``(run, idle_s, close_after_s)`` of every open run: how long each has been idle
        and after how long its app's figure closes it (a stopping edge hands them over)."""
        return [(r.key, max(0.0, now - r.last), self.gaps.close_after(r.app_id))
                for r in self._open.values()]

    def is_open(self, run_key: str) -> bool:
        """The resolver tracks ``run_key`` as an open inferred run (it will close it)."""
        return run_key in self._open

    # ------------------------------------------------------------------ restarts
    def snapshot(self) -> dict[str, Any]:
        """What a restarted gateway needs so that a continuation still joins its run: the
        evidence and passage indexes, the open runs and the apps' gaps, JSON-serialisable
        (:meth:`restore`). Apps and units need nothing: their names are functions of their
        fingerprints and templates, made again on first sight."""
        return {"version": SNAPSHOT_VERSION, "index": self.index.dump(),
                "passages": self.passages.dump(),
                "open": [[r.key, r.tenant, r.app, r.app_id, r.last, r.requests]
                         for r in self._open.values()],
                "gaps": self.gaps.snapshot()}

    def restore(self, data: Mapping[str, Any], *, active: Callable[[str], bool] | None = None
                ) -> int:
        """Put back a :meth:`snapshot`; ``active(run_key)``: whether the gateway still has
        the run active (runs it ended meanwhile are not reopened). Returns the open runs
        restored. A snapshot of another version is ignored (0)."""
        if data.get("version") != SNAPSHOT_VERSION:
            return 0
        self.index.load(data.get("index") or [])
        self.passages.load(data.get("passages") or [])
        self.gaps.restore(data.get("gaps") or {})
        n = 0
        for key, tenant, app, app_id, last, requests in data.get("open") or []:
            if key in self._open or (active is not None and not active(key)):
                continue
            run = _Run(key, tenant, app, app_id, float(last), 0, int(requests))
            self._open[key] = run
            self._by_app.setdefault(app_id, OrderedDict())[key] = None
            n += 1
        return n

    def stats(self) -> dict[str, int]:
        """Sizes of every bounded structure (for ``/metrics``: the index size above all)."""
        turns = self.turns.stats()
        return {"index_entries": len(self.index), "index_tenants": self.index.tenants,
                "index_evicted": self.index.evicted, "index_expired": self.index.expired,
                "passage_entries": len(self.passages), "passage_evicted": self.passages.evicted,
                "open_runs": len(self._open), "recently_closed": len(self._recently_closed),
                "apps": len(self.apps), "units": len(self.units),
                "instruction_templates": len(self.instructions), "gap_apps": len(self.gaps),
                "fanout_bursts": len(self.fanouts),
                "miner_tenants": turns["tenants"], "miner_clusters": turns["clusters"],
                "miner_cached": turns["cached"], "miner_mined": turns["mined"]}

    def app_list(self) -> list[AppInfo]:
        """The apps inferred so far (``hermes apps list``), names after the operator's
        renames."""
        out = []
        for info in self.apps.apps():
            canonical = self.names.canonical(info.app_id)
            out.append(AppInfo(info.app_id, self.names.name(canonical, info.name), info.tenant,
                               info.model, info.tools, info.instructions, info.first_seen,
                               info.runs))
        return out

    # ------------------------------------------------------------------ internals
    def _app_key(self, tenant: str, body: Mapping[str, Any], msgs: Sequence[Any],
                 instr: tuple[bytes, str, str], app_h: str) -> _AppKey:
        """Which app a new run of this request belongs to: the client's ``X-Hermes-App``,
        else the fingerprint of its instructions, tools, model and tenant after the
        operator's merges; a request with neither instructions nor tools is fingerprinted by
        what varies between such programs instead (:meth:`_bare_variant`)."""
        if app_h:  # named by the client; its units and gaps are still the tenant's own
            return _AppKey(f"{tenant}/{app_h}", app_h, "", "", [])
        m = body.get("model")
        model = m if isinstance(m, str) else ""
        tools = tool_signature(body.get("tools"))
        shape = instr[0] if instr[0] or tools else self._bare_variant(tenant, body, msgs)
        fp = app_fingerprint(tenant, model, shape, tools)
        return _AppKey(self.names.canonical(fp), "", fp, model, tools)

    def _bare_variant(self, tenant: str, body: Mapping[str, Any], msgs: Sequence[Any]) -> bytes:
        """What tells apart programs without instructions or tools: the API (chat,
        Responses, completions), the structured-output schema (chat ``response_format``,
        Responses ``text.format``) and the template of the first user turn (mined like the
        units' turns: the first skeleton of its drain3 cluster, stable as the cluster
        grows). Empty for a plain chat request of no user turn."""
        api = "chat" if "messages" in body else "responses" if "input" in body else "completions"
        text = body.get("text")
        fmt = body.get("response_format") or (text.get("format") if isinstance(text, dict)
                                              else None)
        if isinstance(fmt, dict) and fmt.get("type") == "text":
            fmt = None
        first = next((m for m in msgs if isinstance(m, dict) and m.get("role") == "user"), None)
        cfg = self.config
        template = "" if first is None else self.turns.template(tenant, turn_skeleton(
            first, max_chars=cfg.template_max_chars, max_lines=cfg.template_max_lines))
        if api == "chat" and fmt is None and not template:
            return b""
        parts = [api, json.dumps(fmt, sort_keys=True, separators=(",", ":"), default=str)
                 if fmt is not None else "", template]
        return blake2b("".join(f"{len(p)}:{p}" for p in parts).encode(), digest_size=16,
                       person=b"hermes-bare").digest()

    def _new_run(self, tenant: str, app: _AppKey, instr: tuple[bytes, str, str],
                 now: float) -> _Run:
        app_id = app.app_id
        if app.named:
            name = app.named
        else:
            fp = app.fingerprint
            info = self.apps.see(fp, tenant=tenant, model=app.model,
                                 instructions_template=instr[1], tools=app.tools, now=now)
            info.runs += 1
            if app_id == fp:
                name = self.names.name(fp, info.name)
            else:
                target = self.apps.get(app_id)
                name = self.names.name(app_id, target.name if target else f"app-{app_id[:6]}")
        run = _Run(self.new_run_id(), tenant, name, app_id, now)
        self._open[run.key] = run
        order = self._by_app.get(app_id)
        if order is None:
            order = self._by_app[app_id] = OrderedDict()
        order[run.key] = None
        if len(self._open) > self.config.max_open_runs:
            self._evict(now)
        return run

    def _adopt(self, run_key: str, now: float) -> _Run | None:
        """Track a run the evidence names that another edge (or a scheduler before a
        failover) opened, if the registry still has it active (:attr:`adopt`)."""
        assert self.adopt is not None
        got = self.adopt(run_key)
        if got is None:
            return None
        tenant, app, app_id = got
        # requests=1: its first request was made elsewhere (this is not a new run)
        run = _Run(run_key, tenant, app, app_id, now, requests=1)
        self._open[run_key] = run
        self._by_app.setdefault(app_id, OrderedDict())[run_key] = None
        if len(self._open) > self.config.max_open_runs:
            self._evict(now)
        return run if run_key in self._open else None

    def _remember_closed(self, run: _Run) -> None:
        """Keep (app, last activity) of a run closed for idleness, so that a continuation
        arriving after the close teaches its app the gap the close figure missed (bounded:
        ``max_open_runs`` entries, oldest out)."""
        rc = self._recently_closed
        rc[run.key] = (run.app_id, run.last)
        if len(rc) > self.config.max_open_runs:
            rc.popitem(last=False)

    def _evict(self, now: float) -> None:
        """Close the least recently active open run (``max_open_runs`` reached): O(1)."""
        oldest = next(iter(self._open.values()))
        self._drop(oldest)
        self._closed.append(ClosedRun(oldest.key, oldest.tenant, oldest.app, "evicted",
                                      now - oldest.last, oldest.requests))

    def _drop(self, run: _Run) -> None:
        del self._open[run.key]
        order = self._by_app[run.app_id]
        del order[run.key]
        if not order:
            del self._by_app[run.app_id]

    def _release(self, run_key: str, now: float) -> None:
        run = self._open.get(run_key)
        if run is not None:
            run.busy = max(0, run.busy - 1)
            run.last = now
            self._by_app[run.app_id].move_to_end(run_key)
            self._open.move_to_end(run_key)

    def _unit(self, tenant: str, app_id: str, instr: tuple[bytes, str, str],
              msgs: Sequence[Any]) -> tuple[str, str]:
        """The request's unit name and its last turn's template."""
        digest, _, islug = instr
        last = None
        for m in reversed(msgs):
            if not (isinstance(m, dict) and m.get("role") in INSTRUCTION_ROLES):
                last = m
                break
        cfg = self.config
        skeleton = turn_skeleton(last, max_chars=cfg.template_max_chars,
                                 max_lines=cfg.template_max_lines)
        template = self.turns.template(tenant, skeleton)
        key = unit_key(app_id, digest, template)
        return self.units.name(key, app_id, islug, template), template
