"""Two holes that used to let a program run on the wrong data or the wrong semaphore:

- A launch passes only a view's address, so a launch argument must be a contiguous part
  of its host array (point indices, then at most one slice, then whole dimensions). A
  view that is not (a column slice `t[:, 128:256]`) used to be passed silently, the
  kernel reading the dense rows that start at its first element; it is now a compile
  error at the argument (docs/language.md, Host).
- A semaphore array's index known only at run time used to be unchecked: `ws[i]` with
  i = 2 was the semaphore declared after `ws`, i = -1 the one before. It is now checked
  free of cycles by the `addi` that adds the array's first semaphore, in every statement
  that takes a semaphore, as an `out-of-range` fault (docs/language.md, docs/safety.md).
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import mkemu
from mkemu.errors import EmulatorFault, SourceError

# -- launch views ------------------------------------------------------------------

# The reproducer of docs/language.md (through VMEM), and the same copy HBM to HBM for
# views of any rank.
REPRO = """\
kernel k(a: hbm f32[8, 128], y: hbm f32[8, 128]) { vmem v: f32[8, 128]; sem s;
    start copy(a, v, s); wait copy(a, v, s); start copy(v, y, s); wait copy(v, y, s); }
host { input t: f32[8, 256]; output y: f32[8, 128]; launch k(t[:, 128:256], y); }
"""
COPY = """\
kernel k(a: hbm f32[{shape}], y: hbm f32[{shape}]) {{ sem s;
    start copy(a, y, s); wait copy(a, y, s); }}
host {{ input t: f32[{array}]; output y: f32[{shape}]; launch k({view}, y); }}
"""


def launch_source(array: tuple[int, ...], view: str, shape: tuple[int, ...]) -> str:
    return COPY.format(array=", ".join(map(str, array)), view=view, shape=", ".join(map(str, shape)))


def compile_error(source: str) -> str:
    with pytest.raises(SourceError) as info:
        mkemu.compile_source(source, "prog.mk", hw="test", mesh="1")
    return info.value.render()


def test_the_docs_column_slice_is_an_error_at_the_argument():
    # The reproducer of docs/language.md: it used to run, y taking t's first 1,024 floats
    # after t[0, 128] (rows 0..7 of a dense f32[8, 128] from there), not the columns.
    text = compile_error(REPRO)
    line = "  host { input t: f32[8, 256]; output y: f32[8, 128]; launch k(t[:, 128:256], y); }"
    assert text == (
        "prog.mk:3:62: error: argument 'a' is not a contiguous part of 't': t[0:8, 128:256] (of "
        "f32[8, 256]) takes 128 of the 256 elements of dimension 1 at each of 8 indices of dimension 0, "
        "so its elements are not adjacent. A launch passes only a view's address (the kernel would read "
        "dense f32[8, 128] from its first element), so a launch view is point indices, then at most one "
        "slice, then whole dimensions (`w[l]`, `w[l, 0:4, :]`, `y[4:8, :]`): pass the whole array and "
        "index it in the kernel\n" + line + "\n" + " " * 63 + "^" * len("t[:, 128:256]")), text


# (array shape, view, the view's shape, the dimensions the message names: partial, outer)
NON_CONTIGUOUS = {
    "a column slice": ((8, 256), "t[:, 128:256]", (8, 128), (1, 0, 128, 256, 8)),
    "rows and columns": ((8, 256), "t[2:6, 0:128]", (4, 128), (1, 0, 128, 256, 4)),
    "a column": ((8, 128), "t[:, 3]", (8,), (1, 0, 1, 128, 8)),
    "a middle point": ((3, 8, 128), "t[:, 1, :]", (3, 128), (1, 0, 1, 8, 3)),
    "a slice inside a slice": ((3, 8, 128), "t[0:2, 0:4, :]", (2, 4, 128), (1, 0, 4, 8, 2)),
    "whole rows of a slice, then a partial row": ((4, 8, 256), "t[1, 2:6, 0:128]", (4, 128), (2, 1, 128, 256, 4)),
    "a slice, a whole dimension, a partial one": ((2, 4, 256), "t[:, :, 0:128]", (2, 4, 128), (2, 0, 128, 256, 2)),
}


@pytest.mark.parametrize("case", sorted(NON_CONTIGUOUS))
def test_a_non_contiguous_launch_view_is_an_error_naming_why(case):
    array, view, shape, (partial, outer, taken, size, count) = NON_CONTIGUOUS[case]
    text = compile_error(launch_source(array, view, shape))
    first = text.splitlines()[0]
    assert first.startswith(f"prog.mk:3:{launch_source(array, view, shape).splitlines()[2].index(view) + 1}: "
                            "error: argument 'a' is not a contiguous part of 't': "), text
    assert (f"takes {taken} of the {size} elements of dimension {partial} at each of {count} indices of "
            f"dimension {outer}, so its elements are not adjacent") in first, text
    assert "a launch view is point indices, then at most one slice, then whole dimensions" in first, text
    assert len(text.splitlines()) == 3, text               # one error, with its line and carets


def test_every_non_contiguous_argument_is_reported_together():
    source = """\
