"""The Hermes gateway: the HTTP edge (``api/``), the live scheduler's services and their map
(``docs/architecture.md``).

Entry points: :func:`hermes.gateway.config.load_config`, :func:`hermes.gateway.server.serve`,
:func:`hermes.gateway.app.create_app`. Importing this package imports nothing heavy.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "load_config", "serve", "start_background", "GatewayConfig"]


def __getattr__(name: str) -> Any:  # lazy, so `import hermes.gateway` stays cheap
    if name in ("load_config", "GatewayConfig"):
        from hermes.gateway import config

        return getattr(config, name)
    if name == "create_app":
        from hermes.gateway.app import create_app

        return create_app
    if name in ("serve", "start_background"):
        from hermes.gateway import server

        return getattr(server, name)
    raise AttributeError(name)
