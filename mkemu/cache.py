"""The user cache directory, and compiled `.mk` programs kept in it.

Compiling a large program (the K3 megakernel and its imports) takes about half a
second, and the same program is compiled with the same parameters over and over (every
`mkemu run`, every test). A compiled program is therefore kept, pickled, under a key
that hashes everything its output depends on: the compiler's own sources, the main
file's name and text, the parameters and the hardware profile (its values, not the
file it was read from). The entry also records every file the compile read (imports
included) with a hash of its text; an entry whose files changed is compiled afresh, and
so is one whose bytes no longer match the checksum it was written with (a damaged file). A
relative name is read relative to the current directory, so two checkouts at different
places share the entries of the files they hold alike (a program that read the shipped
library's files, named by absolute path, only with the library at the same place).
About `MAX_PROGRAMS` entries and `MAX_PROGRAM_BYTES` are kept; the least recently used
beyond them are dropped (looked for at every `EVICT_EVERY`-th store of a process: a
test suite stores a thousand programs, most of them written once to temporary files,
and a scan of the directory at each store would cost more than the compiles it saves).

Modules compiled by numba (the issue loop, the flow model's kernels) are written into
the same directory under a name that hashes their source (`module_in_cache`), so
numba's on-disk cache next to them is keyed by content: compiled once per machine and
version whether mkemu runs from a checkout, a read-only one or a fresh install. A
process compiling a version holds a lock file next to it, so others that import it
meanwhile wait and then load the compiled code rather than compile it too. Of each
kind, the `MAX_MODULES` versions used last are kept (the issue loop's compiled code is
3 MB a version); older ones go, with numba's cache of them.

The syntax tree of each `.mk` file parsed is kept too (`cached_parse`, a `parsed`
folder): parsing is most of a cold compile of a large program.
The `.mk` parser's LALR tables (Lark's pickle of them, `dsl/parser.py`) are kept in a
`grammar` folder of the same directory, which only this user can write (Lark's own
`cache=True` would load a pickle of a predictable name from the shared temporary folder).

Arrays that take longer to make than to read back (the K3 weights of a model and
seed: a second or more for 67 M parameters) are kept the same way by
`cached_arrays`, as one `.npy` file per key, memory-mapped on use, at most
`MAX_ARRAY_BYTES` in all. Each file ends with `ARRAYS_MAGIC` and a checksum of its
data (`ArrayCheck`: its CRC-32 and length; numpy ignores bytes after the data, so it is
still a `.npy` file); one that fails it (flipped bits, words or pages swapped or zeroed,
a truncated write, a file of an earlier version) is made afresh and written over, never
used. The checksum is read on every run: about 60 ms for the 133 MB of k3-mini's
weights, where a SHA-256 took 0.1-0.2 s of a 3 s run. It guards against damage, not
against someone forging a file.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import math
import os
import pickle
import struct
import stat
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

try:
    import fcntl
except ImportError:     # (not on Windows)
    fcntl = None

from mkemu.errors import ConfigError
from mkemu.shipped import programs_root

MAX_PROGRAMS = 4096
MAX_PROGRAM_BYTES = 256 << 20
EVICT_EVERY = 16     # program stores per process between looks for entries to drop
MAX_PARSED = 4096    # syntax trees of `.mk` files kept (`cached_parse`)
MAX_PARSED_BYTES = 128 << 20
MIN_PARSED_CHARS = 2048   # shorter texts are parsed each time (about 20 ms or less)
MAX_ARRAY_BYTES = 1 << 30
MAX_MODULES = 8      # versions kept of each kind of generated module
STALE_WRITE_S = 3600  # a temporary file of a write this old is an orphan (`_evict`)
# A kept entry's file (a program, a syntax tree): this, the SHA-256 of the rest, then the pickled entry.
ENTRY_MAGIC = b"mkemu-program-1\n"
# A kept array's file: a .npy file, then this and the `ArrayCheck` of its data.
ARRAYS_MAGIC = b"mkemu-arrays-3\n"


class NoCacheDirectory(ConfigError, OSError):
    """No cache directory can be written: an OSError to the caches that do without
    (compiled programs, arrays), a one-line error where the code must be compiled."""


def cache_dir(sub: str = "") -> Path:
    """A writable directory for mkemu's caches: `$XDG_CACHE_HOME/mkemu` (an absolute
    `XDG_CACHE_HOME` only, as the XDG spec says) or `~/.cache/mkemu`, else a per-user
    temporary directory, used only if this user owns it and no one else may write to it
    (its code is imported: another user must not be able to plant a module there)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    shared = Path(tempfile.gettempdir()) / f"mkemu-cache-{uid}"
    for root in (Path(base) / "mkemu", shared):
        candidate = root / sub if sub else root
        try:
            if root == shared:
                root.mkdir(mode=0o700, exist_ok=True)
                st = os.lstat(root)
                if hasattr(os, "getuid") and (st.st_uid != uid or not stat.S_ISDIR(st.st_mode)
                                              or st.st_mode & 0o022):
                    continue
            candidate.mkdir(parents=True, exist_ok=True)
            if takes_files(candidate):
                return candidate
        except OSError:
            continue
    raise NoCacheDirectory(f"no writable cache directory for mkemu: neither {Path(base) / 'mkemu'} nor {shared} "
                      "(one of this user's own) can be written; set XDG_CACHE_HOME to a writable folder",
                      key="XDG_CACHE_HOME")


