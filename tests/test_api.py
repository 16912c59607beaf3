"""The Python API (`import mkemu`): docs/api.md's example as written, options shared
with the CLI, inputs and outputs per chip, references, drivers and errors."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

import mkemu
from mkemu.cli import main

ROOT = Path(__file__).parents[1]


def _doc_example() -> str:
    text = (ROOT / "docs" / "api.md").read_text()
    section = text[text.index("## A test with the API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_documented_example_runs_as_written():
    namespace: dict = {}
    exec(compile(_doc_example(), "docs/api.md", "exec"), namespace)
    tests = [fn for name, fn in namespace.items() if name.startswith("test_")]
    assert len(tests) == 2
    for test in tests:
        test()


def test_a_shipped_example_equals_its_reference_on_every_chip():
    kernel = mkemu.compile("all_reduce", hw="test", mesh="2x2")
    run = kernel()                                      # inputs generated from the seed
    expected = kernel.expected(run.inputs)
    assert set(expected) == {f"out@{chip}" for chip in range(4)}
    for key, value in expected.items():
        assert np.array_equal(run.outputs[key].view(np.uint32), np.asarray(value, np.float32).view(np.uint32))
    assert run.check() is None and run.report.bit_exact is True


def test_expected_takes_a_plain_name_for_every_chip_as_a_run_does():
    # (it raised "reference function reference raised KeyError: 'a@0'")
    kernel = mkemu.compile("vector_add", hw="test", mesh="2")
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal((8, 1024)).astype(np.float32) for _ in range(2))
    run = kernel({"a": a, "b": b})
    expected = kernel.expected({"a": a, "b": b})
    assert set(expected) == {"out@0", "out@1"}
    assert run.check(expected) is None
    # A name@chip given beside the plain name is that chip's own array.
    mixed = kernel.expected({"a": a, "b": b, "a@1": b})
    assert np.array_equal(mixed["out@0"], expected["out@0"]) and np.array_equal(mixed["out@1"], b + b)


def test_the_api_and_the_cli_report_the_same_figures(capsys):
    argv = ["run", "softmax", "--hw", "test", "--mesh", "2", "--seed", "3", "--json"]
    assert main(argv) == 0
    cli = json.loads(capsys.readouterr().out)
    run = mkemu.compile("softmax", hw="test", mesh="2", seed=3)()
    run.check()
    for key in ("cycles", "instructions", "hbm_bytes", "unit_busy_cycles", "stall_cycles", "bit_exact"):
        assert run.report.figures[key] == cli[key], key
    assert run.report.cycles == cli["cycles"]
    assert run.report.seconds == pytest.approx(cli["seconds"])
    assert sum(run.report.breakdown.values()) == sum(cli["stall_cycles"].values()) + cli["idle_cycles"]


def test_a_wrong_output_is_reported_with_its_place():
    kernel = mkemu.compile("vector_add", hw="test", mesh="1")
    a = np.ones((8, 1024), np.float32)
    run = kernel(a=a, b=a)
    wrong = {"out": a + a + np.float32(1)}
    mismatch = run.check(wrong)
    assert mismatch is not None and mismatch.buffer == "out" and mismatch.index == (0, 0)
    assert run.report.bit_exact is False and "differs at index [0, 0]" in run.report.mismatch


def test_per_chip_keys_win_over_replicated_ones():
    kernel = mkemu.compile("vector_add", hw="test", mesh="2")
    a = np.ones((8, 1024), np.float32)
    run = kernel({"a": a, "a@1": 3 * a}, b=a)
    assert run.output("out", 0)[0, 0] == 2 and run.output("out", 1)[0, 0] == 4
    assert set(run.inputs) == {"a@0", "a@1", "b@0", "b@1"}


def test_inputs_from_an_npz_file(tmp_path):
    a = np.full((8, 1024), 2.0, np.float32)
    np.savez(tmp_path / "in.npz", a=a, b=a)
    run = mkemu.compile("vector_add", hw="test", mesh="1")(str(tmp_path / "in.npz"))
    assert run.output("out")[0, 0] == 4 and run.check() is None


@pytest.mark.parametrize("call, message", [
    (lambda k: k(c=np.zeros(1)), "no buffer named 'c'"),
    (lambda k: k({"a@5": np.zeros((8, 1024), np.float32)}), "chip must be 0..0"),
    (lambda k: k(a=np.zeros((4, 4), np.float32)), "buffer a"),
    (lambda k: k(a=np.float32(1.0)), "buffer a: shape () != declared (8, 1024)"),   # (was said to be (1,))
    (lambda k: k(a=np.full((8, 1024), "x")), "buffer a (f32): got an array of <U1, not numbers"),
])
def test_bad_inputs_are_config_errors(call, message):
    kernel = mkemu.compile("vector_add", hw="test", mesh="1")
    with pytest.raises(mkemu.ConfigError, match=re.escape(message)):
        call(kernel)


@pytest.mark.parametrize("changes, message", [
    ({"mesh": "2y2"}, "bad mesh"),
    ({"mesh": (0, 1)}, "bad mesh"),
    ({"dma_order": "lifo"}, "dma_order must be one of"),
    ({"checks": {"races", "nope"}}, "unknown check(s) nope"),
    ({"max_cycles": 0}, "max_cycles must be an integer >= 1"),
    ({"params": {"N": "big"}}, "params want NAME -> integer"),
    ({"colour": "red"}, "unknown option(s) colour"),
    ({"model": "k3-tiny"}, "model applies only to programs run by a driver (e.g. the K3 programs), not to vector_add.mk"),
])
def test_bad_options_are_config_errors(changes, message):
    with pytest.raises(mkemu.ConfigError, match=re.escape(message)):
        mkemu.compile("vector_add", hw="test", **changes)


@pytest.mark.parametrize("make", [mkemu.Options, mkemu.Options.of])
@pytest.mark.parametrize("changes, message", [
    ({"bogus": 1}, "bogus: error: unknown option(s) bogus; known: accept, batch, "),
    ({"self": 1}, "self: error: unknown option(s) self; known: accept, batch, "),   # (was Python's TypeError)
    ({"sed": 1}, "sed: error: unknown option(s) sed (did you mean 'seed'?); known: "),
    ({"colour": 1, "sed": 1}, "colour: error: unknown option(s) colour, sed; known: "),
    ({"seed": "x"}, "seed: error: seed must be an integer >= 0, not 'x'"),
    ({"mesh": "0"}, "mesh: error: bad mesh '0'"),
    ({"mesh": b"1x1"}, "mesh: error: bad mesh b'1x1'"),     # (was taken as the mesh (49, 120, 49))
    ({"mesh": {2: 1}}, "mesh: error: bad mesh {2: 1}"),      # (was taken as its keys)
    ({"checks": None}, "checks: error: checks must be a set of check names"),
    # (OverflowError from math.isfinite, and an array's ambiguous truth value, escaped)
    ({"routing_skew": 10**400}, "routing_skew: error: routing_skew must be a finite number, not an integer of 401"),
    ({"dma_order": np.array(["fifo", "round_robin"])}, "dma_order: error: dma_order must be one of round_robin, fifo"),
    ({"schedule": np.array(["late"])}, "schedule: error: schedule must be one of normal, shuffle, late"),
    ({"model": "k3-tiny", "routing": "r.json", "routing_skew": 1.0},
     "routing_skew: error: routing_skew, routing: give one of them"),
])
def test_options_made_directly_are_checked_as_options_of_checks_them(make, changes, message):
    # (Options(bogus=1) raised Python's TypeError: anything but an MkemuError escaping the API is a bug)
    with pytest.raises(mkemu.ConfigError, match="^" + re.escape(message)):
        make(**changes)


def test_options_fields_are_given_by_name():
    with pytest.raises(mkemu.ConfigError, match=r"^options: error: Options takes its fields by name .*: got 'test'$"):
        mkemu.Options("test")
    options = mkemu.Options(hw="test", mesh=np.array([2, 2]))
    assert options.mesh == (2, 2, 1) and mkemu.Options.of(options, seed=3) == mkemu.Options(hw="test", mesh="2x2",
                                                                                          seed=3)


def test_options_are_one_object_shared_with_the_emulator():
    options = mkemu.Options(seed=4, dma_order="fifo", checks={"races"}, mesh="2x2")
    assert options.mesh == (2, 2, 1)
    config = options.run_config()
    assert (config.seed, config.dma_order, config.checks) == (4, "fifo", frozenset({"races"}))
    kernel = mkemu.compile("vector_add", options, hw="test")
    assert kernel.options == mkemu.Options.of(options, hw="test") and kernel.chips == 4


def test_numpy_integers_are_taken_as_the_ints_they_are():
    options = mkemu.Options(seed=np.int64(3), mesh=(np.int64(2), np.int32(1)), max_cycles=np.uint64(10**9),
                            batch=np.int32(2), params={"N": np.int64(4)})
    assert (options.seed, options.mesh, options.max_cycles, options.batch, options.params) == (
        3, (2, 1, 1), 10**9, 2, {"N": 4})
    assert all(type(v) is int for v in (options.seed, *options.mesh, options.max_cycles, options.batch,
                                        options.params["N"]))
    with pytest.raises(mkemu.ConfigError, match="seed must be an integer >= 0"):
        mkemu.Options(seed=np.int64(-1))


def test_numpy_numbers_are_taken_as_the_floats_they_are():
    # (as the integer fields take numpy integers; a report or tune record holds the option)
    for value in (np.float32(1.5), np.float64(1.5), np.int64(2)):
        skew = mkemu.Options(routing_skew=value, timing_only=True).routing_skew
        assert type(skew) is float and skew == value
    with pytest.raises(mkemu.ConfigError, match="routing_skew must be a number >= 0"):
        mkemu.Options(routing_skew=np.float32(-1), timing_only=True)


def test_compile_text_and_compile_file_share_the_profile_default():
    import inspect

    from mkemu.dsl.compiler import compile_file, compile_text
    from mkemu.isa.hardware import DEFAULT_PROFILE

    defaults = {inspect.signature(f).parameters["profile"].default for f in (compile_file, compile_text)}
    assert defaults == {DEFAULT_PROFILE} == {mkemu.Options().hw}


def test_a_reference_by_module_name(tmp_path, monkeypatch):
    (tmp_path / "my_refs.py").write_text(
        "def twice(inputs, *, chips, cores_per_chip):\n"
        "    return {'y': inputs['x@0'] * 2}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    source = _doc_example().split('"""')[1].replace("param N = 256;", 'param N = 256;\nreference "my_refs:twice";')
    kernel = mkemu.compile_source(source, hw="test", mesh="1")
    assert kernel.reference.__name__ == "twice"
    assert kernel(x=np.ones((8, 256), np.float32)).check() is None
    with pytest.raises(mkemu.ConfigError, match="no module named 'no_such_refs'"):
        mkemu.compile_source(source.replace("my_refs:twice", "no_such_refs:twice"), hw="test")


