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
  user message; nothing in it names or continues its run, so plain traffic cannot group
  these calls into runs (and with per-unit instructions, not even into one app): a session id
  or ``X-Hermes-Run`` is the evidence that would. GoT scores candidates with one scoring
  prompt wherever they stand in the graph, so its ``score1``/``score2``/``score3`` share one
  template: a prompt cannot tell them apart.

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


@dataclass(frozen=True, slots=True)
class UnitPrompt:
    """One unit's prompt template: ``turn`` is its last user turn, ``{text}`` the variable
    part; ``system`` its own instructions (independent prompts only)."""

    turn: str
    system: str = ""


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


def _indep(**units: tuple[str, str]) -> AppPrompts:
    return AppPrompts(False, {u: UnitPrompt(t, s) for u, (s, t) in units.items()})


_GOT_SCORE = ("You are a legal expert. Score how well a merged NDA keeps the clauses of the "
              "originals and removes the redundancy.",
              "Originals:\n{text}\nMerged NDA:\n{text}\nScore (1 to 10) and rationale:")

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
                          "Claim: {text}\nQueries:"),
        verifies=("You verify a claim against evidence.",
                  "Claim: {text}\nEvidence: {text}\nVerdict and reasoning:")),
    "factool_math": _indep(
        extract_claims=("You extract every equation of a math answer, one a line.",
                        "Answer: {text}\nEquations:"),
        generate_queries=("You turn an equation into a Python expression that checks it.",
                          "Equation: {text}\nPython:")),
    "langchain_mapreduce": _indep(
        generate_summary=("You summarise documents.",
                          "Write a concise summary of the following:\n{text}\nCONCISE SUMMARY:"),
        collapse_summaries=("You combine summaries of parts of a document.",
                            "Combine these summaries into one:\n{text}\nCOMBINED SUMMARY:"),
        generate_final_summary=("You write the final summary of a document.",
                                "Summaries of its parts:\n{text}\nFINAL SUMMARY:")),
    "got_docmerge": _indep(
        generate1=("You are a legal expert. Merge NDAs into one, keeping every clause and "
                   "removing the redundancy.", "Documents:\n{text}\nMerged NDA:"),
        aggregate=("You are a legal expert. Combine candidate merges of NDAs into one better "
                   "merge.", "Candidates:\n{text}\nCombined NDA:"),
        generate2=("You are a legal expert. Improve a merged NDA against its originals.",
                   "Originals:\n{text}\nMerged NDA to improve:\n{text}\nImproved NDA:"),
        score1=_GOT_SCORE, score2=_GOT_SCORE, score3=_GOT_SCORE),
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


@dataclass(slots=True)
class RunBodies:
    """The request bodies of one run, step after step (module docstring).

    :meth:`step` gives the messages of each call of an LLM step; :meth:`answered` takes the
    replies the gateway returned (the assistant messages, as returned) and, for a
    conversation, continues the history with the first branch and its reply."""

    app: str
    rng: np.random.Generator
    history: list[Message] = field(default_factory=list)

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

    def step(self, unit: str, input_tokens: Sequence[int]) -> list[list[Message]]:
        """The messages of each call of an LLM step of ``unit`` (one per input-token count)."""
        up = unit_prompt(self.app, unit)
        out: list[list[Message]] = []
        for tokens in input_tokens:
            want = max(1, tokens) * CHARS_PER_TOKEN
            if self.conversation:
                head = list(self.history)
            else:
                head = [{"role": "system", "content": up.system}]
            fixed = chars_of(head) + len(up.turn.replace("{text}", ""))
            turn = {"role": "user", "content": _fill(up.turn, self.rng, want - fixed)}
            out.append([*head, turn])
        return out

    def answered(self, sent: Sequence[Sequence[Message]], replies: Sequence[Message]) -> None:
        """The gateway's replies to the calls of the last :meth:`step` (in its order)."""
        if self.conversation and sent:
            self.history = [*sent[0], dict(replies[0])]