def takes_files(folder) -> bool:
    """Whether a file can be made in `folder`: one is made there (a temporary file of
    this call's own, gone when closed), as `os.access` says yes to root whatever the file
    system (a read-only mount, /sys) then refuses."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def module_in_cache(prefix: str, source: str, *depends: str, announce: str | None = None,
                    while_compiling: Callable[[], contextlib.AbstractContextManager] | None = None) -> ModuleType:
    """`source` imported as a module written to the cache directory, named `prefix`
    plus a hash of the source and `depends` (other texts its compiled code depends on,
    e.g. versions); imported once per process.

    `announce` is what importing it does the first time on this machine (numba
    compiling it, which can take a minute): said on a terminal's stderr before a
    version with no compiled code yet is imported, so a first run does not look hung
    (`mkemu: <announce> ...`). A version counts as compiled once an import of it has
    completed (a `.compiled` marker next to it). `while_compiling()`, a context manager,
    is entered around that first import, in the process that makes it."""
    name = _module_name(prefix, source, depends)
    # One thread imports a module while the others wait for it: a module is in
    # sys.modules from before it runs (see below), so a second thread that looked
    # there unguarded would take it half-imported, without its functions. A lock per
    # module, not one for all: flows.py calls this while Python holds its own import
    # lock, and one shared lock could then deadlock against the loop's import.
    with _import_lock(name):
        module = sys.modules.get(name)
        if module is not None:
            return module
        return _import_module(name, prefix, source, announce, while_compiling)


def compiled_in_cache(prefix: str, source: str, *depends: str) -> bool:
    """Would `module_in_cache` with these arguments load compiled code from the cache
    (a version compiled on this machine before), rather than compile it?"""
    try:
        path = cache_dir() / f"{_module_name(prefix, source, depends)}.py"
    except ConfigError:     # (no cache directory: nothing was compiled into one)
        return False
    return path.with_suffix(".compiled").exists() and path.is_file()


def _module_name(prefix: str, source: str, depends: tuple[str, ...]) -> str:
    """`prefix` plus a hash of the module's source and what its compiled code depends on."""
    return f"{prefix}_{hashlib.sha256(chr(0).join((source, *depends)).encode()).hexdigest()[:20]}"


_import_locks: dict[str, threading.RLock] = {}
_import_locks_guard = threading.Lock()


def _import_lock(name: str) -> threading.RLock:
    with _import_locks_guard:
        return _import_locks.setdefault(name, threading.RLock())