def test_an_assembly_reference_may_be_followed_by_a_comment(tmp_path):
    # the comment was taken as part of the reference's name, as the assembler does not
    example = (ROOT / "programs" / "examples" / "vector_add.s").read_text()
    (tmp_path / "vector_add_ref.py").write_text((ROOT / "programs" / "examples" / "vector_add_ref.py").read_text())
    for comment in (" ; the numpy reference", "; same", "  # or so"):
        source = example.replace(".reference vector_add_ref.py:reference",
                                 ".reference vector_add_ref.py:reference" + comment)
        kernel = mkemu.compile_source(source, filename=str(tmp_path / "va.s"), hw="test", mesh="1")
        assert kernel.reference.__name__ == "reference"
        assert kernel.program.reference == "vector_add_ref.py:reference"
        assert kernel().check() is None


def test_a_driven_program_runs_through_its_driver():
    k3 = mkemu.compile("k3_megakernel", model="k3-tiny", prompt_len=1, steps=2, trace=True)
    assert k3.is_driven
    run = k3()
    figures = run.report.figures
    assert figures["bit_exact"] is True and len(figures["tokens"][0]) == 2
    assert run.report.cycles == sum(figures["cycles_per_step"])
    assert set(run.report.breakdown) == set(figures["breakdown_us"])
    assert run.report.trace.end_cycle >= run.report.cycles
    # The buffers as the last step left them: its logits give the last token (greedy).
    assert set(run.outputs) >= {f"logits@{chip}" for chip in range(k3.chips)} and run.inputs == {}
    assert int(np.argmax(run.output("logits")[0])) == figures["tokens"][0][-1]
    assert run.output("tokens").dtype == np.int32
    with pytest.raises(mkemu.ConfigError, match="checks the outputs itself"):
        run.check()
    assert run.check({"logits@0": run.output("logits")}) is None
    with pytest.raises(mkemu.ConfigError, match="no expected outputs"):
        run.check({})
    with pytest.raises(mkemu.ConfigError, match="driver writes its own inputs"):
        k3(tokens=np.zeros(1, np.int32))
    session = k3.session()
    assert session.info.chips == k3.chips and "logits" in session.buffers()


