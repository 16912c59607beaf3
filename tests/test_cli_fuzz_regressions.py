"""Regressions found by fuzzing the command line: bad input gets one line naming the
place and a non-zero exit, never a traceback; outputs are not half-written."""

from __future__ import annotations

import json
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from mkemu.cli import main

EXAMPLE = str(Path(__file__).parent.parent / "programs" / "examples" / "vector_add.s")
RUN = ["run", EXAMPLE, "--hw", "test", "--mesh", "1"]
PROFILE = Path(__file__).parent.parent / "isa" / "profiles" / "test.toml"


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def failed(capsys, *argv, naming: str) -> str:
    code, out, err = cli(capsys, *argv)
    assert code == 1, (code, out, err)
    assert naming in err, err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.fixture
def trace_file(tmp_path, capsys) -> Path:
    path = tmp_path / "t.mkt"
    assert cli(capsys, *RUN, "--trace", str(path))[0] == 0
    return path


def _rewrite_trace(src: Path, dst: Path, edit) -> None:
    """The trace with its payload edited (meta, columns) and its header and CRC made right again."""
    data = src.read_bytes()
    raw = zlib.decompress(data[36:])
    (size,) = struct.unpack_from("<Q", raw)
    meta, columns = json.loads(raw[8:8 + size]), bytearray(raw[8 + size:])
    edit(meta, columns)
    text = json.dumps(meta).encode()
    payload = struct.pack("<Q", len(text)) + text + bytes(columns)
    body = zlib.compress(payload)
    dst.write_bytes(struct.pack("<8sIIQQI", b"MKTRACE\x00", 1, 0, len(payload), len(body), zlib.crc32(body)) + body)


# ------------------------------------------------------------ run options


@pytest.mark.parametrize("flag", ["--max-cycles", "--max-instructions"])
def test_a_guard_beyond_64_bits_is_an_error_not_an_overflow(capsys, flag):
    failed(capsys, *RUN, flag, str(10**23), naming=flag)


def test_a_guard_at_the_bound_still_runs(capsys):
    assert cli(capsys, *RUN, "--max-cycles", str(2**62), "--max-instructions", str(2**62))[0] == 0


@pytest.mark.parametrize("skew", ["nan", "inf", "1e309"])
def test_a_routing_skew_that_is_not_finite_is_an_error(capsys, skew):
    failed(capsys, "run", "k3_megakernel", "--model", "k3-tiny", "--timing-only", "--routing-skew", skew,
           naming="--routing-skew")


# ------------------------------------------------------------ program names and output paths


def test_a_program_name_too_long_for_the_file_system(capsys):
    failed(capsys, "run", "x" * 5000, naming="File name too long")
    failed(capsys, "asm", "x" * 5000, "--params", naming="File name too long")


def test_an_empty_program_name(capsys):
    failed(capsys, "run", "", naming="PROGRAM")


@pytest.mark.parametrize("params", [False, True])
def test_asm_output_under_a_file_is_an_error(capsys, tmp_path, params):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    argv = ["asm", "vector_add", "-o", str(a_file / "out.lst")] + (["--params"] if params else [])
    failed(capsys, *argv, naming="-o")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_asm_empty_output_path_is_an_error(capsys):
    code, out, err = cli(capsys, "asm", "vector_add", "-o", "")
    assert code == 1 and out == "" and "-o" in err


def test_atomic_write_under_a_file_is_a_config_error(tmp_path):
    from mkemu.errors import ConfigError
    from mkemu.runner import atomic_write

    a_file = tmp_path / "f"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="Not a directory"):
        atomic_write(str(a_file / "x"), b"data")
    with pytest.raises(ConfigError, match="empty"):
        atomic_write("", b"data")
    with pytest.raises(ConfigError, match="too long"):
        atomic_write(str(tmp_path / ("x" * 5000)), b"data")


