from pathlib import Path

from mkemu.isa.doc import render


def test_isa_doc_is_current():
    doc = Path(__file__).parents[2] / "docs" / "isa.md"
    assert doc.read_text() == render() + "\n", "regenerate: python -m mkemu.isa.doc > docs/isa.md"
