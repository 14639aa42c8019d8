"""Dataflow: a prompt that holds text Hermes answered continues the run that answered it.

Programs of independent prompts (Graph-of-Thoughts, map-reduce chains, FacTool's stages)
share no conversation, so continuation cannot group their stages, and each stage would be
ranked as a short job of its own. What they do share is *data*: each operation's prompt holds
the texts it works on, which are earlier replies (a score prompt holds the candidate it
scores, an aggregate prompt the candidates, a reduce prompt the summaries, a verify prompt
the claim parsed out of an extraction). So a request whose text contains a passage of a reply
Hermes returned recently, to the same tenant, is the next step of that reply's run.

Passages are lines: programs embed an earlier output as a block of its own, or pick lines out
of it (one claim a line, one JSON field), far more often than they splice it into the middle
of a sentence. Both sides are normalised the same way: whitespace collapsed, a list marker
(``1.``, ``-``, ``*``) and quotes or brackets at the ends dropped (a claim listed as
``1. "X"`` comes back as ``X``). A prompt line that begins with a short label
(``Claim: X``, ``Observation: X``) is also looked up without it. A line counts when it has
at least ``min_chars`` characters (short lines like "Sure:" or "7" would join unrelated
runs); a line longer than ``head_chars`` is also indexed by its head, so a program that cuts a
long output to fit its prompt (keeping the start) still matches. What this cannot see, stated
in ``[identity]``'s docs: an output paraphrased, spliced into the middle of a line or cut to
fewer than ``head_chars`` characters of a longer line, and inputs two stages share that no
reply holds (FacTool-code's generate and test stages both read the problem, never each
other).

A passage answered in two different runs is common text (a boilerplate line the model says
every time), not data: it is marked ambiguous and never used again while indexed. Digests
are BLAKE2b-128 keyed by the tenant (:func:`~hermes.gateway.resolve.canon.key_digest`), so
two tenants' identical texts never meet. Pure functions; the resolver keeps the index.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

from hermes.gateway.resolve.canon import content_text, key_digest

#: the index value of a passage seen in replies of two different runs
AMBIGUOUS = ""
_KIND = "passage"
#: a list marker at the start of a line
_MARKER = re.compile(r"^(?:\d{1,3}[.)]|[-*\u2022])\s+")
#: a short label at the start of a prompt line ("Claim: ", "Merged NDA: ")
_LABEL = re.compile(r"^[A-Za-z][\w'()/-]*(?: [\w'()/-]+){0,3} ?: ")
_ENDS = "\"'`<>[](){}"


def _norm(line: str) -> str:
    return _MARKER.sub("", " ".join(line.split())).strip(_ENDS).strip()


def passages(text: str, *, min_chars: int, head_chars: int, max_chars: int | None = None,
             labels: bool = False) -> Iterator[str]:
    """The normalised lines of ``text`` with at least ``min_chars`` characters, each followed
    by its first ``head_chars`` characters when longer (module docstring). ``labels``: a
    labelled line is also given without its label (the prompt side). ``max_chars``: look at
    the head of ``text`` only."""
    if max_chars is not None:
        text = text[:max_chars]
    for line in text.splitlines():
        if len(line) < min_chars:
            continue
        s = _norm(line)
        forms = [s]
        if labels:
            m = _LABEL.match(s)
            if m is not None:
                forms.append(_norm(s[m.end():]))
        for f in forms:
            if len(f) < min_chars:
                continue
            yield f
            if len(f) > head_chars:
                yield f[:head_chars]


def reply_digests(tenant: str, reply: Any, *, min_chars: int, head_chars: int,
                  max_passages: int) -> list[bytes]:
    """The digests a reply (an assistant message) is indexed under: its content's passages,
    at most ``max_passages`` of them (the first), so one long answer costs bounded memory."""
    if not isinstance(reply, dict):
        return []
    out: list[bytes] = []
    for p in passages(content_text(reply.get("content")), min_chars=min_chars,
                      head_chars=head_chars):
        out.append(key_digest(tenant, _KIND, p))
        if len(out) >= max_passages:
            break
    return out


def prompt_digests(tenant: str, messages: Sequence[Any], *, min_chars: int, head_chars: int,
                   max_chars: int) -> list[bytes]:
    """The digests of every passage of a request's messages, in order, over at most
    ``max_chars`` characters of text in all (the CPU a request can cost is bounded)."""
    out: list[bytes] = []
    budget = max_chars
    for m in messages:
        if budget <= 0:
            break
        if not isinstance(m, dict):
            continue
        text = content_text(m.get("content"))
        for p in passages(text, min_chars=min_chars, head_chars=head_chars, max_chars=budget,
                          labels=True):
            out.append(key_digest(tenant, _KIND, p))
        budget -= len(text)
    return out


def vote(runs: Sequence[str | None]) -> str | None:
    """The run most passages point at (ambiguous and unknown passages are no vote; a tie goes
    to the run whose passage comes last: the text a prompt ends with is what it works on)."""
    count: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, run in enumerate(runs):
        if run:
            count[run] = count.get(run, 0) + 1
            last[run] = i
    if not count:
        return None
    return max(count, key=lambda r: (count[r], last[r]))
