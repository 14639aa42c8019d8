"""API keys per tenant: their format, hashing, and the stores that keep their hashes.

A key is ``hk-<id>.<secret>``: ``id`` (8 hex digits) finds the stored entry, ``secret`` (32
random bytes, URL-safe base64) is checked against its scrypt hash (``scrypt$N$r$p$salt$hash``,
:func:`hashlib.scrypt`) with a constant-time compare. Only the hash is stored; ``hermes keys
create`` prints the key once. Stores: a JSON auth file (:class:`FileKeyStore`, reloaded when
it changes, so keys created while the gateway runs work at once) or Redis
(:class:`RedisKeyStore`, shared by several gateways). The auth file also holds per-tenant
limits::

    {"version": 1,
     "keys": [{"id": "1a2b3c4d", "tenant": "acme", "hash": "scrypt$...", "created": 1.7e9}],
     "tenants": {"acme": {"rate": 20, "burst": 40, "max_concurrent": 8,
                          "max_active_runs": 100, "rpm": 600}}}

Checking a key against a request (caching, throttling, the middleware) is
:mod:`hermes.gateway.auth`'s.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes.core.limits import TenantLimits

KEY_PREFIX = "hk-"
_SCRYPT = (1 << 14, 8, 1)  # N, r, p: ~20 ms and 16 MiB per hash


class AuthError(ValueError):
    """A bad auth file or key store (the message names the file and the field)."""


class KeyStoreUnavailable(RuntimeError):
    """The key store (Redis) did not answer: no key can be checked against it now."""


# ---------------------------------------------------------------------------------- hashing
def hash_secret(secret: str, *, salt: bytes | None = None, params: tuple[int, int, int] = _SCRYPT) -> str:
    """``scrypt$N$r$p$salt$hash`` of ``secret`` (salt and hash in hex)."""
    n, r, p = params
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(secret.encode(), salt=salt, n=n, r=r, p=p, maxmem=64 << 20, dklen=32)
    return f"scrypt${n}${r}${p}${salt.hex()}${digest.hex()}"


def verify_secret(secret: str, stored: str) -> bool:
    """Whether ``secret`` matches the stored hash (constant-time compare of the digests)."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        got = hashlib.scrypt(secret.encode(), salt=bytes.fromhex(salt), n=int(n), r=int(r),
                             p=int(p), maxmem=64 << 20, dklen=len(digest) // 2)
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got.hex(), digest)


def new_key() -> tuple[str, str, str]:
    """A fresh key: ``(key, id, secret)``."""
    key_id = secrets.token_hex(4)
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    return f"{KEY_PREFIX}{key_id}.{secret}", key_id, secret


