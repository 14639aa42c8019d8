"""Apps: a stable fingerprint of a program, a readable name, and the operator's renames/merges.

An app is what does not vary between runs of one program (issue 17): its instructions as a
template (:mod:`hermes.gateway.resolve.templates`), its tool set (names and JSON schemas,
canonical: order and spacing do not matter, descriptions are left out), the model, and the
tenant, hashed together (BLAKE2b-96, hex). Two tenants running identical prompts get two apps;
so do two programs differing only in a tool's schema.

Names are made on first sight from the instructions' first meaningful words, the first tool
names and a short hash, e.g. ``weather-agent-get_weather-add-3f2a9c``, prefixed by the
tenant when there is one (``acme.weather-agent-3f2a9c``: a tenant's own app, :func:`owned`); the hash keeps names of
different fingerprints apart (lengthened on the rare clash). :class:`AppNames` is the
operator's mapping on top (``hermes apps rename|merge``): a JSON-serialisable object the
knowledge base stores, applied by the resolver to every new run.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hermes.gateway.resolve.templates import slug

_NAME_OK = re.compile(r"[^A-Za-z0-9_.-]+")
MAX_MERGE_HOPS = 16


def tool_signature(tools: Any) -> list[tuple[str, str]]:
    """``[(name, canonical JSON schema)]`` of chat (``{"function": {...}}``) or Responses
    (``{"name", "parameters"}``) tools, sorted by name; other tool types by their type."""
    out: list[tuple[str, str]] = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        inner = tool.get("function")
        fn: dict[str, Any] = inner if isinstance(inner, dict) else tool
        name = fn.get("name")
        if not isinstance(name, str):
            name = f"<{tool.get('type', 'tool')}>"
        schema = json.dumps(fn.get("parameters"), sort_keys=True, separators=(",", ":"),
                            ensure_ascii=False, default=str)
        out.append((name, schema))
    out.sort()
    return out


def app_fingerprint(tenant: str, model: str, instructions: bytes,
                    tools: Sequence[tuple[str, str]]) -> str:
    """The app id: hex BLAKE2b-96 of tenant, model, instructions template digest, tool set."""
    h = blake2b(digest_size=12, person=b"hermes-app")
    for part in (tenant, model or ""):
        h.update(f"{len(part)}:{part}".encode())
    h.update(instructions)
    for name, schema in tools:
        h.update(f"{len(name)}:{name}{len(schema)}:{schema}".encode())
    return h.hexdigest()


def app_name(instructions_template: str, tools: Sequence[tuple[str, str]], app_id: str,
             *, hash_chars: int = 6) -> str:
    """A readable name: instruction words, up to two tool names, a short hash."""
    parts = [p for p in (slug(instructions_template),) if p]
    parts += [_NAME_OK.sub("", n)[:24] for n, _ in tools[:2] if not n.startswith("<")]
    parts = [p for p in parts if p] or ["chat"]
    return "-".join(parts + [app_id[:hash_chars]])


def owned(tenant: str, name: str) -> str:
    """An inferred app's name, owned by its tenant: ``TENANT.NAME`` (the gateway's rule for a
    tenant's own apps: hidden from other tenants, run and taught by its tenant only), or
    ``NAME`` for the tenant ``default`` (authentication off, no tenant named)."""
    name = name.replace(".", "-")
    return name if tenant in ("", "default") else f"{tenant}.{name}"


@dataclass(slots=True)
class AppInfo:
    """What the resolver knows of an app (for ``hermes apps list``)."""

    app_id: str
    name: str
    tenant: str
    model: str
    tools: list[str]
    instructions: str  # the template, truncated
    first_seen: float
    runs: int = 0


class AppBook:
    """App id -> :class:`AppInfo` with unique names; bounded (least recently seen out)."""

    def __init__(self, max_apps: int = 10_000) -> None:
        self.max_apps = max_apps
        self._apps: OrderedDict[str, AppInfo] = OrderedDict()
        self._by_name: dict[str, str] = {}
        #: apps remembered so far, ever (not lowered by evictions): a change to persist
        self.added = 0

    def __len__(self) -> int:
        return len(self._apps)

    def get(self, app_id: str) -> AppInfo | None:
        return self._apps.get(app_id)

    def see(self, app_id: str, *, tenant: str, model: str, instructions_template: str,
            tools: Sequence[tuple[str, str]], now: float) -> AppInfo:
        """The app's record, made (and named) on first sight."""
        info = self._apps.get(app_id)
        if info is not None:
            self._apps.move_to_end(app_id)
            return info
        name = owned(tenant, app_name(instructions_template, tools, app_id))
        if self._by_name.get(name, app_id) != app_id:
            name = owned(tenant, app_name(instructions_template, tools, app_id,
                                          hash_chars=len(app_id)))
        info = AppInfo(app_id, name, tenant, model, [n for n, _ in tools],
                       instructions_template[:200], now)
        self.added += 1
        self._apps[app_id] = info
        self._by_name[name] = app_id
        if len(self._apps) > self.max_apps:
            _, old = self._apps.popitem(last=False)
            if self._by_name.get(old.name) == old.app_id:
                del self._by_name[old.name]
        return info

    def note(self, app_id: str, *, name: str, tenant: str, model: str, now: float) -> AppInfo:
        """An app another process's resolver named (an edge's new inferred run, split
        roles): remembered under the name that resolver gave it, so that the operator can
        list, rename and merge it here, where the mapping is kept; its runs counted."""
        info = self._apps.get(app_id)
        if info is None:
            info = AppInfo(app_id, name, tenant, model, [], "", now)
            self.added += 1
            self._apps[app_id] = info
            self._by_name.setdefault(name, app_id)
            if len(self._apps) > self.max_apps:
                _, old = self._apps.popitem(last=False)
                if self._by_name.get(old.name) == old.app_id:
                    del self._by_name[old.name]
        else:
            self._apps.move_to_end(app_id)
        info.runs += 1
        return info

    def learn(self, seen: AppInfo) -> AppInfo:
        """An app another process's resolver knows, with what identifies it (an edge's book,
        told to a newly elected scheduler): remembered as :meth:`note` does, its runs added
        to those counted here (each edge counts the runs it started)."""
        info = self._apps.get(seen.app_id)
        if info is None:
            info = AppInfo(seen.app_id, seen.name, seen.tenant, seen.model, list(seen.tools),
                           seen.instructions, seen.first_seen)
            self.added += 1
            self._apps[seen.app_id] = info
            self._by_name.setdefault(seen.name, seen.app_id)
            if len(self._apps) > self.max_apps:
                _, old = self._apps.popitem(last=False)
                if self._by_name.get(old.name) == old.app_id:
                    del self._by_name[old.name]
        else:
            if not info.tools and not info.instructions:  # noted from a call: fill it in
                info.tools, info.instructions = list(seen.tools), seen.instructions
            info.first_seen = min(info.first_seen, seen.first_seen)
        info.runs += seen.runs
        return info

    def apps(self) -> list[AppInfo]:
        """Every app remembered, most recently seen last."""
        return list(self._apps.values())