# An MXFP4 weight buffer: the whole array (values, then scales) copied into VMEM and
# loaded onto the matrix unit; its scales follow its values at twice their row pitch.
MXFP4_KERNEL = """
.buffer w mxfp4 64x128 input
.buffer x f32 8x128 input
.buffer y f32 8x128 output
.kernel main
    .smem 0 4352 1 0 0 1 0 0
    .smem 28 4096 1 0 0 1 0 0
    rdsr s31, core
    bne s31, s0, done
    li s1, @w
    li s2, 65536
    li s3, 28
    dma.start vmem[s2], hbm[s1], s0, s0
    li s4, @x
    dma.start vmem[s0], hbm[s4], s3, s0
    li s5, 8448
    sem.wait s0, s5
    li s6, 512
    vld.w v0, 0(s0), s6, m0
    li s7, 64
    li s8, 4194432
    li s9, 69632
    mxu.ldw.mx x0, 0(s2), s7, s8, s9
    mxu.push x0, v0, 0
    mxu.mac x0, a0, 1
    mxu.pop v1, x0, a0, 0
    vst.w v1, 0(s0), s6, m0
    li s10, @y
    dma.start hbm[s10], vmem[s0], s3, s0
    li s5, 4096
    sem.wait s0, s5
done:
    halt
"""


def test_an_mxfp4_buffer_is_written_quantised_and_read_by_the_matrix_unit():
    from mkemu.isa import numerics as nx

    kernel = mkemu.compile_source(MXFP4_KERNEL, "mx.s", hw="test", mesh="1")
    assert kernel.buffers["w"].dtype == "mxfp4" and kernel.program.buffer("w").size_bytes == 64 * 64 + 2 * 128
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 128)).astype(np.float32)
    x = rng.standard_normal((8, 128)).astype(np.float32)
    run = kernel(w=w, x=x)
    held = nx.mxfp4_from_bytes(nx.mxfp4_to_bytes(w), w.shape)
    expected = nx.mxu_matmul_numpy(np.zeros((8, 128), np.float32), x[:, :64], held)
    assert np.array_equal(run.outputs["y@0"].view(np.uint32), expected.view(np.uint32))
    assert np.array_equal(run.output("w"), held)          # read back as the values it holds


class _Bits:
    """A bf16 tensor held as its bit patterns (like the K3 driver's weights)."""

    def __init__(self, bits):
        self.bf16_bits = bits


def test_bf16_bit_patterns_are_written_as_they_are():
    kernel = mkemu.compile_source(".buffer w bf16 2x4x128 input\n.kernel main\n    halt\n", "w.s", hw="test", mesh="1")
    session = kernel.session()
    bits = np.random.default_rng(5).integers(0, 1 << 16, (8, 128)).astype(np.uint16) & 0xBFFF   # finite
    bits[0, :3] = [0x7F81, 0xFFC1, 0x8000]          # a signalling NaN, a NaN payload, -0.0: kept
    session.write("w", _Bits(bits))                  # merged leading dimensions, as for arrays
    assert np.array_equal(session.read("w").view(np.uint32).reshape(8, 128) >> 16, bits)
    floats = (bits.astype(np.uint32) << 16).view(np.float32)
    floats[0, :2] = 1.0                              # (rounding float32 would quiet NaNs)
    session.write("w", floats.reshape(2, 4, 128))
    assert np.array_equal(session.read("w").view(np.uint32).reshape(8, 128)[1:], floats[1:].view(np.uint32))
    with pytest.raises(mkemu.ConfigError, match="bf16_bits must be uint16"):
        session.write("w", _Bits(bits.astype(np.int32)))


