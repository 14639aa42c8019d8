"""MkDocs hook: the reference pages generated from the code (hermes.cli.docgen) join the
build, so the command-line and configuration references always match the code."""

from __future__ import annotations

from typing import Any


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    from hermes.cli.docgen import PAGES

    for rel, make in PAGES.items():
        files.append(File.generated(config, rel, content=make()))
    return files
