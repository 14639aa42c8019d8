"""``hermes runs show RUN --timeline``: a run's units, requests and tool calls drawn on one
time axis in the terminal (rich), from the gateway's ``GET /admin/runs/{id}/timeline``
(:mod:`hermes.gateway.timeline`).

Each unit invocation is a row (``─`` from its start to its end); under it each LLM request
and tool call is a row: ``░`` waiting (sent to its node, queued there behind higher-ranked
work), ``▒`` serving before the first token (prefill), ``█`` serving (decode, or the tool
running). The columns on the right give the waiting and serving seconds, so that where the
time went reads off one screen.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

WAIT, PREFILL, SERVE, UNIT = "░", "▒", "█", "─"
STYLES = {WAIT: "yellow", PREFILL: "cyan", SERVE: "green", UNIT: "bright_black"}


def _axis(t0: float, t1: float, width: int) -> Text:
    """A ruler of ``width`` columns from 0 to ``t1 - t0`` seconds, with a few ticks."""
    span = max(t1 - t0, 1e-9)
    line = [" "] * width
    ticks = 4 if width >= 40 else 2
    for i in range(ticks + 1):
        col = min(width - 1, round(i * (width - 1) / ticks))
        label = _secs(i * span / ticks)
        start = max(0, min(col - (len(label) if i == ticks else 0), width - len(label)))
        for j, ch in enumerate(label):
            line[start + j] = ch
    return Text("".join(line), style="bold")


def _secs(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 120:
        return f"{s:.2f}s"
    return f"{s / 60:.1f}m"


def _bar(segments: list[tuple[float | None, float | None, str]], t0: float, t1: float,
         width: int) -> Text:
    """Columns filled with each segment's character (later segments over earlier ones)."""
    span = max(t1 - t0, 1e-9)
    cells = [" "] * width
    for a, b, ch in segments:
        if a is None or b is None or b < a:
            continue
        lo = int((a - t0) / span * width)
        hi = max(lo + 1, int(round((b - t0) / span * width)))
        for c in range(max(0, lo), min(width, hi)):
            cells[c] = ch
    text = Text()
    for ch in cells:
        text.append(ch, style=STYLES.get(ch))
    return text


def _end(tl: dict[str, Any]) -> float:
    ends = [tl.get("finished") or 0.0]
    for u in tl["units"]:
        ends.append(u.get("finished") or 0.0)
        for r in u["requests"]:
            ends.append(r.get("done") or 0.0)
    return max(e for e in ends if e is not None)


def render_timeline(tl: dict[str, Any], width: int = 60) -> Group:
    """The drawing of one timeline (the answer of ``GET /admin/runs/{id}/timeline``)."""
    t0 = tl.get("t0") or 0.0
    t1 = max(_end(tl), t0 + 1e-6)
    head = Text.assemble(
        ("run ", "bold"), (str(tl.get("run_id")), "bold cyan"), "  app ", str(tl.get("app")),
        "  ", str(tl.get("state")), "  ACT ", _secs(t1 - t0),
        ("  (inferred)" if tl.get("inferred") else ""),
        (f"  trace {tl['trace_id']}" if tl.get("trace_id") else ""))
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    table.add_column("unit / request", no_wrap=True, overflow="ellipsis", max_width=34)
    table.add_column(_axis(t0, t1, width), no_wrap=True, width=width)
    table.add_column("wait", justify="right")
    table.add_column("serve", justify="right")
    for u in tl["units"]:
        start, end = u.get("started"), u.get("finished") or t1
        table.add_row(Text(f"{u['unit']}", style="bold"), _bar([(start, end, UNIT)], t0, t1, width),
                      "", _secs(end - start) if start is not None else "")
        for r in u["requests"]:
            q, d, f, done = r["queued"], r["dispatched"], r["first_token"], r["done"]
            done = done if done is not None else t1
            segs = [(q, d if d is not None else done, WAIT)]
            if d is not None:
                segs += [(d, f if f is not None else done, PREFILL if f is not None else SERVE)]
                if f is not None:
                    segs.append((f, done, SERVE))
            what = "tool" if r.get("kind") == "tool" else "llm"
            where = r.get("engine") or r.get("node") or ""
            wait = _secs(d - q) if d is not None and q is not None else "-"
            serve = _secs(done - d) if d is not None else "-"
            label = Text(f" └ {what} {where}", style="dim" if r.get("state") != "done" else None)
            if r.get("state") == "failed":
                label.append(" failed", style="red")
            table.add_row(label, _bar(segs, t0, t1, width), wait, serve)
    legend = Text.assemble((WAIT, STYLES[WAIT]), " waiting (queued at its node)   ",
                           (PREFILL, STYLES[PREFILL]), " serving, before the first token   ",
                           (SERVE, STYLES[SERVE]), " serving   ", (UNIT, STYLES[UNIT]), " unit")
    return Group(head, Text(""), table, Text(""), legend)


def print_timeline(tl: dict[str, Any], console: Console | None = None,
                   width: int | None = None) -> None:
    """Print the drawing (bars as wide as the terminal allows, 30 columns at least)."""
    console = console or Console()
    bars = width if width is not None else max(30, min(100, console.width - 56))
    console.print(render_timeline(tl, bars))
