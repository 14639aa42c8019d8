"""One behavioural suite, run against every KnowledgeBase implementation (``store_factory`` is
parametrised over the file store and a real Redis)."""

from __future__ import annotations

import pytest

from hermes.core.pdgraph import PDGraphError

BAD_NAMES = ["../evil", "a/b", "/etc/passwd", ".hidden", "..", "", "x" * 129, "a b", "a\\b",
             "ok\n", "é"]


def test_put_get_round_trip(store_factory, mkgraph):
    store = store_factory()
    g = mkgraph("toy")
    assert store.get("toy") is None
    store.put(g)
    got = store.get("toy")
    assert got == g
    assert got.to_json() == g.to_json()
    # a fresh instance (no cache) reads the same graph back from storage
    assert store_factory().get("toy") == g
    assert "toy" in store and "other" not in store


def test_put_replaces_previous_graph(store_factory, mkgraph):
    store = store_factory()
    store.put(mkgraph("toy", n=10, seed=1))
    newer = mkgraph("toy", n=40, seed=2)
    store.put(newer)
    got = store.get("toy")
    assert got == newer and got.runs == 40
    assert store.list_apps() == ["toy"]


def test_list_all_and_delete(store_factory, mkgraph):
    store = store_factory()
    assert store.list_apps() == [] and store.all() == {}
    graphs = {name: mkgraph(name, n=12, seed=i) for i, name in enumerate(["b_app", "a.app", "c-3"])}
    for g in graphs.values():
        store.put(g)
    assert store.list_apps() == ["a.app", "b_app", "c-3"]
    assert store.all() == graphs

    assert store.delete("b_app") is True
    assert store.get("b_app") is None
    assert store.delete("b_app") is False
    assert store.list_apps() == ["a.app", "c-3"]
    assert store.get("a.app") == graphs["a.app"]  # others untouched


def test_bad_graph_rejected_and_stored_one_untouched(store_factory, mkgraph):
    store = store_factory()
    good = mkgraph("toy")
    store.put(good)
    bad = good.model_copy(deep=True)
    bad.entry = {"no_such_unit": 1.0}  # attribute assignment is not validated by pydantic
    with pytest.raises(PDGraphError, match="no_such_unit"):
        store.put(bad)
    assert store.get("toy") == good
    assert store_factory().get("toy") == good


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda text: text[: len(text) // 2], "not valid JSON"),
        (lambda text: text.replace('"version":1', '"version":99', 1), "version"),
        (lambda text: text.replace('"input_tokens":[', '"input_tokens":[-5,', 1), "input_tokens"),
        (lambda text: text.replace('"entry":{', '"entry":{"ghost":0.5,', 1), "entry"),
    ],
    ids=["truncated", "wrong-version", "negative-tokens", "bad-probs"],
)
def test_put_json_rejects_bad_upload(store_factory, mkgraph, mutate, needle):
    store = store_factory()
    good = mkgraph("toy")
    store.put(good)
    text = mutate(good.to_json())
    assert text != good.to_json()
    with pytest.raises(PDGraphError) as err:
        store.put_json("toy", text, source="upload.json")
    assert "upload.json" in str(err.value) and needle in str(err.value)
    assert store_factory().get("toy") == good


def test_put_json_accepts_good_upload_and_checks_app(store_factory, mkgraph):
    store = store_factory()
    g = mkgraph("toy", n=20, seed=3)
    returned = store.put_json("toy", g.to_json(indent=2), source="upload.json")
    assert returned == g and store.get("toy") == g
    # a document whose app differs from the name it is uploaded under is refused
    other = mkgraph("other", n=15, seed=4)
    with pytest.raises(PDGraphError, match="'other'"):
        store.put_json("toy", other.to_json(), source="upload.json")
    assert store.get("toy") == g and store.get("other") is None


@pytest.mark.parametrize("name", BAD_NAMES)
def test_unsafe_app_names_rejected(store_factory, mkgraph, name):
    store = store_factory()
    g = mkgraph("toy", n=10)
    with pytest.raises(ValueError, match="bad app name"):
        store.get(name)
    with pytest.raises(ValueError, match="bad app name"):
        store.delete(name)
    with pytest.raises(ValueError, match="bad app name"):
        store.put_json(name, g.to_json())
    renamed = g.model_copy(update={"app": name}) if name else g.model_copy(update={"app": ""})
    with pytest.raises(ValueError):
        store.put(renamed)
    with pytest.raises(ValueError, match="bad app name"):
        list(store.records(name))
    assert store.list_apps() == []
    assert name not in store


def test_records_append_cap_and_read_back(store_factory, mkrecords):
    store = store_factory(max_records=5)
    runs = mkrecords("toy", n=30, seed=5)
    others = mkrecords("other", n=2, seed=6)
    for rec in runs:
        store.append_record(rec)
    for rec in others:
        store.append_record(rec)
    assert list(store.records("toy")) == runs[-5:]  # FIFO: the newest 5, oldest first
    assert list(store.records("other")) == others
    assert list(store.records("never_seen")) == []
    # another instance (after a "restart") reads the same log
    assert list(store_factory(max_records=5).records("toy")) == runs[-5:]

    store.append_record(mkrecords("toy", n=1, seed=7)[0])
    got = list(store.records("toy"))
    assert len(got) == 5 and got[:4] == runs[-4:] and got[-1].run_id == "toy-7-0"

    store.clear_records("toy")
    assert list(store.records("toy")) == []
    assert list(store.records("other")) == others


def test_records_default_cap_is_1000(store_factory):
    assert store_factory().max_records == 1000
    with pytest.raises(ValueError):
        store_factory(max_records=0)


def test_two_instances_see_each_others_writes(store_factory, mkgraph, mkrecords):
    a, b = store_factory(), store_factory()
    g1, g2 = mkgraph("toy", n=10, seed=1), mkgraph("toy", n=35, seed=2)
    a.put(g1)
    assert b.get("toy") == g1  # b has now cached g1
    b.put(g2)
    assert a.get("toy") == g2
    assert b.get("toy") == g2
    a.put(g1)
    assert b.get("toy") == g1  # b's cache is invalidated by a's write
    b.delete("toy")
    assert a.get("toy") is None and a.list_apps() == []

    rec = mkrecords("toy", n=1, seed=9)[0]
    a.append_record(rec)
    assert list(b.records("toy")) == [rec]


def test_batched_appends_equal_one_by_one(store_factory, mkrecords):
    """``append_records`` (the gateway learner's batch) keeps order per app, interleaves apps
    and caps like single appends; a batch with a bad app name writes nothing."""
    store = store_factory(max_records=40)
    toy = mkrecords("toy", n=30, seed=8)
    other = mkrecords("other", n=3, seed=9)
    batch = [r for pair in zip(toy, other, strict=False) for r in pair] + toy[3:]
    store.append_records(batch[:10])
    store.append_records(batch[10:])
    store.append_records([])
    assert list(store.records("toy")) == toy and list(store.records("other")) == other
    store.append_records(mkrecords("toy", n=25, seed=10))  # over the cap: the newest 40
    got = list(store.records("toy"))
    assert len(got) == 40 and got[:15] == toy[-15:]
    assert list(store_factory(max_records=40).records("toy")) == got
    bad = mkrecords("toy", n=1, seed=11)[0].model_copy(update={"app": "../evil"})
    with pytest.raises(ValueError):
        store.append_records([mkrecords("other", n=1, seed=12)[0], bad])
    assert list(store.records("other")) == other
