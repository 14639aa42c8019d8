"""The ``hermes`` command line: serve, profile, estimate, bench, load and admin commands."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from hermes import __version__
from hermes.extras import MissingExtraError, require

#: The command tree: each top-level command, its one-line help, and the function of the
#: module under ``hermes.cli`` that adds it (with its sub-commands and flags) to the parser.
#: Only the chosen command's module is imported (``hermes --help`` and the admin commands start
#: without numpy, scipy, the gateway or the simulator: tests/ops/test_cli_startup.py); the
#: help here is the one its module gives (the same test checks they agree).
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("hermes.cli.serve:add_parsers",
              "run the gateway and scheduler (embedded defaults: no arguments needed)"),
    "example-config": ("hermes.cli.serve:add_parsers",
                       "print the commented example hermes.toml (every key and its default): "
                       "hermes example-config > hermes.toml"),
    "run": ("hermes.cli.run:add_run_parser",
            "run a hosted app once on a gateway and wait for its end (waits for the gateway to "
            "be ready; non-zero exit on any failure)"),
    "profile": ("hermes.cli.profile:add_parsers",
                "run a benchmark app in simulation and/or learn a PDGraph from run records"),
    "estimate": ("hermes.cli.profile:add_parsers", "an app's total demand before it starts"),
    "bench": ("hermes.cli.bench:add_parsers", "benchmarks (simulator and live)"),
    "apps": ("hermes.cli.admin:add_admin_parsers",
             "applications and their PDGraphs on a running gateway"),
    "runs": ("hermes.cli.admin:add_admin_parsers", "runs on a running gateway"),
    "policy": ("hermes.cli.admin:add_admin_parsers", "the scheduling policy of a running gateway"),
    "knob": ("hermes.cli.admin:add_admin_parsers", "the prewarming knob K per app or tenant"),
    "top": ("hermes.cli.admin:add_admin_parsers", "live view of runs and engines"),
    "plan": ("hermes.cli.plan:add_plan_parser",
             "GPU planning: SamuLLM's multi-LLM batch planner, the cluster model's calibration"),
    "keys": ("hermes.cli.keys:add_keys_parser",
             "API keys per tenant (hashed) and ZeroMQ CURVE keys"),
    "load": ("hermes.cli.load:add_load_parser",
             "run the benchmark apps as HTTP clients of a live gateway; ACT like `hermes bench "
             "sched`"),
}


def _adder(target: str):  # noqa: ANN202 - a function of the sub-parsers action
    module, _, func = target.partition(":")
    return getattr(importlib.import_module(module), func)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``hermes`` parser. With ``command`` (a top-level command name), only that command is
    built in full and the others are stubs with their one-line help, so that starting a
    command imports its own module alone; with ``None``, every command is built in full (the
    CLI reference is generated from this)."""
    p = argparse.ArgumentParser(
        prog="hermes", description="Hermes: a serving gateway for LLM applications. "
        "`hermes serve` starts it; `hermes COMMAND --help` tells more.")
    p.add_argument("--version", action="version", version=f"hermes {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    built: set[str] = set()
    for name, (target, help_) in COMMANDS.items():
        if command is None or COMMANDS.get(command, ("",))[0] == target:
            if target not in built:
                built.add(target)
                _adder(target)(sub)
        else:
            sub.add_parser(name, help=help_, add_help=False)
    return p


def _command_of(argv: Sequence[str]) -> str | None:
    """The top-level command named in ``argv`` (its first word that is not an option)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_of(argv)
    args = build_parser(command or "").parse_args(argv)
    try:
        if getattr(args, "plot", None):  # every --plot: refused before the run, not after it
            require("plot")
        return int(args.func(args) or 0)
    except (ValueError, OSError, MissingExtraError) as exc:
        print(f"hermes: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: a line, not a traceback
        print("hermes: interrupted", file=sys.stderr)
        return 130

