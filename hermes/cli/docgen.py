"""The documentation site's generated reference pages: the command line (from the argparse
parsers of ``hermes`` and ``hermeslet``) and the gateway's configuration keys (from the
pydantic models of :mod:`hermes.gateway.config`). ``docs/hooks.py`` adds both pages to the
MkDocs build, so they cannot fall behind the code; ``python -m hermes.cli.docgen DIR`` writes
them to ``DIR`` for a look.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: the help text's width (argparse reads $COLUMNS): fixed, so the pages do not depend on the
#: terminal that builds them
WIDTH = "100"


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]
         ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command under ``parser``, depth first, with its words (``("hermes", "bench",
    "sched")``)."""
    yield path, parser
    for name, sub in _subcommands(parser):
        yield from walk(sub, (*path, name))


def parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """The two programs' parsers, every command built in full."""
    from hermes.cli import build_parser
    from hermeslet.cli import _parser

    return [("hermes", build_parser()), ("hermeslet", _parser())]


def cli_reference() -> str:
    """The command-line reference page (Markdown): each command's ``--help``."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        out = ["# Command-line reference", "",
               "Generated from the programs' own parsers when the site is built: each "
               "command's `--help`. `hermes COMMAND --help` prints the same.", ""]
        for prog, parser in parsers():
            for words, p in walk(parser, (prog,)):
                out += [f"{'#' * min(len(words) + 1, 6)} `{' '.join(words)}`", "",
                        "```text", p.format_help().rstrip(), "```", ""]
        return "\n".join(out)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _field_doc(model: type[Any], name: str) -> str:
    """A field's ``#:`` comment in the source (pydantic keeps no docstrings of fields)."""
    import inspect

    try:
        lines = inspect.getsource(model).splitlines()
    except (OSError, TypeError):
        return ""
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith(f"{name}:"):
            doc: list[str] = []
            j = i - 1
            while j >= 0 and lines[j].strip().startswith("#:"):
                doc.insert(0, lines[j].strip()[2:].strip())
                j -= 1
            return " ".join(doc)
    return ""


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        value = field.default_factory()
    else:
        return "(required)"
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    elif isinstance(value, list):
        value = [v.model_dump() if hasattr(v, "model_dump") else v for v in value]
    return json.dumps(value)


def config_reference() -> str:
    """The configuration reference page (Markdown): every section and key of ``hermes.toml``
    with its default, its environment variable and its comment in the code."""
    from hermes.gateway.config import _SECTIONS, EngineConfig, _unique_keys

    unique = _unique_keys()
    out = ["# Configuration reference", "",
           "Generated from the gateway's configuration models (`hermes/gateway/config.py`) "
           "when the site is built. Precedence, last wins: defaults, the file (`hermes serve "
           "--config hermes.toml`), `HERMES_*` environment variables, command-line flags. "
           "`hermes example-config` prints a commented file with every key; "
           "[Configuration](../configuration.md) tells more about each part.", ""]
    for section, model in _SECTIONS.items():
        out += [f"## `[{section}]`", "", (model.__doc__ or "").strip(), "",
                "| key | default | environment | what it does |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            env = f"`HERMES_{section.upper()}__{name.upper()}`"
            if unique.get(name) == section:
                env += f", `HERMES_{name.upper()}`"
            doc = _field_doc(model, name).replace("|", "\\|")
            out.append(f"| `{name}` | `{_default(field)}` | {env} | {doc} |")
        out.append("")
    out += ["## `[[engines]]`", "", (EngineConfig.__doc__ or "").strip() + " A list of "
            "tables (`HERMES_ENGINES`: a JSON list); the default is the built-in engine and "
            "an embedding engine beside it.", "",
            "| key | default | what it does |", "|---|---|---|"]
    for name, field in EngineConfig.model_fields.items():
        doc = _field_doc(EngineConfig, name).replace("|", "\\|")
        out.append(f"| `{name}` | `{_default(field)}` | {doc} |")
    return "\n".join(out) + "\n"


PAGES = {"reference/cli.md": cli_reference, "reference/config.md": config_reference}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hermes.cli.docgen DIR", file=sys.stderr)
        return 2
    for rel, make in PAGES.items():
        path = Path(args[0]) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(make())
        print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
