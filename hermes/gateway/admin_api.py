"""Moved: the admin API is :mod:`hermes.gateway.api.admin_api` (issue 16).

Kept only for :mod:`hermes.gateway.looplag`, which imports ``require_admin`` from here; remove
this module once it imports from :mod:`hermes.gateway.api.admin_api`.
"""

from __future__ import annotations

from hermes.gateway.api.admin_api import require_admin

__all__ = ["require_admin"]