kernel k(a: hbm f32[8, 128], b: hbm f32[8, 128]) { vmem v: f32[8, 128]; sem s;
    start copy(a, v, s); wait copy(a, v, s); start copy(v, b, s); wait copy(v, b, s); }
host { input t: f32[8, 256]; output y: f32[8, 384];
    launch k(t[:, 0:128], y[:, 128:256]); }
"""
    text = compile_error(source)
    assert "prog.mk:4:14: error: argument 'a' is not a contiguous part of 't'" in text, text
    assert "prog.mk:4:27: error: argument 'b' is not a contiguous part of 'y'" in text, text


# (array shape, view, the numpy index of the same elements, the view's shape)
CONTIGUOUS = {
    "the whole array": ((8, 128), "t", np.s_[:, :], (8, 128)),
    "a point index": ((3, 8, 128), "t[1]", np.s_[1], (8, 128)),
    "a point, a row slice, a whole dimension": ((3, 8, 128), "t[2, 4:8, :]", np.s_[2, 4:8, :], (4, 128)),
    "a row slice": ((8, 128), "t[4:8, :]", np.s_[4:8, :], (4, 128)),
    "a row slice with the rest missing": ((8, 128), "t[2:6]", np.s_[2:6], (4, 128)),
    "a point, then a column slice": ((8, 256), "t[3, 128:256]", np.s_[3, 128:256], (128,)),
    "a slice of length 1, then a column slice": ((8, 256), "t[3:4, 128:256]", np.s_[3:4, 128:256], (1, 128)),
    "two points, then a slice": ((2, 4, 256), "t[1, 2, 128:256]", np.s_[1, 2, 128:256], (128,)),
    "a whole dimension written as a slice": ((8, 128), "t[2:4, 0:128]", np.s_[2:4, 0:128], (2, 128)),
    "a point on a dimension of size 1 after a slice": ((4, 1, 128), "t[1:3, 0, :]", np.s_[1:3, 0, :], (2, 128)),
}


@pytest.mark.parametrize("case", sorted(CONTIGUOUS))
def test_a_contiguous_launch_view_passes_its_own_elements(case):
    array, view, index, shape = CONTIGUOUS[case]
    kernel = mkemu.compile_source(launch_source(array, view, shape), "prog.mk", hw="test", mesh="1")
    t = np.arange(np.prod(array), dtype=np.float32).reshape(array)
    y = kernel(t=t).outputs["y@0"]
    np.testing.assert_array_equal(np.asarray(y).reshape(shape), t[index].reshape(shape))


def test_host_loops_and_lets_take_contiguous_views_and_are_checked_too():
    ok = """\
kernel k(a: hbm f32[8, 128], y: hbm f32[8, 128]) { vmem v: f32[8, 128]; sem s;
    start copy(a, v, s); wait copy(a, v, s); start copy(v, y, s); wait copy(v, y, s); }
host { input t: f32[4, 8, 128]; output y: f32[4, 8, 128];
    for l in 0..4 { let w = t[l]; launch k(w, y[3 - l]); } }