def test_atomic_write_takes_a_long_but_valid_name(tmp_path):
    from mkemu.runner import atomic_write

    target = tmp_path / ("y" * 250)
    atomic_write(str(target), b"data")
    assert target.read_bytes() == b"data" and [p.name for p in tmp_path.iterdir()] == [target.name]


# ------------------------------------------------------------ trace exports


@pytest.mark.parametrize("first, second", [("--perfetto", "--html"), ("--html", "--perfetto"),
                                           ("--perfetto", "--plot"), ("--html", "--plot")])
def test_no_export_is_written_when_another_cannot_be(capsys, tmp_path, trace_file, first, second):
    good = tmp_path / "good.out"
    failed(capsys, "trace", str(trace_file), first, str(good), second, str(tmp_path / "no" / "x"),
           naming=second)
    assert not good.exists()


@pytest.mark.parametrize("flag", ["--perfetto", "--html", "--plot"])
def test_an_empty_export_path_is_an_error(capsys, trace_file, flag):
    failed(capsys, "trace", str(trace_file), flag, "", naming=flag)


@pytest.mark.parametrize("flag", ["--perfetto", "--html"])
def test_an_export_under_a_file_is_an_error(capsys, trace_file, flag):
    failed(capsys, "trace", str(trace_file), flag, str(trace_file / "x"), naming=flag)


def test_a_trace_with_a_negative_dma_size_is_corrupted(capsys, tmp_path, trace_file):
    def edit(meta, columns):
        col = meta["tables"]["dma"]["size_bytes"]
        at = col["offset"]
        columns[at:at + 8] = struct.pack("<q", -2**63)

    bad = tmp_path / "bad.mkt"
    _rewrite_trace(trace_file, bad, edit)
    for extra in ([], ["--perfetto", str(tmp_path / "x.pf")], ["--html", str(tmp_path / "x.html")]):
        failed(capsys, "trace", str(bad), *extra, naming="size_bytes")


@pytest.mark.parametrize("key, value", [("end_cycle", 10**30), ("end_cycle", -1)])
def test_a_trace_with_an_end_cycle_beyond_64_bits_is_corrupted(capsys, tmp_path, trace_file, key, value):
    bad = tmp_path / "bad.mkt"
    _rewrite_trace(trace_file, bad, lambda meta, columns: meta.__setitem__(key, value))
    for extra in ([], ["--html", str(tmp_path / "x.html")]):
        failed(capsys, "trace", str(bad), *extra, naming="end_cycle")


def test_a_trace_with_a_launch_beyond_64_bits_is_corrupted(capsys, tmp_path, trace_file):
    def edit(meta, columns):
        meta["launches"][0]["end"] = 10**30

    bad = tmp_path / "bad.mkt"
    _rewrite_trace(trace_file, bad, edit)
    failed(capsys, "trace", str(bad), naming="launches")


# ------------------------------------------------------------ --inputs files


