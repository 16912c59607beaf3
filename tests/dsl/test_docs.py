"""Every complete program in docs/language.md (a block opening with `// file:`) checks."""

import re
from pathlib import Path

import pytest

from mkemu.dsl.frontend import load_program
from mkemu.errors import SourceError

DOC = Path(__file__).parents[2] / "docs" / "language.md"
BLOCKS = re.findall(r"```mk\n// file: (\S+)\n(.*?)```", DOC.read_text(), re.S)


def write_all(root: Path) -> None:
    for name, body in BLOCKS:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(body)
    (root / "vector_add_ref.py").write_text("def reference(inputs):\n    return {}\n")


def test_the_doc_has_the_tutorial_programs():
    names = [name for name, _ in BLOCKS]
    assert "vector_add.mk" in names and "matmul_double_buffered.mk" in names


@pytest.mark.parametrize("name", [name for name, _ in BLOCKS])
def test_doc_program_checks(tmp_path, name):
    write_all(tmp_path)
    load_program(tmp_path / name)


def test_doc_claim_about_loop_bounds(tmp_path):
    write_all(tmp_path)
    path = tmp_path / "vector_add_tiled.mk"
    path.write_text(path.read_text().replace("0..N / TN {", "0..N / TN + 1 {"))
    with pytest.raises(SourceError, match=r"slice reaching 0\.\.4608 is out of range"):
        load_program(path)
