"""The PDGraph knowledge base: a directory of JSON files or Redis, behind one interface.

``open_store(None)`` opens the default knowledge base (:func:`default_kb`: ``$HERMES_KB``, else
the PDGraphs shipped with Hermes), ``open_store("shipped")`` the shipped PDGraphs (package data
``hermes/data/pdgraphs``, found through :mod:`importlib.resources` from any directory),
``open_store("some/dir")`` a :class:`FileStore` there and ``open_store("redis://host:port/0")``
a :class:`RedisStore`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from hermes.kb.base import (
    APP_NAME_RE,
    DEFAULT_MAX_RECORDS,
    KnowledgeBase,
    validate_app_name,
)
from hermes.kb.file import FileStore
from hermes.kb.redis_store import RedisStore

__all__ = [
    "APP_NAME_RE",
    "DEFAULT_MAX_RECORDS",
    "FileStore",
    "KnowledgeBase",
    "RedisStore",
    "check_kb_environment",
    "default_kb",
    "open_store",
    "shipped_pdgraphs_dir",
    "validate_app_name",
]

#: the one environment variable naming the knowledge base (the gateway's ``stores.kb``)
ENV_KB = "HERMES_KB"
#: environment variables that used to name it, and what replaced them
RENAMED_ENV = {"HERMES_PDGRAPHS": ENV_KB}
#: the ``stores.kb`` / ``--kb`` / ``HERMES_KB`` value naming the PDGraphs shipped with Hermes
SHIPPED = "shipped"
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def shipped_pdgraphs_dir() -> Path:
    """The PDGraphs shipped with Hermes (package data), wherever Hermes is installed."""
    return Path(str(resources.files("hermes") / "data" / "pdgraphs"))


def check_kb_environment(environ: Mapping[str, str] | None = None) -> None:
    """Refuse (ValueError) an environment variable that no longer names the knowledge base."""
    env = os.environ if environ is None else environ
    for old, new in RENAMED_ENV.items():
        if old in env:
            raise ValueError(f"{old} is no longer read: set {new} instead (a PDGraph directory, "
                             f"redis://HOST:PORT/DB, or {SHIPPED!r} for the shipped PDGraphs)")


def default_kb() -> str:
    """The knowledge base used when none is given: ``$HERMES_KB``, else ``"shipped"``."""
    check_kb_environment()
    return os.environ.get(ENV_KB) or SHIPPED


def open_store(
    spec: str | Path | None = None, *, max_records: int = DEFAULT_MAX_RECORDS
) -> KnowledgeBase:
    """Open a knowledge base: None -> :func:`default_kb`, ``"shipped"`` -> the shipped PDGraphs,
    a ``redis://``/``rediss://``/``unix://`` URL -> :class:`RedisStore`, anything else ->
    :class:`FileStore` at that path."""
    if spec is None:
        spec = default_kb()
    if spec == SHIPPED:
        return FileStore(shipped_pdgraphs_dir(), max_records=max_records)
    if isinstance(spec, str) and spec.startswith(REDIS_SCHEMES):
        return RedisStore(spec, max_records=max_records)
    return FileStore(Path(spec), max_records=max_records)
