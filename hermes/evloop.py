"""The event loop the gateway and HermesLet processes run on: uvloop where installed.

uvloop (libuv) cuts the per-callback and per-socket-read cost of the event loop, which is most
of the gateway's per-request overhead besides the work itself (``hermes bench gateway``).
uvicorn picks it by itself only in ``uvicorn.run``; processes that drive ``Server.serve()`` or
their own coroutine call :func:`run` instead of :func:`asyncio.run`. ``HERMES_EVENT_LOOP=asyncio``
forces the standard loop (debugging, or a platform without uvloop); without uvloop installed,
:func:`run` is :func:`asyncio.run`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None for asyncio's default loop."""
    if os.environ.get("HERMES_EVENT_LOOP", "auto").lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def loop_name() -> str:
    """``uvloop`` or ``asyncio``: what :func:`run` would use."""
    return "asyncio" if loop_factory() is None else "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a new event loop (uvloop where available)."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
