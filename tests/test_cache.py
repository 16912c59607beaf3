"""Compiled programs kept in the user cache: a repeat compile is a hit, and anything the
program depends on (its text, an imported file, params, profile, the path as named)
makes a fresh compile. Generated modules not compiled yet are imported by one process
at a time."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mkemu
from mkemu.api import build_program
from mkemu import cache
from mkemu.cache import cached_program
from mkemu.isa.hardware import load_profile

MAIN = """import "lib.mk";
kernel k(x: hbm f32[8, N], y: hbm f32[8, N]) {
    vmem v: f32[8, N];
    sem s;
    start copy(x, v, s);
    wait copy(x, v, s);
    v = v + v;
    start copy(v, y, s);
    wait copy(v, y, s);
}
host {
    input x: f32[8, N];
    output y: f32[8, N];
    launch k(x, y);
}
"""


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "MIN_PARSED_CHARS", 0)     # (these programs are short)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lib.mk").write_text("const N = 128;\n")
    (tmp_path / "main.mk").write_text(MAIN)
    return tmp_path


def compile_counted(path: str, text: str, profile, params=None):
    calls = []

    def build():
        calls.append(1)
        from mkemu.dsl.compiler import compile_program
        from mkemu.dsl.frontend import load_program

        loaded = load_program(path, params, text=text)
        return compile_program(loaded, profile), loaded.sources

    program, hit = cached_program(path, text, profile, params or {}, build)
    assert hit == (not calls)
    return program, hit


def test_a_repeat_compile_comes_from_the_cache(cache_home):
    profile = load_profile("test")
    first, hit1 = compile_counted("main.mk", MAIN, profile)
    second, hit2 = compile_counted("main.mk", MAIN, profile)
    assert (hit1, hit2) == (False, True)
    assert [k.code.tobytes() for k in first.kernels.values()] == [k.code.tobytes() for k in second.kernels.values()]
    assert build_program("main.mk", MAIN, profile, {}).kernels.keys() == first.kernels.keys()


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "old format"])
def test_a_damaged_entry_is_compiled_afresh_and_written_over(cache_home, damage):
    # A flipped bit in the code words loaded as another program (a race or an
    # out-of-bounds fault blamed on the source); others raised OverflowError,
    # IndexError or MemoryError from the unpickling, on every later run.
    import pickle

    profile = load_profile("test")
    first, _ = compile_counted("main.mk", MAIN, profile)
    (entry,) = (cache_home / "cache" / "mkemu" / "programs").glob("*.pkl")
    data = bytearray(entry.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 1
    elif damage == "truncate":
        data = data[:len(data) - 7]
    elif damage == "empty":
        data = bytearray()
    else:   # the entry as it was written before it carried a checksum
        data = bytearray(pickle.dumps(pickle.loads(bytes(data[len(cache.ENTRY_MAGIC) + 32:]))))
    entry.write_bytes(bytes(data))
    again, hit = compile_counted("main.mk", MAIN, profile)
    assert not hit and again.kernels["k"].code.tobytes() == first.kernels["k"].code.tobytes()
    assert compile_counted("main.mk", MAIN, profile)[1]      # (written over: a hit again)


def test_an_edited_import_is_compiled_afresh(cache_home):
    profile = load_profile("test")
    before, _ = compile_counted("main.mk", MAIN, profile)
    (cache_home / "lib.mk").write_text("const N = 256;\n")
    after, hit = compile_counted("main.mk", MAIN, profile)
    assert not hit
    assert before.kernels["k"].code.tobytes() != after.kernels["k"].code.tobytes()


def test_text_profile_and_path_are_part_of_the_key(cache_home):
    test, v7 = load_profile("test"), load_profile("tpu-v7-like")
    compile_counted("main.mk", MAIN, test)
    assert not compile_counted("main.mk", MAIN.replace("v + v", "v * v"), test)[1]
    assert not compile_counted("main.mk", MAIN, v7)[1]
    program, hit = compile_counted(str(cache_home / "main.mk"), MAIN, test)
    assert not hit   # spans name the file as given, so an absolute path is another program
    assert program.kernels["k"].source_map[0].file == str(cache_home / "main.mk")


def test_copies_of_one_profile_file_share_entries_and_any_other_value_does_not(cache_home):
    """Where a profile was read from is no part of the key (a test or a sweep writes the
    same profile into folder after folder); every value in it is."""
    def written(folder: str, vmem: int = 4 << 20):
        path = cache_home / folder / "hw.toml"
        path.parent.mkdir()
        path.write_text(f'extends = "test"\n[core]\nvmem_bytes = {vmem}\n')
        return load_profile(str(path))

    one, copy, other = written("a"), written("b"), written("c", 2 << 20)
    assert one.source != copy.source
    assert not compile_counted("main.mk", MAIN, one)[1]
    assert compile_counted("main.mk", MAIN, copy)[1]
    assert not compile_counted("main.mk", MAIN, other)[1]


# -- arrays ---------------------------------------------------------------------------

def test_kept_arrays_come_back_equal_and_read_only(cache_home):
    import numpy as np

    from mkemu.cache import cached_arrays

    calls = []
    made = [np.arange(12, dtype=np.uint16).reshape(3, 4), np.array([7, 8], np.uint16)]

    def build():
        calls.append(1)
        return [a.copy() for a in made]

    first = cached_arrays("k", np.uint16, [(3, 4), (2,)], build)
    second = cached_arrays("k", np.uint16, [(3, 4), (2,)], build)
    assert len(calls) == 1
    for a, b in zip(made, second):
        assert b.dtype == a.dtype and np.array_equal(a, b)
        assert not b.flags.writeable
    assert all(np.array_equal(a, b) for a, b in zip(first, made))
    # A kept file of another size is not trusted: the arrays are made again.
    cached_arrays("k", np.uint16, [(3, 5), (2,)], lambda: [np.zeros((3, 5), np.uint16), made[1]])
    assert np.array_equal(cached_arrays("k", np.uint16, [(3, 5), (2,)], build)[0], np.zeros((3, 5)))
    assert len(calls) == 1


def _kept_arrays_file(cache_home, key: str):
    from mkemu.cache import cache_dir

    return cache_dir("arrays") / f"{key}.npy"


@pytest.mark.parametrize("damage", ["flip a data byte", "flip a checksum byte", "cut short", "add a byte",
                                    "swap two words", "one bit flipped up and one down",
                                    "no checksum (an earlier version's file)"])
def test_a_damaged_kept_array_file_is_made_afresh_and_written_over(cache_home, damage):
    import numpy as np

    from mkemu.cache import cached_arrays

    made = [np.arange(12, dtype=np.uint16).reshape(3, 4), np.array([7, 8], np.uint16)]
    calls = []

    def build():
        calls.append(1)
        return [a.copy() for a in made]

    shapes = [(3, 4), (2,)]
    cached_arrays("k", np.uint16, shapes, build)
    path = _kept_arrays_file(cache_home, "k")
    data = bytearray(path.read_bytes())
    at = np.load(path, mmap_mode="r").offset + 2          # the second value of the first array
    if damage == "flip a data byte":
        data[at] ^= 0x10
    elif damage == "flip a checksum byte":
        data[-1] ^= 1
    elif damage == "cut short":
        del data[-5:]
    elif damage == "add a byte":
        data += b"\0"
    elif damage == "swap two words":            # (values 0..3 and 4..7: an XOR and a sum of words miss it)
        data[at - 2:at + 14] = data[at + 6:at + 14] + data[at - 2:at + 6]
    elif damage == "one bit flipped up and one down":
        data[at - 2] ^= 4                        # (value 0 becomes 4 and value 4 becomes 0: the same
        data[at + 6] ^= 4                        # bit of two words, as above)
    else:                                     # a plain .npy file of the right type and size
        np.save(path, np.full(14, 99, np.uint16))
        data = bytearray(path.read_bytes())
    path.write_bytes(bytes(data))
    again = cached_arrays("k", np.uint16, shapes, build)
    assert len(calls) == 2                    # the damaged bytes are not used: made afresh
    assert all(np.array_equal(a, b) for a, b in zip(made, again))
    # ... and written over: the next call reads the repaired file back.
    kept = cached_arrays("k", np.uint16, shapes, build)
    assert len(calls) == 2
    assert all(np.array_equal(a, b) for a, b in zip(made, kept))
    assert not list(path.parent.glob(".*.tmp"))


def test_a_kept_array_file_is_still_a_npy_file(cache_home):
    import numpy as np

    from mkemu.cache import cached_arrays

    cached_arrays("k", np.int32, [(2, 3)], lambda: [np.arange(6, dtype=np.int32).reshape(2, 3)])
    assert np.array_equal(np.load(_kept_arrays_file(cache_home, "k")), np.arange(6))


def test_array_cache_keeps_at_most_its_byte_budget(cache_home, monkeypatch):
    import numpy as np

    import mkemu.cache as cache

    monkeypatch.setattr(cache, "MAX_ARRAY_BYTES", 3000)
    for k in range(4):
        cache.cached_arrays(f"a{k}", np.uint8, [(1000,)], lambda: [np.full(1000, k, np.uint8)])
    kept = sorted(p.name for p in cache.cache_dir("arrays").glob("*.npy"))
    assert len(kept) == 2 and "a3.npy" in kept


def test_only_the_module_versions_used_last_are_kept_with_their_compiled_files(cache_home, monkeypatch):
    import os
    import sys

    import mkemu.cache as cache

    monkeypatch.setattr(cache, "MAX_MODULES", 3)
    directory = cache.cache_dir()
    (directory / "__pycache__").mkdir(exist_ok=True)

    def make(k: int, used_at: float) -> str:
        name = cache.module_in_cache("mkemu_evicttest", f"VALUE = {k}\n").__name__
        monkeypatch.delitem(sys.modules, name)          # (as if each ran in a process of its own)
        (directory / "__pycache__" / f"{name}.run-1.py311.nbi").write_text("numba's index")
        os.utime(directory / f"{name}.used", (used_at, used_at))
        return name

    def kept() -> set[str]:
        return {p.stem for p in directory.glob("mkemu_evicttest_*.py")}

    names = [make(k, 1000.0 + k) for k in range(5)]
    assert kept() == set(names[2:])
    for gone in names[:2]:
        assert not list(directory.glob(f"{gone}.*")) and not list((directory / "__pycache__").glob(f"{gone}.*"))
    assert (directory / "__pycache__" / f"{names[4]}.run-1.py311.nbi").exists()
    # Using an old version again keeps it: the next new one drops the least recently used.
    assert cache.module_in_cache("mkemu_evicttest", "VALUE = 2\n").VALUE == 2
    assert (directory / f"{names[2]}.used").stat().st_mtime > 1004.0
    newest = make(5, 1500.0)
    assert kept() == {names[2], names[4], newest}


def test_the_first_compile_of_a_module_version_is_announced_on_a_terminal(cache_home, monkeypatch):
    import io
    import sys

    import mkemu.cache as cache

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    said = Terminal()
    monkeypatch.setattr(sys, "stderr", said)
    what = "compiling the test module"
    name = cache.module_in_cache("mkemu_announcetest", "VALUE = 1\n", announce=what).__name__
    assert said.getvalue() == "mkemu: compiling the test module ...\n"
    monkeypatch.delitem(sys.modules, name)     # a later process: compiled already, nothing said
    assert cache.module_in_cache("mkemu_announcetest", "VALUE = 1\n", announce=what).VALUE == 1
    assert said.getvalue().count("compiling") == 1
    # An import that fails leaves the version uncompiled: the next try says so again.
    for _ in range(2):
        with pytest.raises(ZeroDivisionError):
            cache.module_in_cache("mkemu_announcetest", "VALUE = 1 / 0\n", announce=what)
    assert said.getvalue().count("compiling") == 3
    # Not a terminal (a pipe, a test's capture): nothing is said.
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    cache.module_in_cache("mkemu_announcetest", "VALUE = 2\n", announce=what)
    assert piped.getvalue() == ""


def test_two_checkouts_share_an_entry_while_their_files_agree(cache_home, monkeypatch):
    """Relative names are read relative to the current directory: the same files at
    another place are the same program; a different imported file there is not."""
    profile = load_profile("test")
    other = cache_home / "elsewhere"
    other.mkdir()
    (other / "lib.mk").write_text("const N = 128;\n")
    compile_counted("main.mk", MAIN, profile)
    monkeypatch.chdir(other)
    program, hit = compile_counted("main.mk", MAIN, profile)
    assert hit and program.kernels["k"].source_map[0].file == "main.mk"
    (other / "lib.mk").write_text("const N = 256;\n")
    assert not compile_counted("main.mk", MAIN, profile)[1]


def test_the_program_cache_keeps_its_entry_and_byte_budget(cache_home, monkeypatch):
    import mkemu.cache as cache

    monkeypatch.setattr(cache, "MAX_PROGRAMS", 3)
    monkeypatch.setattr(cache, "EVICT_EVERY", 1)
    profile = load_profile("test")
    for n in range(6):
        compile_counted("main.mk", MAIN.replace("v + v", f"v + v + {n}.0"), profile)
    assert len(list((cache_home / "cache" / "mkemu" / "programs").glob("*.pkl"))) == 3
    monkeypatch.setattr(cache, "MAX_PROGRAM_BYTES", 1)
    compile_counted("main.mk", MAIN, profile)
    assert len(list((cache_home / "cache" / "mkemu" / "programs").glob("*.pkl"))) == 1


def test_a_program_reading_the_shipped_library_is_kept_for_that_library_only(cache_home, monkeypatch):
    """Its spans name the library's files by absolute path: a library elsewhere (another
    install or checkout) compiles it afresh."""
    import mkemu.cache as cache

    text = 'import "mkemu:lib/collectives.mk";\n' + MAIN
    profile = load_profile("test")
    compile_counted("main.mk", text, profile)
    compile_counted("main.mk", MAIN, profile)
    assert compile_counted("main.mk", text, profile)[1]
    monkeypatch.setattr(cache, "_shipped_root", lambda: str(cache_home / "another-install"))
    assert not compile_counted("main.mk", text, profile)[1]
    assert compile_counted("main.mk", MAIN, profile)[1]     # it read no shipped file: still kept


SLOW_MODULE = """
import time
with open(LOG, "a") as fh:
    fh.write(f"start {time.monotonic()}\\n")