def _import_module(name: str, prefix: str, source: str, announce: str | None,
                   while_compiling: Callable[[], contextlib.AbstractContextManager] | None) -> ModuleType:
    path = cache_dir() / f"{name}.py"
    text = source.encode()
    if not path.is_file() or path.read_bytes() != text:
        _replace(path, lambda fh: fh.write(text))
        _evict(path.parent, f"{prefix}_*.py", MAX_MODULES, used=_module_used, files=_module_files)
    _touch(path.with_suffix(".used"))
    compiled = path.with_suffix(".compiled")
    if announce and not compiled.exists() and sys.stderr is not None and sys.stderr.isatty():
        print(f"mkemu: {announce} ...", file=sys.stderr, flush=True)
    with _compiling(path.with_suffix(".lock"), compiled):
        for attempt in (1, 2):
            first = while_compiling is not None and not compiled.exists()
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            # Registered before it runs: numba's cache finds the module again by name.
            sys.modules[name] = module
            try:
                with while_compiling() if first else contextlib.nullcontext():
                    spec.loader.exec_module(module)
                break
            except Exception:
                del sys.modules[name]
                if attempt == 2:
                    raise
                # A damaged file of what was compiled from it (numba's cache, Python's
                # bytecode: a truncated index raised from numba on every run): compiled afresh.
                _purge_compiled(path)
            except BaseException:
                del sys.modules[name]
                raise
        _touch(compiled)
    return module


def _purge_compiled(path: Path) -> None:
    """Drop what was compiled from the module at `path` (`_compiled_files`)."""
    for file in _compiled_files(path):
        file.unlink(missing_ok=True)


def damaged_compiled_code(exc: BaseException) -> bool:
    """Was `exc` raised reading numba's cache of a module compiled at its first call
    (the flow model's kernels: `module_in_cache` compiles the issue loop's at import,
    where a damaged file is compiled afresh)? Then the compiled code of the modules
    whose functions were loading (of every module, if none is named) is dropped, to be
    compiled afresh by the next run, and True."""
    modules, damaged = set(), False
    tb = exc.__traceback__
    while tb is not None:
        file = tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
        damaged = damaged or file.endswith("numba/core/caching.py")
        py_func = getattr(tb.tb_frame.f_locals.get("self"), "py_func", None)   # (a numba dispatcher's)
        if file.endswith("numba/core/dispatcher.py") and py_func is not None:
            modules.add(py_func.__module__)
        tb = tb.tb_next
    if not damaged:
        return False
    try:     # (the modules whose functions were loading, else every one)
        for module in cache_dir().glob("mkemu_*.py"):
            if module.stem in modules or not modules:
                _purge_compiled(module)
    except (OSError, ConfigError):
        pass
    return True


@contextlib.contextmanager
def _compiling(lock: Path, compiled: Path):
    """Held while a version with no compiled code yet is imported: one process compiles
    it, and any other that imports it meanwhile (another test or tuning worker) waits,
    then loads numba's code from the cache instead of compiling it too. (No lock where
    the OS offers none.)"""
    if compiled.exists() or fcntl is None:
        yield
        return
    fh = None
    try:
        fh = open(lock, "a")
        fcntl.flock(fh, fcntl.LOCK_EX)
    except OSError:     # (a file system without locks: each process compiles its own)
        if fh is not None:
            fh.close()
            fh = None
    try:
        yield
    finally:
        if fh is not None:
            fh.close()      # (which releases the lock)


def _touch(path: Path) -> None:
    """Mark a module used (a file of its own: touching the module's source would make
    numba's cache of it stale)."""
    try:
        path.touch()
    except OSError:
        pass


def _module_used(path: Path) -> Path:
    """The file whose time says when module `path` was last used (none yet: a version
    from before the markers, or the one just written: its source)."""
    marker = path.with_suffix(".used")
    return marker if marker.exists() else path


def _module_files(path: Path) -> list[Path]:
    """Module `path`, its markers and its compiled files."""
    return [path, path.with_suffix(".used"), path.with_suffix(".lock"), *_compiled_files(path)]


def _compiled_files(path: Path) -> list[Path]:
    """What was compiled from module `path`: its compiled marker, Python's bytecode and
    numba's cache of it."""
    return [path.with_suffix(".compiled"), *(path.parent / "__pycache__").glob(f"{path.stem}.*")]


_fingerprint: str | None = None


