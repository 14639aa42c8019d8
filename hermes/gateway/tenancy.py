"""Which tenant the request being handled belongs to, and which runs it may see.

The security middleware (:mod:`hermes.gateway.auth`) sets :data:`current_tenant` from the
request's API key; the run registry (:mod:`hermes.gateway.runs`) hides other tenants' runs
with :func:`visible` (they answer 404). Kept apart from the middleware so that services read
the tenant without depending on the HTTP layer.
"""

from __future__ import annotations

import contextvars

#: the tenant of the request being handled (None: authentication is off)
current_tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "hermes_current_tenant", default=None)


def visible(run_tenant: str | None) -> bool:
    """Whether the current request's tenant may see a run of ``run_tenant`` (always, with
    authentication off or outside a request)."""
    t = current_tenant.get()
    return t is None or t == run_tenant
