"""Every instruction is implemented, and the compiled loop is built from the table."""

from __future__ import annotations

from mkemu.cache import cache_dir
from mkemu.emulator.decode import LOCAL_ROWS
from mkemu.emulator.loop import compiled_loop, generate_source
from mkemu.emulator.machine import GLOBAL_OPS
from mkemu.isa.table import GLOBAL_KINDS, TABLE


def test_every_row_is_implemented_once():
    source = generate_source()
    for mnemonic, instr in TABLE.items():
        if instr.is_global:
            assert instr.global_kind in GLOBAL_OPS, mnemonic
        else:
            assert source.count(f"# {mnemonic}\n") == 1, mnemonic
    assert set(GLOBAL_OPS) == set(GLOBAL_KINDS)
    assert {i.mnemonic for i in LOCAL_ROWS} == {m for m, i in TABLE.items() if not i.is_global}


def test_the_loop_is_compiled_outside_the_source_tree():
    compiled_loop()
    cached = list(cache_dir().glob("mkemu_loop_*.py"))
    assert cached and all("/emulator/" not in str(p) for p in cached)
    assert any(p.read_text() == generate_source() for p in cached)

