"""A HermesLet on its own event loop in a thread: a remote node for gateway tests.

Subclasses set what they need, then call ``super().__init__(address)`` (the thread starts
there) and build the node in :meth:`ThreadedNode.make`, on the node's own loop. hermeslet is
imported inside ``make``: importing the package while the gateway tests are collected would
shadow tests/hermeslet (a package of the same name) for pytest.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class ThreadedNode:
    """Runs :meth:`make`'s HermesLet until :meth:`stop`."""

    def __init__(self, address: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.agent: Any = None
        self.thread = threading.Thread(target=self._main, args=(address,), daemon=True)
        self.thread.start()

    def make(self, address: str) -> Any:
        """The HermesLet to run (called in the node's thread, its loop current)."""
        raise NotImplementedError

    def _main(self, address: str) -> None:
        asyncio.set_event_loop(self.loop)
        self.agent = self.make(address)
        self.loop.run_until_complete(self.agent.run())

    def stop(self) -> None:
        if self.agent is not None:
            self.loop.call_soon_threadsafe(self.agent.stop)
        self.thread.join(10)
