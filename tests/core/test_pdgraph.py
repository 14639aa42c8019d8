"""PDGraph JSON: round trip and rejection of bad input with errors naming file, unit, field."""

from __future__ import annotations

import json

import pytest

from hermes.core.pdgraph import MAX_SAMPLES, PDGraph, PDGraphError
from hermes.core.profiler import learn
from tests.core.toyapps import kbqa_like_records


@pytest.fixture(scope="module")
def graph() -> PDGraph:
    return learn(kbqa_like_records(200))


@pytest.fixture()
def doc(graph: PDGraph) -> dict:
    return json.loads(graph.to_json())


def load(doc: dict | str, tmp_path, name: str = "g.json") -> PDGraph:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return PDGraph.load(path)


def test_round_trip(graph: PDGraph, tmp_path) -> None:
    graph.save(tmp_path / "toy.json")
    again = PDGraph.load(tmp_path / "toy.json")
    assert again == graph
    assert again.next_probs("extract") == {"query": 1.0}
    assert not list(tmp_path.glob(".*tmp"))


def test_missing_field(doc: dict, tmp_path) -> None:
    del doc["units"]["verify"]["backend"]
    with pytest.raises(PDGraphError, match=r"g\.json: unit 'verify': field backend: Field required"):
        load(doc, tmp_path)


def test_ill_typed_field(doc: dict, tmp_path) -> None:
    doc["units"]["query"]["consumption"]["parallelism"][0] = "many"
    with pytest.raises(PDGraphError, match=r"unit 'query': field consumption\.parallelism\.0"):
        load(doc, tmp_path)


def test_negative_tokens(doc: dict, tmp_path) -> None:
    doc["units"]["extract"]["consumption"]["output_tokens"][3] = -5
    with pytest.raises(PDGraphError, match=r"unit 'extract': field consumption\.output_tokens\.3: .*greater than or equal to 0"):
        load(doc, tmp_path)


def test_probabilities_must_sum_to_one(doc: dict, tmp_path) -> None:
    doc["units"]["extract"]["next"] = {"query": 0.7, "": 0.2}
    with pytest.raises(PDGraphError, match=r"unit 'extract': field next: next-unit probabilities sum to 0\.9"):
        load(doc, tmp_path)


def test_unknown_next_unit(doc: dict, tmp_path) -> None:
    doc["units"]["query"]["next"] = {"nonexistent": 1.0}
    with pytest.raises(PDGraphError, match=r"unit 'query': field next: unknown next unit 'nonexistent'"):
        load(doc, tmp_path)


def test_unknown_entry_unit(doc: dict, tmp_path) -> None:
    doc["entry"] = {"ghost": 1.0}
    with pytest.raises(PDGraphError, match=r"field entry: unknown unit 'ghost'"):
        load(doc, tmp_path)


def test_truncated_json(graph: PDGraph, tmp_path) -> None:
    text = graph.to_json()
    with pytest.raises(PDGraphError, match=r"g\.json: not valid JSON \(truncated\?\)"):
        load(text[: len(text) // 2], tmp_path)


def test_wrong_version(doc: dict, tmp_path) -> None:
    doc["version"] = 99
    with pytest.raises(PDGraphError, match=r"field version: unsupported version 99"):
        load(doc, tmp_path)


def test_bad_backend(doc: dict, tmp_path) -> None:
    doc["units"]["search"]["backend"] = "gpu:whatever"
    with pytest.raises(PDGraphError, match=r"unit 'search': field backend: bad backend 'gpu:whatever'"):
        load(doc, tmp_path)


def test_sample_lists_capped(doc: dict, tmp_path) -> None:
    doc["units"]["extract"]["consumption"]["input_tokens"] = [1] * (MAX_SAMPLES + 1)
    with pytest.raises(PDGraphError, match=r"unit 'extract': field consumption\.input_tokens"):
        load(doc, tmp_path)


def test_missing_file(tmp_path) -> None:
    with pytest.raises(PDGraphError, match=r"nope\.json: cannot read"):
        PDGraph.load(tmp_path / "nope.json")


def test_llm_follow_p_looks_through_tool_units(graph: PDGraph, doc: dict, tmp_path) -> None:
    """extract -> query (LLM); query -> search (tool) -> verify (LLM); verify -> the end."""
    assert graph.llm_follow_p("extract") == 1.0
    assert graph.llm_follow_p("query") == 1.0  # through the search tool
    assert graph.llm_follow_p("query", hops=1) == 0.0  # the tool is next
    assert graph.llm_follow_p("verify") == 0.0  # the run ends
    assert graph.llm_follow_p("nope") == 0.0
    doc["units"]["search"]["next"] = {"verify": 0.6, "": 0.4}
    assert load(doc, tmp_path).llm_follow_p("query") == pytest.approx(0.6)


def test_next_llm_p_without_evidence_is_even(graph: PDGraph) -> None:
    from hermes.core.pdgraph import UNKNOWN_NEXT_LLM_P, next_llm_p

    assert next_llm_p(None, "query") == UNKNOWN_NEXT_LLM_P == 0.5
    assert next_llm_p(graph, "nope") == 0.5  # the graph lacks the unit
    assert next_llm_p(graph, "query") == 1.0  # the router's question: through the tool
    assert next_llm_p(graph, "search", hops=1) == 1.0  # retention's: right after the tool
    assert next_llm_p(graph, "query", hops=1) == 0.0
