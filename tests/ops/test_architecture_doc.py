"""docs/architecture.md names modules that exist, and its layers are the ones the import
contracts check (.importlinter.gateway), so that the map stays true as the code moves."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

from tests.ops.conftest import REPO

DOC = (REPO / "docs" / "architecture.md").read_text()
GATEWAY = REPO / "hermes" / "gateway"


def _exists(path: Path) -> bool:
    return path.is_file() or (path.is_dir() and (path / "__init__.py").is_file())


def _layers_block() -> list[str]:
    """The layers of the doc's "Checked" section (the last fenced block)."""
    blocks = re.findall(r"```\n(.*?)```", DOC, flags=re.S)
    return [line.strip() for line in blocks[-1].splitlines() if line.strip()]


def test_every_path_the_doc_names_exists() -> None:
    paths = set(re.findall(r"\b((?:hermes|hermeslet|tests|docs)/[\w/.-]*\w/?)", DOC))
    assert len(paths) > 20, paths
    missing = sorted(p for p in paths if not _exists(REPO / p.rstrip("/")))
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_gateway_module_in_the_diagrams_exists() -> None:
    """Short names in the diagrams (``runs.py``, ``api/binding.py``) are gateway modules."""
    short = {m for m in re.findall(r"(?<![\w/])((?:api/)?[a-z_]+\.py)\b", DOC)}
    assert {"runs.py", "dispatch.py", "api/binding.py"} <= short
    missing = sorted(m for m in short if not (GATEWAY / m).is_file()
                     and not (REPO / "hermes" / m).is_file())
    assert not missing, f"docs/architecture.md names gateway modules that do not exist: {missing}"


def test_dotted_modules_and_layers_exist() -> None:
    dotted = set(re.findall(r"`(hermes(?:\.[a-z_]+)+)`", DOC))
    assert {"hermes.core", "hermes.gateway"} <= dotted
    for name in dotted:
        assert _exists(REPO / Path(*name.split("."))) or _exists(
            (REPO / Path(*name.split("."))).with_suffix(".py")), name
    for layer in _layers_block():
        for part in (p.strip() for p in layer.split("|")):
            if part.startswith("(") and part.endswith(")"):
                continue  # optional: may not exist yet
            assert _exists(GATEWAY / part) or _exists(GATEWAY / f"{part}.py"), part


def test_the_doc_shows_the_layers_the_contract_checks() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / ".importlinter.gateway")
    contract = cfg["importlinter:contract:gateway-layers"]
    assert contract["containers"].split() == ["hermes.gateway"]
    layers = [line.strip() for line in contract["layers"].splitlines() if line.strip()]
    assert layers == _layers_block()
