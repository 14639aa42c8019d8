"""What the gateway app holds for its routes: the live scheduler and the hosted-app registry.

Every route of the edge reaches the services through these two accessors (one typed place
instead of a private ``_sched`` per API module); :func:`hermes.gateway.app.create_app` puts
them on ``app.state``.
"""

from __future__ import annotations

from fastapi import Request

from hermes.gateway.hosted import HostedRegistry
from hermes.gateway.scheduler import LiveScheduler


def scheduler_of(request: Request) -> LiveScheduler:
    """The app's live scheduler."""
    sched: LiveScheduler = request.app.state.scheduler
    return sched


def hosted_of(request: Request) -> HostedRegistry:
    """The app's registry of hosted applications."""
    reg: HostedRegistry = request.app.state.hosted
    return reg
