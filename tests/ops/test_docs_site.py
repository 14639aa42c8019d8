"""The documentation site (MkDocs + Material, ``mkdocs.yml``): it builds with strict link
checks, its reference pages are generated from the code, and what a user reads (README, the
site, every ``--help``) says no "issue N"."""

from __future__ import annotations

import functools
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hermes.cli.docgen import cli_reference, config_reference, parsers, walk
from tests.ops.conftest import REPO

ISSUE = re.compile(r"\b[Ii]ssues? \d+")


@functools.cache
def _cli() -> str:
    return cli_reference()


def _commands() -> list[tuple[str, ...]]:
    return [words for prog, p in parsers() for words, _ in walk(p, (prog,))]


def test_no_issue_numbers_in_user_facing_text() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for page in pages:
        found = ISSUE.findall(page.read_text())
        assert not found, f"{page.relative_to(REPO)}: {found}"
    helps = _cli()
    assert not ISSUE.findall(helps), ISSUE.findall(helps)
    # --help points at nothing an installed package lacks (serve's pointed at
    # docs/configuration.md, which is not in the wheel)
    for outside in ("docs/", "../shared", "README"):
        assert outside not in helps, outside


def test_the_readme_command_table_lists_every_command() -> None:
    """Each command and sub-command (``hermes keys revoke``, ``hermeslet run-plan``, ...) is in
    a row of the README's table that starts with its parent command."""
    rows = [ln for ln in (REPO / "README.md").read_text().splitlines() if ln.startswith("| `")]
    for words in _commands():
        if len(words) == 1:
            continue
        parent, name = " ".join(words[:-1]), words[-1]
        pattern = re.compile(rf"`{re.escape(parent)} ([\w\-|\\ ]*\b)?{re.escape(name)}\b")
        assert any(pattern.search(r) for r in rows), f"{' '.join(words)} not in the table"


def test_the_reference_pages_cover_the_code() -> None:
    cli = _cli()
    for words in _commands():
        assert f"`{' '.join(words)}`" in cli, words
    from hermes.gateway.config import _SECTIONS, EngineConfig

    conf = config_reference()
    for section, model in _SECTIONS.items():
        assert f"## `[{section}]`" in conf
        for key in model.model_fields:
            assert f"| `{key}` |" in conf, f"{section}.{key}"
    for key in EngineConfig.model_fields:
        assert f"| `{key}` |" in conf
    assert "| `n_walks` | `1000` | `HERMES_SCHEDULER__N_WALKS`, `HERMES_N_WALKS` |" in conf


@pytest.mark.slow  # ~15 s; .ci/run also builds the site itself
@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs not installed (pip install -e '.[docs]')")
def test_the_site_builds_strict(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d",
                        str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True,
                       timeout=300, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin",
                                         "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for page in ("reference/cli/index.html", "reference/config/index.html",
                 "getting-started/index.html", "results/simulator/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    assert "hermes bench soak" in (tmp_path / "site" / "reference/cli/index.html").read_text()
