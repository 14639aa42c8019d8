"""The gateway's overlay store: learned graphs shadow shipped ones, which are never rewritten."""

from __future__ import annotations

from hermes.core.profiler import learn
from hermes.kb.file import FileStore
from hermes.kb.overlay import OverlayStore
from tests.core.toyapps import kbqa_like_records


def test_learned_graph_shadows_shipped_one_without_touching_it(tmp_path) -> None:
    shipped_dir = tmp_path / "shipped"
    shipped = FileStore(shipped_dir)
    original = learn(kbqa_like_records(50))
    shipped.put(original)
    before = (shipped_dir / "toy_kbqa.json").read_bytes()

    kb = OverlayStore(FileStore(tmp_path / "state"), FileStore(shipped_dir))
    assert kb.get("toy_kbqa") == original
    relearned = learn(kbqa_like_records(80, seed=3))
    kb.put(relearned)
    assert kb.get("toy_kbqa") == relearned
    assert (shipped_dir / "toy_kbqa.json").read_bytes() == before
    assert kb.list_apps() == ["toy_kbqa"]
    assert kb.delete("toy_kbqa")
    assert kb.get("toy_kbqa") == original  # the shipped graph shows again