def test_an_i32_buffer_takes_only_integers_that_fit():
    kernel = mkemu.compile("all_to_all", hw="test", mesh="2")
    inputs = kernel.generate_inputs()
    counts = inputs["counts@0"]
    with pytest.raises(mkemu.ConfigError, match=re.escape("buffer counts (i32): got float64 values")):
        kernel({**inputs, "counts@0": counts.astype(np.float64)})
    with pytest.raises(mkemu.ConfigError, match=re.escape("do not all fit in int32")):
        kernel({**inputs, "counts@1": counts.astype(np.int64) + 2**40})
    with pytest.raises(mkemu.ConfigError, match="an i32 buffer takes integers"):
        kernel.session().write("counts", counts.astype(np.float32))
    widened = {key: a.astype(np.int64) if key.startswith("counts") else a for key, a in inputs.items()}
    assert kernel(widened).check() is None     # integers that fit are taken, whatever their width


@pytest.mark.parametrize("huge, shown", [
    (2**70, "0..1180591620717411303424"),
    (-2**70, "-1180591620717411303424..0"),
    (2**64, "0..18446744073709551616"),             # (just beyond uint64)
])
def test_integers_beyond_int64_are_out_of_range_for_an_i32_buffer_not_objects(huge, shown):
    # (they were "got an array of object, not numbers": numpy holds them as objects)
    kernel = mkemu.compile("all_to_all", hw="test", mesh="2")
    inputs = kernel.generate_inputs()
    counts = np.zeros_like(inputs["counts@1"]).tolist()    # a Python list, as a user might give it
    counts[0][0] = huge
    message = f"buffer counts (i32): values {shown} do not all fit in int32"
    with pytest.raises(mkemu.ConfigError) as info:
        kernel({**inputs, "counts@1": counts})
    assert str(info.value) == f"counts@1: error: {message}"
    with pytest.raises(mkemu.ConfigError) as info:
        kernel.session().write("counts", counts, chip=1)
    assert str(info.value) == f"counts: error: {message}"


def test_integers_held_as_objects_are_integers_whatever_the_buffer():
    kernel = mkemu.compile("all_to_all", hw="test", mesh="2")
    inputs = kernel.generate_inputs()
    as_objects = {key: a.astype(object) if key.startswith("counts") else a for key, a in inputs.items()}
    assert kernel(as_objects).check() is None          # that fit in int32: taken, as any integer type
    vector_add = mkemu.compile("vector_add", hw="test", mesh="1")
    ones = np.ones((8, 1024), np.float32)
    assert vector_add(a=np.full((8, 1024), 2**70, object), b=ones).inputs["a@0"][0, 0] == np.float32(2.0**70)
    with pytest.raises(mkemu.ConfigError, match=re.escape("buffer a (f32): got an array of object, not numbers")):
        vector_add(a=np.full((8, 1024), None, object), b=ones)
    assert vector_add(a=np.full((8, 1024), 2.0**70), b=ones).output("out")[0, 0] == np.float32(2.0**70)


def test_python_integers_beyond_int64_in_a_list_are_rounded_once_into_a_float_buffer():
    """numpy makes such a list float64 (rounded once already); they were rounded twice
    (2^63 + 2^39 + 1 became 2^63, not the nearest float32, 2^63 + 2^40) or, for an i32
    buffer, called floats."""
    zeros = np.zeros((8, 1024), np.float32)
    vector_add = mkemu.compile("vector_add", hw="test", mesh="1")
    held = vector_add(a=[[2**63 + 2**39 + 1] + [0] * 1023] * 8, b=zeros).inputs["a@0"]
    assert int(held[0, 0]) == 2**63 + 2**40
    rmsnorm = mkemu.compile("rmsnorm", hw="test", mesh="1")                       # w is bf16
    held = rmsnorm(x=zeros, w=[[2**63 + 2**55 + 1] + [0] * 1023]).inputs["w@0"]
    assert int(held[0, 0]) == 2**63 + 2**56
    assert vector_add(a=[[-10**400] + [0] * 1023] * 8, b=zeros).inputs["a@0"][0, 0] == -np.inf
    with pytest.raises(mkemu.ConfigError, match=re.escape("buffer counts (i32): values 0..9223372036854775808 do "
                                                          "not all fit in int32")):
        mkemu.compile("all_to_all", hw="test", mesh="1")(counts=[[2**63] + [0] * 31] * 2)


