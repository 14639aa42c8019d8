"""Who is asking, and may they: API-key authentication, per-tenant admission, body limits.

Keys and their stores are :mod:`hermes.gateway.keys`'s; the request's tenant, once known, is
:data:`hermes.gateway.tenancy.current_tenant`.

Middleware (:class:`SecurityMiddleware`, pure ASGI so streamed responses pass through)
    1. request bodies larger than ``security.max_body_bytes`` get 413 (by ``Content-Length``,
       or while reading a chunked body);
    2. with authentication on, every path but ``/healthz``, ``/metrics`` (its own token), the
       OpenAPI docs and ``/admin`` (its own token) needs ``Authorization: Bearer KEY`` (or
       ``X-API-Key``): 401 otherwise; the tenant of the key is put in the request's state and
       in :data:`current_tenant`, which the run registry uses to hide other tenants' runs (404).
       A key's scrypt check runs in a worker thread (at most :attr:`Authenticator.
       verify_concurrency` at once), never on the event loop; a verified key is remembered
       for :attr:`Authenticator.cache_ttl_s` (60 s; keyed by a hash of the whole key, and
       only while the stored entry is unchanged: a revoked key fails at once). Failed checks
       are throttled per failing secret and per client address (:class:`AuthThrottle`),
       never per key id alone, so that wrong secrets sent with a tenant's key id do not lock
       that tenant out: past the budget, 429 with ``Retry-After`` without running scrypt. A
       key verified before (:attr:`Authenticator.known_ttl_s`, entry unchanged) is never
       throttled, and guesses of key ids that do not exist are throttled apart from wrong
       secrets of real ones, so guesses from an address shared with other tenants (a NAT)
       lock them out neither. The client address is the peer's; ``X-Forwarded-For`` counts only
       from the proxies named in ``server.trusted_proxies``;
    3. per-tenant admission (:class:`hermes.core.limits.Admission`): rate limit (token bucket)
       and requests in flight; 429 with ``Retry-After`` when over. Request bodies being read
       are capped per tenant too (``security.tenant_max_uploads``), before any is read: slow
       bodies of one tenant cannot hold the gateway's connections. Limits changed in the auth
       file or in Redis apply within a second, to the buckets already in use too. With a
       shared store (``cluster.store``) admission is
       :class:`~hermes.gateway.shared.SharedAdmission` (exact across gateway processes);
       when that store or the Redis key store does not answer: 503 ``store_unavailable``,
       or, with ``cluster.store_unavailable = "admit-local"``, this process's own limits
       and recently verified keys (counted in ``hermes_shared_store_unavailable_total`` and
       logged, never silent).

Admin: the ``/admin`` routes check ``HERMES_ADMIN_TOKEN`` themselves
(:func:`hermes.gateway.api.admin_api.require_admin`).

Depends on nothing of the gateway above it: errors take the shape of
:func:`hermes.gateway.errors.error_body`.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from fastapi import HTTPException, Request

from hermes.core.limits import Admission, TenantLimits, TokenBucket
from hermes.gateway.errors import wire_error
from hermes.gateway.keys import (
    AuthError,
    FileKeyStore,
    KeyEntry,
    KeyStore,
    KeyStoreUnavailable,
    RedisKeyStore,  # noqa: F401 - its old import path (hermes.cli.keys uses it)
    open_key_store,
    split_key,
    verify_secret,
)
from hermes.gateway.shared import SharedAdmission, SharedStore, StoreUnavailable
from hermes.gateway.tenancy import current_tenant

log = logging.getLogger("hermes.gateway.auth")

ADMIN_TOKEN_ENV = "HERMES_ADMIN_TOKEN"
PUBLIC_PATHS = ("/healthz", "/readyz", "/metrics", "/docs", "/redoc", "/openapi.json")


class AuthThrottle:
    """Failed key checks per failing secret and per client address: token buckets of
    ``per_key`` (``per_address``) failures, refilled at that many per ``window_s``. While a
    bucket is empty, that secret (anything from that address) is answered 429 without a
    check. The first argument names the failing secret (key id and a hash of the key), not
    the key id alone: an attacker who knows a tenant's key id cannot lock the tenant's own
    key out. Memory is bounded: the least recently failed entries are forgotten past
    ``max_entries``."""

    def __init__(self, per_key: int = 5, per_address: int = 20, window_s: float = 60.0,
                 max_entries: int = 100_000) -> None:
        self.per_key, self.per_address, self.window_s = per_key, per_address, window_s
        self.max_entries = max_entries
        self._buckets: OrderedDict[tuple[str, str], list[float]] = OrderedDict()

    def _tokens(self, kind: str, name: str, burst: int, now: float) -> float:
        b = self._buckets.get((kind, name))
        if b is None:
            return float(burst)
        return min(float(burst), b[0] + (now - b[1]) * burst / self.window_s)

    def wait(self, key_id: str | None, address: str | None, now: float, *,
             guess: bool = False) -> float:
        """Seconds until a check for ``key_id`` from ``address`` may run (0: now).
        ``guess``: a key id that does not exist, counted apart (it costs no check, and
        must not lock out the other tenants behind the same address)."""
        wait = 0.0
        for kind, name, burst in (("key", key_id, self.per_key),
                                  ("guess" if guess else "addr", address, self.per_address)):
            if name is None:
                continue
            tokens = self._tokens(kind, name, burst, now)
            if tokens < 1.0:
                wait = max(wait, (1.0 - tokens) * self.window_s / burst)
        return wait

    def failed(self, key_id: str | None, address: str | None, now: float, *,
               guess: bool = False) -> None:
        for kind, name, burst in (("key", key_id, self.per_key),
                                  ("guess" if guess else "addr", address, self.per_address)):
            if name is None:
                continue
            tokens = self._tokens(kind, name, burst, now)
            self._buckets[(kind, name)] = [max(0.0, tokens - 1.0), now]
            self._buckets.move_to_end((kind, name))
        while len(self._buckets) > self.max_entries:
            self._buckets.popitem(last=False)


class Authenticator:
    """Key -> tenant, with a short-lived cache of verified keys (scrypt is deliberately slow).

    :meth:`authenticate` (the middleware's) runs scrypt in worker threads, at most
    :attr:`verify_concurrency` at once and :attr:`max_pending` waiting, and throttles failures
    (:class:`AuthThrottle`); :meth:`tenant_of` is the same check, blocking (CLI, tests)."""

    #: how long a verified key is accepted without running scrypt again (s)
    cache_ttl_s: float = 60.0
    #: scrypt checks running at once (each ~20 ms of CPU and 16 MiB)
    verify_concurrency: int = 2
    #: checks waiting for a slot before further ones get 429
    max_pending: int = 64
    #: while the key store does not answer, accept a key verified within ``cache_ttl_s``
    #: (``cluster.store_unavailable = "admit-local"``; a key revoked meanwhile passes until
    #: then); else every check fails with :class:`KeyStoreUnavailable` (503)
    admit_cached_when_unavailable: bool = False
    #: how long a key verified once passes the throttle and the queue (s; entry unchanged)
    known_ttl_s: float = 24 * 3600.0

    def __init__(self, store: KeyStore, cache_size: int = 4096,
                 throttle: AuthThrottle | None = None) -> None:
        self.store = store
        #: sha256(key) -> (id, tenant, stored hash, when it was verified: monotonic clock)
        self._cache: OrderedDict[str, tuple[str, str, str, float]] = OrderedDict()
        #: sha256(key) -> (stored hash, when) of keys verified before: never throttled
        self._known: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.cache_size = cache_size
        self.throttle = throttle or AuthThrottle()
        self._sem: asyncio.Semaphore | None = None
        self._pending = 0
        self.stats = {"verified": 0, "failed": 0, "throttled": 0, "cache_hits": 0,
                      "cached_while_unavailable": 0}

    def _lookup(self, key: str | None) -> tuple[str, str, KeyEntry | None, str] | None:
        """``(id, secret, stored entry or None, fingerprint)`` of a well-formed key."""
        if not key:
            return None
        parts = split_key(key)
        if parts is None:
            return None
        key_id, secret = parts
        fp = hashlib.sha256(key.encode()).hexdigest()
        try:
            entry = self.store.get(key_id)  # revocation takes effect at once
        except KeyStoreUnavailable:
            hit = self._cache.get(fp) if self.admit_cached_when_unavailable else None
            if hit is None or time.monotonic() - hit[3] >= self.cache_ttl_s:
                raise
            entry = KeyEntry(hit[0], hit[1], hit[2])  # verified lately: the local view
            self.stats["cached_while_unavailable"] += 1
            log.warning("key store unavailable: key id %s accepted from this process's cache "
                        "(cluster.store_unavailable = 'admit-local')", key_id)
        return key_id, secret, entry, fp

    def _cached(self, fp: str, entry: KeyEntry, now: float) -> bool:
        hit = self._cache.get(fp)
        if hit is None:
            return False
        if hit[:3] != (entry.id, entry.tenant, entry.hash) or now - hit[3] >= self.cache_ttl_s:
            del self._cache[fp]  # expired, or the stored entry changed
            return False
        self._cache.move_to_end(fp)
        self.stats["cache_hits"] += 1
        return True

    def _remember(self, fp: str, entry: KeyEntry, now: float) -> None:
        self._cache[fp] = (entry.id, entry.tenant, entry.hash, now)
        self._cache.move_to_end(fp)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        self._known[fp] = (entry.hash, now)
        self._known.move_to_end(fp)
        while len(self._known) > 4 * self.cache_size:
            self._known.popitem(last=False)

    def _is_known(self, fp: str, entry: KeyEntry, now: float) -> bool:
        """This very key was verified within :attr:`known_ttl_s` and its entry is unchanged."""
        hit = self._known.get(fp)
        return hit is not None and hit[0] == entry.hash and now - hit[1] < self.known_ttl_s

    def tenant_of(self, key: str | None) -> str | None:
        """The key's tenant, or None if the key is missing, malformed, unknown or revoked
        (blocking; no throttling)."""
        got = self._lookup(key)
        if got is None or got[2] is None:
            return None
        _, secret, entry, fp = got
        now = time.monotonic()
        if self._cached(fp, entry, now):
            return entry.tenant
        if not verify_secret(secret, entry.hash):
            return None
        self._remember(fp, entry, now)
        return entry.tenant

    async def authenticate(self, key: str | None, address: str | None) -> tuple[str | None, float]:
        """``(tenant, 0)`` for a good key, ``(None, 0)`` for a missing, malformed, unknown,
        revoked or wrong one (401), ``(None, seconds)`` when throttled (429 + Retry-After)."""
        got = self._lookup(key)
        if got is None:
            return None, 0.0
        key_id, secret, entry, fp = got
        now = time.monotonic()
        if entry is not None and self._cached(fp, entry, now):
            return entry.tenant, 0.0
        known = entry is not None and self._is_known(fp, entry, now)
        failing = f"{key_id}:{fp}"  # this secret, not the key id alone
        if not known:
            wait = self.throttle.wait(failing if entry is not None else None, address, now,
                                      guess=entry is None)
            if wait > 0:
                self.stats["throttled"] += 1
                return None, wait
        if entry is None:  # unknown id: no scrypt, but a guess from this address
            self.throttle.failed(None, address, now, guess=True)
            self.stats["failed"] += 1
            return None, 0.0
        if self._pending >= self.max_pending and not known:
            self.stats["throttled"] += 1
            return None, 1.0
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.verify_concurrency)
        self._pending += 1
        try:
            async with self._sem:
                ok = await asyncio.to_thread(verify_secret, secret, entry.hash)
        finally:
            self._pending -= 1
        now = time.monotonic()
        if not ok:
            self.throttle.failed(failing, address, now)
            self.stats["failed"] += 1
            return None, 0.0
        self.stats["verified"] += 1
        self._remember(fp, entry, now)
        return entry.tenant, 0.0


# ---------------------------------------------------------------------------------- admin
def _bearer(value: str | None) -> str | None:
    if value and value[:7].lower() == "bearer ":
        return value[7:].strip()
    return None


# ---------------------------------------------------------------------------------- config
def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class Security:
    """What the middleware enforces, built from the config's ``[security]`` section."""

    authenticator: Authenticator | None
    admission: Admission
    max_body_bytes: int
    store: KeyStore | None = None
    #: the shared store (``cluster.store``): its outages are counted here too
    shared: SharedStore | None = None
    #: request bodies of one tenant being read at once (0: unlimited)
    max_uploads: int = 0
    #: tenant -> request bodies being read now
    uploading: dict[str, int] = field(default_factory=dict)

    #: an edge that must not enforce limits per instance (no shared store, no
    #: ``cluster.per_edge_limits``): limits that appear in the key store while it serves
    #: are logged as an ERROR naming the fix (they are enforced by this process meanwhile)
    warn_local_limits: str = ""

    @property
    def auth_on(self) -> bool:
        return self.authenticator is not None

    def local_limits(self) -> list[str]:
        """The admission limits this process enforces from its own memory, one phrase each
        naming where it is set (the config key, or the key store's tenant); empty with a
        shared store (:class:`SharedAdmission`: exact across processes) or without limits.
        ``max_active_runs`` is not one (the scheduler counts runs), nor ``burst`` without a
        rate."""
        adm = self.admission
        if not isinstance(adm, Admission):
            return []
        out = [f"security.tenant_{name} = {value:g}"
               for name, value in adm.default.counted()]
        where = (f"the auth file {self.store.path}" if isinstance(self.store, FileKeyStore)
                 else "the Redis key store (security.auth_redis)")
        for tenant, lim in sorted(adm.per_tenant.items()):
            counted = lim.counted()
            if counted:
                out.append(f"tenant {tenant!r} ({', '.join(n for n, _ in counted)}) in {where}")
        return out

    def refresh_limits(self) -> None:
        """Re-read per-tenant limits from the store and apply them live: a tenant whose
        limits changed gets its rate bucket re-made with the new rate and burst (a lower
        burst caps the tokens it had, a higher one adds the difference at once), or dropped
        when it has no rate limit any more."""
        if self.store is None:
            return
        new = self.store.tenant_limits()
        adm = self.admission
        old = adm.per_tenant
        if new == old:
            return
        adm.per_tenant = new
        local = self.local_limits() if self.warn_local_limits else []
        if local:
            log.error("%s: %s", self.warn_local_limits, "; ".join(local))
        if not isinstance(adm, Admission):
            return  # shared admission: the limits go with every call
        for tenant in list(adm.buckets):
            if old.get(tenant, adm.default) == new.get(tenant, adm.default):
                continue
            lim = adm.limits(tenant)
            bucket = adm.buckets.pop(tenant)
            if lim.rate is None:
                continue
            burst = lim.burst if lim.burst is not None else max(1.0, lim.rate)
            fresh = TokenBucket(lim.rate, burst)
            bucket._refill(time.monotonic())
            fresh.tokens = min(burst, bucket.tokens + max(0.0, burst - bucket.burst))
            fresh.stamp = bucket.stamp
            adm.buckets[tenant] = fresh


def check_exposure(config: Any) -> None:
    """Refuse (:class:`AuthError`) to serve off loopback without authentication, or with
    unsandboxed tool calls at all; called before the listening socket is bound."""
    sec = config.security
    if config.tools.unsafe_unsandboxed and not is_loopback(config.server.host):
        raise AuthError(
            f"refusing to serve on {config.server.host} with unsafe unsandboxed tool calls "
            "(--unsafe-unsandboxed-tools / tools.unsafe_unsandboxed): any client could run "
            "code as the gateway's user. It is for local development on loopback only; "
            "install bubblewrap or connect a HermesLet with --docker instead")
    if not (sec.auth_file or sec.auth_redis) and not is_loopback(config.server.host):
        raise AuthError(
            f"refusing to serve on {config.server.host} without authentication: give "
            "--auth-file FILE (keys from `hermes keys create`) or security.auth_redis")


def build_security(config: Any, shared: SharedStore | None = None) -> Security:
    """The gateway's :class:`Security`; refuses to serve off loopback without authentication.
    ``shared``: the shared store, where per-tenant admission then lives (exact across
    gateway processes)."""
    check_exposure(config)
    sec = config.security
    store = open_key_store(sec.auth_file, sec.auth_redis)
    default = TenantLimits(rate=sec.tenant_rate or None, burst=sec.tenant_burst or None,
                           max_concurrent=sec.tenant_max_concurrent or None,
                           max_active_runs=sec.tenant_max_active_runs or None,
                           rpm=sec.tenant_rpm or None)
    admission: Admission | SharedAdmission = Admission(default=default)
    if shared is not None:
        admission = SharedAdmission(shared, default=default,
                                    lease_s=config.scheduler.request_timeout_s)
    auth = Authenticator(store) if store is not None else None
    if auth is not None and shared is not None:
        auth.admit_cached_when_unavailable = shared.policy == "admit-local"
    s = Security(auth, admission, sec.max_body_bytes, store, shared,
                 max_uploads=sec.tenant_max_uploads)
    if store is not None:
        s.admission.per_tenant = store.tenant_limits()  # also fails early on a bad file
        if sec.first_key_tenant and not store.entries():
            first_key(store, sec.first_key_tenant, sec.auth_redis or sec.auth_file)
    return s


def first_key(store: KeyStore, tenant: str, where: str) -> str:
    """The first API key of an empty key store (``security.first_key_tenant``: a container's
    first start), printed once on stdout; only its hash is kept."""
    key = store.create(tenant)
    print(f"hermes: no API key yet in {where}: created one for tenant {tenant!r}, shown only "
          f"once (Authorization: Bearer KEY; more with `hermes keys create`):\n{key}",
          flush=True)
    return key


# ---------------------------------------------------------------------------------- middleware
class BodyTooLarge(HTTPException):
    """Raised while reading a (chunked) body that grows over the limit: 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is over the limit of {limit} bytes")


def _json_error(status: int, message: str, code: str, headers: list[tuple[bytes, bytes]] | None = None,
                path: str = "") -> tuple[dict, bytes]:
    """The answer's start and body, in the error shape of ``path``'s API
    (:func:`hermes.gateway.errors.wire_error`)."""
    status, err = wire_error(path, status, message, code=code)
    body = json.dumps(err).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    hdrs += headers or []
    return {"type": "http.response.start", "status": status, "headers": hdrs}, body


class SecurityMiddleware:
    """Body size limit, API-key authentication, tenant scoping and admission (see module doc)."""

    def __init__(self, app: Any, security: Security) -> None:
        self.app = app
        self.security = security
        self._last_limits = 0.0

    async def _reply(self, send: Any, status: int, message: str, code: str,
                     headers: list[tuple[bytes, bytes]] | None = None, path: str = "") -> None:
        start, body = _json_error(status, message, code, headers, path)
        await send(start)
        await send({"type": "http.response.body", "body": body})

    async def _unavailable(self, send: Any, why: str) -> None:
        """503: the shared state a request needs cannot be read (never admitted silently)."""
        await self._reply(send, 503, f"{why}; refused (cluster.store_unavailable = "
                          "'refuse'); retry later", "store_unavailable", [(b"retry-after", b"1")])

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sec = self.security
        path: str = scope.get("path", "")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        limit = sec.max_body_bytes
        clen = headers.get("content-length")
        if clen is not None:
            try:
                n = int(clen)
            except ValueError:
                await self._reply(send, 400, "bad Content-Length header", "invalid_request", path=path)
                return
            if n > limit:
                await self._reply(send, 413, f"request body of {n} bytes is over the limit of "
                                  f"{limit} bytes", "body_too_large", path=path)
                return
        public = path.startswith(PUBLIC_PATHS) or path.startswith("/admin")
        tenant: str | None = None
        if sec.auth_on and not public:
            key = _bearer(headers.get("authorization")) or headers.get("x-api-key")
            assert sec.authenticator is not None
            client = scope.get("client")
            try:
                tenant, wait = await sec.authenticator.authenticate(
                    key, client[0] if client else None)
            except KeyStoreUnavailable as e:
                if sec.shared is not None:
                    sec.shared.count("api-keys", "refused")
                await self._unavailable(send, str(e))
                return
            if wait > 0:
                retry = str(max(1, math.ceil(wait)))
                await self._reply(send, 429, "too many failed API-key checks from this "
                                  "client or for this key id (or too many checks in "
                                  "progress); retry later", "auth_throttled",
                                  [(b"retry-after", retry.encode())], path=path)
                return
            if tenant is None:
                await self._reply(send, 401, "missing or invalid API key (Authorization: "
                                  "Bearer hk-... or X-API-Key: hk-...)", "invalid_api_key",
                                  [(b"www-authenticate", b"Bearer")], path=path)
                return
        admitted_as: str | None = None
        if not public:
            who = tenant or headers.get("x-hermes-tenant") or "default"
            now = time.monotonic()
            if sec.store is not None and now - self._last_limits > 1.0:
                self._last_limits = now
                try:
                    sec.refresh_limits()
                except Exception:  # a half-edited file: keep the limits we had
                    pass
            adm = sec.admission
            try:  # shared admission: one round trip to the store, the loop free meanwhile
                ok, wait, reason = (await adm.admit_async(who, now)
                                    if isinstance(adm, SharedAdmission) else adm.admit(who, now))
            except StoreUnavailable as e:
                await self._unavailable(send, str(e))
                return
            if not ok:
                retry = str(max(1, math.ceil(wait))) if math.isfinite(wait) else "60"
                await self._reply(send, 429, reason, "rate_limited", [(b"retry-after", retry.encode())], path=path)
                return
            admitted_as = who
        uploading_as: str | None = None
        if admitted_as is not None and sec.max_uploads and (
                "transfer-encoding" in headers or (clen or "0").strip() not in ("", "0")):
            if sec.uploading.get(admitted_as, 0) >= sec.max_uploads:
                sec.admission.release(admitted_as)
                await self._reply(send, 429, f"more than {sec.max_uploads} request bodies of "
                                  "this tenant are being read; retry later", "rate_limited",
                                  [(b"retry-after", b"1"), (b"connection", b"close")])
                return
            uploading_as = admitted_as
            sec.uploading[admitted_as] = sec.uploading.get(admitted_as, 0) + 1
        scope.setdefault("state", {})["tenant"] = tenant
        token = current_tenant.set(tenant)
        seen = 0

        def uploaded() -> None:
            nonlocal uploading_as
            if uploading_as is not None:
                n = sec.uploading.get(uploading_as, 1) - 1
                if n > 0:
                    sec.uploading[uploading_as] = n
                else:
                    sec.uploading.pop(uploading_as, None)
                uploading_as = None

        async def limited_receive() -> dict:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
                if not msg.get("more_body", False):
                    uploaded()
            else:
                uploaded()
            return msg

        started = False

        async def tracking_send(msg: dict) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._reply(send, 413, f"request body is over the limit of {limit} bytes",
                                  "body_too_large", path=path)
        finally:
            uploaded()
            current_tenant.reset(token)
            if admitted_as is not None:
                if isinstance(sec.admission, SharedAdmission):
                    await sec.admission.release_async(admitted_as)
                else:
                    sec.admission.release(admitted_as)


def tenant_for(request: Request, asked: str | None) -> str | None:
    """The tenant a new run belongs to: the key's tenant when authentication is on (a body
    naming another tenant is refused with 403), else what the client asked for."""
    auth = request.scope.get("state", {}).get("tenant")
    if auth is None:
        return asked
    if asked is not None and asked != auth:
        raise HTTPException(403, f"tenant {asked!r} does not match the API key's tenant")
    return auth


def install_security(app: Any, config: Any, shared: SharedStore | None = None) -> Security:
    """Build :class:`Security` from ``config`` and wrap ``app`` in the middleware."""
    sec = build_security(config, shared)
    app.state.security = sec
    app.add_middleware(SecurityMiddleware, security=sec)
    return sec