def compiler_fingerprint() -> str:
    """A hash of the compiler's and the ISA's sources and of `mkemu/errors.py` (what a
    compiled program or a kept syntax tree depends on: every node holds a `SourceSpan`)."""
    global _fingerprint
    if _fingerprint is None:
        import mkemu.dsl
        import mkemu.errors
        import mkemu.isa

        digest = hashlib.sha256()
        for package in (mkemu.dsl, mkemu.isa):
            root = Path(package.__file__).parent
            for path in sorted(root.rglob("*")):
                if path.suffix in (".py", ".lark", ".toml") and "__pycache__" not in path.parts:
                    digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
        digest.update(b"errors.py\0" + Path(mkemu.errors.__file__).read_bytes())
        _fingerprint = digest.hexdigest()
    return _fingerprint


def cached_program(path: str, text: str, profile, params: dict[str, int], build: Callable):
    """The result of `build()`, which compiles `text` (named `path`) and returns the
    program and the text of every file it read by name, or the kept result of an
    earlier identical compile. Returns (program, whether it came from the cache)."""
    # The path as given (the program's source spans name files so). Files it imports
    # are checked by their text when the entry is used (`_load`). Where the profile was
    # read from does not change what the compiler makes: copies of one profile file
    # share entries (`values_key`).
    # (params in hex: a value past 4,300 decimal digits has no repr, and the front end
    # says what is wrong with it)
    key = hashlib.sha256(repr((compiler_fingerprint(), path, text, [(k, hex(v)) for k, v in sorted(params.items())],
                               profile.values_key())).encode()).hexdigest()
    try:
        directory = cache_dir("programs")
    except OSError:
        return build()[0], False   # (no cache to keep it in: compiled, not kept)
    entry = directory / f"{key}.pkl"
    program = _load(entry, path)
    if program is not None:
        return program, True
    program, sources = build()
    # The main file's text is part of the key; every other file read is checked on use.
    hashes = {name: _digest(body.encode()) for name, body in sources.items() if name != path}
    _store(entry, hashes, program)
    _stored_in(directory, MAX_PROGRAMS, MAX_PROGRAM_BYTES)
    return program, False


_stores: dict[Path, int] = {}   # per folder: the entries this process stored in it


def _stored_in(directory: Path, max_entries: int, max_bytes: int) -> None:
    """This process stored an entry in `directory`: at every `EVICT_EVERY`-th (the first
    included), drop the least recently used beyond the budget (`_evict`)."""
    count = _stores.get(directory, 0)
    if count % EVICT_EVERY == 0:
        _evict(directory, max_entries=max_entries, max_bytes=max_bytes)
    _stores[directory] = count + 1


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _load(entry: Path, main_path: str):
    """The kept program, unless a file it read changed. Relative names are read relative
    to the current directory; the shipped library's files are named by absolute path,
    so a program that read them is kept only for the library at the same place (its
    spans name those files)."""
    record = _read_entry(entry)
    if record is None:
        return None
    try:
        hashes, program, root = record
    except (TypeError, ValueError):
        return None
    here = _shipped_root()
    if root != here and any(name.startswith(root + os.sep) for name in hashes):
        return None
    for name, digest in hashes.items():
        try:
            if _digest(Path(name).read_text().encode()) != digest:
                return None
        except (OSError, UnicodeDecodeError):
            return None
    _touch_entry(entry)
    return program


def _read_entry(entry: Path):
    """The object kept in `entry` (`_write_entry`), or None. A damaged entry (a flipped
    bit, a truncated write) is a miss, made afresh and written over: never an object that
    differs from what was written, nor an unpickling error of any kind."""
    try:
        # (only a regular file: a named pipe or a link to a device in its place would
        # block or never end)
        with open(entry, "rb", opener=_regular_only) as fh:
            data = fh.read()
    except OSError:
        return None
    head = len(ENTRY_MAGIC) + 32
    if data[:len(ENTRY_MAGIC)] != ENTRY_MAGIC or hashlib.sha256(data[head:]).digest() != data[len(ENTRY_MAGIC):head]:
        return None
    try:
        key, record = pickle.loads(data[head:])
    except Exception:   # noqa: BLE001 - (whatever a payload of another version raises)
        return None
    # (an entry copied or renamed onto another key's file is a miss)
    return record if key == entry.stem else None


