"""docs/api.md audited call by call (what tests/test_api.py and
tests/test_docs_cli_api.py do not already hold): the opening example's output, the
options table's defaults, what a `Kernel`, a `Run`, a `Report` and a `Session` hold,
generated and partial inputs, the reference contract and faults."""

from __future__ import annotations

import contextlib
import inspect
import io
import re
from pathlib import Path

import numpy as np
import pytest

import mkemu
from mkemu.errors import EmulatorFault, MkemuError

ROOT = Path(__file__).parents[1]
DOC = (ROOT / "docs" / "api.md").read_text()

SCALE = """
kernel scale(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    sem s;
    start copy(x, v, s);
    wait copy(x, v, s);
    v = v + v;
    start copy(v, y, s);
    wait copy(v, y, s);
}
host { input x: f32[8, 128]; output y: f32[8, 128]; launch scale(x, y); }
"""


def test_the_opening_example_prints_what_the_page_says():
    command = re.search(r'python -c "(.*?)"\n', DOC, re.S).group(1).replace("\\\n", "")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(command, {})
    assert re.fullmatch(r"None Report\(cycles=\d+, seconds=\d\.\d{3}e-\d\d, bit_exact=True\)\n", out.getvalue())


def test_signatures_and_the_options_table_defaults():
    assert str(inspect.signature(mkemu.compile)).startswith("(program: 'str', options: 'Options | None' = None, **")
    params = inspect.signature(mkemu.compile_source).parameters
    assert list(params)[:3] == ["text", "filename", "options"] and params["filename"].default == "<source>.mk"
    call = inspect.signature(mkemu.Kernel.__call__).parameters
    assert call["inputs"].kind is inspect.Parameter.POSITIONAL_ONLY and call["inputs"].default is None
    assert call["progress"].default is None and call["arrays"].kind is inspect.Parameter.VAR_KEYWORD
    o = mkemu.Options()
    assert (o.hw, o.mesh, o.seed, o.max_cycles, o.max_instructions, o.dma_order) == (
        "tpu-v7-like", None, 0, 10**12, 50_000_000, "round_robin")
    assert (o.checks, o.schedule, o.schedule_seed, o.params, o.trace, o.timing_only) == (
        frozenset({"races", "semaphores"}), "normal", 0, {}, None, False)
    assert mkemu.Options(mesh="4").mesh == (4, 1, 1) and mkemu.Options(mesh=(2, 2)).mesh == (2, 2, 1)
    for field in ("schedule", "dma_order"):
        with pytest.raises(mkemu.ConfigError, match=f"^{field}: error: {field} must be one of"):
            mkemu.Options(**{field: "nope"})
    config = mkemu.Options(schedule="shuffle", schedule_seed=3, max_instructions=7).run_config()
    assert (config.schedule, config.schedule_seed, config.max_instructions) == ("shuffle", 3, 7)
    # the profile's mesh when none is given
    assert mkemu.compile("vector_add", hw="test").chips == 2


def test_list_programs_and_what_a_kernel_holds():
    programs = {p.name: p for p in mkemu.list_programs()}
    assert {"vector_add", "k3_megakernel"} <= set(programs)
    assert programs["vector_add"].path.is_file() and programs["vector_add"].description
    kernel = mkemu.compile("vector_add", hw="test", mesh="2x1x1")
    assert (kernel.chips, kernel.cores_per_chip) == (2, 2)
    assert kernel.buffers["out"] == mkemu.BufferInfo("out", "f32", (8, 1024), "output")
    assert kernel.buffers["a"].kind == "input" and kernel.program.buffer("a").name == "a"
    assert callable(kernel.reference) and kernel.compile_s >= 0
    assert mkemu.compile_source(SCALE, hw="test", mesh="1").reference is None


def test_inputs_generated_given_in_part_and_what_the_reference_sees():
    kernel = mkemu.compile("vector_add", hw="test", mesh="2")
    run = kernel()                                   # no inputs: every input generated from the seed
    generated = kernel.generate_inputs()
    assert set(generated) == set(run.inputs) == {"a@0", "a@1", "b@0", "b@1"}
    assert all(np.array_equal(generated[key], run.inputs[key]) for key in generated)
    assert not np.array_equal(generated["a@0"], mkemu.compile("vector_add", hw="test", mesh="2", seed=1)
                              .generate_inputs()["a@0"])
    a = np.full((8, 1024), 3.0, np.float32)
    run = kernel(a=a)                                # b is not given: zeros, for the reference too
    assert set(run.inputs) == {"a@0", "a@1"}
    assert np.array_equal(run.output("out", 1), a) and run.check() is None
    assert run.report.bit_exact is True and run.report.mismatch is None


