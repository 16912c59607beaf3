"""docs/collectives.md's recipe for a program of one's own, as written: import the
library with `mkemu:` from any folder, and check it with the importable model of its
reduction order (helper-72)."""

import re
from pathlib import Path

import mkemu

DOC = (Path(__file__).parents[2] / "docs" / "collectives.md").read_text()

PROGRAM = """
import "mkemu:lib/collectives.mk";
reference "ar_ref.py:reference";
kernel ar(x: hbm f32[2, 32, 128], out: hbm f32[2, 32, 128]) {
    vmem buf: f32[32, 128];
    sem s;
    start copy(x[core_id()], buf, s);
    wait copy(x[core_id()], buf, s);
    all_reduce(buf, 32, 128, 8, 1, 32 / 8);
    start copy(buf, out[core_id()], s);
    wait copy(buf, out[core_id()], s);
}
"""


def test_the_documented_reference_checks_a_users_all_reduce_bit_for_bit(tmp_path):
    assert 'import "mkemu:lib/collectives.mk";' in DOC
    (tmp_path / "ar_ref.py").write_text(re.search(r"```python\n(.*?)```", DOC, re.S).group(1))
    kernel = mkemu.compile_source(PROGRAM, tmp_path / "ar.mk", hw="test", mesh="2x2x1")
    run = kernel()                        # seeded random inputs: the sums' order shows in their bits
    assert run.check() is None and run.report.bit_exact