def test_python_numbers_held_as_objects_are_inputs_and_expected_values_as_the_numbers_they_are():
    """A list mixing a Python integer beyond int64 with floats is numbers (numpy holds
    them as objects): a float buffer rounds each once, an i32 buffer refuses the floats,
    and check() compares such expected values, where it had called them "not numbers"."""
    vector_add = mkemu.compile("vector_add", hw="test", mesh="1")
    zeros = np.zeros((8, 1024), np.float32)
    mixed = [[2**70, 2.5] * 512] * 8
    run = vector_add(a=mixed, b=zeros)
    assert list(run.output("out")[0, :2]) == [np.float32(2.0**70), 2.5]
    assert run.check({"out": mixed}) is None
    assert run.check({"out": np.array(mixed, object)}) is None
    mismatch = run.check({"out": [[2**70 + 2**60, 2.5] * 512] * 8})   # (rounds to another float32)
    assert mismatch is not None and mismatch.index == (0, 0) and mismatch.count == 8 * 512
    kernel = mkemu.compile("all_to_all", hw="test", mesh="2")
    inputs = kernel.generate_inputs()
    counts = inputs["counts@1"].tolist()
    counts[0][0] = 2.5
    counts[0][1] = 2**70
    with pytest.raises(mkemu.ConfigError, match=r"buffer counts \(i32\): got numbers that are not all integers"):
        kernel({**inputs, "counts@1": counts})
    run = kernel(inputs)
    out = run.output("rcounts", 0)
    assert run.check({"rcounts@0": out.astype(object)}) is None
    huge = out.astype(object)
    huge[0, 0] = 2**70
    assert run.check({"rcounts@0": huge}).expected == "1180591620717411303424"


def test_an_integer_expected_value_of_a_float_buffer_is_shown_as_the_float32_it_is_compared_as():
    vector_add = mkemu.compile("vector_add", hw="test", mesh="1")
    run = vector_add(a=np.full((8, 1024), -0.0, np.float32), b=np.full((8, 1024), -0.0, np.float32))
    mismatch = run.check({"out": np.zeros((8, 1024), int)})     # an integer 0 is +0.0, the output -0.0
    assert (mismatch.expected, mismatch.actual) == ("0, as float32 0.0 (0x00000000)", "-0.0 (0x80000000)")


def test_a_driven_program_given_an_inputs_file_says_its_driver_writes_its_own(tmp_path):
    path = tmp_path / "in.npz"
    np.savez(path, not_a_buffer=np.ones(3))
    kernel = mkemu.compile("k3_megakernel", model="k3-tiny", prompt_len=1, steps=1)
    with pytest.raises(mkemu.ConfigError, match="this program's driver writes its own inputs; call it with none"):
        kernel(path)


def test_booleans_are_the_numbers_0_and_1_for_any_buffer():
    vector_add = mkemu.compile("vector_add", hw="test", mesh="1")
    flags = np.zeros((8, 1024), bool)
    flags[0, :3] = True
    out = vector_add(a=flags, b=np.ones((8, 1024), np.float32)).output("out")
    assert list(out[0, :4]) == [2.0, 2.0, 2.0, 1.0]
    kernel = mkemu.compile("all_to_all", hw="test", mesh="2")
    session = kernel.session()
    session.write("counts", np.ones(session.read("counts").shape, bool), chip=1)
    assert (session.read("counts", chip=1) == 1).all()


def _masked(shape, dtype=np.float32):
    data = np.ones(shape, dtype)
    mask = np.zeros(shape, bool)
    mask[0, 0] = True
    return np.ma.masked_array(data, mask)


@pytest.mark.parametrize("write", [
    lambda k, m: k(a=m, b=m.data),                            # a run's input
    lambda k, m: k({"a@0": m, "b": m.data}),                  # under name@chip
    lambda k, m: k.session().write("a", m),                   # a driver's write
    lambda k, m: k.session().write("a", m, chip=0),
    lambda k, m: k(a=list(m), b=m.data),                      # rows of it in a list
    lambda k, m: k(a=[m[0].tolist(), *m[1:]], b=m.data),      # one deep inside
])
def test_a_masked_input_is_refused_not_written_without_its_mask(write):
    kernel = mkemu.compile("vector_add", hw="test", mesh="1")
    with pytest.raises(mkemu.ConfigError) as info:
        write(kernel, _masked((8, 1024)))
    message = str(info.value)
    assert message.startswith("a") and "buffer a is a masked array, whose mask would be dropped" in message
    assert ".filled(" in message and "value.data" in message
    # The fix it names is taken.
    m = _masked((8, 1024))
    assert kernel(a=m.filled(0.0), b=m.data).output("out")[0, :2].tolist() == [1.0, 2.0]


def test_masked_bf16_bits_and_expected_outputs_are_refused_too():
    kernel = mkemu.compile_source(".buffer w bf16 8x128 input\n.kernel main\n    halt\n", "w.s", hw="test", mesh="1")
    with pytest.raises(mkemu.ConfigError, match=re.escape("buffer w: bf16_bits is a masked array")):
        kernel.session().write("w", _Bits(_masked((8, 128), np.uint16)))
    run = mkemu.compile("vector_add", hw="test", mesh="1")(a=np.ones((8, 1024), np.float32), b=np.ones((8, 1024), np.float32))
    with pytest.raises(mkemu.ConfigError, match=re.escape("expected output 'out' is a masked array")):
        run.check({"out": _masked((8, 1024)) * 2})      # (a check that ignored the mask would pass)
    with pytest.raises(mkemu.ConfigError, match=re.escape("buffer a is a masked array")):
        run.kernel.expected({"a": _masked((8, 1024)), "b": np.ones((8, 1024), np.float32)})


def test_progress_must_be_callable_and_a_buffer_of_that_name_goes_in_the_dict():
    source = """
    kernel k(progress: hbm f32[8, 128], out: hbm f32[8, 128]) {
        vmem x: f32[8, 128];
        sem s;
        start copy(progress, x, s);
        wait copy(progress, x, s);
        start copy(x, out, s);
        wait copy(x, out, s);
    }
    """
    kernel = mkemu.compile_source(textwrap.dedent(source), "p.mk", hw="test", mesh="1x1x1")
    a = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
    with pytest.raises(mkemu.ConfigError, match="progress takes a callable .* kernel\\(\\{'progress': array\\}\\)"):
        kernel(progress=a)
    assert np.array_equal(kernel({"progress": a}).output("out"), a)