def test_a_run_and_its_report():
    kernel = mkemu.compile_source(SCALE, "/tmp/api_audit.mk", hw="test", mesh="2")
    x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    run = kernel({"x": x, "x@1": -x})
    assert set(run.outputs) == {"y@0", "y@1"} and np.array_equal(run.outputs["y@1"], -2 * x)
    assert np.array_equal(run.output("x", chip=1), -x)            # any buffer, not only outputs
    report = run.report
    assert report.bit_exact is None and report.mismatch is None and report.trace is None
    assert report.seconds == report.cycles / kernel.profile.clock_hz
    assert set(report.breakdown) == {"unit", "dependency", "semaphore", "barrier", "idle"}
    for key in ("instructions", "unit_busy_cycles", "hbm_bytes", "per_core", "region_cycles", "cycles"):
        assert key in report.figures, key
    assert repr(report) == f"Report(cycles={report.cycles}, seconds={report.seconds:.3e}, bit_exact=None)"


def test_a_keyword_wins_over_the_dict_and_f32_buffers_round_to_float32():
    kernel = mkemu.compile_source(SCALE, "/tmp/api_audit.mk", hw="test", mesh="1")
    run = kernel({"x": np.zeros((8, 128), np.float32)}, x=np.full((8, 128), 1 + 2.0**-30))
    assert run.inputs["x@0"].dtype == np.float32 and (run.inputs["x@0"] == 1).all()
    assert (run.output("y") == 2).all()
    ints = kernel(x=np.full((8, 128), 2**24 + 1, np.int64)).inputs["x@0"]
    assert (ints == 2**24).all()                                    # to nearest even


def test_check_compares_bits_any_nan_equals_any_nan_and_zeros_keep_their_sign():
    kernel = mkemu.compile_source(SCALE, "/tmp/api_audit.mk", hw="test", mesh="1")
    run = kernel(x=np.full((8, 128), np.nan, np.float32))
    other_nan = np.full((8, 128), 0xFFC00001, np.uint32).view(np.float32)
    assert run.check({"y": other_nan}) is None and run.report.bit_exact is True
    run = kernel(x=np.zeros((8, 128), np.float32))
    mismatch = run.check({"y@0": np.full((8, 128), -0.0, np.float32)})
    assert (mismatch.buffer, mismatch.chip, mismatch.index, mismatch.count) == ("y", 0, (0, 0), 1024)
    assert mismatch.render() == run.report.mismatch == (
        "FAIL: y on chip 0 differs at index [0, 0]: expected -0.0 (0x80000000), got 0.0 (0x00000000) "
        "(1024 element(s) differ)")
    assert run.report.bit_exact is False and run.report.figures["bit_exact"] is False


def test_the_reference_contract(tmp_path):
    (tmp_path / "r.py").write_text(
        "SEEN = {}\n"
        "def ref(inputs, *, chips, cores_per_chip, mesh):\n"
        "    SEEN.update(chips=chips, cores=cores_per_chip, mesh=mesh, keys=sorted(inputs))\n"
        "    return {f'y@{c}': inputs[f'x@{c}'] * 2 for c in range(chips)}\n"
        "def plain(inputs, *, chips, cores_per_chip):\n"
        "    return {'y': inputs['x@0'] * 2}\n"
        "def ragged(inputs, *, chips, cores_per_chip):\n"
        "    return {'y': [[1.0], [1.0, 2.0]]}\n")
    (tmp_path / "helper.py").write_text("X = 2\n")
    (tmp_path / "r2.py").write_text("import helper\ndef ref(inputs, *, chips, cores_per_chip):\n    return {}\n")

    def build(name, mesh="2x1x1"):
        src = f'reference "{name}";\n' + SCALE
        return mkemu.compile_source(src, str(tmp_path / "p.mk"), hw="test", mesh=mesh)

    kernel = build("r.py:ref")
    assert kernel(x=np.ones((8, 128), np.float32)).check() is None
    assert kernel.reference.__globals__["SEEN"] == {"chips": 2, "cores": 2, "mesh": (2, 1, 1), "keys": ["x@0", "x@1"]}
    assert build("r.py:plain", mesh="1")().check() is None          # no mesh parameter: none passed
    with pytest.raises(mkemu.ConfigError) as info:
        build("r.py:ragged", mesh="1")().check()
    assert str(info.value).startswith("r.py:ragged: y: error: expected output 'y' is not an array")
    with pytest.raises(mkemu.ConfigError, match="no module named 'helper'"):
        build("r2.py:ref")                     # a reference file is loaded on its own
    with pytest.raises(mkemu.ConfigError, match="has no function 'nope'"):
        build("r.py:nope")
    # A file that is not there is a ConfigError too, at the program's reference line (it
    # was the front end's SourceError, while a missing function was a ConfigError).
    with pytest.raises(mkemu.ConfigError) as info:
        build("gone.py:ref")
    assert (info.value.file, info.value.line, info.value.column) == (str(tmp_path / "p.mk"), 1, 1)
    assert info.value.render().startswith(f"{tmp_path / 'p.mk'}:1:1: error: reference file 'gone.py' not found")


def test_an_inputs_file_with_no_arrays(tmp_path):
    np.savez(tmp_path / "empty.npz")
    kernel = mkemu.compile_source(SCALE, "/tmp/api_audit.mk", hw="test", mesh="1")
    with pytest.raises(mkemu.ConfigError) as info:
        kernel(tmp_path / "empty.npz")
    assert str(info.value) == (f"{tmp_path / 'empty.npz'}: error: the file holds no arrays (give one per input "
                               "buffer, keyed name or name@chip)")


