"""`import "mkemu:lib/..."` reaches the shipped library from a program in any folder
(helper-72: a program outside the checkout had no way to import collectives.mk but
its absolute path)."""

import numpy as np
import pytest

import mkemu

PROGRAM = """
import "mkemu:lib/collectives.mk";
kernel ar(x: hbm f32[2, 8, 128], out: hbm f32[2, 8, 128]) {
    vmem buf: f32[8, 128];
    sem s;
    start copy(x[core_id()], buf, s);
    wait copy(x[core_id()], buf, s);
    all_reduce(buf, 8, 128, 8, 1, 1);
    start copy(buf, out[core_id()], s);
    wait copy(buf, out[core_id()], s);
}
"""


def test_a_program_in_any_folder_imports_the_shipped_collectives(tmp_path):
    kernel = mkemu.compile_source(PROGRAM, tmp_path / "ar.mk", hw="test", mesh="2x1x1")
    x = {f"x@{chip}": np.stack([np.full((8, 128), 1 + chip + 2 * core, np.float32) for core in range(2)])
         for chip in range(2)}
    run = kernel(x)
    # Participants bring 1, 3 (chip 0) and 2, 4 (chip 1): small integers sum exactly in any order.
    for chip in range(2):
        np.testing.assert_array_equal(run.outputs[f"out@{chip}"], np.full((2, 8, 128), 10, np.float32))


def test_a_missing_shipped_file_names_where_it_looked(tmp_path):
    with pytest.raises(mkemu.MkemuError) as info:
        mkemu.compile_source('import "mkemu:lib/nope.mk";\n', tmp_path / "p.mk", hw="test")
    text = str(info.value)
    assert "p.mk:1:1: error: cannot find imported file 'mkemu:lib/nope.mk'" in text
    assert "lib/nope.mk)" in text and str(tmp_path) not in text.split("looked for")[1]


@pytest.mark.parametrize("path", ["mkemu:/etc/hostname", "mkemu:../../x.mk", "mkemu:lib/../../x.mk"])
def test_a_shipped_import_stays_among_the_shipped_programs(tmp_path, path):
    # (an absolute path after the prefix replaced the shipped folder; '..' climbed out of it)
    with pytest.raises(mkemu.MkemuError) as info:
        mkemu.compile_source(f'import "{path}";\n', tmp_path / "p.mk", hw="test")
    assert "p.mk:1:1: error: 'mkemu:' names a file of the shipped programs, relative to them" in str(info.value)
    assert f"'{path}' is outside them" in str(info.value)