def test_generated_inputs_too_big_for_the_host_name_the_buffer_and_its_line():
    # The host's refusal named no buffer (numpy's float64 shape alone).
    src = "kernel k(x: hbm f32[1048576, 1048576]) {\n}\nhost {\n    input x: f32[1048576, 1048576];\n    launch k(x);\n}\n"
    kernel = mkemu.compile_source(src, "big.mk", hw="test", mesh="1")
    with pytest.raises(MemoryError, match=r"generating input 'x' f32\[1048576, 1048576\] \(4,398,046,511,104 bytes, "
                                          r"declared at big.mk:4\): "):
        kernel.generate_inputs()


def test_check_given_only_buffers_that_are_not_outputs_is_an_error():
    kernel = mkemu.compile("vector_add", hw="test", mesh="2")
    a = np.ones((8, 1024), np.float32)
    run = kernel(a=a, b=a)
    with pytest.raises(mkemu.ConfigError, match=r"only for a \(input\), b \(input\), none of them an output"):
        run.check({"a": a, "b@1": a})
    assert run.report.bit_exact is None
    assert run.check({"a": a, "out": a + a}) is None and run.report.bit_exact


def test_an_input_of_a_narrow_ml_dtypes_type_is_taken_as_the_values_it_holds():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    kernel = mkemu.compile("rmsnorm", hw="test")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 1024)).astype(np.float32)
    w = rng.standard_normal((1, 1024)).astype(ml_dtypes.bfloat16)
    run = kernel(x=x, w=w)
    assert run.check() is None
    assert np.array_equal(run.output("y"), kernel(x=x, w=w.astype(np.float32)).output("y"))
    # (expected outputs are given as float32 arrays, bf16 ones too: docs/api.md)
    with pytest.raises(mkemu.ConfigError, match="give bf16 values as float32"):
        run.check({"y": run.output("y").astype(ml_dtypes.bfloat16)})
    # Refused values are named by the type given, not the float32 they were widened to.
    counts = np.ones((2, 32), ml_dtypes.bfloat16)
    all_to_all = mkemu.compile("all_to_all", hw="test")
    for call in (lambda: all_to_all(counts=counts), lambda: all_to_all.session().write("counts", counts)):
        with pytest.raises(mkemu.ConfigError, match=r"buffer counts \(i32\): got bfloat16 values"):
            call()


DRIVEN = """
reference "drv.py:drive";
kernel scale(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    sem s;
    start copy(x, v, s);
    wait copy(x, v, s);
    start copy(v, y, s);
    wait copy(v, y, s);
}
host {
    input x: f32[8, 128];
    output y: f32[8, 128];
    launch scale(x, y);
}
"""


@pytest.mark.parametrize("figures, problem", [
    ('{"bit_exact": True, "cycles": None}', "cycles is None, not a whole number of cycles"),
    ('{"cycles": float("nan")}', "cycles is nan"),
    ('{"cycles": 1.5}', "cycles is 1.5"),
    ('{"cycles": True}', "cycles is True"),
    ('{"cycles_per_step": ["a"]}', "cycles_per_step is ['a'], not a list"),
    ('{"bit_exact": "yes"}', "bit_exact is 'yes', not True, False or None"),
    ('{1: 2}', "names are not all strings (1)"),
])
def test_a_driver_s_figures_the_report_cannot_take_are_an_error_naming_the_driver(tmp_path, capsys, figures, problem):
    (tmp_path / "drv.py").write_text(f"def drive(session, options):\n    session.run()\n    return {figures}\n"
                                     "drive.mkemu_driver = True\n")
    program = tmp_path / "d.mk"
    program.write_text(DRIVEN)
    with pytest.raises(mkemu.ConfigError) as info:
        mkemu.compile(str(program), hw="test", mesh="1")()
    assert problem in str(info.value) and "driver drive returned figures whose" in str(info.value)
    assert "drv.py:1" in str(info.value)
    assert main(["run", str(program), "--hw", "test", "--mesh", "1"]) == 1
    out, err = capsys.readouterr()
    assert problem in err and "Traceback" not in out + err


def test_a_driver_s_whole_numbers_of_cycles_are_the_report_s(tmp_path):
    (tmp_path / "drv.py").write_text("import numpy as np\ndef drive(session, options):\n    session.run()\n"
                                     "    return {'bit_exact': True, 'cycles_per_step': [np.int64(5), 7]}\n"
                                     "drive.mkemu_driver = True\n")
    program = tmp_path / "d.mk"
    program.write_text(DRIVEN)
    report = mkemu.compile(str(program), hw="test", mesh="1")().report
    assert report.cycles == 12 and report.bit_exact is True


def test_a_session_call_the_driver_gets_wrong_is_named_at_the_drivers_line(tmp_path, capsys):
    """docs/api.md: a driver that raises is a ConfigError naming the line of the driver
    it failed at; a session method's refusal (a buffer the program does not have) had
    named only the buffer."""
    (tmp_path / "drv.py").write_text("def drive(session, options):\n    session.run()\n"
                                     "    session.write('zz', 1)\n    return {}\ndrive.mkemu_driver = True\n")
    program = tmp_path / "d.mk"
    program.write_text(DRIVEN)
    with pytest.raises(mkemu.ConfigError) as info:
        mkemu.compile(str(program), hw="test", mesh="1")()
    error = info.value
    assert (error.file, error.line, error.key) == (str(tmp_path / "drv.py"), 3, "zz")
    assert str(error).startswith(f"{tmp_path / 'drv.py'}:3: zz: error: the program has no HBM buffer 'zz'")
    assert main(["run", str(program), "--hw", "test", "--mesh", "1"]) == 1
    assert capsys.readouterr().err.startswith(f"{tmp_path / 'drv.py'}:3: zz: error: ")


