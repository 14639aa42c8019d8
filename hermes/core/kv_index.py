"""What an engine's KV cache holds, block by block, by tier, from its KV events (issue 19).

:class:`BlockIndex` is the set of block hashes (vLLM's 64-bit event form,
:func:`hermes.core.kv_blocks.external_hash`) an engine holds per *medium* (``GPU``, ``CPU``,
...: vLLM's event field; an event without one is the GPU's), with the LoRA adapter each was
computed with. It applies vLLM's three events: ``BlockStored`` (idempotent: vLLM re-announces
blocks a request reused), ``BlockRemoved`` and ``AllBlocksCleared`` (every medium: the index
may forget blocks the engine still has, never claim blocks it lost).

The HermesLet keeps one per engine from the events and tells the gateway what changed, not
every block every time: :meth:`BlockIndex.take_delta` gives the hashes stored and removed per
medium since the last delta (net of what was stored then removed in between), and the
gateway's copy applies them (:meth:`BlockIndex.apply_delta`). ``max_blocks`` caps each
medium: past it the oldest-stored blocks leave the index (a cap only makes it claim less).

:func:`match_blocks` reads a prompt's chained block hashes against several engines' indexes
at once: per engine the leading blocks it holds on the GPU, then the following ones it holds
on another tier (loadable: vLLM's CPU offloading), stopping at the first block no engine
holds, so a router pays only for the hashes of prefixes somebody holds.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"

#: per medium, the hashes stored and the hashes removed (a summary's payload)
Delta = tuple[dict[str, list[int]], dict[str, list[int]]]

_ABSENT = object()


class BlockIndex:
    """Block hashes an engine holds, per medium (see the module docstring)."""

    def __init__(self, max_blocks: int | None = None) -> None:
        if max_blocks is not None and max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1 or None, not {max_blocks}")
        self.max_blocks = max_blocks
        #: medium -> hash -> LoRA adapter name (None: the base model), oldest stored first
        self._media: dict[str, OrderedDict[int, str | None]] = {}
        #: per medium, hashes changed since the last :meth:`take_delta`
        self._dirty: dict[str, set[int]] = {}
        #: per medium, what the last delta left the reader holding
        self._told: dict[str, set[int]] = {}

    @staticmethod
    def _medium(medium: str | None) -> str:
        return medium.upper() if medium else MEDIUM_GPU

    # ------------------------------------------------------------------ events
    def stored(self, hashes: Iterable[int], medium: str | None = None,
               lora_name: str | None = None) -> None:
        """``BlockStored``: the engine holds these blocks on ``medium``."""
        m = self._medium(medium)
        held = self._media.setdefault(m, OrderedDict())
        dirty = self._dirty.setdefault(m, set())
        for h in hashes:
            held.pop(h, None)
            held[h] = lora_name
            dirty.add(h)
        if self.max_blocks is not None:
            while len(held) > self.max_blocks:
                old, _ = held.popitem(last=False)
                dirty.add(old)

    def removed(self, hashes: Iterable[int], medium: str | None = None) -> None:
        """``BlockRemoved``: the engine no longer holds these blocks on ``medium``."""
        m = self._medium(medium)
        held = self._media.get(m)
        if held is None:
            return
        dirty = self._dirty.setdefault(m, set())
        for h in hashes:
            if held.pop(h, _ABSENT) is not _ABSENT or h in self._told.get(m, ()):
                dirty.add(h)

    def cleared(self) -> None:
        """``AllBlocksCleared``: forget every block of every medium."""
        for m, held in self._media.items():
            self._dirty.setdefault(m, set()).update(held)
            held.clear()

    # ------------------------------------------------------------------ reading
    def holds(self, block_hash: int, medium: str = MEDIUM_GPU) -> bool:
        held = self._media.get(medium)
        return held is not None and block_hash in held

    def lora_of(self, block_hash: int, medium: str = MEDIUM_GPU) -> str | None:
        held = self._media.get(medium)
        return held.get(block_hash) if held is not None else None

    def media(self) -> list[str]:
        return [m for m, held in self._media.items() if held]

    def hashes(self, medium: str = MEDIUM_GPU) -> set[int]:
        return set(self._media.get(medium, ()))

    def count(self, medium: str | None = None) -> int:
        """Blocks held on ``medium`` (None: on all media)."""
        if medium is not None:
            return len(self._media.get(medium, ()))
        return sum(len(h) for h in self._media.values())

    # ------------------------------------------------------------------ summaries
    def take_delta(self, *, full: bool = False) -> Delta:
        """What changed since the last delta: ``(stored, removed)`` per medium, each a sorted
        list of hashes (deterministic). ``full``: everything held, as a reader starting from
        an empty index needs (``removed`` is then empty)."""
        stored: dict[str, list[int]] = {}
        removed: dict[str, list[int]] = {}
        if full:
            for m, held in self._media.items():
                if held:
                    stored[m] = sorted(held)
                self._told[m] = set(held)
            self._dirty.clear()
            return stored, removed
        for m, dirty in self._dirty.items():
            held = self._media.get(m, OrderedDict())
            told = self._told.setdefault(m, set())
            add = sorted(h for h in dirty if h in held and h not in told)
            gone = sorted(h for h in dirty if h not in held and h in told)
            told.update(add)
            told.difference_update(gone)
            if add:
                stored[m] = add
            if gone:
                removed[m] = gone
        self._dirty.clear()
        return stored, removed

    def apply_delta(self, stored: Mapping[str, Iterable[int]],
                    removed: Mapping[str, Iterable[int]], *, full: bool = False) -> None:
        """Apply a delta from :meth:`take_delta` (``full``: replace everything)."""
        if full:
            self._media.clear()
        for m, hs in removed.items():
            self.removed(hs, m)
        for m, hs in stored.items():
            self.stored(hs, m)
        self._dirty.clear()


@dataclass(slots=True)
class BlockMatch:
    """One engine's hold on a prompt: leading blocks on the GPU, then blocks on another tier."""

    gpu_blocks: int = 0
    cpu_blocks: int = 0
    #: still extending (internal to :func:`match_blocks`)
    _on_gpu: bool = field(default=True, repr=False)
    _open: bool = field(default=True, repr=False)


def match_blocks(hashes: Iterator[int] | Iterable[int],
                 indexes: Mapping[str, BlockIndex]) -> dict[str, BlockMatch]:
    """Per engine of ``indexes``, how many leading blocks of the prompt whose chained block
    hashes are ``hashes`` it holds on the GPU, and how many further ones on another medium
    (a chain broken on every medium stops there: vLLM's prefix hit is a leading run). Reads
    ``hashes`` only while some engine's run continues."""
    out = {name: BlockMatch() for name in indexes}
    if not out:
        return out
    for h in hashes:
        any_open = False
        for name, idx in indexes.items():
            mt = out[name]
            if not mt._open:
                continue
            if mt._on_gpu and idx.holds(h, MEDIUM_GPU):
                mt.gpu_blocks += 1
            elif any(idx.holds(h, m) for m in idx.media()):
                mt._on_gpu = False
                mt.cpu_blocks += 1
            else:
                mt._open = False
                continue
            any_open = True
        if not any_open:
            break
    return out