def _npy(header: str, data: bytes = b"\0" * 64) -> bytes:
    header = header + " " * (118 - len(header) - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + data


def test_damaged_npz_files_are_errors(capsys, tmp_path):
    a = np.ones((8, 128), np.float32)
    good = tmp_path / "good.npz"
    np.savez(good, a=a, b=a)
    data = good.read_bytes()
    (tmp_path / "truncated.npz").write_bytes(data[:len(data) // 2])
    np.savez_compressed(tmp_path / "c.npz", a=a, b=a)
    damaged = bytearray((tmp_path / "c.npz").read_bytes())
    damaged[len(damaged) // 2] ^= 0x55
    (tmp_path / "inflate.npz").write_bytes(bytes(damaged))
    crc = bytearray(data)
    crc[data.index(b"NUMPY") + 200] ^= 0xFF          # array data: the member's CRC no longer matches
    (tmp_path / "crc.npz").write_bytes(bytes(crc))
    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as z:    # a header whose shape needs petabytes
        z.writestr("a.npy", _npy("{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000, 100000), }"))
    for name in ("truncated.npz", "inflate.npz", "crc.npz", "huge.npz"):
        failed(capsys, *RUN, "--inputs", str(tmp_path / name), naming=name)


def test_an_npz_without_arrays_is_an_error(capsys, tmp_path):
    np.savez(tmp_path / "empty.npz")
    failed(capsys, *RUN, "--inputs", str(tmp_path / "empty.npz"), naming="no arrays")


def test_buffers_missing_from_the_inputs_file_start_as_zeros_for_the_reference_too(capsys, tmp_path):
    np.savez(tmp_path / "a.npz", a=np.ones((8, 128), np.float32))       # no b: zeros
    code, out, err = cli(capsys, *RUN, "--inputs", str(tmp_path / "a.npz"))
    assert code == 0 and out.startswith("PASS"), err
    np.savez(tmp_path / "chip.npz", **{"a@0": np.ones((8, 128), np.float32)})
    code, out, err = cli(capsys, *RUN, "--mesh", "2", "--inputs", str(tmp_path / "chip.npz"))
    assert code == 0 and out.startswith("PASS"), err


# ------------------------------------------------------------ hardware profiles


def _profile(tmp_path, old: str, new: str) -> str:
    text = PROFILE.read_text()
    assert old in text
    path = tmp_path / "hw.toml"
    path.write_text(text.replace(old, new))
    return str(path)


@pytest.mark.parametrize("old, new, key", [
    ("hop_latency_cycles = 50", "hop_latency_s = 1e300", "ici.hop_latency_s"),
    ("clock_hz = 1e9", "clock_hz = 1e-300", "chip.hbm_bw_bytes_per_s"),
    ("mxu_dim = 128", "mxu_dim = 1048576", "core.mxu_dim"),
])
def test_profile_values_the_emulator_cannot_hold_are_errors(capsys, tmp_path, old, new, key):
    path = _profile(tmp_path, old, new)
    failed(capsys, "hw", "show", path, naming=key)
    failed(capsys, *RUN[:2], "--hw", path, "--mesh", "1", naming=key)


# ------------------------------------------------------------ tune and sweep records


def test_tune_and_sweep_refuse_an_empty_record_path(capsys):
    failed(capsys, "tune", "vector_add", "--hw", "test", "--mesh", "1", "--param", "N=1024,2048", "--out", "",
           naming="--out")
    failed(capsys, "sweep", "vector_add", "--hw", "test", "--mesh", "1", "--out", "", naming="--out")
    failed(capsys, "sweep", "vector_add", "--hw", "test", "--mesh", "", naming="mesh")


@pytest.mark.parametrize("flag", ["--record-routing", "--dump", "--routing", "--model"])
def test_an_empty_path_option_is_an_error_not_ignored(capsys, flag):
    failed(capsys, "run", "k3_megakernel", "--model", "k3-tiny", flag, "", naming=flag)


def test_tune_refuses_an_empty_resume_path(capsys):
    failed(capsys, "tune", "vector_add", "--hw", "test", "--mesh", "1", "--param", "N=1024,2048", "--resume", "",
           naming="--resume")


# ------------------------------------------------------------ adversarial schedules


def test_schedules_are_bounded(capsys):
    failed(capsys, *RUN, "--schedules", str(10**9), naming="--schedules")


def test_schedule_runs_write_none_of_the_normal_runs_outputs(monkeypatch):
    # (they rewrote --dump and --record-routing with an adversarial run's data)
    import mkemu.run
    from mkemu.options import Options

    seen = []

    def execute(file, options, **kwargs):
        seen.append(options)
        return {"bit_exact": True}, None

    monkeypatch.setattr(mkemu.run, "execute", execute)
    options = Options(trace="t.mkt", dump="dump", record_routing="routing.json")
    entries = mkemu.run.check_schedules("k3_megakernel", options, 2, {"bit_exact": True})
    assert [e["outcome"] for e in entries] == ["same", "same"]
    assert [(o.schedule, o.trace, o.dump, o.record_routing) for o in seen] == [
        ("late", None, None, None), ("shuffle", None, None, None)]


# ------------------------------------------------------------ arrays that are not arrays of numbers


VECTOR_ADD = Path(__file__).parent.parent / "programs" / "examples" / "vector_add.mk"


@pytest.mark.parametrize("returned", ['{"out": [[1.0], [1.0, 2.0]]}',              # ragged: a ValueError
                                      '{"out": np.zeros((8, 1024), [("x", "f4")])}'])  # a TypeError comparing
def test_a_reference_returning_what_is_not_an_array_of_numbers(capsys, tmp_path, returned):
    (tmp_path / "p.mk").write_text(VECTOR_ADD.read_text())
    (tmp_path / "vector_add_ref.py").write_text(
        f"import numpy as np\n\ndef reference(inputs, *, chips, cores_per_chip):\n    return {returned}\n")
    failed(capsys, "run", str(tmp_path / "p.mk"), "--hw", "test", "--mesh", "1",
           naming="vector_add_ref.py:reference: out: error: expected output 'out'")


def test_ragged_arrays_given_to_the_api_are_config_errors():
    import mkemu

    kernel = mkemu.compile("vector_add", hw="test", mesh="1")
    ragged = [[1.0], [1.0, 2.0]]
    with pytest.raises(mkemu.ConfigError, match="buffer a is not an array"):
        kernel(a=ragged)
    with pytest.raises(mkemu.ConfigError, match="buffer a is not an array"):
        kernel.session().write("a", ragged)
    with pytest.raises(mkemu.ConfigError, match="expected output 'out' is not an array"):
        kernel().check({"out": ragged})


# ------------------------------------------------------------ outputs over inputs


@pytest.mark.parametrize("argv, flag, what", [
    (["asm", "{prog}", "--hw", "test", "-o", "{prog}"], "-o", "the program"),          # replaced by its listing
    (["asm", "{prog}", "--params", "-o", "{prog}"], "-o", "the program"),
    (["run", "{prog}", "--hw", "test", "--mesh", "1", "--trace", "{prog}"], "--trace", "the program"),
    (["run", "{prog}", "--hw", "{hw}", "--mesh", "1", "--trace", "{hw}"], "--trace", "the --hw profile"),
    (["run", "{prog}", "--hw", "test", "--mesh", "1", "--inputs", "{npz}", "--trace", "{npz}"], "--trace",
     "the --inputs file"),
    (["tune", "{prog}", "--hw", "test", "--mesh", "1", "--param", "N=1024,2048", "--out", "{prog}"], "--out",
     "the program"),
    (["sweep", "{prog}", "--hw", "test", "--mesh", "1", "--out", "{prog}"], "--out", "the program"),
])
def test_an_output_over_a_file_the_command_reads_is_an_error(capsys, tmp_path, argv, flag, what):
    prog, hw, npz = tmp_path / "p.mk", tmp_path / "hw.toml", tmp_path / "in.npz"
    prog.write_text(VECTOR_ADD.read_text())
    hw.write_text(PROFILE.read_text())
    np.savez(npz, a=np.ones((8, 1024), np.float32))
    saved = {p: p.read_bytes() for p in (prog, hw, npz)}
    argv = [a.format(prog=prog, hw=hw, npz=npz) for a in argv]
    failed(capsys, *argv, naming=f"{flag}: error: {argv[argv.index(flag) + 1]} is {what}; write {flag} to another")
    assert {p: p.read_bytes() for p in saved} == saved


def test_two_outputs_of_one_run_are_two_files(capsys, tmp_path):
    out = str(tmp_path / "x")
    failed(capsys, "run", "k3_megakernel", "--model", "k3-tiny", "--trace", out, "--record-routing", out,
           naming="--trace and --record-routing both write")
    assert not (tmp_path / "x").exists()
