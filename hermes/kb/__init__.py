"""The PDGraph knowledge base: a directory of JSON files or Redis, behind one interface.

``open_store(None)`` opens the default directory (see :func:`default_pdgraphs_dir`),
``open_store("some/dir")`` a :class:`FileStore` there and ``open_store("redis://host:port/0")``
a :class:`RedisStore`.
"""

from __future__ import annotations

import os
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
    "default_pdgraphs_dir",
    "open_store",
    "validate_app_name",
]

ENV_PDGRAPHS = "HERMES_PDGRAPHS"
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def default_pdgraphs_dir() -> Path:
    """The default knowledge-base directory: ``$HERMES_PDGRAPHS`` if set, else ``./pdgraphs``
    if it exists, else the ``pdgraphs/`` shipped next to the ``hermes`` package."""
    env = os.environ.get(ENV_PDGRAPHS)
    if env:
        return Path(env)
    local = Path("pdgraphs")
    if local.is_dir():
        return local
    return Path(__file__).resolve().parents[2] / "pdgraphs"


def open_store(
    spec: str | Path | None = None, *, max_records: int = DEFAULT_MAX_RECORDS
) -> KnowledgeBase:
    """Open a knowledge base: None -> the default directory, a ``redis://``/``rediss://``/
    ``unix://`` URL -> :class:`RedisStore`, anything else -> :class:`FileStore` at that path."""
    if spec is None:
        return FileStore(default_pdgraphs_dir(), max_records=max_records)
    if isinstance(spec, str) and spec.startswith(REDIS_SCHEMES):
        return RedisStore(spec, max_records=max_records)
    return FileStore(Path(spec), max_records=max_records)
