"""What the ``hermes`` commands print: row dicts as ``rich`` tables, and JSON output.

One place for the output helpers of the command line (:mod:`hermes.cli`, the admin commands in
:mod:`hermes.cli.admin` and :mod:`hermes.cli.keys`, the benchmarks under :mod:`hermes.bench`,
``hermes load``). It imports nothing of Hermes, so any command module can use it.

- :func:`print_table`: rows (dicts) as a table; a column is right-aligned unless its first
  value is a string; floats with 3 decimals (``compact``: 1 from
  100 on, as the benchmarks print them);
- :func:`print_json`: ``--json`` on stdout, one document per line;
- :func:`print_json_pretty`: a JSON document, indented and coloured, for people;
- :func:`write_json`: the rows of ``--json FILE``;
- :func:`progress_bar`: a ``tqdm`` bar on stderr (hidden when stderr is not a terminal).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

#: the width tables are laid out for (rich would otherwise wrap them to the terminal)
TABLE_WIDTH = 200


def cell(value: object, *, compact: bool = False) -> str:
    """A table cell: floats with 3 decimals (``compact``: 1 decimal from 100 on), ``-`` for
    None (a figure that does not exist), else ``str``."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}" if compact and abs(value) >= 100 else f"{value:.3f}"
    return str(value)


def table(rows: Sequence[Mapping[str, Any]], title: str | None = None, *,
          compact: bool = False) -> Any:
    """The ``rich`` table of ``rows``: a column per key, in the order keys first appear; a row
    without a key has an empty cell there."""
    from rich.table import Table

    first: dict[str, Any] = {}  # column -> its first value (the column's alignment)
    for r in rows:
        for k, v in r.items():
            first.setdefault(k, v)
    t = Table(title=title)
    for c, v in first.items():
        t.add_column(str(c), justify="left" if isinstance(v, str) else "right")
    for r in rows:
        t.add_row(*(cell(r[c], compact=compact) if c in r else "" for c in first))
    return t


def print_table(rows: Sequence[Mapping[str, Any]], title: str | None = None, *,
                compact: bool = False, empty: str | None = "(no rows)",
                file: IO[str] | None = None) -> None:
    """Print ``rows`` as a table on ``file`` (stdout); no rows: the line ``empty``, if any."""
    from rich.console import Console

    out = file or sys.stdout
    if not rows:
        if empty is not None:
            print(empty, file=out)
        return
    Console(file=out, width=TABLE_WIDTH).print(table(rows, title, compact=compact))


def print_json(data: Any, *, flush: bool = False) -> None:
    """``data`` as one line of JSON on stdout (``--json``: for scripts)."""
    print(json.dumps(data), flush=flush)


def print_json_pretty(data: Any) -> None:
    """``data`` as indented, highlighted JSON on stdout (for people)."""
    from rich.console import Console

    Console(width=160).print_json(json.dumps(data))


def write_json(path: str | Path | None, rows: Iterable[Mapping[str, Any]], *, indent: int = 2,
               quiet: bool = False) -> None:
    """Write ``rows`` as a JSON list to ``path`` (nothing without one); unless ``quiet``, say so
    on stderr."""
    if not path:
        return
    rows = list(rows)
    Path(path).write_text(json.dumps(rows, indent=indent) + "\n")
    if not quiet:
        print(f"wrote {len(rows)} rows to {path}", file=sys.stderr)


def progress_bar(total: int, desc: str, unit: str = "run") -> Any:
    """A progress bar of ``total`` steps on stderr, cleared when done (``tqdm``, imported here
    so that building the command line does not load it)."""
    from tqdm import tqdm  # type: ignore[import-untyped]

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, disable=None)
