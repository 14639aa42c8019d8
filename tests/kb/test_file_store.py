"""FileStore specifics: on-disk layout, crash safety of writes, the record log's compaction and
torn lines, the default directory. The shared behaviour is in test_store_contract.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import hermes
from hermes.core.pdgraph import PDGraph, PDGraphError
from hermes.core.records import RecordError
from hermes.kb import FileStore, RedisStore, default_kb, open_store, shipped_pdgraphs_dir


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_layout_is_name_dot_json(tmp_path, mkgraph):
    store = FileStore(tmp_path / "pdgraphs")
    g = mkgraph("factool_kbqa")
    store.put(g)
    assert _files(tmp_path / "pdgraphs") == ["factool_kbqa.json"]
    assert PDGraph.load(tmp_path / "pdgraphs" / "factool_kbqa.json") == g
    assert store.path_of("factool_kbqa") == tmp_path / "pdgraphs" / "factool_kbqa.json"


def test_crash_during_write_keeps_old_file_and_leaves_no_temp(tmp_path, mkgraph, monkeypatch):
    root = tmp_path / "pdgraphs"
    store = FileStore(root)
    old, new = mkgraph("toy", n=10, seed=1), mkgraph("toy", n=40, seed=2)
    store.put(old)
    before = (root / "toy.json").read_bytes()

    def crash(src, dst):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        store.put(new)
    monkeypatch.undo()

    assert (root / "toy.json").read_bytes() == before
    assert _files(root) == ["toy.json"]  # the temp file was removed
    assert store.get("toy") == old
    assert FileStore(root).get("toy") == old


def test_crash_on_first_write_leaves_nothing(tmp_path, mkgraph, monkeypatch):
    root = tmp_path / "pdgraphs"
    store = FileStore(root)
    monkeypatch.setattr(os, "replace", lambda s, d: (_ for _ in ()).throw(OSError("crash")))
    with pytest.raises(OSError):
        store.put(mkgraph("toy"))
    monkeypatch.undo()
    assert store.get("toy") is None and store.list_apps() == []
    assert _files(root) == []


def test_unsafe_name_cannot_escape_directory(tmp_path, mkgraph):
    root = tmp_path / "a" / "pdgraphs"
    store = FileStore(root)
    g = mkgraph("toy")
    for name in ["../escaped", "../../escaped", "/tmp/escaped"]:
        with pytest.raises(ValueError, match="bad app name"):
            store.put(g.model_copy(update={"app": name}))
        with pytest.raises(ValueError, match="bad app name"):
            store.put_json(name, g.to_json())
    assert not list(tmp_path.rglob("escaped*"))


def test_bad_file_on_disk_is_reported_with_its_path(tmp_path, mkgraph):
    root = tmp_path / "pdgraphs"
    root.mkdir()
    (root / "broken.json").write_text('{"version": 1, "app": "broken", "entry": {')
    store = FileStore(root)
    with pytest.raises(PDGraphError, match="broken.json"):
        store.get("broken")
    # a file whose app field disagrees with its name is refused too
    (root / "named.json").write_text(mkgraph("other").to_json())
    with pytest.raises(PDGraphError, match="expected 'named'"):
        store.get("named")


def test_list_ignores_temp_hidden_and_foreign_files(tmp_path, mkgraph):
    root = tmp_path / "pdgraphs"
    store = FileStore(root)
    store.put(mkgraph("toy"))
    (root / ".toy.json.abc123.tmp").write_text("partial")
    (root / ".hidden.json").write_text("{}")
    (root / "notes.txt").write_text("hi")
    (root / "dir.json").mkdir()
    assert store.list_apps() == ["toy"]
    assert list(store.all()) == ["toy"]


def test_cache_reuses_parsed_graph_until_file_changes(tmp_path, mkgraph):
    root = tmp_path / "pdgraphs"
    store = FileStore(root)
    store.put(mkgraph("toy", n=10, seed=1))
    first = store.get("toy")
    assert store.get("toy") is first  # unchanged file: no reparse
    replacement = mkgraph("toy", n=25, seed=2)
    replacement.save(root / "toy.json")  # written behind the store's back
    assert store.get("toy") == replacement
    (root / "toy.json").unlink()
    assert store.get("toy") is None


def test_records_in_separate_dir_and_compaction(tmp_path, mkrecords):
    root, rdir = tmp_path / "pdgraphs", tmp_path / "logs"
    store = FileStore(root, records_dir=rdir, max_records=5)
    runs = mkrecords("toy", n=60, seed=1)
    for rec in runs:
        store.append_record(rec)
    log = rdir / "toy.jsonl"
    assert log.exists() and not (root / "records").exists()
    lines = log.read_text().splitlines()
    assert len(lines) <= 5 + 16  # compacted: bounded by cap + slack, not 60
    assert list(store.records("toy")) == runs[-5:]


def test_torn_last_line_is_skipped_and_truncated(tmp_path, mkrecords):
    store = FileStore(tmp_path / "pdgraphs")
    runs = mkrecords("toy", n=4, seed=2)
    for rec in runs[:3]:
        store.append_record(rec)
    with open(store.records_path("toy"), "a") as fh:
        fh.write('{"app": "toy", "run_id": "half-writ')  # crash mid-append
    assert list(store.records("toy")) == runs[:3]
    store.append_record(runs[3])
    assert list(store.records("toy")) == runs
    assert "half-writ" not in store.records_path("toy").read_text()


def test_corrupt_record_line_names_file_and_line(tmp_path, mkrecords):
    store = FileStore(tmp_path / "pdgraphs")
    runs = mkrecords("toy", n=2, seed=3)
    store.append_record(runs[0])
    with open(store.records_path("toy"), "a") as fh:
        fh.write('{"app": "toy"}\n')
    store.append_record(runs[1])
    with pytest.raises(RecordError, match=r"toy\.jsonl:2: field run_id"):
        list(store.records("toy"))


# ------------------------------------------------------------------------- open_store
def test_open_store_default_resolution(tmp_path, monkeypatch):
    """Issue 15, item 10: one variable (HERMES_KB) names the knowledge base; without it the
    PDGraphs shipped in the package are found from any directory; HERMES_PDGRAPHS is refused."""
    monkeypatch.delenv("HERMES_PDGRAPHS", raising=False)
    monkeypatch.setenv("HERMES_KB", str(tmp_path / "from_env"))
    assert default_kb() == str(tmp_path / "from_env")
    store = open_store(None)
    assert isinstance(store, FileStore) and store.root == tmp_path / "from_env"

    monkeypatch.delenv("HERMES_KB")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pdgraphs").mkdir()  # a ./pdgraphs of the current directory is not looked at
    shipped = shipped_pdgraphs_dir()
    assert shipped == Path(hermes.__file__).resolve().parent / "data" / "pdgraphs"
    for store in (open_store(None), open_store("shipped")):
        assert isinstance(store, FileStore) and store.root == shipped
        assert len(store.list_apps()) == 10

    monkeypatch.setenv("HERMES_PDGRAPHS", str(tmp_path))
    with pytest.raises(ValueError, match="HERMES_PDGRAPHS is no longer read: set HERMES_KB"):
        open_store(None)


def test_open_store_by_spec(tmp_path):
    store = open_store(tmp_path / "kb")
    assert isinstance(store, FileStore) and store.root == tmp_path / "kb"
    assert isinstance(open_store(str(tmp_path / "kb2")), FileStore)
    r = open_store("redis://127.0.0.1:1/3")  # redis-py connects lazily: nothing is contacted
    assert isinstance(r, RedisStore) and "127.0.0.1:1/3" in r.describe()
    r.close()
    assert open_store(tmp_path, max_records=7).max_records == 7
