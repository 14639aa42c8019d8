"""Request bodies of the benchmark apps as the real programs send them (issue 17's measure).

``hermes load --identity`` asks whether the gateway finds runs, apps and units in plain
OpenAI traffic, so the traffic must have the shape the real programs give it, identical in
every mode. Each app model's docstring (:mod:`hermes.workloads.apps`) says how its real
program builds prompts, and that decides the shape:

- **conversations** (:data:`CONVERSATION`): the program keeps one chat history per run and
  every call continues it. ReAct (FEVER, ALFWorld: "every prompt holds the trajectory so
  far"), plan-and-execute ("executor prompts grow with the results so far"), code generation
  (the fix prompt holds the code and its error, the summary the program's output) and LLM
  reasoning (each solve prompt holds the answers so far). A request's messages are: the
  app-wide system prompt (a fixed template with the run's task id in it), the task as the
  first user turn, every earlier turn of the run with the reply exactly as the gateway
  returned it, then the unit's user turn (an observation, a tool result or an instruction:
  a fixed per-(app, unit) template with variable fillers). A fan-out step (several calls at
  once) branches from the same history with one distinct sub-task turn per call, and the run
  continues from the first branch and its reply (as self-consistency keeps one chain);
- **independent prompts** (everything else): FacTool's stages (each a fresh prompt filled
  from the previous stage's parsed output), LangChain map-reduce (map, collapse and reduce
  chains with their own prompts), Graph-of-Thoughts document merging (every operation a
  fresh prompt holding the texts it works on). Every call is a per-unit system role plus one
  user message; nothing in it names or continues its run. What a stage's prompt does hold is
  its inputs, and where those are earlier outputs the app model says which
  (:attr:`UnitPrompt.consumes`: a GoT score prompt holds the candidate it scores, the
  aggregate prompt both candidates, a collapse prompt its share of the map summaries, a
  FacTool query prompt the extracted claim), the replies exactly as the gateway returned
  them go in, each on its own line (``{input}``), cut (head kept) only where they would not
  fit the step's input tokens. That is the dataflow evidence
  (:mod:`hermes.gateway.resolve.dataflow`); FacTool-code's two stages share only the
  problem, no output, so nothing in its traffic ties them. GoT scores candidates with one
  scoring prompt wherever they stand in the graph, so its ``score1``/``score2``/``score3``
  share one template: a prompt cannot tell them apart.

Sizes: each request's text is padded with variable filler (numbers, which prompt templates
mask) so that it has at least the step's input tokens at 4 characters a token; a
conversation's history can make it longer than the app model's figure (the driver reports
the ratio). Labels stay free of numbers (``Thought:``, not ``Thought 2:``): the filler is the
variable part, the template the fixed one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: characters a token, as the built-in engine counts them
CHARS_PER_TOKEN = 4
#: the least filler a turn gets, so every turn has a variable part
MIN_FILLER_CHARS = 24

Message = dict[str, Any]


#: how a step's calls share the outputs their prompts hold (:attr:`UnitPrompt.share`)
SHARES = ("all", "part", "one", "each")


@dataclass(frozen=True, slots=True)
class UnitPrompt:
    """One unit's prompt template: ``turn`` is its last user turn, ``{text}`` the variable
    part, ``{input}`` (independent prompts) the earlier outputs it holds; ``system`` its own
    instructions (independent prompts only).

    ``consumes``: the units whose outputs ``{input}`` holds (of those that ran, the latest
    step's). ``share``: ``all``, every call holds all of them; ``part``, call j of m holds the
    j-th contiguous share (a collapse group); ``one``, every call of this unit's k-th step
    holds output k (GoT's judges scoring one candidate a step); ``each``, call j holds
    output j (modulo their number)."""

    turn: str
    system: str = ""
    consumes: tuple[str, ...] = ()
    share: str = "all"

    def __post_init__(self) -> None:
        if self.share not in SHARES:
            raise ValueError(f"share must be one of {SHARES}, got {self.share!r}")


@dataclass(frozen=True, slots=True)
class AppPrompts:
    """One app's prompt templates. ``conversation``: calls continue the run's history
    (``system`` with ``{task}`` for the task id, ``task`` the first user turn); otherwise
    each call is an independent prompt of its unit."""

    conversation: bool
    units: Mapping[str, UnitPrompt]
    system: str = ""
    task: str = ""


def _conv(system: str, task: str, **units: str) -> AppPrompts:
    return AppPrompts(True, {u: UnitPrompt(t) for u, t in units.items()}, system, task)


def _indep(**units: tuple[str, ...]) -> AppPrompts:
    """Units as ``(system, turn)`` or ``(system, turn, consumes, share)`` (``consumes``: unit
    names separated by commas)."""
    out = {}
    for u, spec in units.items():
        system, turn, *rest = spec
        consumes = tuple(rest[0].split(",")) if rest else ()
        out[u] = UnitPrompt(turn, system, consumes, rest[1] if len(rest) > 1 else "all")
    return AppPrompts(False, out)


_GOT_SCORE = ("You are a legal expert. Score how well a merged NDA keeps the clauses of the "
              "originals and removes the redundancy.",
              "Originals:\n{text}\nMerged NDA:\n{input}\nScore (1 to 10) and rationale:")

#: the benchmark apps' templates (module docstring)
PROMPTS: dict[str, AppPrompts] = {
    "react_fever": _conv(
        "Solve a fact verification task with interleaving Thought, Action, Observation steps. "
        "Action is one of Search[entity], Lookup[keyword], Finish[SUPPORTS, REFUTES or NOT "
        "ENOUGH INFO]. Claim id {task}.",
        "Claim: {text}",
        thought="Observation: {text}\nWrite your next Thought and Action."),
    "react_alfw": _conv(
        "Interact with a household to solve a task. You can go to, open, take, put, heat, "
        "cool, clean and use objects. Think before you act. Episode {task}.",
        "Your task is to: {text}",
        thought="Observation: {text}\nWrite your next thought and action."),
    "plan_execute": _conv(
        "You are a planner and executor with tools: classify_image (ResNet-50), transcribe "
        "(Whisper), generate_image (Stable Diffusion). Request {task}.",
        "User request: {text}",
        plan="Make a plan:\nList the tool tasks, one JSON object a line.\nAttachments: {text}",
        execute_step="Results so far: {text}\nNext task: write the arguments of its tool call "
                     "as JSON.",
        summarize="All results: {text}\nAnswer the user's request from these results."),
    "code_generation": _conv(
        "You are a Python programmer. You write complete programs for data and ML tasks; "
        "they run in a python:3.10-slim container. Job {task}.",
        "Task: {text}",
        generate_code="Write the program:\nRequirements: {text}",
        fix_code="Execution failed with this error:\nTraceback: {text}\nFix the program and "
                 "write it again in full.",
        summarize="Program output: {text}\nSummarize the result for the user."),
    "llm_reasoning": _conv(
        "Answer the question by reasoning step by step. Question id {task}.",
        "Question: {text}",
        decompose="Decompose the question into sub-questions, one a line:\nContext: {text}",
        solve="Sub-question: {text}\nSolve it step by step; end with The answer is.",
        answer="Solved steps: {text}\nWrite the final answer."),
    "factool_code": _indep(
        generate_queries=("You are a test engineer. Write test inputs for a coding problem.",
                          "Problem: {text}\nWrite three test inputs as a Python list:"),
        generate_solutions=("You are a Python programmer. Solve the coding problem.",
                            "Problem: {text}\nSolution:")),
    "factool_kbqa": _indep(
        extract_claims=("You extract the factual claims a text makes, one a line.",
                        "Text: {text}\nClaims:"),
        generate_queries=("You write search-engine queries that would verify a claim.",
                          "Claim: {input}\nContext: {text}\nQueries:", "extract_claims",
                          "each"),
        verifies=("You verify a claim against evidence.",
                  "Claim: {input}\nEvidence: {text}\nVerdict and reasoning:", "extract_claims",
                  "each")),
    "factool_math": _indep(
        extract_claims=("You extract every equation of a math answer, one a line.",
                        "Answer: {text}\nEquations:"),
        generate_queries=("You turn an equation into a Python expression that checks it.",
                          "Equation: {input}\nContext: {text}\nPython:", "extract_claims",
                          "each")),
    "langchain_mapreduce": _indep(
        generate_summary=("You summarise documents.",
                          "Write a concise summary of the following:\n{text}\nCONCISE SUMMARY:"),
        collapse_summaries=("You combine summaries of parts of a document.",
                            "Notes: {text}\nCombine these summaries into one:\n{input}\n"
                            "COMBINED SUMMARY:", "collapse_summaries,generate_summary", "part"),
        generate_final_summary=("You write the final summary of a document.",
                                "Notes: {text}\nSummaries of its parts:\n{input}\n"
                                "FINAL SUMMARY:", "collapse_summaries,generate_summary")),
    "got_docmerge": _indep(
        generate1=("You are a legal expert. Merge NDAs into one, keeping every clause and "
                   "removing the redundancy.", "Documents:\n{text}\nMerged NDA:"),
        aggregate=("You are a legal expert. Combine candidate merges of NDAs into one better "
                   "merge.", "Originals:\n{text}\nCandidates:\n{input}\nCombined NDA:",
                   "generate1"),
        generate2=("You are a legal expert. Improve a merged NDA against its originals.",
                   "Originals:\n{text}\nMerged NDA to improve:\n{input}\nImproved NDA:",
                   "aggregate", "one"),
        score1=(*_GOT_SCORE, "generate1", "one"), score2=(*_GOT_SCORE, "aggregate", "one"),
        score3=(*_GOT_SCORE, "generate2")),
}

#: the apps whose runs are conversations (module docstring)
CONVERSATION = frozenset(a for a, p in PROMPTS.items() if p.conversation)


def prompts_of(app: str) -> AppPrompts:
    """The app's templates; an app :data:`PROMPTS` lacks sends independent prompts whose
    templates :func:`unit_prompt` makes from the unit names."""
    return PROMPTS.get(app) or AppPrompts(False, {})


def unit_prompt(app: str, unit: str) -> UnitPrompt:
    """The unit's template; a unit the app's table lacks gets one from its name."""
    got = prompts_of(app).units.get(unit)
    if got is not None:
        return got
    words = unit.replace("_", " ")
    return UnitPrompt(f"{words.capitalize()}:\n{{text}}\nAnswer:",
                      f"You do the {words} step of {app.replace('_', ' ')}.")


def filler(rng: np.random.Generator, chars: int) -> str:
    """``chars`` characters of variable text (numbers, which prompt templates mask)."""
    n = max(1, chars // 7 + 1)
    return " ".join(str(x) for x in rng.integers(100_000, 999_999, size=n))[:max(1, chars)]


def chars_of(messages: Sequence[Message]) -> int:
    """The text characters of a chat request's messages (what the engine counts)."""
    return sum(len(str(m.get("content") or "")) for m in messages)


def _fill(template: str, rng: np.random.Generator, chars: int) -> str:
    """``template`` with its ``{text}`` slots filled with ``chars`` characters in all."""
    slots = max(1, template.count("{text}"))
    each = max(MIN_FILLER_CHARS, -(-chars // slots))
    parts = template.split("{text}")
    out = parts[0]
    for p in parts[1:]:
        out += filler(rng, each) + p
    return out


#: an embedded output is never cut shorter than this (characters): the dataflow index knows a
#: long line by its head (``[identity] dataflow_head_chars``, 256)
MIN_EMBED_CHARS = 320


def _held_outputs(outputs: Sequence[str], share: str, j: int, m: int, k: int) -> list[str]:
    """The outputs call ``j`` of ``m`` of this unit's ``k``-th step holds
    (:attr:`UnitPrompt.share`)."""
    n = len(outputs)
    if share == "all":
        return list(outputs)
    if share == "part":
        return list(outputs[j * n // m:(j + 1) * n // m]) or [outputs[j % n]]
    return [outputs[(k if share == "one" else j) % n]]


@dataclass(slots=True)
class RunBodies:
    """The request bodies of one run, step after step (module docstring).

    :meth:`step` gives the messages of each call of an LLM step; :meth:`answered` takes the
    replies the gateway returned (the assistant messages, as returned) and, for a
    conversation, continues the history with the first branch and its reply; for independent
    prompts, keeps them as the step's outputs for the units that consume them."""

    app: str
    rng: np.random.Generator
    history: list[Message] = field(default_factory=list)
    #: unit -> (step number, its replies' text) of the unit's latest step
    outputs: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    #: unit -> steps of it so far
    steps_of: dict[str, int] = field(default_factory=dict)
    #: the unit of the last :meth:`step` (whose replies :meth:`answered` takes)
    _last_unit: str = ""
    _serial: int = 0

    def __post_init__(self) -> None:
        p = prompts_of(self.app)
        if p.conversation:
            task_id = int(self.rng.integers(10_000, 99_999))
            self.history = [
                {"role": "system", "content": p.system.format(task=task_id)},
                {"role": "user", "content": _fill(p.task, self.rng, 2 * MIN_FILLER_CHARS)}]

    @property
    def conversation(self) -> bool:
        return prompts_of(self.app).conversation

    def _inputs(self, up: UnitPrompt) -> list[str]:
        """The outputs ``up`` consumes: of its ``consumes`` units that ran, the latest's."""
        got = [self.outputs[u] for u in up.consumes if u in self.outputs]
        return max(got)[1] if got else []

    def step(self, unit: str, input_tokens: Sequence[int]) -> list[list[Message]]:
        """The messages of each call of an LLM step of ``unit`` (one per input-token count)."""
        up = unit_prompt(self.app, unit)
        k = self.steps_of.get(unit, 0)
        self.steps_of[unit] = k + 1
        self._last_unit = unit
        inputs = [] if self.conversation else self._inputs(up)
        m = len(input_tokens)
        out: list[list[Message]] = []
        for j, tokens in enumerate(input_tokens):
            want = max(1, tokens) * CHARS_PER_TOKEN
            if self.conversation:
                head = list(self.history)
            else:
                head = [{"role": "system", "content": up.system}]
            turn_t = up.turn
            if "{input}" in turn_t:
                held = _held_outputs(inputs, up.share, j, m, k) if inputs else []
                room = want - chars_of(head) - len(turn_t) - MIN_FILLER_CHARS
                each = max(MIN_EMBED_CHARS, room // max(1, len(held)))
                text = "\n\n".join(h.strip()[:each] for h in held) or filler(self.rng, each)
                turn_t = turn_t.replace("{input}", text)
            fixed = chars_of(head) + len(turn_t.replace("{text}", ""))
            turn = {"role": "user", "content": _fill(turn_t, self.rng, want - fixed)}
            out.append([*head, turn])
        return out

    def answered(self, sent: Sequence[Sequence[Message]], replies: Sequence[Message]) -> None:
        """The gateway's replies to the calls of the last :meth:`step` (in its order)."""
        if self.conversation and sent:
            self.history = [*sent[0], dict(replies[0])]
        elif not self.conversation and self._last_unit:
            self._serial += 1
            self.outputs[self._last_unit] = (self._serial, [str(r.get("content") or "")
                                                       for r in replies])
