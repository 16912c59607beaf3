"""A run-time fault in an inlined fn names the line in the fn (its `source`) and the call
it was inlined at (its `context`), as the compiler's own errors in inlined code do; a
fault in code written in the kernel itself has no context. A deadlock's line per
waiting core names both too."""

from __future__ import annotations

import numpy as np
import pytest

import mkemu
from mkemu.errors import EmulatorFault

# BUG 1: a race inside fn `scale`, called twice (lines 19 and 20): only the second call's
# copy reads a buffer still being written. BUG 2: the same kernel's own statement races.
# BUG 3: a deadlock on a wait inside nested fns (`outer` calls `inner`).
PROGRAM = """\
param BUG = 0;
fn scale(src: vmem f32[8, 128], dst: vmem f32[8, 128], racy: bool) {
    if racy && BUG == 1 {
        dst = src * 2.0;
    }
}
fn inner(s: sem) {
    wait(s, 2);
}
fn outer(s: sem) {
    inner(s);
}
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem a: f32[8, 128];
    vmem b: f32[8, 128];
    sem xs;
    sem never;
    start copy(x, a, xs);
    scale(b, b, false);
    scale(a, b, true);
    if BUG == 2 {
        b = a + 1.0;
    }
    if BUG == 3 {
        signal(never, 1);
        outer(never);
    }
    wait copy(x, a, xs);
    b = a;
    start copy(b, y, xs);
    wait copy(b, y, xs);
}
host {
    input x: f32[8, 128];
    output y: f32[8, 128];
    launch k(x, y);
}
"""


def run(tmp_path, bug: int):
    path = tmp_path / "calls.mk"
    path.write_text(PROGRAM)
    kernel = mkemu.compile(str(path), hw="test", mesh="1x1x1", params={"BUG": bug})
    return kernel(x=np.ones((8, 128), np.float32))


def test_a_fault_in_an_inlined_fn_names_the_call_it_was_inlined_at(tmp_path):
    with pytest.raises(EmulatorFault) as info:
        run(tmp_path, 1)
    fault = info.value
    assert fault.kind == "race"
    assert fault.source.startswith(f"{tmp_path / 'calls.mk'}:4:") and "dst = src * 2.0" in fault.source
    assert fault.context == f"in fn 'scale' inlined at {tmp_path / 'calls.mk'}:20:5"
    lines = fault.render().splitlines()
    assert lines[lines.index(f"  source: {fault.source}") + 1] == f"  {fault.context}"


def test_a_fault_in_the_kernels_own_code_has_no_context(tmp_path):
    with pytest.raises(EmulatorFault) as info:
        run(tmp_path, 2)
    fault = info.value
    assert fault.kind == "race" and fault.source.endswith(":13: b = a + 1.0;")
    assert fault.context is None
    assert "inlined at" not in fault.render()


def test_a_deadlock_in_nested_fns_names_every_call_innermost_first(tmp_path):
    with pytest.raises(EmulatorFault) as info:
        run(tmp_path, 3)
    fault = info.value
    assert fault.kind == "deadlock" and ":8:" in fault.source
    # (the call of `inner` in the body of `outer`, then the call of `outer` in the kernel)
    assert fault.context == (f"in fn 'inner' inlined at {tmp_path / 'calls.mk'}:11:5, "
                             f"in fn 'outer' inlined at {tmp_path / 'calls.mk'}:26:9")
    # Each waiting core's line names the calls too (the fn's line alone is a library's
    # line when the wait is in one, the same for every call of it).
    assert fault.details[0].endswith(f"[{fault.source} ({fault.context})]"), fault.details[0]


def test_clean_runs_and_listings_are_unchanged_by_the_contexts(tmp_path):
    assert run(tmp_path, 0).output("y").tolist() == np.ones((8, 128)).tolist()
