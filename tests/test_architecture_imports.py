"""docs/architecture.md's dependency rule, checked on the sources: `isa` imports
nothing of `dsl` or `emulator`, and `dsl` and `emulator` never import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
FORBIDDEN = {"isa": ("mkemu.dsl", "mkemu.emulator"), "dsl": ("mkemu.emulator",), "emulator": ("mkemu.dsl",)}


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_none_it_must_not(package):
    found = [(str(path.relative_to(ROOT)), name) for path in sorted((ROOT / package).glob("*.py"))
             for name in imported(path) if name.startswith(FORBIDDEN[package])]
    assert not found
