"""The user cache directory, and compiled `.mk` programs kept in it.

Compiling a large program (the K3 megakernel and its imports) takes about half a
second, and the same program is compiled with the same parameters over and over
(every `mkemu run`, every test). A compiled program is therefore kept, pickled, under
a key that hashes everything its output depends on: the compiler's own sources, the
main file's name and text, the parameters and the hardware profile. The entry also
records every file the compile read (imports included) with a hash of its text; an
entry whose files changed is compiled afresh. At most `MAX_PROGRAMS` entries are
kept; the least recently used are dropped.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

MAX_PROGRAMS = 256


def cache_dir(sub: str = "") -> Path:
    """A writable directory for mkemu's caches: `$XDG_CACHE_HOME/mkemu` or
    `~/.cache/mkemu`, else a per-user temporary directory."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    for root in (Path(base) / "mkemu", Path(tempfile.gettempdir()) / f"mkemu-cache-{uid}"):
        candidate = root / sub if sub else root
        try:
            candidate.mkdir(parents=True, exist_ok=True)
            probe = candidate / f".probe{os.getpid()}"
            probe.write_text("")
            probe.unlink()
            return candidate
        except OSError:
            continue
    raise OSError("no writable cache directory for mkemu")


_fingerprint: str | None = None


def compiler_fingerprint() -> str:
    """A hash of the compiler's and the ISA's sources (what a compiled program depends on)."""
    global _fingerprint
    if _fingerprint is None:
        import mkemu.dsl
        import mkemu.isa

        digest = hashlib.sha256()
        for package in (mkemu.dsl, mkemu.isa):
            root = Path(package.__file__).parent
            for path in sorted(root.rglob("*")):
                if path.suffix in (".py", ".lark", ".toml") and "__pycache__" not in path.parts:
                    digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
        _fingerprint = digest.hexdigest()
    return _fingerprint


def cached_program(path: str, text: str, profile, params: dict[str, int], build: Callable):
    """The result of `build()`, which compiles `text` (named `path`) and returns the
    program and the text of every file it read by name, or the kept result of an
    earlier identical compile. Returns (program, whether it came from the cache)."""
    # The path as given (the program's source spans name files so), and where it is
    # relative from: imports are found relative to it.
    where = "" if os.path.isabs(path) else os.getcwd()
    key = hashlib.sha256(repr((compiler_fingerprint(), path, where, text,
                               sorted(params.items()), repr(profile))).encode()).hexdigest()
    try:
        directory = cache_dir("programs")
    except OSError:
        return build(), False
    entry = directory / f"{key}.pkl"
    program = _load(entry, path)
    if program is not None:
        return program, True
    program, sources = build()
    # The main file's text is part of the key; every other file read is checked on use.
    hashes = {name: _digest(body.encode()) for name, body in sources.items() if name != path}
    _store(entry, hashes, program)
    _evict(directory)
    return program, False


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _load(entry: Path, main_path: str):
    try:
        with open(entry, "rb") as fh:
            hashes, program = pickle.load(fh)
    except (OSError, pickle.PickleError, EOFError, AttributeError, ImportError, ValueError):
        return None
    for name, digest in hashes.items():
        try:
            if _digest(Path(name).read_text().encode()) != digest:
                return None
        except (OSError, UnicodeDecodeError):
            return None
    try:
        os.utime(entry)   # recently used
    except OSError:       # another process evicted it meanwhile: the program is still good
        pass
    return program


def _store(entry: Path, hashes: dict[str, str], program) -> None:
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            pickle.dump((hashes, program), fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, entry)
    except (OSError, pickle.PickleError, TypeError, AttributeError):
        tmp.unlink(missing_ok=True)


def _evict(directory: Path) -> None:
    """Drop the least recently used entries beyond `MAX_PROGRAMS` (other processes may
    be loading, storing or evicting at the same time: a file that vanished is skipped)."""
    entries = []
    for path in directory.glob("*.pkl"):
        try:
            entries.append((path.stat().st_mtime, path))
        except OSError:
            continue
    entries.sort()
    for _, stale in entries[:max(0, len(entries) - MAX_PROGRAMS)]:
        stale.unlink(missing_ok=True)