def _regular_only(path: str, flags: int) -> int:
    """`open`'s opener: the file without blocking on a named pipe, and only if it is a
    regular file."""
    fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"not a regular file: {path}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _touch_entry(entry: Path) -> None:
    try:
        os.utime(entry)   # recently used
    except OSError:       # another process evicted it meanwhile: what it held is still good
        pass


def _write_entry(entry: Path, record) -> None:
    """Keep `record` in `entry`, pickled behind a checksum, written atomically (a cache:
    a failure to write is no error)."""
    try:
        payload = pickle.dumps((entry.stem, record), protocol=pickle.HIGHEST_PROTOCOL)
        _replace(entry, lambda fh: fh.write(ENTRY_MAGIC + hashlib.sha256(payload).digest() + payload))
    except (OSError, pickle.PickleError, TypeError, AttributeError, RecursionError):
        pass


def _replace(path: Path, write: Callable) -> None:
    """Write `path` through a temporary file and a rename: other processes and threads
    see the old file or the whole new one. `write(fh)` writes the bytes."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@functools.cache
def _shipped_root() -> str:
    """Where the shipped library is (resolved once per process)."""
    return str(programs_root().resolve())


def _store(entry: Path, hashes: dict[str, str], program) -> None:
    _write_entry(entry, (hashes, program, _shipped_root()))


def cached_parse(text: str, filename: str, parse: Callable, parser_version: str):
    """`parse(text, filename)` (a `.mk` file's syntax tree), or the kept result of an
    earlier parse of the same text under the same name (its spans name the file) by the
    same compiler and parser library (`parser_version`). Parsing is most of a cold compile
    of a large program (the K3 megakernel in a new process: 2.4 s with nothing kept, about
    1 s with its files' trees kept, bench/compile_time.py), so a run with new parameters,
    a new process of a sweep or a test compiles in a third of the time. A text that does
    not parse is not kept (its error is raised again), nor one shorter than
    `MIN_PARSED_CHARS`: it parses in less time than keeping it costs (a test suite's or a
    fuzzer's thousands of small files written once: 1,200 one-line files parsed in 0.4 s
    and were kept in 10 s, the cache's folder full)."""
    if len(text) < MIN_PARSED_CHARS:
        return parse(text, filename)
    key = hashlib.sha256(repr((compiler_fingerprint(), parser_version, filename, text)).encode()).hexdigest()
    try:
        directory = cache_dir("parsed")
    except OSError:
        return parse(text, filename)
    entry = directory / f"{key}.pkl"
    module = _read_entry(entry)
    if module is not None:
        _touch_entry(entry)
        return module
    module = parse(text, filename)
    _write_entry(entry, module)
    _stored_in(directory, MAX_PARSED, MAX_PARSED_BYTES)
    return module


def _evict(directory: Path, pattern: str = "*.pkl", max_entries: int = MAX_PROGRAMS,
           max_bytes: int | None = None, used: Callable[[Path], Path] = lambda path: path,
           files: Callable[[Path], Sequence[Path]] = lambda path: (path,)) -> None:
    """Drop the least recently used entries beyond `max_entries` (and beyond `max_bytes`
    in all): an entry's time is that of `used(entry)`, and dropping it deletes
    `files(entry)`. Other processes may be loading, storing or evicting at the same
    time: a file that vanished is skipped, and one that cannot be removed (a folder in its
    place, a file of another user) is left, never an error. Temporary files of writes
    (`_replace`) older than `STALE_WRITE_S` are dropped: their process died mid-write."""
    entries = []
    for path in directory.glob(pattern):
        try:
            size, stamp = path.stat().st_size, used(path).stat().st_mtime
        except OSError:
            continue
        entries.append((stamp, size, path))
    entries.sort(reverse=True)          # most recently used first
    total = 0
    for k, (_, size, path) in enumerate(entries):
        total += size
        if k >= max_entries or (max_bytes is not None and total > max_bytes and k):
            for name in files(path):
                try:
                    name.unlink(missing_ok=True)
                except OSError:
                    pass
    now = time.time()
    for path in directory.glob(".*.tmp"):
        try:
            if now - path.stat().st_mtime > STALE_WRITE_S:
                path.unlink()
        except OSError:
            continue


def cached_arrays(key: str, dtype, shapes: Sequence[tuple[int, ...]],
                  build: Callable[[], list[np.ndarray]]) -> list[np.ndarray]:
    """The arrays `build()` returns (of `dtype` and `shapes`, in order), or the kept ones
    of an earlier call with the same `key`, which must hash everything they depend on.
    Kept arrays come back read-only, memory-mapped from the cache file; a file that
    fails its checksum is built afresh and written over (`_kept`)."""
    dtype = np.dtype(dtype)
    sizes = [math.prod(shape) for shape in shapes]
    total = sum(sizes)
    try:
        directory = cache_dir("arrays")
    except OSError:
        return build()
    entry = directory / f"{key}.npy"
    flat = _kept(entry, dtype, total)
    if flat is not None:
        try:
            os.utime(entry)   # recently used
        except OSError:       # another process evicted it meanwhile: the mapped bytes are still good
            pass
        return _split(flat, sizes, shapes)
    arrays = build()

    def write(fh) -> None:
        check = ArrayCheck()
        np.lib.format.write_array_header_1_0(
            fh, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (total,)})
        for array in arrays:
            data = np.ascontiguousarray(array, dtype).reshape(-1).view(np.uint8)
            check.update(data)
            fh.write(data)     # (its buffer, not a copy of it)
        fh.write(ARRAYS_MAGIC + check.digest())

    if 0 < total * dtype.itemsize <= MAX_ARRAY_BYTES:
        try:
            _replace(entry, write)
            _evict(directory, "*.npy", MAX_PROGRAMS, MAX_ARRAY_BYTES)
        except OSError:
            pass
    return arrays


def _kept(entry: Path, dtype: np.dtype, total: int) -> np.ndarray | None:
    """The `total` values of `dtype` kept in `entry`, memory-mapped, or None: no such
    file, one of another type or size, or one whose data does not match the checksum it
    ends with (damaged on disk, cut short, or written before files carried one). The
    whole file is checked before any of it is used: a flipped byte in a weight would
    otherwise change a run's results and nothing would say why."""
    try:
        if not stat.S_ISREG(os.stat(entry).st_mode):   # (a named pipe would block the run)
            return None
        flat = np.load(entry, mmap_mode="r")
        if flat.dtype != dtype or flat.shape != (total,):
            return None
        with open(entry, "rb") as fh:
            fh.seek(flat.offset + flat.nbytes)
            trailer = fh.read(len(ARRAYS_MAGIC) + ArrayCheck.SIZE + 1)     # (one byte more: nothing may follow)
        check = ArrayCheck()
        check.update(flat.view(np.ndarray).view(np.uint8))   # (where it is mapped: no copy of 100 MB)
    except (OSError, ValueError):
        return None
    if trailer != ARRAYS_MAGIC + check.digest():
        return None
    return flat.view(np.ndarray)


class ArrayCheck:
    """The checksum of a kept array's bytes, fed in any number of parts: their CRC-32
    (zlib's, at about 2 GB/s: it sees any burst of flipped bits up to 32 long, words or
    pages swapped, and misses other damage once in 2^32) and their length."""

    SIZE = 12

    def __init__(self):
        self.crc, self.length = 0, 0

    def update(self, data: np.ndarray) -> None:
        """Add `data`, a flat contiguous uint8 array."""
        self.crc = zlib.crc32(data, self.crc)
        self.length += data.size

    def digest(self) -> bytes:
        return struct.pack("<IQ", self.crc, self.length)


def _split(flat: np.ndarray, sizes: list[int], shapes) -> list[np.ndarray]:
    out, at = [], 0
    for size, shape in zip(sizes, shapes):
        out.append(flat[at:at + size].reshape(shape))
        at += size
    return out
