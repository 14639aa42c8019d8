"""The built-in engine's prefix cache as vLLM KV events (issue 19).

The built-in engine caches whole prompt prefixes (a chat's first message, keyed by its text:
:mod:`hermeslet.engines.sim_engine`), on the GPU and, with ``cpu_cache_gb``, in host memory.
:class:`PrefixEventTracker` names each cached prefix's full blocks as vLLM would for the same
token ids (:class:`hermes.core.kv_blocks.BlockHashing` over the built-in tokenizer's ids,
:func:`hermes.core.kv_blocks.builtin_message_token_ids`) and turns changes in what the cache
holds into vLLM's events: ``BlockStored`` for blocks no cached prefix held before on that
medium (the new tail of the prefix's chain, with its parent's hash, as vLLM announces a
request's newly full blocks), ``BlockRemoved`` for blocks no cached prefix holds any more.
Prefixes sharing leading blocks share them (counted per medium). The engine's driver calls
:meth:`PrefixEventTracker.diff` after each iteration with what its cache holds then and
publishes the events (:class:`hermeslet.kv_events.KVEventPublisher`).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hermes.core.kv_blocks import BlockHashing, builtin_message_token_ids, external_hash
from hermes.core.kv_index import MEDIUM_GPU
from hermeslet.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


@dataclass(slots=True)
class _Chain:
    """One prefix's full blocks: hashes (event form) and token ids, first block first."""

    hashes: list[int]
    tokens: list[list[int]]


@dataclass(slots=True)
class PrefixEventTracker:
    """Cached prefixes -> vLLM KV events (module docstring). ``max_prefixes`` bounds the
    remembered token ids of prefixes not cached any more (oldest forgotten first)."""

    hashing: BlockHashing = field(default_factory=BlockHashing)
    max_prefixes: int = 4096
    _chains: dict[str, _Chain] = field(default_factory=dict)
    #: medium -> prefixes published as held
    _held: dict[str, set[str]] = field(default_factory=dict)
    #: medium -> block hash -> how many held prefixes hold it
    _refs: dict[str, Counter[int]] = field(default_factory=dict)

    def note(self, prefix: str, role: str, text: str | None = None) -> None:
        """The engine got a request whose cacheable prefix is ``prefix`` (a first message of
        ``role`` with ``text``; default: the prefix itself)."""
        if prefix in self._chains:
            return
        ids = builtin_message_token_ids(role, prefix if text is None else text)
        bs = self.hashing.block_size
        hashes = [external_hash(h) for h in self.hashing.iter_hashes(ids)]
        self._chains[prefix] = _Chain(hashes, [ids[i * bs:(i + 1) * bs]
                                               for i in range(len(hashes))])
        if len(self._chains) > self.max_prefixes:
            held = set().union(*self._held.values()) if self._held else set()
            for old in list(self._chains):
                if len(self._chains) <= self.max_prefixes:
                    break
                if old not in held:
                    del self._chains[old]

    def block_hashes(self, prefix: str) -> list[int]:
        """The event-form hashes of a noted prefix's full blocks."""
        chain = self._chains.get(prefix)
        return list(chain.hashes) if chain is not None else []

    def diff(self, media: Mapping[str, Iterable[str]]) -> list[KVEvent]:
        """Events taking the published state to ``media`` (medium -> the prefixes the cache
        holds there; a medium left out holds none). Prefixes never noted are skipped."""
        events: list[KVEvent] = []
        for medium in sorted(set(self._held) | set(media)):
            now = {p for p in media.get(medium, ()) if p in self._chains}
            was = self._held.setdefault(medium, set())
            refs = self._refs.setdefault(medium, Counter())
            gone: list[int] = []
            for p in sorted(was - now):
                for h in self._chains[p].hashes:
                    refs[h] -= 1
                    if refs[h] <= 0:
                        del refs[h]
                        gone.append(h)
            if gone:
                events.append(BlockRemoved(block_hashes=list(gone), medium=medium))
            for p in sorted(now - was):
                chain = self._chains[p]
                first_new = next((i for i, h in enumerate(chain.hashes) if h not in refs),
                                 len(chain.hashes))
                for h in chain.hashes:
                    refs[h] += 1
                if first_new < len(chain.hashes):
                    events.append(self._stored(chain, first_new, medium))
            self._held[medium] = now
        return events

    def clear(self) -> list[KVEvent]:
        """The engine dropped its whole cache: ``AllBlocksCleared``."""
        self._held.clear()
        self._refs.clear()
        return [AllBlocksCleared()]

    def _stored(self, chain: _Chain, first: int, medium: str) -> BlockStored:
        return BlockStored(
            block_hashes=list(chain.hashes[first:]),
            parent_block_hash=chain.hashes[first - 1] if first else None,
            token_ids=[t for block in chain.tokens[first:] for t in block],
            block_size=self.hashing.block_size, lora_id=None,
            medium=medium, lora_name=None)


def held_prefixes(cache: object) -> dict[str, Sequence[str]]:
    """What a built-in engine's prefix cache holds, per medium: a block pool's GPU and host
    tiers, or the entry LRU's prefixes (GPU)."""
    gpu = getattr(cache, "gpu", None)
    if gpu is not None:
        return {MEDIUM_GPU: list(gpu), "CPU": list(getattr(cache, "cpu", ()))}
    return {MEDIUM_GPU: list(getattr(cache, "_lru", ()))}
