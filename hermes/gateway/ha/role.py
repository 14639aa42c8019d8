"""A gateway process among elected schedulers: a standby until elected, then the leader until
its lease ends, then gone.

:class:`SchedulerRole` takes part in the election (:mod:`hermes.gateway.ha.election`) for the
gateway's :class:`~hermes.gateway.scheduler.LiveScheduler`:

- **standby**: the process is up and warm (imports, knowledge base, store connections), its
  scheduler is built but not started: no node socket, no runs. HTTP answers 503 (code
  ``not_leader``, ``Retry-After``) except the health endpoints; ``/readyz`` is 503, so a load
  balancer that checks it sends no traffic here;
- **elected** (a new epoch): every message to a node is stamped with the epoch and sent only
  while the lease holds (:attr:`~hermes.gateway.nodes.NodeTable.fence`); the scheduler starts
  (binds the node socket), reads the operator's app names again from the knowledge base (a
  rename or merge made under the previous leader), restores the accepted runs from the
  shared store and resumes them once the nodes its predecessor served have said hello (they
  report the work they hold, which is adopted rather than run again:
  :mod:`hermes.gateway.recovery`); ``/readyz`` is 200;
- **deposed** (a renewal refused, or none in time: a pause, a lost store): the process stops
  at once with exit status :data:`EXIT_DEPOSED`, without writing anything, as Kubernetes'
  leader-elected controllers do; its supervisor (Kubernetes, systemd, ``hermes bench ha``)
  starts it again as a standby. Nodes reject its stale epoch in any case;
- **elected but unable to lead** (its start failed: the node socket's port taken by another
  process, an unreachable store): the error is logged, the lease given up at once (a standby
  takes over without waiting for it to expire) and the process exits with
  :data:`EXIT_DEPOSED`, to be started again as a standby. Before, it went on renewing a
  lease it could not serve under: no scheduler served at all until it was killed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from hermes.core.lease import LeaseTerms
from hermes.gateway.config import GatewayConfig
from hermes.gateway.ha.backends import open_lease_store
from hermes.gateway.ha.election import LeaderElection

log = logging.getLogger("hermes.gateway.ha")

#: exit status of a scheduler whose lease ended (EX_TEMPFAIL: restart it, as a standby)
EXIT_DEPOSED = 75

#: how often (wall s) an elected all-in-one leader stores the inferred apps, when added
APPS_PUBLISH_S = 0.5

#: paths a standby still answers (health, metrics)
STANDBY_PATHS = ("/readyz", "/healthz", "/metrics")


class SchedulerRole:
    """This process's part in the election (see the module doc)."""

    def __init__(self, config: GatewayConfig, scheduler: Any,
                 activate: Callable[[], Awaitable[None]], *,
                 exit: Callable[[int], Any] = os._exit) -> None:
        ha = config.ha
        self.config = config
        self.scheduler = scheduler
        self.activate = activate
        self.exit = exit
        self.member = ha.member or f"{socket.gethostname()}:{os.getpid()}"
        self.store = open_lease_store(ha.election)
        terms = LeaseTerms(ttl_s=ha.lease_ttl_s, renew_s=ha.lease_renew_s)
        self.election = LeaderElection(
            self.store, terms, self.member, on_elected=self._on_elected,
            on_deposed=self._on_deposed,
            record={"nodes_address": ha.advertised(config.scheduler.bind),
                    "http_address": _http_address(config),
                    # split roles: where edges send their calls (hermes.gateway.edge)
                    "edge_address": ha.advertised(ha.edge_bind) if ha.edge_bind else None})
        #: serving as the leader (elected and started)
        self.active = False
        self.elected_at: float | None = None  # wall time the lease was granted
        self.activated_at: float | None = None  # wall time the scheduler was started
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        # a thread waiting for the GIL gets it within 1 ms (5 by default): the renewals
        # must not wait behind a busy event loop
        sys.setswitchinterval(0.001)
        self.election.start()
        log.warning("scheduler %s: standby, waiting for the lease in %s", self.member,
                    self.store.url)
        from hermes.kb import REDIS_SCHEMES

        kb = self.config.stores.kb
        if not kb.startswith(REDIS_SCHEMES):
            log.warning("scheduler %s: [stores] kb = %r is this process's own (a directory is "
                        "read-only: what it learns and the operator's app names are written "
                        "under its state directory): a scheduler elected after it has neither; "
                        "give every scheduler one redis:// knowledge base", self.member, kb)

    async def stop(self) -> None:
        """A clean stop: give the lease up (a standby takes over at once), the inferred apps
        of an all-in-one leader stored first."""
        for t in self._tasks:
            t.cancel()
        if self.active and self._all_in_one:
            await self._store_apps()
        await asyncio.to_thread(self.election.stop, release=True)

    def ready(self) -> bool:
        """Whether traffic should come here: elected, started, and the lease holds."""
        return self.active and self.election.held()

    def describe(self) -> dict[str, Any]:
        nodes = self.scheduler.node_table
        return {"role": "leader" if self.ready() else "standby", "member": self.member,
                "epoch": self.election.epoch, "elected_at": self.elected_at,
                "activated_at": self.activated_at,
                "first_dispatch_at": nodes.first_dispatch_at,
                "fenced_sends": self.scheduler.stats.get("ha_fenced_sends", 0)}

    # ------------------------------------------------------------------ election callbacks
    def _on_elected(self, epoch: int) -> None:  # the election thread
        assert self._loop is not None
        at = time.time()
        self._loop.call_soon_threadsafe(
            lambda: self._tasks.append(self._loop.create_task(  # type: ignore[union-attr]
                self._become_leader(epoch, at), name="hermes-ha-elected")))

    async def _become_leader(self, epoch: int, at: float) -> None:
        """Start leading at ``epoch`` (module doc, "elected"); a start that fails gives the
        lease up and ends the process (module doc, "elected but unable to lead")."""
        try:
            await self._lead(epoch, at)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # whatever stops it, it must not hold the lease on
            await self._give_up(epoch, exc)

    async def _give_up(self, epoch: int, exc: Exception) -> None:
        """The start at ``epoch`` failed with ``exc``: release the lease, exit to be
        restarted as a standby."""
        self.active = False
        log.error("scheduler %s: elected at epoch %d but could not start leading: %s: %s; "
                  "giving the lease up", self.member, epoch, type(exc).__name__, exc,
                  exc_info=exc)
        try:
            await asyncio.to_thread(self.election.stop, release=True)
        except Exception as e:  # the lease then expires after its ttl
            log.warning("could not give the lease up: %s", e)
        print(json.dumps({"event": "ha_start_failed", "epoch": epoch, "member": self.member,
                          "error": f"{type(exc).__name__}: {exc}"}), file=sys.stderr,
              flush=True)
        self.exit(EXIT_DEPOSED)

    async def _lead(self, epoch: int, at: float) -> None:
        sched = self.scheduler
        self.elected_at = at
        nodes = sched.node_table
        nodes.epoch = epoch
        nodes.fence = self.election.held
        try:
            expected = set(await asyncio.to_thread(self.store.nodes))
        except Exception as exc:
            log.warning("could not read the previous leader's nodes: %s", exc)
            expected = set()
        sched.recovery.expect_nodes = expected or None
        ids = getattr(sched, "identities", None)
        if ids is not None:  # the app names the previous leader may have changed since
            try:  # this process started (edges follow this leader's: hermes.gateway.edge.infer)
                if await asyncio.to_thread(ids.reload_names):
                    log.warning("scheduler %s: app names (renames, merges) read again from "
                                "the knowledge base", self.member)
            except Exception as exc:
                log.warning("could not read the app names again: %s", exc)
            if self._all_in_one:  # no edges to tell it their apps: the previous leader's
                n = ids.learned_stored(await asyncio.to_thread(ids.stored_apps))
                if n:
                    log.warning("scheduler %s: %d inferred apps of the previous leader read "
                                "from the knowledge base", self.member, n)
        sched.recovery.defer_ended = True  # the active runs first: dispatch starts sooner
        store = sched.durable.store
        if store is not None:  # read off the loop: the election thread keeps renewing
            active = getattr(store, "active_runs", None)
            if active is not None:  # the active runs now, the ended ones in the background
                sched.recovery.prefetched = await asyncio.to_thread(active)
                sched.recovery.fetch_rest = store.ended_runs_chunks
            else:
                sched.recovery.prefetched = await asyncio.to_thread(store.runs)
        await self.activate()
        # ready once the runs not ended are resuming (nodes connected, replays launched);
        # a lookup of an ended run not restored yet answers 503 (retry) meanwhile
        await sched.recovery.recovered_ready.wait()
        self.active = True
        self.activated_at = time.time()
        log.warning("scheduler %s: leader at epoch %d (elected to started: %.3f s; waiting "
                    "for nodes %s)", self.member, epoch, self.activated_at - at,
                    sorted(expected))
        self._tasks.append(asyncio.get_running_loop().create_task(
            self._publish_nodes(), name="hermes-ha-nodes"))
        if self._all_in_one and ids is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(
                self._publish_apps(), name="hermes-ha-apps"))

    @property
    def _all_in_one(self) -> bool:
        """This process serves HTTP and infers runs itself (``--ha`` without ``--role``)."""
        return self.config.ha.role == "all"

    async def _publish_apps(self) -> None:
        """All-in-one: keep the apps this leader's run resolver knows in the knowledge base
        (:data:`~hermes.gateway.identity.APPS_DOC`), written when some were added, every
        :data:`APPS_PUBLISH_S` at most: the leader elected after it lists them at takeover.
        A ``kill -9`` within that time loses the apps added since (listed again from their
        next new run)."""
        while True:
            await asyncio.sleep(APPS_PUBLISH_S)
            await self._store_apps()

    async def _store_apps(self) -> None:
        """Write the inferred apps once, if some were added and the lease holds (a write
        that fails is made again next time)."""
        ids = self.scheduler.identities
        if not self.election.held():
            return
        doc = ids.take_apps_doc()
        if doc is None:
            return
        try:
            await asyncio.to_thread(ids.store_apps, doc)
        except Exception as exc:
            ids.apps_doc_not_stored()
            log.warning("could not store the inferred apps in the knowledge base: %s", exc)

    async def _publish_nodes(self) -> None:
        """Keep the names of the nodes served in the store (a successor waits for them)."""
        last: list[str] | None = None
        while True:
            names = sorted(self.scheduler.nodes)
            if names != last and names:
                try:
                    await asyncio.to_thread(self.store.put_nodes, names)
                    last = names
                except Exception as exc:
                    log.warning("could not publish the node names: %s", exc)
            await asyncio.sleep(0.5)

    def _on_deposed(self, epoch: int, why: str) -> None:  # the election thread
        self.active = False
        if epoch < 0:
            return
        fenced = self.scheduler.stats.get("ha_fenced_sends", 0)
        msg = (f"hermes: scheduler {self.member} lost the lease of epoch {epoch} ({why}); "
               f"{fenced} sends were fenced; exiting ({EXIT_DEPOSED}) to restart as a standby")
        log.error(msg)
        print(json.dumps({"event": "ha_deposed", "epoch": epoch, "why": why,
                          "fenced_sends": fenced, "member": self.member}), file=sys.stderr,
              flush=True)
        self.exit(EXIT_DEPOSED)


def _http_address(config: GatewayConfig) -> str:
    """``host:port`` of this process's HTTP server as others dial it (edges proxy to it)."""
    host = config.server.host
    if host in ("0.0.0.0", "::", "") and config.ha.advertise:
        host = config.ha.advertise
    return f"{host}:{config.server.port}"


class StandbyGate:
    """ASGI middleware: while this process is not the serving leader, every HTTP request but
    the health paths gets 503 ``not_leader`` (a load balancer retries elsewhere)."""

    def __init__(self, app: Any, state: Any) -> None:
        self.app = app
        self.state = state  # the FastAPI app's state: ``ha`` is the SchedulerRole
        self._body = json.dumps({"error": {
            "message": "this gateway's scheduler is a standby (not the lease holder); retry "
                       "through the load balancer", "type": "service_unavailable",
            "param": None, "code": "not_leader"}}).encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in STANDBY_PATHS:
            role = getattr(self.state, "ha", None)
            if role is None or not role.ready():
                await send({"type": "http.response.start", "status": 503,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"retry-after", b"1"),
                                        (b"content-length", str(len(self._body)).encode())]})
                await send({"type": "http.response.body", "body": self._body})
                return
        await self.app(scope, receive, send)