def test_errors_pickle_and_copy_with_every_attribute():
    """A process pool or a tuning worker sends errors back to its parent."""
    import copy
    import pickle

    from mkemu.errors import EmulatorFault, SourceError
    from mkemu.tools.trace_reader import TraceError

    fault = EmulatorFault("race", "boom", chip=1, core=0, cycle=7, pc=3, instruction="vld", details=("d",))
    with pytest.raises(SourceError) as info:
        mkemu.compile_source("kernel k( {", "bad.mk", hw="test")
    for error in (fault, info.value, mkemu.ConfigError("bad", file="f.toml", key="hw"), TraceError("x", file="t")):
        for back in (pickle.loads(pickle.dumps(error)), copy.deepcopy(error), copy.copy(error)):
            assert type(back) is type(error) and vars(back) == vars(error)
            assert str(back) == str(error) and back.render() == error.render()


def test_a_process_pool_gets_the_error_itself():
    import concurrent.futures

    with concurrent.futures.ProcessPoolExecutor(1) as pool:
        with pytest.raises(mkemu.errors.SourceError, match=r"bad\.mk:1:11: error: unexpected"):
            pool.submit(mkemu.compile_source, "kernel k( {", "bad.mk", hw="test").result()


def test_one_kernel_writing_its_trace_from_several_threads(tmp_path):
    """Each thread's output goes through a temporary file of its own (they used to share
    the process's, and a thread's rename took another's away)."""
    import concurrent.futures

    from mkemu.tools.trace_reader import read_trace

    trace = tmp_path / "shared.mkt"
    kernel = mkemu.compile("vector_add", hw="test", mesh="1", trace=str(trace))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        runs = [f.result() for f in [pool.submit(kernel) for _ in range(12)]]
    assert len({r.report.cycles for r in runs}) == 1
    assert read_trace(str(trace)).end_cycle == runs[0].report.cycles
    assert [p.name for p in tmp_path.iterdir()] == ["shared.mkt"]        # no temporary file left


def test_an_exception_of_the_callers_progress_reaches_the_caller_as_raised():
    class Enough(Exception):
        pass

    def stop(*report):
        raise Enough("stop here")

    k3 = mkemu.compile("k3_megakernel", model="k3-tiny", prompt_len=1, steps=2)
    with pytest.raises(Enough, match="stop here"):
        k3(progress=stop)


def test_dir_shows_the_api():
    assert {"compile", "compile_source", "Kernel", "Run", "Options", "Session"} <= set(dir(mkemu))


def test_a_traced_runs_machine_goes_with_the_run_without_a_garbage_collection(monkeypatch):
    # The recorder referred back to its machine: the pair waited for a full collection,
    # and a loop of traced runs (a tuner asking for traces) piled up machines (1.8 GB
    # after 250 runs of a small kernel).
    import gc
    import weakref

    from mkemu.emulator.machine import Machine

    made = []
    real = Machine.__init__

    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        made.append(weakref.ref(self))

    monkeypatch.setattr(Machine, "__init__", init)
    kernel = mkemu.compile("vector_add", hw="test", mesh="1", trace=True)
    gc.disable()
    try:
        run = kernel()
        assert run.report.trace is not None and made[-1]() is not None
        del run
        assert made[-1]() is None
    finally:
        gc.enable()


def test_check_takes_name_at_chip_over_name_as_inputs_do():
    # A dict in the inputs' form (`a` for every chip, `a@1` for chip 1) compared `out`
    # against chip 1 as well, failing a correct run.
    kernel = mkemu.compile("vector_add", hw="test", mesh="2")
    zeros, ones = np.zeros((8, 1024), np.float32), np.ones((8, 1024), np.float32)
    run = kernel({"a": zeros, "a@1": ones, "b": zeros})
    assert run.check({"out": zeros, "out@1": ones}) is None and run.report.bit_exact
    mismatch = run.check({"out": ones, "out@1": ones})
    assert "on chip 0" in mismatch.render() and not run.report.bit_exact


def test_check_converts_integer_and_bool_expected_values_of_a_float_buffer_to_float32_bits():
    """They were compared by value: a -0.0 output passed against the integer 0."""
    kernel = mkemu.compile("vector_add", hw="test", mesh="1")
    minus = np.full((8, 1024), -0.0, np.float32)
    run = kernel(a=minus, b=minus)
    for zeros in (np.zeros((8, 1024), np.int64), np.zeros((8, 1024), bool)):
        assert run.check({"out": zeros}) is not None           # +0 and -0 differ
    assert run.check({"out": np.full((8, 1024), -0.0)}) is None
    big = np.full((8, 1024), 16777216.0, np.float32)
    run = kernel(a=big, b=np.zeros_like(big))
    assert run.check({"out": np.full((8, 1024), 16777217, np.int64)}) is None   # float32(16777217) is 2^24