def test_a_timing_only_plain_run():
    src = """
kernel k(x: hbm i32[8, 128], z: hbm f32[8, 128], y: hbm i32[8, 128]) {
    vmem w: f32[8, 128];
    sem s;
    if core_id() == 0 {
        start copy(w, z, s); wait copy(w, z, s);
        start copy(x, y, s); wait copy(x, y, s);
    }
}
host { input x: i32[8, 128]; output z: f32[8, 128]; output y: i32[8, 128]; launch k(x, z, y); }
"""
    kernel = mkemu.compile_source(src, "/tmp/api_audit.mk", hw="test", mesh="1", timing_only=True)
    x = np.arange(1024, dtype=np.int32).reshape(8, 128)
    run = kernel(x=x)
    assert set(run.outputs) == {"y@0"} and np.array_equal(run.output("y"), x)     # i32 buffers hold data
    with pytest.raises(mkemu.ConfigError, match="holds no data in a timing-only run"):
        run.output("z")
    assert run.report.cycles == mkemu.compile_source(src, "/tmp/api_audit.mk", hw="test", mesh="1")(x=x).report.cycles
    computed = src.replace("start copy(x, y, s); wait copy(x, y, s);",
                           "start copy(x, w2, s); wait copy(x, w2, s);\n"
                           "        start copy(w2, y, s); wait copy(w2, y, s);").replace(
        "vmem w: f32[8, 128];", "vmem w: f32[8, 128];\n    vmem w2: i32[8, 128];")
    with pytest.raises(EmulatorFault) as info:
        mkemu.compile_source(computed, "/tmp/api_audit.mk", hw="test", mesh="1", timing_only=True)(x=x)
    assert info.value.kind == "readback"


def test_a_session_writes_runs_and_reads_with_hbm_kept_between_runs():
    kernel = mkemu.compile_source(SCALE, "/tmp/api_audit.mk", hw="test", mesh="2")
    session = kernel.session()
    assert session.buffers() == {"x": ("f32", (8, 128), "input"), "y": ("f32", (8, 128), "output")}
    info = session.info
    assert (info.chips, info.cores_per_chip, info.mesh, info.clock_hz) == (2, 2, (2, 1, 1), 1e9)
    assert info.hbm_bw_bytes_per_s > 0 and info.dma_engine_bw_bytes_per_s > 0
    session.write("x", np.full((8, 128), 3.0, np.float32))            # every chip
    first = session.run()
    assert np.array_equal(session.read("y", 1), np.full((8, 128), 6.0, np.float32))
    session.write("x", session.read("y"), chip=0)
    second = session.run()
    assert session.read("y")[0, 0] == 12 and session.read("y", 1)[0, 0] == 6
    assert second["cycles"] == first["cycles"] > 0                     # that run's figures alone


def test_a_fault_is_an_emulator_fault_with_its_place():
    src = SCALE.replace("    v = v + v;\n    start copy(v, y, s);",
                        "    start copy(v, y, s);\n    v = v + v;")
    kernel = mkemu.compile_source(src, "/tmp/api_audit.mk", hw="test", mesh="1")
    with pytest.raises(EmulatorFault) as info:
        kernel(x=np.ones((8, 128), np.float32))
    fault = info.value
    assert isinstance(fault, MkemuError) and isinstance(fault, mkemu.MkemuError)
    assert fault.kind == "race" and (fault.chip, fault.core) == (0, 0)
    assert fault.cycle > 0 and fault.pc >= 0 and fault.instruction.startswith("vst.w")
    assert fault.source.startswith("/tmp/api_audit.mk:8:") and fault.details == ()
    assert fault.render().startswith(f"fault [race] at chip 0, core 0, cycle {fault.cycle}, pc {fault.pc:#06x}: ")


def test_a_driver_is_called_with_a_session_and_its_options(tmp_path):
    (tmp_path / "drv.py").write_text(
        "import numpy as np\n"
        "CALLS = []\n"
        "def drive(session, options):\n"
        "    CALLS.append(dict(options))\n"
        "    session.write('x', np.ones((8, 128), np.float32))\n"
        "    figures = session.run()\n"
        "    if options.get('progress'):\n"
        "        options['progress'](1, 1, figures)\n"
        "    return {'cycles_per_step': [figures['cycles']], 'breakdown_us': {'all': 1.0}, 'bit_exact': True}\n"
        "drive.mkemu_driver = True\n")
    src = 'reference "drv.py:drive";\n' + SCALE
    kernel = mkemu.compile_source(src, str(tmp_path / "d.mk"), hw="test", mesh="1", seed=5)
    assert kernel.is_driven
    seen = []
    run = kernel(progress=lambda *a: seen.append(a[:2]))
    assert kernel.reference.__globals__["CALLS"][0]["seed"] == 5 and seen == [(1, 1)]
    assert run.report.bit_exact is True and run.report.breakdown == {"all": 1.0}
    assert run.report.cycles == run.report.figures["cycles_per_step"][0]
    with pytest.raises(mkemu.ConfigError, match="driver writes its own inputs"):
        kernel(x=np.ones((8, 128), np.float32))