"""
    t = np.arange(4 * 8 * 128, dtype=np.float32).reshape(4, 8, 128)
    y = mkemu.compile_source(ok, "prog.mk", hw="test", mesh="1")(t=t).outputs["y@0"]
    np.testing.assert_array_equal(np.asarray(y).reshape(4, 8, 128), t[::-1])
    bad = ok.replace("f32[4, 8, 128]; output", "f32[8, 4, 128]; output").replace("t[l]", "t[:, l, :]")
    text = compile_error(bad)
    # Reported once, at the argument, with the first trip's indices (not once per trip).
    assert text.startswith("prog.mk:4:50: error: argument 'a' is not a contiguous part of 't': "
                           "t[0:8, 0, 0:128] (of f32[8, 4, 128]) takes 1 of the 4 elements of dimension 1 "
                           "at each of 8 indices of dimension 0"), text
    assert len(text.splitlines()) == 3, text


# -- semaphore array indices ---------------------------------------------------------

# `i` (q[0]) indexes the semaphore array in the one statement under test (BODY's first
# line that uses it); `g` (q[1]) is a good index everywhere else. `before` and `after`
# lie either side of `ws` (and `rs`), so a bad index used to name one of them.
SEMS = """\
kernel k(q: hbm i32[8], x: hbm f32[8, 128], y: hbm f32[8, 128]) {{
    smem qs: i32[8];
    vmem a: f32[8, 128];
    vmem b: f32[8, 128];
    sem before;
    sem ws[2];
    sem rs[2];
    sem after;
    start copy(q, qs, after); wait copy(q, qs, after);
    let i = qs[0]; let g = qs[1];
    let me = global_core(chip_id(), core_id());
{body}
    start copy(a, y, after); wait copy(a, y, after);
    signal(before, 1); wait(before, 1);
}}
host {{ input q: i32[8]; input x: f32[8, 128]; output y: f32[8, 128]; launch k(q, x, y); }}
"""
BODY_LINE = SEMS.splitlines().index("{body}") + 1
REMOTE = "copy(x, b @ me, ws[{s}], rs[{r}])"

# name -> (the statements, the line among them that uses i, the array it indexes)
FORMS = {
    "signal": (["signal(ws[i], 1);", "wait(ws[g], 1);", "start copy(x, a, after); wait copy(x, a, after);"],
               0, "ws"),
    "wait": (["signal(ws[g], 3);", "wait(ws[i], 3);", "start copy(x, a, after); wait copy(x, a, after);"],
             1, "ws"),
    "wait with bytes()": (["start copy(x, a, ws[g]);", "wait(ws[i], bytes(a));"], 1, "ws"),
    "start copy": (["start copy(x, a, ws[i]);", "wait copy(x, a, ws[g]);"], 0, "ws"),
    "wait copy": (["start copy(x, a, ws[g]);", "wait copy(x, a, ws[i]);"], 1, "ws"),
    "a bound copy": (["let h = copy(x, a, ws[i]);", "start h;", "wait copy(x, a, ws[g]);"], 1, "ws"),
    "a counted wait": (["start copy(x[0:4, :], a[0:4, :], ws[g]);", "start copy(x[4:8, :], a[4:8, :], ws[g]);",
                        "wait 2 * copy(x[0:4, :], a[0:4, :], ws[i]);"], 2, "ws"),
    "a remote signal": (["signal(ws[i] @ me, 1);", "wait(ws[g], 1);",
                         "start copy(x, a, after); wait copy(x, a, after);"], 0, "ws"),
    "a remote copy's send semaphore": ([f"start {REMOTE.format(s='i', r='g')};",
                                        f"wait {REMOTE.format(s='g', r='g')};",
                                        f"wait recv {REMOTE.format(s='g', r='g')};",
                                        "start copy(x, a, after); wait copy(x, a, after);"], 0, "ws"),
    "a remote copy's receive semaphore": ([f"start {REMOTE.format(s='g', r='i')};",
                                           f"wait {REMOTE.format(s='g', r='g')};",
                                           f"wait recv {REMOTE.format(s='g', r='g')};",
                                           "start copy(x, a, after); wait copy(x, a, after);"], 0, "rs"),
    "wait recv": ([f"start {REMOTE.format(s='g', r='g')};", f"wait {REMOTE.format(s='g', r='g')};",
                   f"wait recv {REMOTE.format(s='g', r='i')};", "start copy(x, a, after); wait copy(x, a, after);"], 2, "rs"),
    "a counted wait recv": ([f"start {REMOTE.format(s='g', r='g')};", f"wait {REMOTE.format(s='g', r='g')};",
                             f"wait recv 1 * {REMOTE.format(s='g', r='i')};", "start copy(x, a, after); wait copy(x, a, after);"], 2, "rs"),
}


def sems_kernel(form: str, **options):
    lines, _, _ = FORMS[form]
    source = SEMS.format(body="\n".join("    " + s for s in lines))
    return mkemu.compile_source(source, "sems.mk", hw="test", mesh="1", **options)


def run(kernel, i: int, g: int):
    x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    return kernel(q=np.array([i, g] + [0] * 6, np.int32), x=x)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_run_time_semaphore_index_outside_its_array_faults(form):
    kernel = sems_kernel(form)
    _, at, array = FORMS[form]
    for i in (0, 1):
        out = run(kernel, i, i)
        np.testing.assert_array_equal(np.asarray(out.outputs["y@0"]).reshape(8, 128),
                                      np.arange(8 * 128, dtype=np.float32).reshape(8, 128))
    for i in (2, -1, 7, 1 << 30):
        with pytest.raises(EmulatorFault) as info:
            run(kernel, i, 1)
        text = info.value.render()
        assert info.value.kind == "out-of-range", text
        assert f"index {i} of semaphore array '{array}' (sem[2]) is outside 0..1" in text, text
        assert f"sems.mk:{BODY_LINE + at}:" in text, text      # the statement that took it
        assert "instruction: addi " in text, text


def test_the_check_is_free_and_without_it_a_bad_index_names_the_next_semaphore():
    # The check rides on the `addi` that adds the array's first semaphore: with the checks
    # taken out the code and the cycles are the same, and i = 2 is `rs[0]`, i = -1
    # `before` (what happened before the check): the run ends clean, on the wrong one.
    kernel = sems_kernel("signal")
    checks = [c for k in kernel.program.kernels.values() for c in k.ranges.values() if "semaphore" in c.what]
    assert [(c.lo, c.hi, c.kind) for c in checks] == [(0, 2, "out-of-range")] * 2, checks   # ws[i], ws[g]
    checked = run(kernel, 1, 1).report.figures
    kernel.program = attrs.evolve(kernel.program, kernels={
        name: attrs.evolve(k, ranges={}) for name, k in kernel.program.kernels.items()})
    unchecked = run(kernel, 1, 1).report.figures
    for key in ("cycles", "instructions"):
        assert checked[key] == unchecked[key], key
    # ws[2] is rs[0] and ws[-1] is `before`: a signal and a wait on them balance.
    source = SEMS.format(body="    signal(ws[i], 1);\n    wait(ws[i], 1);")
    kernel = mkemu.compile_source(source, "sems.mk", hw="test", mesh="1")
    kernel.program = attrs.evolve(kernel.program, kernels={
        name: attrs.evolve(k, ranges={}) for name, k in kernel.program.kernels.items()})
    for i in (2, -1):
        run(kernel, i, 1)


def test_the_semaphore_check_adds_no_instruction():
    # The same kernel with a constant index has the `addi` replaced by the `li` of the
    # semaphore number: one instruction either way, and only the run-time one is checked.
    run_time = sems_kernel("signal")
    constant = mkemu.compile_source(
        SEMS.format(body="\n".join("    " + s for s in FORMS["signal"][0]).replace("ws[i]", "ws[1]")
                    .replace("ws[g]", "ws[1]")),
        "sems.mk", hw="test", mesh="1")
    (k1,), (k2,) = run_time.program.kernels.values(), constant.program.kernels.values()
    assert len(k1.code) == len(k2.code)
    assert not any("semaphore" in c.what for c in k2.ranges.values())


def test_a_loop_affine_semaphore_index_keeps_its_compile_time_check_and_never_faults():
    source = SEMS.format(body="    for j in 0..2 { signal(ws[j], 1); wait(ws[j], 1); }\n"
                              "    start copy(x, a, after); wait copy(x, a, after);")
    run(mkemu.compile_source(source, "sems.mk", hw="test", mesh="1"), 0, 0)
    text = compile_error(SEMS.format(body="    for j in 0..3 { signal(ws[j], 1); wait(ws[j], 1); }"))
    assert "index ranging over 0..2 is out of range for semaphore array 'ws' (size 2)" in text, text


def test_a_timing_only_run_checks_semaphore_indices_too():
    kernel = sems_kernel("wait copy", timing_only=True)
    run(kernel, 1, 1)
    with pytest.raises(EmulatorFault, match=r"index 2 of semaphore array 'ws' \(sem\[2\]\) is outside 0\.\.1"):
        run(kernel, 2, 1)


def test_pipeline_semaphore_arrays_are_checked_and_run_clean():
    # A pipeline's own semaphore array (`<stream>.sem`) is indexed by t % depth: checked
    # like any other, and always inside it.
    source = """\
kernel k(x: hbm f32[32, 128], y: hbm f32[32, 128]) {
    pipeline t in 0..4 depth 2 {
        input xt = x[t * 8 +: 8, :];
        output yt = y[t * 8 +: 8, :];
        yt = xt * 2.0;
    }
}
host { input x: f32[32, 128]; output y: f32[32, 128]; launch k(x, y); }
"""
    kernel = mkemu.compile_source(source, "pipe.mk", hw="test", mesh="1")
    whats = [c.what for k in kernel.program.kernels.values() for c in k.ranges.values()]
    assert any("of semaphore array 'xt.sem' (sem[2])" in w for w in whats), whats
    x = np.arange(32 * 128, dtype=np.float32).reshape(32, 128)
    np.testing.assert_array_equal(np.asarray(kernel(x=x).outputs["y@0"]).reshape(32, 128), 2 * x)
