"""Packaging hygiene (issue 15, items 13-14): every declared dependency is used by the code
that declares it, optional parts come with an extra and name it when it is missing, the
license is declared the SPDX way, and every ``hermes serve`` option says what it does."""

from __future__ import annotations

import argparse
import ast
import re
import sys
import tomllib

import pytest

from hermes.extras import EXTRAS, MissingExtraError, require
from tests.ops.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
#: distribution -> import name, where they differ
IMPORT_NAME = {"pyzmq": "zmq", "prometheus-client": "prometheus_client", "pyyaml": "yaml"}


def _dist(req: str) -> str:
    return re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower()


def _imports(*, top_level_only: bool = False) -> set[str]:
    """Top-level module names the package code imports (at module level only, if asked)."""
    names: set[str] = set()
    for pkg in ("hermes", "hermeslet"):
        for path in (REPO / pkg).rglob("*.py"):
            tree = ast.parse(path.read_text())
            nodes = tree.body if top_level_only else ast.walk(tree)
            for node in nodes:
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names.add(node.module.split(".")[0])
    return names


def test_every_core_dependency_is_imported_by_the_package() -> None:
    used = _imports()
    for req in PROJECT["dependencies"]:
        dist = _dist(req)
        assert IMPORT_NAME.get(dist, dist.replace("-", "_")) in used, f"{dist} is not used"
    declared = {_dist(r) for r in PROJECT["dependencies"]}
    # scipy is core since hermes load --identity scores with it (and is imported: above)
    assert not declared & {"matplotlib", "docker", "openai", "peft"}


def test_optional_parts_are_extras_that_name_themselves() -> None:
    extras = PROJECT["optional-dependencies"]
    for extra, (dist, module, _) in EXTRAS.items():
        assert [_dist(r) for r in extras[extra]] == [dist]
        # never imported at a module's top level: the core install imports every module
        assert module not in _imports(top_level_only=True), module
    code = "\n".join(p.read_text() for pkg in ("hermes", "hermeslet")
                     for p in (REPO / pkg).rglob("*.py"))
    for extra in EXTRAS:
        assert f'require("{extra}")' in code, extra
    # dev (CI's `pip install -e .[dev]`) and all pull every optional part
    for group in ("dev", "all"):
        (self_ref,) = [r for r in extras[group] if r.startswith("hermes-gateway[")]
        assert set(EXTRAS) <= set(self_ref[len("hermes-gateway["):-1].split(",")), group
    assert not {"vllm", "lora"} & set(extras)  # vLLM lives in its own venv (.ci/vllm-cpu.sh)


def test_a_missing_extra_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                            capsys: pytest.CaptureFixture) -> None:  # noqa: ANN001
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r"pip install 'hermes-gateway\[plot\]'"):
        require("plot")
    from hermes.cli import main

    rc = main(["bench", "sched", "--apps", "5", "--window", "1", "--policies", "vllm",
               "--workers", "1", "--no-progress", "--plot", str(tmp_path / "cdf.png")])
    err = capsys.readouterr().err
    assert rc != 0 and "hermes-gateway[plot]" in err and "Traceback" not in err
    monkeypatch.setitem(sys.modules, "openai", None)
    from hermes.cli.load import LoadDriver

    with pytest.raises(MissingExtraError, match=r"hermes-gateway\[load\]"):
        LoadDriver("http://127.0.0.1:1")


def test_license_is_declared_with_spdx_and_shipped() -> None:
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    (setuptools,) = [r for r in PYPROJECT["build-system"]["requires"] if _dist(r) == "setuptools"]
    assert int(re.search(r">=\s*(\d+)", setuptools).group(1)) >= 77  # SPDX license strings
    assert PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"] == ["hermes*", "hermeslet*"]
    assert not (REPO / "workloads").exists()


def test_every_serve_option_has_help_and_policy_lists_the_policies() -> None:
    from hermes.cli import build_parser
    from hermes.core.policies import policy_names

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    serve = sub.choices["serve"]
    for action in serve._actions:
        assert action.help, f"hermes serve {action.option_strings} has no help"
    (policy,) = [a for a in serve._actions if "--policy" in a.option_strings]
    for name in policy_names():
        assert name in policy.help