def split_key(key: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a well-formed key, else None."""
    if not key.startswith(KEY_PREFIX) or "." not in key:
        return None
    key_id, _, secret = key[len(KEY_PREFIX):].partition(".")
    if not key_id or not secret or len(key) > 256:
        return None
    return key_id, secret


@dataclass(frozen=True, slots=True)
class KeyEntry:
    id: str
    tenant: str
    hash: str
    created: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "tenant": self.tenant, "hash": self.hash, "created": self.created}


def _limits(obj: Any, where: str) -> TenantLimits:
    if not isinstance(obj, dict):
        raise AuthError(f"{where}: expected an object of limits")
    allowed = {"rate", "burst", "max_concurrent", "max_active_runs", "rpm"}
    extra = set(obj) - allowed
    if extra:
        raise AuthError(f"{where}: unknown field(s) {sorted(extra)}; allowed: {sorted(allowed)}")
    for k, v in obj.items():
        if v is not None and (not isinstance(v, int | float) or isinstance(v, bool) or v <= 0):
            raise AuthError(f"{where}.{k}: must be a positive number or null, got {v!r}")
    return TenantLimits(**obj)


# ---------------------------------------------------------------------------------- stores
class KeyStore(ABC):
    """Where key hashes (and per-tenant limits) are kept."""

    @abstractmethod
    def get(self, key_id: str) -> KeyEntry | None: ...

    @abstractmethod
    def add(self, entry: KeyEntry) -> None: ...

    @abstractmethod
    def revoke(self, key_id: str) -> bool: ...

    @abstractmethod
    def entries(self) -> list[KeyEntry]: ...

    def tenant_limits(self) -> dict[str, TenantLimits]:
        return {}

    def create(self, tenant: str) -> str:
        """Make a key for ``tenant``, store its hash, return the key (shown once)."""
        if not tenant or len(tenant) > 128 or not all(c.isalnum() or c in "_.-" for c in tenant):
            raise AuthError(f"bad tenant name {tenant!r}: 1-128 characters from [A-Za-z0-9_.-]")
        key, key_id, secret = new_key()
        self.add(KeyEntry(key_id, tenant, hash_secret(secret), time.time()))
        return key


class FileKeyStore(KeyStore):
    """Keys in a JSON auth file (mode 0600), re-read when the file changes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int, int] | None = None
        self._data: dict[str, Any] = {"version": 1, "keys": [], "tenants": {}}
        self._by_id: dict[str, KeyEntry] = {}
        self._limits: dict[str, TenantLimits] = {}
        self._lock = threading.Lock()

    def _load(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._by_id, self._limits = None, {}, {}
            self._data = {"version": 1, "keys": [], "tenants": {}}
            return
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        try:
            data = json.loads(self.path.read_text())
        except ValueError as e:
            raise AuthError(f"{self.path}: not valid JSON: {e}") from None
        if not isinstance(data, dict) or not isinstance(data.get("keys", []), list):
            raise AuthError(f"{self.path}: expected an object with a 'keys' list")
        by_id = {}
        for i, k in enumerate(data.get("keys", [])):
            try:
                e = KeyEntry(str(k["id"]), str(k["tenant"]), str(k["hash"]), float(k.get("created", 0)))
            except (KeyError, TypeError, ValueError) as err:
                raise AuthError(f"{self.path}: keys[{i}]: missing or bad field {err}") from None
            by_id[e.id] = e
        tenants = data.get("tenants", {}) or {}
        if not isinstance(tenants, dict):
            raise AuthError(f"{self.path}: 'tenants' must be an object")
        self._limits = {t: _limits(v, f"{self.path}: tenants.{t}") for t, v in tenants.items()}
        self._data, self._by_id, self._stamp = data, by_id, stamp

    def get(self, key_id: str) -> KeyEntry | None:
        with self._lock:
            self._load()
            return self._by_id.get(key_id)

    def entries(self) -> list[KeyEntry]:
        with self._lock:
            self._load()
            return list(self._by_id.values())

    def tenant_limits(self) -> dict[str, TenantLimits]:
        with self._lock:
            self._load()
            return dict(self._limits)

    def _save(self) -> None:
        from hermes.fsutil import atomic_write_text

        atomic_write_text(self.path, json.dumps(self._data, indent=2) + "\n")
        os.chmod(self.path, 0o600)
        self._stamp = None

    def add(self, entry: KeyEntry) -> None:
        with self._lock:
            self._load()
            self._data.setdefault("keys", []).append(entry.to_json())
            self._save()

    def revoke(self, key_id: str) -> bool:
        with self._lock:
            self._load()
            keys = self._data.get("keys", [])
            kept = [k for k in keys if k.get("id") != key_id]
            if len(kept) == len(keys):
                return False
            self._data["keys"] = kept
            self._save()
            return True

    def set_limits(self, tenant: str, limits: dict[str, Any]) -> None:
        with self._lock:
            self._load()
            _limits(limits, f"{self.path}: tenants.{tenant}")
            self._data.setdefault("tenants", {})[tenant] = limits
            self._save()


class RedisKeyStore(KeyStore):
    """Keys in Redis: hash ``<prefix>keys`` (id -> entry JSON), ``<prefix>tenants`` (limits)."""

    def __init__(self, url: str, prefix: str = "hermes:auth:") -> None:
        import redis

        # short timeouts: a key is checked on every request, on the event loop
        self.r = redis.Redis.from_url(url, decode_responses=True, socket_timeout=1.0,
                                      socket_connect_timeout=1.0)
        self.prefix = prefix

    def get(self, key_id: str) -> KeyEntry | None:
        import redis

        try:
            raw = self.r.hget(self.prefix + "keys", key_id)
        except redis.RedisError as e:
            raise KeyStoreUnavailable(f"key store {self.prefix}keys: {e}") from None
        if raw is None:
            return None
        d = json.loads(raw)
        return KeyEntry(d["id"], d["tenant"], d["hash"], float(d.get("created", 0)))

    def add(self, entry: KeyEntry) -> None:
        self.r.hset(self.prefix + "keys", entry.id, json.dumps(entry.to_json()))

    def revoke(self, key_id: str) -> bool:
        return bool(self.r.hdel(self.prefix + "keys", key_id))

    def entries(self) -> list[KeyEntry]:
        out = []
        for raw in self.r.hgetall(self.prefix + "keys").values():
            d = json.loads(raw)
            out.append(KeyEntry(d["id"], d["tenant"], d["hash"], float(d.get("created", 0))))
        return out

    def tenant_limits(self) -> dict[str, TenantLimits]:
        return {t: _limits(json.loads(v), f"redis {self.prefix}tenants.{t}")
                for t, v in self.r.hgetall(self.prefix + "tenants").items()}

    def set_limits(self, tenant: str, limits: dict[str, Any]) -> None:
        _limits(limits, f"tenants.{tenant}")
        self.r.hset(self.prefix + "tenants", tenant, json.dumps(limits))


def open_key_store(auth_file: str = "", redis_url: str = "") -> KeyStore | None:
    if redis_url:
        return RedisKeyStore(redis_url)
    if auth_file:
        return FileKeyStore(auth_file)
    return None