time.sleep(0.5)
with open(LOG, "a") as fh:
    fh.write(f"end {time.monotonic()}\\n")
"""

GATED_IMPORT = """
import os, sys, time
from mkemu.cache import module_in_cache
open(sys.argv[1] + ".ready", "w").close()
while not os.path.exists(sys.argv[2]):     # (all three import at once)
    time.sleep(0.005)
module_in_cache("mkemu_slowtest", sys.argv[3])
"""


def test_processes_importing_a_version_not_yet_compiled_take_turns(tmp_path):
    """The first import of a generated module (numba compiling it) runs in one process
    at a time: the others wait, then load what it compiled."""
    log, go = tmp_path / "log", tmp_path / "go"
    source = f"LOG = {str(log)!r}\n" + SLOW_MODULE
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", GATED_IMPORT, str(tmp_path / str(n)), str(go), source],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(3)]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"{n}.ready").exists() for n in range(3)) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.write_text("")
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outs]
    events = [line.split() for line in log.read_text().splitlines()]
    assert [kind for kind, _ in events] == ["start", "end"] * 3     # never two at once
    assert all(float(events[i][1]) <= float(events[i + 1][1]) for i in range(len(events) - 1))
    marked = list((tmp_path / "cache" / "mkemu").glob("mkemu_slowtest_*.compiled"))
    assert len(marked) == 1


def test_a_relative_xdg_cache_home_is_ignored(tmp_path, monkeypatch):
    """The XDG spec: a relative XDG_CACHE_HOME is invalid (each folder would get a cache
    of its own, compiling the issue loop again)."""
    from mkemu.cache import cache_dir

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    monkeypatch.chdir(tmp_path)
    assert cache_dir() == tmp_path / "home" / ".cache" / "mkemu"
    assert not (tmp_path / "relative").exists()


def test_the_temporary_fallback_must_be_the_user_s_own(tmp_path, monkeypatch):
    """With the user's cache unwritable, the per-user folder under the temporary
    directory is used, but not one other users may write to (modules there are imported)."""
    from mkemu import cache

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))           # (a file: no folder can be made in it)
    monkeypatch.setattr(cache.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    shared = tmp_path / "tmp" / f"mkemu-cache-{os.getuid()}"
    assert cache.cache_dir() == shared and shared.stat().st_mode & 0o777 == 0o700
    shared.chmod(0o777)                                          # (as if another user had made it)
    with pytest.raises(mkemu.ConfigError, match="no writable cache directory for mkemu"):
        cache.cache_dir()


EAGER = "from numba import njit\n\n@njit('int64(int64)', cache=True)\ndef twice(x):\n    return 2 * x\n"
LAZY = "from numba import njit\n\n@njit(cache=True)\ndef twice(x):\n    return 2 * x\n"


def _truncate_compiled(directory, stem: str, pattern: str) -> int:
    files = list((directory / "__pycache__").glob(f"{stem}.{pattern}"))
    for file in files:
        file.write_bytes(file.read_bytes()[:20])
    return len(files)


def _fresh(name: str) -> None:
    import sys

    sys.modules.pop(name, None)


def test_a_damaged_compiled_file_of_a_module_compiled_at_import_is_compiled_afresh(cache_home):
    # A truncated numba index or data file raised from numba on every run.
    for pattern in ("*.nbi", "*.nbc"):
        source = EAGER + f"# {pattern}\n"
        module = cache.module_in_cache("mkemu_eagertest", source)
        assert module.twice(21) == 42
        _fresh(module.__name__)
        assert _truncate_compiled(cache.cache_dir(), module.__name__, pattern) >= 1, pattern
        again = cache.module_in_cache("mkemu_eagertest", source)
        assert again is not module and again.twice(4) == 8
        _fresh(module.__name__)


def test_a_damaged_compiled_file_of_a_module_compiled_at_first_call_is_cleared(cache_home):
    # Loaded at a function's first call, outside the import: the error is said as the
    # cache's (mkemu's command line prints one line) and the module's files are dropped,
    # so the next process compiles it afresh.
    module = cache.module_in_cache("mkemu_lazytest", LAZY)
    assert module.twice(21) == 42
    _fresh(module.__name__)
    assert _truncate_compiled(cache.cache_dir(), module.__name__, "*.nbi") == 1
    damaged = cache.module_in_cache("mkemu_lazytest", LAZY)
    with pytest.raises(Exception) as info:
        damaged.twice(3)
    assert cache.damaged_compiled_code(info.value)
    assert not list((cache.cache_dir() / "__pycache__").glob(f"{module.__name__}.*"))
    _fresh(module.__name__)
    assert cache.module_in_cache("mkemu_lazytest", LAZY).twice(5) == 10
    assert not cache.damaged_compiled_code(ValueError("not from numba's cache"))
    _fresh(module.__name__)


@given(data=st.binary(max_size=80), cuts=st.lists(st.integers(0, 80), max_size=4), flip=st.integers(0, 639),
       swap=st.tuples(st.integers(0, 9), st.integers(0, 9)))
def test_an_array_files_checksum_does_not_depend_on_how_its_bytes_arrive_and_sees_damage(data, cuts, flip, swap):
    import numpy as np

    from mkemu.cache import ArrayCheck

    def check(raw: bytes, parts=()) -> bytes:
        c, at = ArrayCheck(), 0
        for cut in sorted(min(p, len(raw)) for p in parts) + [len(raw)]:
            c.update(np.frombuffer(raw[at:cut], np.uint8))
            at = cut
        return c.digest()

    assert check(data, cuts) == check(data)
    if data:
        damaged = bytearray(data)
        damaged[flip // 8 % len(data)] ^= 1 << flip % 8
        assert check(bytes(damaged)) != check(data)
    words = [data[i:i + 8] for i in range(0, len(data) - len(data) % 8, 8)]
    i, j = (k % len(words) for k in swap) if words else (0, 0)
    if words and words[i] != words[j]:        # two 8-byte words swapped
        words[i], words[j] = words[j], words[i]
        assert check(b"".join(words) + data[len(words) * 8:]) != check(data)


def test_a_module_version_counts_as_compiled_once_an_import_of_it_completed(cache_home, monkeypatch):
    import sys

    import mkemu.cache as cache

    assert not cache.compiled_in_cache("mkemu_readytest", "VALUE = 1\n", "dep")
    with pytest.raises(ZeroDivisionError):
        cache.module_in_cache("mkemu_readytest", "VALUE = 1 / 0\n", "dep")
    assert not cache.compiled_in_cache("mkemu_readytest", "VALUE = 1 / 0\n", "dep")
    name = cache.module_in_cache("mkemu_readytest", "VALUE = 1\n", "dep").__name__
    monkeypatch.delitem(sys.modules, name)
    assert cache.compiled_in_cache("mkemu_readytest", "VALUE = 1\n", "dep")
    # (another source, or the same one depending on something else, is another version)
    assert not cache.compiled_in_cache("mkemu_readytest", "VALUE = 2\n", "dep")
    assert not cache.compiled_in_cache("mkemu_readytest", "VALUE = 1\n", "other")


def _counted_parse(calls: list):
    from mkemu.dsl.parser import _parse_afresh

    def parse(text, name):
        calls.append(name)
        return _parse_afresh(text, name)
    return parse


def test_a_parsed_file_is_kept_per_text_and_name_and_loads_as_the_same_tree(cache_home):
    from mkemu.dsl.parser import _parse_afresh

    calls = []
    first = cache.cached_parse(MAIN, "main.mk", _counted_parse(calls), "v1")
    again = cache.cached_parse(MAIN, "main.mk", _counted_parse(calls), "v1")
    assert calls == ["main.mk"] and again == first == _parse_afresh(MAIN, "main.mk")
    # The spans name the file: another name, another parser version or another text is parsed afresh.
    other = cache.cached_parse(MAIN, "other.mk", _counted_parse(calls), "v1")
    assert other.items[1].span.file == "other.mk" != first.items[1].span.file
    cache.cached_parse(MAIN, "main.mk", _counted_parse(calls), "v2")
    cache.cached_parse(MAIN + "\n", "main.mk", _counted_parse(calls), "v1")
    assert calls == ["main.mk", "other.mk", "main.mk", "main.mk"]


def test_a_damaged_parse_entry_is_parsed_afresh_and_a_syntax_error_is_not_kept(cache_home):
    from mkemu.errors import SourceError

    calls = []
    first = cache.cached_parse(MAIN, "main.mk", _counted_parse(calls), "v1")
    (entry,) = (cache_home / "cache" / "mkemu" / "parsed").glob("*.pkl")
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 1
    entry.write_bytes(bytes(data))
    assert cache.cached_parse(MAIN, "main.mk", _counted_parse(calls), "v1") == first and len(calls) == 2
    assert cache.cached_parse(MAIN, "main.mk", _counted_parse(calls), "v1") == first and len(calls) == 2
    for _ in range(2):
        with pytest.raises(SourceError, match="main.mk:1"):
            cache.cached_parse("kernel k( {", "main.mk", _counted_parse(calls), "v1")
    assert len(calls) == 4 and len(list(entry.parent.glob("*.pkl"))) == 1


def test_a_program_compiled_from_kept_syntax_trees_is_the_same_program(cache_home):
    from mkemu.dsl import parser

    profile = load_profile("test")
    parser._parse_text.cache_clear()     # (texts this process parsed before are kept in memory)
    first, _ = compile_counted("main.mk", MAIN, profile)
    assert len(list((cache_home / "cache" / "mkemu" / "parsed").glob("*.pkl"))) == 2   # main.mk, lib.mk
    for entry in (cache_home / "cache" / "mkemu" / "programs").glob("*.pkl"):
        entry.unlink()
    parser._parse_text.cache_clear()     # (as in a new process: only the kept trees)
    again, hit = compile_counted("main.mk", MAIN, profile)
    assert not hit and again.kernels["k"].code.tobytes() == first.kernels["k"].code.tobytes()


def test_an_entry_that_is_not_a_regular_file_or_holds_another_key_is_a_miss(cache_home):
    calls = []
    first = cache.cached_parse(MAIN, "main.mk", _counted_parse(calls), "v1")
    (entry,) = (cache_home / "cache" / "mkemu" / "parsed").glob("*.pkl")
    # A named pipe in an entry's place was opened and read: the compile blocked for good.
    entry.unlink()
    os.mkfifo(entry)
    assert cache.cached_parse(MAIN, "main.mk", _counted_parse(calls), "v1") == first and len(calls) == 2
    assert entry.is_file()       # (written over)
    # The kept tree of another text copied onto this text's entry passes the checksum.
    other = cache.cached_parse(MAIN.replace("v + v", "v * v"), "main.mk", _counted_parse(calls), "v1")
    (other_entry,) = set((cache_home / "cache" / "mkemu" / "parsed").glob("*.pkl")) - {entry}
    entry.write_bytes(other_entry.read_bytes())
    assert cache.cached_parse(MAIN, "main.mk", _counted_parse(calls), "v1") == first != other
    assert len(calls) == 4


def test_eviction_leaves_what_it_cannot_remove_and_drops_orphaned_temporaries(tmp_path):
    for k in range(4):
        (tmp_path / f"{k}.pkl").write_bytes(b"x")
        os.utime(tmp_path / f"{k}.pkl", (1000 + k, 1000 + k))
    (tmp_path / "old.pkl").mkdir()                      # the least recently used: not removable by unlink
    os.utime(tmp_path / "old.pkl", (1, 1))
    orphan, fresh = tmp_path / ".5.pkl.99.1.tmp", tmp_path / ".6.pkl.99.1.tmp"
    orphan.write_bytes(b"half")
    fresh.write_bytes(b"being written")
    os.utime(orphan, (time.time() - cache.STALE_WRITE_S - 10,) * 2)
    cache._evict(tmp_path, max_entries=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".6.pkl.99.1.tmp", "2.pkl", "3.pkl", "old.pkl"]


def test_the_compiler_fingerprint_covers_the_span_class_every_tree_holds(monkeypatch, tmp_path):
    import mkemu.errors

    before = cache.compiler_fingerprint()
    changed = tmp_path / "errors.py"
    changed.write_text(open(mkemu.errors.__file__).read() + "\n# another version\n")
    monkeypatch.setattr(mkemu.errors, "__file__", str(changed))
    monkeypatch.setattr(cache, "_fingerprint", None)
    assert cache.compiler_fingerprint() != before


def test_a_short_text_is_parsed_each_time_and_not_kept(cache_home, monkeypatch):
    monkeypatch.setattr(cache, "MIN_PARSED_CHARS", len(MAIN) + 1)
    calls = []
    for _ in range(2):
        cache.cached_parse(MAIN, "main.mk", _counted_parse(calls), "v1")
    assert len(calls) == 2 and not list((cache_home / "cache" / "mkemu").glob("parsed/*.pkl"))
