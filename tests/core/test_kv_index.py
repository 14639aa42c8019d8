"""The per-engine block index (issue 19): events, deltas (summaries) and prefix matching."""

from __future__ import annotations

import pytest

from hermes.core.kv_index import BlockIndex, match_blocks


def test_index_follows_stored_removed_cleared() -> None:
    idx = BlockIndex()
    idx.stored([1, 2, 3])
    idx.stored([2, 9], medium="cpu", lora_name="ad")
    assert idx.hashes() == {1, 2, 3} and idx.hashes("CPU") == {2, 9}
    assert idx.lora_of(9, "CPU") == "ad" and idx.lora_of(1) is None
    idx.stored([1])  # re-announced: idempotent
    assert idx.count("GPU") == 3 and idx.count() == 5
    idx.removed([2, 77])  # an unknown hash is ignored
    assert idx.hashes() == {1, 3} and idx.holds(2, "CPU")
    idx.cleared()
    assert idx.count() == 0 and idx.media() == []


def test_max_blocks_drops_oldest_stored() -> None:
    idx = BlockIndex(max_blocks=2)
    idx.stored([1, 2])
    idx.stored([1])  # refreshed: now the newest
    idx.stored([3])
    assert idx.hashes() == {1, 3}
    with pytest.raises(ValueError, match="max_blocks"):
        BlockIndex(max_blocks=0)


def test_full_then_incremental_deltas_rebuild_a_copy() -> None:
    src, copy = BlockIndex(), BlockIndex()
    src.stored([1, 2, 3])
    src.stored([7], medium="CPU")
    stored, removed = src.take_delta(full=True)
    assert stored == {"GPU": [1, 2, 3], "CPU": [7]} and removed == {}
    copy.apply_delta(stored, removed, full=True)
    # net changes only: 4 stored then removed in between is not sent; 2 removed is
    src.stored([4, 5])
    src.removed([4, 2])
    src.removed([7], medium="CPU")
    stored, removed = src.take_delta()
    assert stored == {"GPU": [5]} and removed == {"GPU": [2], "CPU": [7]}
    copy.apply_delta(stored, removed)
    assert copy.hashes() == src.hashes() == {1, 3, 5} and copy.count("CPU") == 0
    assert src.take_delta() == ({}, {})  # nothing changed since
    # removed then stored again between deltas: nothing to tell
    src.removed([1])
    src.stored([1])
    assert src.take_delta() == ({}, {})
    src.cleared()
    stored, removed = src.take_delta()
    copy.apply_delta(stored, removed)
    assert removed == {"GPU": [1, 3, 5]} and copy.count() == 0


def test_full_delta_replaces_a_stale_copy() -> None:
    src, copy = BlockIndex(), BlockIndex()
    copy.stored([100, 101])  # what a gateway held from before a gap
    src.stored([1])
    copy.apply_delta(*src.take_delta(full=True), full=True)
    assert copy.hashes() == {1}


def test_match_blocks_leading_gpu_then_other_tier() -> None:
    a, b = BlockIndex(), BlockIndex()
    a.stored([1, 2])
    a.stored([3], medium="CPU")
    b.stored([1, 3, 4])  # 2 missing: only a leading run counts
    read: list[int] = []

    def hashes():
        for h in [1, 2, 3, 4, 5, 6]:
            read.append(h)
            yield h

    got = match_blocks(hashes(), {"a": a, "b": b})
    assert (got["a"].gpu_blocks, got["a"].cpu_blocks) == (2, 1)
    assert (got["b"].gpu_blocks, got["b"].cpu_blocks) == (1, 0)
    assert read == [1, 2, 3, 4]  # stops once no engine's run continues
    assert match_blocks([1], {}) == {}