def test_expected_takes_inputs_as_a_run_does():
    """Rounded into their buffers (w is bf16), a buffer not given as zeros, bad keys refused."""
    kernel = mkemu.compile("rmsnorm", hw="test", mesh="1")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 1024)).astype(np.float32)
    w = rng.standard_normal((1, 1024)).astype(np.float32)     # not bf16 values
    run = kernel(x=x, w=w)
    assert run.check(kernel.expected({"x": x, "w": w})) is None and run.check() is None
    assert run.check(kernel.expected({"x": x})) is not None                      # w as zeros
    for bad, message in (({"x": x, "zzz": x}, "no buffer named 'zzz'"), ({"x@5": x}, "chip must be 0..0"),
                         ({1: x}, "inputs are named by buffer")):
        with pytest.raises(mkemu.ConfigError, match=re.escape(message)):
            kernel.expected(bad)


def test_an_empty_program_name_is_keyed_by_the_api_field():
    with pytest.raises(mkemu.ConfigError) as info:
        mkemu.compile("")
    assert info.value.key == "program" and "no program given" in str(info.value)


def test_a_reference_named_after_another_statement_on_its_line_is_still_checked(tmp_path):
    # (a scan for `reference` at the start of a line missed it: the run checked nothing)
    (tmp_path / "r.py").write_text("def reference(inputs, *, chips, cores_per_chip):\n    return {'x': inputs['x@0'] + 1}\n")
    (tmp_path / "p.mk").write_text('const A = 1; reference "r.py:reference";\nkernel k(x: hbm f32[8, 128]) { }\n')
    run = mkemu.compile(str(tmp_path / "p.mk"), hw="test", mesh="1")()
    assert run.check() is not None and run.report.bit_exact is False


H = 10**5000    # (past the 4,300 decimal digits Python writes out: a message printing it raised ValueError)


@pytest.mark.parametrize("call, key", [
    (lambda: mkemu.Options(max_cycles=H), "max_cycles"),
    (lambda: mkemu.Options(seed=[H]), "seed"),
    (lambda: mkemu.Options(max_instructions=-H), "max_instructions"),
    (lambda: mkemu.Options(routing_skew=H), "routing_skew"),
    (lambda: mkemu.Options(checks=[H]), "checks"),
    (lambda: mkemu.compile("vector_add", hw="test", mesh=(H,)), "mesh"),
    (lambda: mkemu.compile("vector_add", hw="test", mesh="1", params={"N": H}), "N"),
    (lambda: mkemu.compile("vector_add", hw="test", mesh="1")().output("out", chip=H), None),
    (lambda: mkemu.compile("vector_add", hw="test", mesh="1").session().read("a", H), "a"),
    (lambda: mkemu.compile("vector_add", hw="test", mesh="1").session().feed_readbacks([H]), "values"),
    (lambda: mkemu.compile("vector_add", hw="test", mesh="1").session().feed_readbacks([1], core=H), "core"),
])
def test_an_integer_too_long_to_write_out_is_a_config_error_naming_its_key(call, key):
    with pytest.raises(mkemu.ConfigError) as info:
        call()
    assert key is None or info.value.key == key
    assert len(str(info.value)) < 400


def test_a_fraction_past_float_range_is_an_infinity_in_a_float_buffer():
    from fractions import Fraction

    vector_add = mkemu.compile("vector_add", hw="test", mesh="1")
    run = vector_add(a=np.full((8, 1024), Fraction(10**400), object), b=np.zeros((8, 1024), np.float32))
    assert (run.output("out") == np.inf).all()


def test_an_inputs_member_declaring_far_more_than_its_buffer_is_refused_unread(tmp_path):
    """A few MB of .npz can inflate to GBs: a member was read whole before its shape
    was checked (2.2 GB of RSS for a 2 MB file), and one naming no buffer too."""
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2**31,)})
    path = tmp_path / "bomb.npz"
    for name in ("a", "zz"):
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"{name}.npy", header.getvalue() + bytes(64))    # (the data, cut short)
        with pytest.raises(mkemu.ConfigError) as info:
            mkemu.compile("vector_add", hw="test", mesh="1")(path)
        assert info.value.key == name
        assert ("no buffer named 'zz'" if name == "zz" else
                "the array declares shape (2147483648,) of float32 (8,589,934,592 bytes), far more than buffer a "
                "(f32[8, 1024]) takes: refused unread") in str(info.value)


@pytest.mark.parametrize("names, message", [
    (("a.npy", "a.npy"), "the file holds array 'a' twice (as members 'a' or 'a.npy'): which one is meant?"),
    (("a", "a.npy"), "the file holds array 'a' twice (as members 'a' or 'a.npy'): which one is meant?"),
    (("aQb.npy",), "a member's name holds a NUL character ('a\\x00b.npy')"),
])
def test_an_inputs_file_naming_an_array_twice_or_with_a_nul_is_refused(tmp_path, names, message):
    # numpy reads one of two members of one name, and a name holding a NUL as its part
    # before it: either ran with an array the file does not clearly give.
    import io
    import warnings
    import zipfile

    member = io.BytesIO()
    np.lib.format.write_array(member, np.ones((8, 1024), np.float32))
    archive = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(archive, "w") as zf:
        warnings.simplefilter("ignore")     # (zipfile's warning of a duplicate name)
        for name in (*names, "b.npy"):
            zf.writestr(name, member.getvalue())
    path = tmp_path / "inputs.npz"
    path.write_bytes(archive.getvalue().replace(b"aQb.npy", b"a\0b.npy"))   # (zipfile writes no NUL itself)
    with pytest.raises(mkemu.ConfigError) as info:
        mkemu.compile("vector_add", hw="test", mesh="1")(path)
    assert info.value.message == message and info.value.file == str(path)
