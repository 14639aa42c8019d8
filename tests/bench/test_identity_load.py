"""``hermes load --identity``: the scoring of inferred runs against the truth (hand-computed
cases), the request bodies (conversations continue with the replies as returned; independent
prompts share no history, only the outputs they work on), and one small experiment per mode against a real gateway with the
built-in engine."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hermes.bench.identity_bodies import (
    CHARS_PER_TOKEN,
    CONVERSATION,
    PROMPTS,
    RunBodies,
    chars_of,
)
from hermes.bench.identity_score import Placed, grouping, label_mapping, matched_accuracy, score
from hermes.workloads.registry import get_app


# ------------------------------------------------------------------------------------ scoring
def test_grouping_pairs_from_the_contingency_table() -> None:
    # truth: runs A A A B B; predicted: x x y z z
    # true pairs: 3 (AAA) + 1 (BB) = 4; predicted pairs: 1 (xx) + 1 (zz) = 2; both: 1 + 1 = 2
    g = grouping(list("AAABB"), list("xxyzz"))
    assert g["grouping_precision"] == 1.0 and g["grouping_recall"] == 0.5
    # ARI: expected = 4 x 2 / C(5, 2) = 0.8; max = (4 + 2) / 2 = 3; (2 - 0.8) / (3 - 0.8)
    assert g["adjusted_rand"] == pytest.approx(1.2 / 2.2)
    # everything merged into one predicted run: recall 1, precision 4 / 10; ARI 0 (chance)
    g = grouping(list("AAABB"), list("qqqqq"))
    assert g["grouping_recall"] == 1.0 and g["grouping_precision"] == pytest.approx(0.4)
    assert g["adjusted_rand"] == pytest.approx(0.0)
    # a merge of two runs and a split of a third: A A B B C C -> x x x x y z
    # true pairs 3; predicted pairs C(4, 2) = 6; both: AA + BB = 2 -> precision 1/3, recall 2/3
    g = grouping(list("AABBCC"), list("xxxxyz"))
    assert g["grouping_precision"] == pytest.approx(1 / 3)
    assert g["grouping_recall"] == pytest.approx(2 / 3)
    # ARI: expected 3 x 6 / 15 = 1.2; max 4.5; (2 - 1.2) / (4.5 - 1.2)
    assert g["adjusted_rand"] == pytest.approx(0.8 / 3.3)
    assert grouping(list("AB"), list("xy"))["adjusted_rand"] == 1.0
    assert grouping(list("AABB"), list("yyxx")) == {
        "grouping_precision": 1.0, "grouping_recall": 1.0, "adjusted_rand": 1.0}


def test_matched_accuracy_is_one_to_one() -> None:
    assert matched_accuracy(list("aabb"), list("xxyy")) == 1.0
    assert matched_accuracy(list("aabb"), list("xxxx")) == 0.5  # one label cannot be both
    assert matched_accuracy(list("aaaa"), list("xyzw")) == 0.25  # a split costs as much
    assert matched_accuracy([], []) == 1.0
    # greedy would map x -> a (3 of a's 4) and leave b with y (1): 4 of 7; the best mapping
    # is x -> b (3), y -> a (3): 6 of 7
    true, pred = list("aaaabbb"), list("xyyyxxx")
    assert matched_accuracy(true, pred) == pytest.approx(6 / 7)
    assert label_mapping(true, pred) == {"x": "b", "y": "a"}


def test_score_overall_and_per_app() -> None:
    placed = [Placed(0, "react", "think", "r1", "u1", "appA"),
              Placed(0, "react", "act", "r1", "u2", "appA"),
              Placed(1, "react", "think", "r2", "u1", "appA"),
              Placed(2, "fact", "check", "r3", "u3", "appB"),
              Placed(2, "fact", "check", "r4", "u3", "appB")]
    s = score(placed)
    assert s["requests"] == 5 and s["unit_accuracy"] == 1.0 and s["app_accuracy"] == 1.0
    assert s["grouping_precision"] == 1.0 and s["grouping_recall"] == 0.5
    assert s["runs"] == 3 and s["inferred_runs"] == 4
    assert s["per_app"]["react"]["grouping_recall"] == 1.0
    assert s["per_app"]["fact"]["grouping_recall"] == 0.0  # a fan-out split in two runs
    assert s["per_app"]["fact"]["app_accuracy"] == 1.0


def test_score_apps_split_and_units_named_with_their_app() -> None:
    # app "fact" seen as two apps (one per unit's instructions), both named unit "u": only
    # the larger inferred app maps to "fact"; the units are two labels, not one
    placed = [Placed(0, "fact", "extract", "r1", "u", "fA"),
              Placed(0, "fact", "verify", "r2", "u", "fB"),
              Placed(0, "fact", "verify", "r3", "u", "fB"),
              Placed(1, "react", "think", "r4", "t", "rA")]
    s = score(placed)
    assert s["per_app"]["fact"]["unit_accuracy"] == 1.0  # (fA, u) -> extract, (fB, u) -> verify
    assert s["per_app"]["fact"]["app_accuracy"] == pytest.approx(2 / 3)
    assert s["per_app"]["react"]["app_accuracy"] == 1.0
    assert s["app_accuracy"] == pytest.approx(3 / 4)
    assert s["per_app"]["fact"]["inferred_apps"] == 2


# ------------------------------------------------------------------------------------ bodies
def _reply(text: str) -> dict:
    return {"role": "assistant", "content": text, "refusal": None}


def test_a_conversation_continues_with_the_replies_as_returned() -> None:
    b = RunBodies("react_fever", np.random.default_rng(0))
    (first,) = b.step("thought", [300])
    assert [m["role"] for m in first] == ["system", "user", "user"]
    assert chars_of(first) >= 300 * CHARS_PER_TOKEN
    b.answered([first], [_reply("Thought: search it. Action: Search[x]")])
    (second,) = b.step("thought", [10])  # fewer tokens than the history: no shrinking
    assert second[:len(first)] == first
    assert second[len(first)] == _reply("Thought: search it. Action: Search[x]")
    assert second[-1]["role"] == "user" and second[-1]["content"].startswith("Observation: ")
    assert second[-1]["content"] != first[-1]["content"]  # the filler varies
    assert len(second) == len(first) + 2
    # the system prompt is one template with the run's task id in it
    other = RunBodies("react_fever", np.random.default_rng(1)).step("thought", [300])[0]
    assert other[0]["content"] != first[0]["content"]
    assert other[0]["content"].split("Claim id")[0] == first[0]["content"].split("Claim id")[0]


def test_a_conversation_fan_out_branches_and_continues_with_one_branch() -> None:
    b = RunBodies("llm_reasoning", np.random.default_rng(0))
    (head,) = b.step("decompose", [200])
    b.answered([head], [_reply("1. a\n2. b")])
    branches = b.step("solve", [150, 150, 150])
    assert len(branches) == 3
    history = [*head, _reply("1. a\n2. b")]
    for msgs in branches:
        assert msgs[:len(history)] == history and len(msgs) == len(history) + 1
    assert len({m[-1]["content"] for m in branches}) == 3  # distinct sub-task turns
    b.answered(branches, [_reply(f"answer {i}") for i in range(3)])
    (nxt,) = b.step("answer", [100])
    assert nxt[:len(branches[0]) + 1] == [*branches[0], _reply("answer 0")]


def test_independent_prompts_share_no_history() -> None:
    b = RunBodies("factool_kbqa", np.random.default_rng(0))
    (first,) = b.step("extract_claims", [180])
    b.answered([first], [_reply("claim")])
    calls = b.step("verifies", [140, 160])
    for msgs, tokens in zip(calls, (140, 160), strict=True):
        assert [m["role"] for m in msgs] == ["system", "user"]
        assert chars_of(msgs) >= tokens * CHARS_PER_TOKEN
    assert calls[0][0] == calls[1][0] != first[0]  # per-unit instructions
    assert calls[0][1] != calls[1][1]


def _words(rng: np.random.Generator, n: int) -> str:
    """A reply as the built-in engine writes one: ``n`` vocabulary words on one line."""
    vocab = "the of and to in is model token engine run unit graph queue rank state".split()
    return "".join(" " + str(w) for w in rng.choice(vocab, size=n))


def _run_got(b: RunBodies, rng: np.random.Generator, send) -> list:  # noqa: ANN001
    """Every LLM step of one GoT run through ``b``; ``send(unit, messages)`` answers a call."""
    out = []
    for step in get_app("got_docmerge").steps(np.random.default_rng(0)):
        sent = b.step(step.unit, [c.input_tokens for c in step.requests])
        replies = [send(step.unit, msgs, c.output_tokens)
                   for msgs, c in zip(sent, step.requests, strict=True)]
        b.answered(sent, replies)
        out.append((step.unit, sent, replies))
    return out


def test_a_stages_prompt_holds_the_outputs_it_works_on() -> None:
    """GoT: each score step holds the candidate it scores (the k-th step the k-th), the
    aggregate prompt both candidates, each on its own line; map-reduce's collapse calls
    share the map summaries; outputs too long for the step are cut, head kept."""
    rng = np.random.default_rng(1)
    steps = _run_got(RunBodies("got_docmerge", np.random.default_rng(0)), rng,
                     lambda unit, msgs, n: _reply(_words(rng, n)))
    by_unit: dict[str, list] = {}
    for unit, sent, replies in steps:
        by_unit.setdefault(unit, []).append((sent, replies))
    (gen_sent, cands), = by_unit["generate1"]
    cand_lines = [c["content"].strip() for c in cands]
    for k, (sent, _) in enumerate(by_unit["score1"]):
        for msgs in sent:
            lines = msgs[-1]["content"].split("\n")
            assert cand_lines[k] in lines and cand_lines[1 - k] not in lines
    (agg_sent, aggs), = by_unit["aggregate"]
    for msgs in agg_sent:
        assert all(c in msgs[-1]["content"].split("\n") for c in cand_lines)
    (g2_sent, _), = by_unit["generate2"]
    assert aggs[0]["content"].strip() in g2_sent[0][-1]["content"].split("\n")
    # map-reduce: each collapse call holds its contiguous share of the summaries
    b = RunBodies("langchain_mapreduce", np.random.default_rng(0))
    maps = b.step("generate_summary", [400] * 6)
    summaries = [_reply(f"summary number {k} " + _words(rng, 60)) for k in range(6)]
    b.answered(maps, summaries)
    coll = b.step("collapse_summaries", [1500, 1500])
    for j, msgs in enumerate(coll):
        for k in range(6):
            held = summaries[k]["content"].strip() in msgs[-1]["content"].split("\n")
            assert held == (k // 3 == j)
    # an output longer than the step's tokens is cut to its head, never below 320 characters
    b = RunBodies("factool_kbqa", np.random.default_rng(0))
    ext = b.step("extract_claims", [180])
    long = _words(rng, 2000).strip()
    b.answered(ext, [_reply(long)])
    (q,) = b.step("generate_queries", [100])
    claim = q[-1]["content"].split("\n")[0]
    assert claim.startswith("Claim: ") and long.startswith(claim[len("Claim: "):])
    assert len(claim) - len("Claim: ") >= 320


def test_the_resolver_finds_got_runs_whole_from_their_bodies() -> None:
    """The bodies and the resolver together, no gateway: the first GoT run of a new app is
    split at its opening burst (not yet known to be a program), every later run is found
    whole, under one app, by fan-out and dataflow."""
    from hermes.gateway.resolve import Resolver

    r = Resolver()
    rng = np.random.default_rng(5)
    now = [1000.0]

    def send(unit: str, msgs: list, n: int) -> dict:
        ident = r.resolve("t", {"model": "m", "messages": msgs}, {}, now[0])
        reply = _reply(_words(rng, n))
        r.answered(ident, reply, now[0] + 0.001)
        runs.append(ident)
        return reply

    for n in range(3):
        runs: list = []
        _run_got(RunBodies("got_docmerge", np.random.default_rng(n)), rng, send)
        now[0] += 1000.0
        groups = {i.run for i in runs}
        assert len(groups) == (2 if n == 0 else 1), (n, [(i.evidence, i.run) for i in runs])
        if n:
            assert {i.evidence for i in runs} == {"new", "fanout", "dataflow"}
            assert len({i.app_id for i in runs}) == 1


def test_every_mix_app_has_templates_for_its_llm_units() -> None:
    assert CONVERSATION == {"react_fever", "react_alfw", "plan_execute", "code_generation",
                            "llm_reasoning"}
    for app, prompts in PROMPTS.items():
        units = {s.unit for seed in range(30)
                 for s in get_app(app).steps(np.random.default_rng(seed)) if s.is_llm}
        assert units <= set(prompts.units), app


# ------------------------------------------------------------------------------- end to end
@pytest.mark.timeout(120)
def test_identity_modes_against_a_gateway(tmp_path) -> None:  # noqa: ANN001
    """Three modes over the same arrivals (seed 3: FacTool code, ReAct, plan-and-execute):
    every row has its ACT and the same calls; only ``infer`` is scored, and there the
    conversations' units and apps are found and ReAct's runs whole."""
    from hermes.cli import main
    from hermes.gateway.config import load_config
    from hermes.gateway.server import start_background

    srv = start_background(load_config(
        None, environ={}, port=0, bind="", kb=str(tmp_path / "kb"),
        state_dir=str(tmp_path / "st"), time_scale=50.0, log_level="warning"))
    try:
        rows = {}
        for mode in ("headers", "infer", "none"):
            out = tmp_path / f"{mode}.json"
            assert main(["load", "--url", srv.url, "--identity", mode, "--apps", "8",
                         "--window", "0.2", "--time-scale", "50", "--seed", "3",
                         "--no-progress", "--json", str(out)]) == 0
            rows[mode] = json.loads(out.read_text())
    finally:
        srv.stop()
    for mode, row in rows.items():
        assert row["identity_mode"] == mode and row["runs"] == 8 and row["failed"] == 0
        assert 0 < row["mean_act_s"] <= row["p95_act_s"]
        assert row["requests"] == rows["headers"]["requests"]  # the same calls in each mode
        assert row["output_tokens_over_model"] == pytest.approx(1.0)  # ignore_eos, max_tokens
        assert row["prompt_tokens_over_model"] >= 1.0
    assert "identity" not in rows["headers"] and "identity" not in rows["none"]
    ident = rows["infer"]["identity"]
    for key in ("grouping_precision", "grouping_recall", "adjusted_rand", "unit_accuracy",
                "app_accuracy"):
        assert 0.0 <= ident[key] <= 1.0
    assert ident["grouping_precision"] == 1.0  # no two arrivals merged
    assert rows["infer"]["runs_not_inferred"] == 0 and rows["infer"]["runs_not_found"] == 0
    convs = {a: v for a, v in ident["per_app"].items() if a in CONVERSATION}
    assert convs, ident["per_app"]  # seed 3's eight arrivals include conversation apps
    for app, got in convs.items():
        assert got["unit_accuracy"] == 1.0 and got["app_accuracy"] == 1.0, (app, got)
    # ReAct's tool calls take tenths of a second: its runs are found whole. (A plan-and-execute
    # run may be split where a tool call and a loaded machine's latency, x50, pass the 60 s a
    # new app's runs are closed after; the README's figures are taken at time scale 1.)
    for app in ("react_fever", "react_alfw"):
        assert ident["per_app"][app]["grouping_recall"] == 1.0, ident["per_app"][app]


def test_identity_warm_up_is_sent_settled_and_reported_apart(tmp_path, capsys) -> None:  # noqa: ANN001
    """``--warmup-apps``: other arrivals first (unmeasured), then the gateway is waited for
    until it has closed every inferred run, then the measured arrivals; the JSON keeps the
    warm-up's figures apart, and the measured runs are the same eight as without it."""
    from hermes.cli import main
    from hermes.gateway.config import load_config
    from hermes.gateway.server import start_background

    srv = start_background(load_config(
        None, environ={}, port=0, bind="", kb=str(tmp_path / "kb"),
        state_dir=str(tmp_path / "st"), time_scale=50.0, log_level="warning"))
    try:
        out = tmp_path / "infer.json"
        assert main(["load", "--url", srv.url, "--identity", "infer", "--apps", "8",
                     "--window", "0.2", "--time-scale", "50", "--seed", "3",
                     "--warmup-apps", "6", "--no-progress", "--json", str(out)]) == 0
        row = json.loads(out.read_text())
        capsys.readouterr()
        assert main(["load", "--url", srv.url, "--identity", "infer",
                     "--warmup-apps", "-1"]) != 0
        assert "--warmup-apps must be >= 0, got -1" in capsys.readouterr().err
    finally:
        srv.stop()
    assert row["runs"] == 8 and row["failed"] == 0
    warm = row["warmup"]
    assert warm["runs"] == 6 and warm["failed"] == 0 and warm["mean_act_s"] > 0
    assert 0.0 <= warm["identity"]["grouping_precision"] <= 1.0
    # the measured phase's scoring covers only its own eight runs
    assert sum(a["runs"] for a in row["identity"]["per_app"].values()) == 8
