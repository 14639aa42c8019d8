"""The command line's shared output helpers (hermes.cliout, issue 16): tables of row dicts,
JSON output, and the `hermes keys list` table built with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes import cliout
from hermes.cli import main


def _lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_table_columns_alignment_and_floats(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"app": "a", "runs": 3, "act_s": 1.23456, "big": 1234.5678},
            {"app": "b", "runs": 10, "act_s": 0.5, "big": 2.0, "other_errors": 2}]
    cliout.print_table(rows, title="t")
    out = _lines(capsys)
    head = next(line for line in out if "app" in line)
    # every key is a column, in the order keys first appear (a later row may add one)
    assert [c.strip() for c in head.strip("┃ ").split("┃")] == ["app", "runs", "act_s", "big",
                                                               "other_errors"]
    a = next(line for line in out if " a " in line)
    assert "1.235" in a and "1234.568" in a  # floats: 3 decimals
    assert "│ a   │" in a  # strings left-aligned ...
    assert "│    3 │" in a  # ... numbers right-aligned
    cliout.print_table(rows, compact=True)
    assert "1234.6" in capsys.readouterr().out  # compact: 1 decimal from 100 on


def test_no_rows(capsys: pytest.CaptureFixture[str]) -> None:
    cliout.print_table([])
    assert capsys.readouterr().out == "(no rows)\n"
    cliout.print_table([], empty=None)
    assert capsys.readouterr().out == ""


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cliout.print_json({"a": [1, 2]})
    assert capsys.readouterr().out == '{"a": [1, 2]}\n'
    path = tmp_path / "rows.json"
    cliout.write_json(str(path), [{"x": 1}])
    assert json.loads(path.read_text()) == [{"x": 1}]
    assert "wrote 1 rows" in capsys.readouterr().err
    cliout.write_json(None, [{"x": 1}])  # no --json FILE: nothing
    assert capsys.readouterr() == ("", "")


def test_keys_list_is_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    auth = str(tmp_path / "auth.json")
    assert main(["keys", "list", "--auth-file", auth]) == 0
    assert capsys.readouterr().out == "(no keys)\n"
    for tenant in ("acme", "beta"):
        assert main(["keys", "create", "--tenant", tenant, "--auth-file", auth]) == 0
    capsys.readouterr()
    assert main(["keys", "list", "--auth-file", auth]) == 0
    out = _lines(capsys)
    assert "API keys" in out[0] and any("tenant" in line and "created" in line for line in out)
    assert sum(("acme" in line) + ("beta" in line) for line in out) == 2