class AppNames(BaseModel):
    """The operator's renames and merges of inferred apps, stored with the knowledge base.

    ``renames``: app id -> name. ``merges``: app id -> the app id it is merged into (a run
    fingerprinted as the first is a run of the second, with the second's name). Keys and
    values are app ids (:func:`app_fingerprint`), which never change, so a mapping survives
    renames. ``model_dump_json()`` / ``AppNames.model_validate_json(text)`` round-trip it.
    """

    model_config = ConfigDict(extra="forbid")

    version: int = 1
    renames: dict[str, str] = Field(default_factory=dict)
    merges: dict[str, str] = Field(default_factory=dict)

    def canonical(self, app_id: str) -> str:
        """The app id a run of ``app_id`` belongs to, after merges (cycle-safe)."""
        seen = 0
        while app_id in self.merges and seen < MAX_MERGE_HOPS:
            app_id = self.merges[app_id]
            seen += 1
        return app_id

    def name(self, app_id: str, default: str) -> str:
        """The operator's name for ``app_id`` (canonical), else ``default``."""
        return self.renames.get(app_id, default)

    def rename(self, app_id: str, name: str) -> None:
        if not name or _NAME_OK.search(name):
            raise ValueError(f"app name {name!r}: use letters, digits, '_', '.', '-'")
        self.renames[app_id] = name

    def merge(self, app_id: str, into: str) -> None:
        """Merge ``app_id`` into ``into`` (refused when it would make a cycle)."""
        if self.canonical(into) == app_id or app_id == into:
            raise ValueError(f"merging {app_id} into {into} would make a cycle")
        self.merges[app_id] = into

    def digest(self) -> str:
        """A short digest of the mapping (hex BLAKE2b-64 of its sorted JSON): edges compare
        it with the one they follow (:mod:`hermes.gateway.edge.wire` ``Ping.names``)."""
        text = json.dumps({"r": self.renames, "m": self.merges}, sort_keys=True,
                          separators=(",", ":"))
        return blake2b(text.encode(), digest_size=8, person=b"hermes-names").hexdigest()
