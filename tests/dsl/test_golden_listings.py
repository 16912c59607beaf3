"""`mkemu asm` listings of the examples and of the language constructs' programs
(tests/dsl/data), compared with the files in golden/.

After a deliberate change to the compiler, regenerate them with
`pytest tests/dsl/test_golden_listings.py --update-golden` and review the diff.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from mkemu.cli import main

EXAMPLES = Path(__file__).parents[2] / "programs" / "examples"
CONSTRUCTS = Path(__file__).with_name("data")
GOLDEN = Path(__file__).with_name("golden")
# One program per language construct: booleans and select (flags), counted waits, structs,
# generics, pipelines, MXFP4 weights.
LISTINGS = [(EXAMPLES, "vector_add"), (EXAMPLES, "rmsnorm")] + [
    (CONSTRUCTS, name) for name in ("flags", "counted_wait", "structs", "generics", "pipeline", "mxfp4")]


@pytest.mark.parametrize("folder,name", LISTINGS, ids=[name for _, name in LISTINGS])
def test_listing_matches_golden(capsys, monkeypatch, request, folder, name):
    monkeypatch.chdir(folder)  # source lines in the listing then name the file as `NAME.mk`
    assert main(["asm", f"{name}.mk"]) == 0
    listing = capsys.readouterr().out
    golden = GOLDEN / f"{name}.lst"
    if request.config.getoption("update_golden"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(listing)
        return
    assert golden.is_file(), f"{golden} is missing: run pytest with --update-golden"
    expected = golden.read_text()
    if listing != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), listing.splitlines(True),
                                            f"golden/{name}.lst", "mkemu asm", n=2))
        pytest.fail(f"the listing of {name}.mk changed (--update-golden to accept):\n{diff[:6000]}")
