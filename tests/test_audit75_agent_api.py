"""The API as a program that drives it sees it: many variants compiled and run in one
process (threads too), inputs refilled between runs, and every bad input a
`mkemu.MkemuError` (docs/api.md)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import mkemu

SCALE = """
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {
    vmem v: f32[8, 128];
    sem s;
    start copy(x, v, s);
    wait copy(x, v, s);
    v = v + v;
    start copy(v, y, s);
    wait copy(v, y, s);
}
"""


def test_the_first_runs_of_a_process_may_start_in_several_threads_at_once():
    # The emulator's compiled modules are imported on first use; a thread that came
    # second used to take the module half-imported (AttributeError: no attribute 'run').
    code = """
import threading
from concurrent.futures import ThreadPoolExecutor
import numpy as np, mkemu
kernel = mkemu.compile("vector_add", hw="test", mesh="1")
a = np.ones((8, 1024), np.float32)
together = threading.Barrier(4)
def run(_):
    together.wait()
    return float(kernel(a=a, b=a).output("out")[0, 0])
with ThreadPoolExecutor(4) as pool:
    print(list(pool.map(run, range(4))))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[2.0, 2.0, 2.0, 2.0]"


def test_compiling_without_a_writable_cache_still_gives_a_kernel(monkeypatch, tmp_path):
    mkemu.compile_source(SCALE, hw="test", mesh="1")()   # the emulator's modules: loaded already
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))          # no folder can be made under a file
    monkeypatch.setattr(tempfile, "tempdir", str(blocked))
    # (a text never compiled before: nothing to find in the cache)
    kernel = mkemu.compile_source(SCALE + "// uncached\n", hw="test", mesh="1")
    x = np.full((8, 128), 3, np.float32)
    np.testing.assert_array_equal(kernel(x=x).output("y"), 2 * x)


def test_threads_of_one_process_all_find_the_cache_writable(monkeypatch, tmp_path):
    from mkemu.cache import cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    together = threading.Barrier(8)

    def probe(_):
        together.wait()
        return {cache_dir("programs") for _ in range(300)}

    with ThreadPoolExecutor(8) as pool:
        found = set().union(*pool.map(probe, range(8)))
    # (not the temporary fallback: one thread unlinking another's probe made it look unwritable)
    assert found == {tmp_path / "mkemu" / "programs"}


def test_a_runs_inputs_are_its_own_when_the_caller_refills_the_arrays():
    kernel = mkemu.compile("vector_add", hw="test", mesh="1")
    a = np.arange(8 * 1024, dtype=np.float32).reshape(8, 1024)
    b = np.ones((8, 1024), np.float32)
    first = kernel(a=a, b=b)
    a[:] = 5                         # the next variant's inputs, in the same arrays
    second = kernel(a=a, b=b)
    assert first.check() is None and second.check() is None
    assert first.inputs["a@0"][0, 1] == 1


def test_a_chip_key_of_thousands_of_digits_is_a_config_error():
    kernel = mkemu.compile("vector_add", hw="test", mesh="1")
    key = "a@" + "9" * 5000
    with pytest.raises(mkemu.ConfigError, match="chip must be 0..0"):
        kernel({key: np.ones((8, 1024), np.float32)})
    run = kernel()
    with pytest.raises(mkemu.ConfigError, match="chip must be 0..0"):
        run.check({"out@" + "1" * 5000: np.ones((8, 1024), np.float32)})


@pytest.mark.parametrize("checks", [[1], [None, "races"], ["races", 2.5]])
def test_checks_named_by_what_is_not_a_name_are_config_errors(checks):
    with pytest.raises(mkemu.ConfigError, match="unknown check") as info:
        mkemu.Options(checks=checks)
    assert info.value.key == "checks"


@pytest.mark.parametrize("field", ["hw", "trace", "model", "dump", "routing", "record_routing"])
def test_a_path_option_with_a_nul_character_is_a_config_error(field):
    with pytest.raises(mkemu.ConfigError, match="NUL") as info:
        mkemu.Options(**{field: "x\0.toml"})
    assert info.value.key == field


def test_a_source_filename_or_inputs_file_with_a_nul_character_is_a_config_error():
    with pytest.raises(mkemu.ConfigError, match="NUL") as info:
        mkemu.compile_source(SCALE, filename="x\0.mk", hw="test", mesh="1")
    assert info.value.key == "filename"
    kernel = mkemu.compile_source(SCALE, hw="test", mesh="1")
    with pytest.raises(mkemu.ConfigError, match="NUL") as info:
        kernel("in\0.npz")
    assert info.value.key == "inputs"


def test_a_session_names_a_core_outside_the_machine():
    session = mkemu.compile_source(SCALE, hw="test", mesh="1").session()
    with pytest.raises(mkemu.ConfigError, match="core must be a global core id 0..1, not 2"):
        session.feed_readbacks([1], core=2)


def test_the_errors_a_driving_program_parses_carry_the_documented_fields(tmp_path):
    from mkemu.errors import EmulatorFault, SourceError

    with pytest.raises(SourceError) as info:
        mkemu.compile_source(SCALE.replace("v = v + v;", "v = v + ;"), filename=tmp_path / "k.mk", hw="test")
    (first, *_) = info.value.diagnostics
    span = first.span
    assert (span.file, span.line, span.column) == (str(tmp_path / "k.mk"), 7, 13)
    assert (span.end_line, span.end_column) == (7, 14) and first.source_line.strip() == "v = v + ;"
    assert isinstance(info.value, mkemu.MkemuError) and first.message

    racy = SCALE.replace("    wait copy(x, v, s);\n    v = v + v;", "    v = v + v;\n    wait copy(x, v, s);")
    kernel = mkemu.compile_source(racy, filename="racy.mk", hw="test", mesh="1")
    for _ in range(2):   # the kernel runs again after a fault, and faults the same way
        with pytest.raises(EmulatorFault) as info:
            kernel()
        fault = info.value
        assert (fault.kind, fault.chip, fault.core) == ("race", 0, 0)
        assert fault.cycle > 0 and fault.pc >= 0 and fault.instruction and fault.source == "racy.mk:6:9: v = v + v;"

    # The command line: the error on stderr, nothing on stdout even with --json, exit 1.
    program = tmp_path / "racy.mk"
    program.write_text(racy)
    done = subprocess.run([sys.executable, "-m", "mkemu.cli", "run", str(program), "--hw", "test", "--mesh", "1",
                           "--json"], capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("fault [race] at chip 0, core 0")
