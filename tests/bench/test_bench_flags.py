"""The ``hermes bench`` command lines check their values before any work starts
(:mod:`hermes.argtypes`): exit 2, the flag and the value named."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(("argv", "says"), [
    (["seallm", "--rate", "0"], "argument --rate: expected comma-separated numbers > 0, got '0'"),
    (["seallm", "--rate", "2,x"], "argument --rate: expected comma-separated numbers > 0"),
    (["seallm", "--rate", "-1"], "argument --rate: expected comma-separated numbers > 0"),
    (["seallm", "--seeds", "x"], "argument --seeds: expected comma-separated integers, got 'x'"),
    (["seallm", "--duration", "0"], "argument --duration: expected a number > 0, got '0'"),
    (["seallm", "--workers", "0"], "argument --workers: expected a positive integer, got '0'"),
    (["sched", "--window", "-5"], "argument --window: expected comma-separated numbers > 0"),
    (["sched", "--apps", "0"], "argument --apps: expected a positive integer, got '0'"),
    (["sched", "--seeds", "1,x"], "argument --seeds: expected comma-separated integers"),
    (["ddl", "--window", "nan"], "argument --window: expected a number > 0, got 'nan'"),
    (["prewarm", "--window", "-1"], "argument --window: expected a number > 0, got '-1'"),
    (["routing", "--engines", "0"], "argument --engines: expected a positive integer"),
])
def test_bench_flags_are_checked_before_any_work(argv: list[str], says: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Bad values stop a benchmark at the command line (exit 2, naming the flag), where they
    used to run (a negative window) or fail deep inside (IndexError for --apps 0 or
    --duration 0)."""
    from hermes.cli import main as cli_main

    with pytest.raises(SystemExit) as exit_:
        cli_main(["bench", *argv])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err
