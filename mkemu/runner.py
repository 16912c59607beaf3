"""Wires a program to the emulator: inputs, the run, and the bit-exact check.

Inputs come from a `.npz` (one array per input buffer, by name, or per chip as
`name@chip`) or are generated from the seed. A program's numpy reference
(`.reference file.py:function` / `reference "file.py:function";`, or an importable
`package.module:function`) is loaded here; the reference contract is in docs/api.md.
Also bf16 storage conversion, the bit-exact comparison and atomic file writes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import linecache
import math
import numbers
import os
import re
import signal
import threading
import traceback
from pathlib import Path

import attrs
import numpy as np

from mkemu.errors import ConfigError, MkemuError, as_read, check_regular_file, grouped, one_line, shown
from mkemu.isa.numerics import bf16_round, mxfp4_from_bytes, mxfp4_to_bytes
from mkemu.isa.program import INPUT_KINDS, Program
from mkemu.options import check_path


@attrs.frozen
class Mismatch:
    buffer: str
    chip: int
    index: tuple[int, ...]
    expected: str
    actual: str
    count: int
    note: str = ""     # what may be behind it, when something is known (e.g. an unrounded bf16)

    def render(self) -> str:
        if self.count < 0:   # the shapes differ: there is no element to point at
            return (f"FAIL: {self.buffer} on chip {self.chip}: the expected value has {self.expected}, "
                    f"the output has {self.actual}")
        return (f"FAIL: {self.buffer} on chip {self.chip} differs at index {list(self.index)}: "
                f"expected {self.expected}, got {self.actual} ({self.count} element(s) differ){self.note}")


def generate_inputs(program: Program, seed: int) -> dict[str, np.ndarray]:
    """Deterministic inputs for every input/inout/weight buffer."""
    rng = np.random.default_rng(seed)
    out = {}
    for buf in program.buffers:
        if buf.kind not in INPUT_KINDS:
            continue
        try:
            out[buf.name] = _generated(buf, rng)
        except MemoryError as exc:   # (named: the CLI reports it in one line)
            where = f", declared at {buf.declared}" if buf.declared else ""
            raise MemoryError(f"generating input '{buf.name}' {buf.dtype}[{', '.join(map(str, buf.shape))}] "
                              f"({buf.size_bytes:,} bytes{where}): {exc}") from None
    return out


def _generated(buf, rng) -> np.ndarray:
    if buf.dtype == "i32":
        return rng.integers(-100, 100, size=buf.shape, dtype=np.int32)
    values = rng.standard_normal(buf.shape).astype(np.float32)
    if buf.dtype == "mxfp4":     # values MXFP4 holds exactly
        return mxfp4_from_bytes(mxfp4_to_bytes(values), buf.shape)
    return bf16_round(values) if buf.dtype == "bf16" else values


def load_inputs(path: str, program: Program) -> dict[str, np.ndarray]:
    # A damaged archive (truncated, bad CRC, a member that does not inflate, a header
    # numpy cannot parse or whose shape does not fit in memory) is the user's file, not
    # our bug: numpy raises many types for it (tokenize.TokenError, MemoryError, ...).
    damaged = Exception
    try:
        check_regular_file(path, "inputs")
        with open(path, "rb") as fh:
            magic = fh.read(6)
    except OSError as exc:
        raise ConfigError(f"cannot read inputs: {exc.strerror or exc}", file=path) from None
    if not magic.startswith((b"PK\x03\x04", b"PK\x05\x06", b"\x93NUMPY")):
        # (numpy would take it for a pickle and talk of allow_pickle)
        raise ConfigError("inputs must be a .npz file (np.savez) of arrays named by buffer; this file is not "
                          "one (not a zip archive)", file=path)
    try:
        data = np.load(path)
    except damaged as exc:
        raise ConfigError(f"cannot read inputs: {_why(exc)}", file=path) from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ConfigError("inputs must be a .npz file (np.savez) of arrays named by buffer", file=path)
    arrays = {}
    buffers = {b.name: b for b in program.buffers}
    with data:
        if not data.files:
            raise ConfigError("the file holds no arrays (give one per input buffer, keyed name or name@chip)",
                              file=path)
        _check_member_names(data, path)
        for key in data.files:     # (named before any is read: a member may be large)
            if key.split("@")[0] not in buffers:
                raise ConfigError(f"no buffer named {key.split('@')[0]!r} in the program "
                                  f"(buffers: {', '.join(sorted(buffers))})", file=path, key=key)
        for k in data.files:
            _check_declared_size(data, k, buffers[k.split("@")[0]], path)
            try:
                arrays[k] = data[k]
            except damaged as exc:   # (named by the array: an object array, a damaged member)
                raise ConfigError(f"cannot read inputs: {_why(exc)}", file=path, key=k) from None
    return arrays


def _check_member_names(data, path: str) -> None:
    """Each array once, under its own name: numpy reads one of two members of one name
    (`x.npy` twice, or `x` and `x.npy`), and a name holding a NUL character as the part
    before it."""
    seen = set()
    for info in data.zip.infolist():
        name = info.orig_filename
        if "\0" in name:
            raise ConfigError(f"a member's name holds a NUL character ('{one_line(name)[:60]}')", file=path)
        key = name.removesuffix(".npy")
        if key in seen:
            raise ConfigError(f"the file holds array {key!r} twice (as members {key!r} or {key + '.npy'!r}): "
                              "which one is meant?", file=path, key=key)
        seen.add(key)


def _check_declared_size(data, key: str, buf, path: str) -> None:
    """A member whose header declares far more bytes than its buffer takes is refused
    unread: a few MB of zip can inflate to GBs (read whole before its shape was checked).
    A header numpy cannot parse is left for the read to report."""
    member = key + ".npy" if key + ".npy" in data.zip.namelist() else key
    try:
        with data.zip.open(member) as fh:
            version = np.lib.format.read_magic(fh)
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            if version not in read:
                return
            shape, _, dtype = read[version](fh)
    except Exception:   # noqa: BLE001 - the read reports a damaged member
        return
    declared = math.prod(shape) * dtype.itemsize
    if declared > max(MAX_INPUT_SLACK, 8 * math.prod(buf.shape) * 2):
        raise ConfigError(f"the array declares shape {shown(tuple(shape))} of {dtype} ({grouped(declared)} bytes), far "
                          f"more than buffer {buf.name} ({buf.dtype}{list(buf.shape)}) takes: refused unread",
                          file=path, key=key)


MAX_INPUT_SLACK = 64 << 20   # bytes an input array may declare whatever its buffer (then its shape is checked)


def _why(exc: Exception) -> str:
    """What went wrong reading a file, in one line (the type's name when it says more)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    if isinstance(exc, (OSError, ValueError, EOFError)) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def as_array(value, what: str, file: str | None = None, key: str | None = None) -> np.ndarray:
    """`value` (an array, a nested list, ...) as a numpy array; one numpy cannot make
    (a ragged list) is a ConfigError naming `what`. So is a masked array, bare or in a
    list: numpy would hand on its data and drop the mask, and the masked values
    (whatever the data holds under them) would be used as if they were given."""
    only_ints = _list_of_ints(value, what, file, key)
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{what} is not an array: {str(exc).splitlines()[0]}", file=file, key=key) from None
    if only_ints and array.dtype.kind == "f" and array.size:
        # Python integers numpy made floats (one of them beyond int64 beside others):
        # kept as the integers they are, for one rounding into the buffer.
        array = np.array(value, dtype=object)
    return array


def _list_of_ints(value, what: str, file: str | None, key: str | None) -> bool:
    """Is `value` nested lists and tuples of Python integers only? A masked array, bare
    or at any depth of them, is a ConfigError naming `what`."""
    ints, stack = isinstance(value, (list, tuple)), [value]
    while stack:      # (a stack of its own: a list may nest deeper than Python's recursion)
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, np.ma.MaskedArray):
            raise ConfigError(f"{what} is a masked array, whose mask would be dropped: give value.filled(fill) "
                              "(with the value masked elements should take) or the plain data (value.data)",
                              file=file, key=key)
        elif not isinstance(item, int):
            ints = False
    return ints


def widened(array: np.ndarray) -> np.ndarray:
    """An input array of a narrow number type of ml_dtypes (bfloat16, the float8s, int4,
    ...), which numpy knows only as void, as the int32 or float32 values it holds,
    exactly (docs/api.md: inputs of any real type); any other array as it is."""
    if array.dtype.kind == "V" and array.dtype.names is None:
        for wide in (np.int32, np.float32):
            if np.can_cast(array.dtype, wide, casting="safe"):
                return array.astype(wide)
    return array


def check_values(name: str, dtype: str, values: np.ndarray, file: str | None = None, key: str | None = None,
                 given: np.dtype | None = None) -> None:
    """Refuse an array whose values a buffer cannot take as they are: not numbers, or,
    for an i32 buffer, not integers or outside int32 (float buffers round to their
    format, as documented). `given`: the type the caller's array had, if `values` is
    that array `widened` (a bfloat16 array is named as one, not as the float32 it became).
    Integers numpy holds as objects (a list holding one beyond int64) are integers: out
    of range for an i32 buffer, where they are reported as any others are; a float
    buffer rounds them once (`to_storage`)."""
    kind = values.dtype.kind
    where = dict(file=file, key=key or name)
    shown = values.dtype if given is None else given
    held = object_numbers(values)
    if kind not in "biuf" and held is None:
        # (np.savez keeps an ml_dtypes array's bytes but not its type: it comes back as void)
        hint = ("; a bfloat16 or float8 array saved with np.savez comes back as bytes without its type: "
                "save it as float32" if kind == "V" and values.dtype.names is None and shown == values.dtype else "")
        raise ConfigError(f"buffer {name} ({dtype}): got an array of {shown}, not numbers{hint}", **where)
    if dtype != "i32":
        return
    if kind == "f":
        raise ConfigError(f"buffer {name} (i32): got {shown} values; an i32 buffer takes integers", **where)
    if held == "real":
        raise ConfigError(f"buffer {name} (i32): got numbers that are not all integers (a list mixing them "
                          "with floats); an i32 buffer takes integers", **where)
    info = np.iinfo(np.int32)
    if values.size and (kind in "iu" or held) and (values.min() < info.min or values.max() > info.max):
        raise ConfigError(f"buffer {name} (i32): values {values.min()}..{values.max()} do not all fit in int32",
                          **where)


def object_numbers(values: np.ndarray) -> str | None:
    """What an array of objects holds, if it is numbers: "int" (integers only) or "real"
    (real numbers, not all integers); None for anything else. numpy makes such an array
    of a list holding an integer beyond int64 and uint64 (2**70), alone or beside floats:
    numbers out of a buffer's range, not something that is no number at all."""
    if values.dtype.kind != "O" or not values.size:
        return None
    held = "int"
    for v in values.flat:
        if isinstance(v, (numbers.Integral, np.bool_)):
            continue
        if not isinstance(v, numbers.Real):
            return None
        held = "real"
    return held


def object_floats(values: np.ndarray) -> np.ndarray:
    """An array of real numbers held as objects (`object_numbers`) as float64: an
    integer rounded to 53 bits to odd, so that rounding the result once more, to float32
    or bf16, rounds as the integer itself would, once (`_int_to_odd`)."""
    def wide(v) -> float:
        if isinstance(v, (numbers.Integral, np.bool_)):
            return _int_to_odd(int(v), 53)
        try:
            return float(v)
        except OverflowError:     # (a Fraction past float64's range: rounds to an infinity, as a float64 would)
            return math.inf if v > 0 else -math.inf

    return np.frompyfunc(wide, 1, 1)(values).astype(np.float64)


def to_storage(array: np.ndarray, dtype: str) -> np.ndarray:
    """Arrays as they sit in HBM: bf16 as its 16-bit patterns, MXFP4 as its values and
    scales (quantised: numerics.mxfp4_encode)."""
    from mkemu.isa.numerics import f32_to_bf16_bits

    # Rounding to float32 takes a float64 beyond its range to +-inf, as documented: no warning.
    with np.errstate(over="ignore"):
        if array.dtype.kind == "O" and dtype != "i32":     # (Python numbers, checked by check_values)
            array = object_floats(array)
        if dtype == "bf16":
            return f32_to_bf16_bits(_f32_for_bf16(np.asarray(array)))
        if dtype == "mxfp4":
            return mxfp4_to_bytes(array)
        return np.asarray(array, {"f32": np.float32, "i32": np.int32}[dtype])


def _int_to_odd(value: int, bits: int) -> float:
    """A Python integer rounded to `bits` significant bits to odd (toward zero, the last
    kept bit set when anything was dropped), as a float (inf beyond float64). Rounding
    that once more to a format of at least 2 bits fewer (float64's 53 to float32's 24,
    float32's 24 to bf16's 8) rounds as the integer itself would, once."""
    size = abs(value)
    shift = max(size.bit_length() - bits, 0)
    kept = size >> shift | (1 if size & ((1 << shift) - 1) else 0)
    try:
        result = math.ldexp(kept, shift)
    except OverflowError:   # (beyond float64, so beyond float32 too)
        result = math.inf
    return -result if value < 0 else result


def _f32_for_bf16(values: np.ndarray) -> np.ndarray:
    """float32 values whose rounding to bf16 (nearest, ties to even) is the nearest bf16
    of `values` themselves. A type float32 holds exactly is converted as it is; wider
    ones (float64, longdouble, 32- and 64-bit integers) are rounded to float32 *to odd* (toward zero,
    the last bit set when anything was dropped): rounding them to float32 to nearest
    first could land on a bf16 tie that the value itself is not on (1 + 2^-8 + 2^-40 is
    nearer 1 + 2^-7 than 1, but its nearest float32 is the tie 1 + 2^-8, which goes to
    1). float32 keeps 16 bits more than bf16, so the odd bit decides such ties rightly."""
    kind, size = values.dtype.kind, values.dtype.itemsize
    if kind == "b" or (kind == "f" and size <= 4) or (kind in "iu" and size <= 2):
        return values.astype(np.float32, copy=False)
    if kind in "iu" and size == 8 and values.size and (values.max() > 2**53 or values.min() < -2**53):
        # Beyond 2^53 a float64 holds these no better than float32 does: to odd exactly, as Python ints.
        return np.array([_int_to_odd(int(v), 24) for v in values.reshape(-1)], np.float32).reshape(values.shape)
    # Exact for the rest: float64 or integers within 2^53 as float64, a longdouble as it is
    # (through float64 it would be rounded twice).
    wide = values if kind == "f" and size > 8 else values.astype(np.float64)
    f32 = wide.astype(np.float32)
    inexact = (f32.astype(wide.dtype) != wide) & ~np.isnan(wide)
    if inexact.any():
        bits = f32.view(np.uint32).copy()
        away = np.abs(f32.astype(wide.dtype)) > np.abs(wide)
        bits[inexact & away] -= np.uint32(1)        # toward zero (an infinity becomes the largest finite)
        bits[inexact] |= np.uint32(1)
        f32 = bits.view(np.float32)
    return f32


def from_storage(array: np.ndarray, dtype: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """The values of an array as stored (an MXFP4 one needs its `shape`)."""
    from mkemu.isa.numerics import bf16_bits_to_f32

    if dtype == "mxfp4":
        return mxfp4_from_bytes(array, shape)
    return bf16_bits_to_f32(array) if dtype == "bf16" else array


# The line naming a program's reference: `reference "file.py:fn";` in a .mk program,
# `.reference file.py:fn` in a .s program (a comment may follow).
_REFERENCE_LINE = re.compile(r'^\s*reference\s+"([^"]+)"\s*;', re.M)
_ASM_REFERENCE_LINE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*:\s*)*\.reference\s+([^\s;#]+)", re.M)   # (labels first)


def declared_reference(path: str, text: str) -> re.Match | None:
    """Where program `path` (its `text`) names its reference; group 1 is the name. The
    match is on the text as the front ends read it (`match.string`): a byte-order mark
    dropped, CR and CRLF line ends made LF."""
    return (_ASM_REFERENCE_LINE if path.endswith(".s") else _REFERENCE_LINE).search(as_read(text))


_IMPORT_LINE = re.compile(r'^\s*import\s+"([^"]+)"\s*;', re.M)


def files_read_by(program: str) -> list[str]:
    """The files a program's build and check read besides itself: the `.mk` files it
    imports (and they import; `mkemu:` ones among the installed programs) and its
    reference `.py` file. Found in the text, without parsing (a file that cannot be
    read is left to the build to report)."""
    from mkemu.shipped import SHIPPED, programs_root

    found, todo = [], [program]
    while todo:
        path = todo.pop()
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        named = [os.path.join(programs_root(), name[len(SHIPPED):]) if name.startswith(SHIPPED)
                 else os.path.join(os.path.dirname(path), name) for name in _IMPORT_LINE.findall(text)]
        reference = declared_reference(path, text)
        if reference and reference.group(1).rpartition(":")[0].endswith(".py"):
            named.append(os.path.join(os.path.dirname(path), reference.group(1).rpartition(":")[0]))
        for used in map(os.path.normpath, named):
            if used != os.path.normpath(program) and used not in found:
                found.append(used)
                if used.endswith(".mk"):
                    todo.append(used)
    return found


def load_reference_named(reference: str, program_path: str | None):
    """The reference function a program names: `package.module:function` (imported by
    name) or `file.py:function` (a file relative to the program's folder). A file that
    lies inside the installed `mkemu.programs` package is imported under its package
    name, so shipped references may use relative imports; any other file is loaded on
    its own (it may import installed modules, not its neighbours)."""
    target, _, func = reference.rpartition(":")
    if not target:
        target, func = reference, "reference"
    if not target.endswith(".py"):
        module = _import(target, target, program_path, _module_file(target))
        where = f"module {target}"
    else:
        base = Path(program_path).parent if program_path else Path.cwd()
        path = base / target
        try:
            found = path.is_file()
        except OSError as exc:     # (a name too long for the file system, a symlink loop)
            raise ConfigError(f"cannot read reference file {target!r}: {exc.strerror or exc}",
                              file=program_path) from None
        if not found:
            raise ConfigError(f"reference file {target!r} not found next to the program ({path})",
                              file=program_path)
        package = _package_of(path)
        if package:
            module = _import(package, str(path.resolve()), program_path, str(path.resolve()))
        else:
            spec = importlib.util.spec_from_file_location(f"mkemu_reference_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            # (named by its full path, as the error's place is)
            _guard(lambda: spec.loader.exec_module(module), spec.origin or str(path), program_path, spec.origin)
        where = f"reference file {path}"
    fn = getattr(module, func, None)
    if not callable(fn):
        raise ConfigError(f"{where} has no function {func!r}", file=program_path)
    return fn


def _module_file(name: str) -> str | None:
    """The file module `name` would be imported from, if it is found and is one (its
    errors are then placed in it), else None."""
    try:
        spec = importlib.util.find_spec(name)
    except Exception:   # noqa: BLE001 - a parent package that fails to import, a bad name: the import says
        return None
    origin = getattr(spec, "origin", None)
    return origin if origin and os.path.isfile(origin) else None


def _import(name: str, shown: str, program_path: str | None, file: str | None = None):
    return _guard(lambda: importlib.import_module(name), shown, program_path, file)


def _guard(load, shown: str, program_path: str | None, file: str | None = None):
    """load() of a reference (`file`, if it is a file): what fails is the user's error,
    one ConfigError at the line of `file` it failed at (with that line and a caret, as
    any located error), or, if it did not fail in `file`, at the program."""
    try:
        return load()
    except MkemuError:
        raise
    except ModuleNotFoundError as exc:
        raise ConfigError(f"reference {shown} failed to load: no module named {exc.name!r}",
                          **_failed_in(exc, file, program_path)) from None
    except KeyboardInterrupt:    # (the user's wish: not the reference's error)
        raise
    except BaseException as exc:  # a broken reference file is the user's error, not ours
        # (SystemExit and the like too: a sys.exit(0) in it would end mkemu with status 0,
        # as if it passed)
        where = _failed_in(exc, file, program_path)
        # (a syntax error's own text names its file and line: said by the location instead)
        said = exc.msg if isinstance(exc, SyntaxError) and where.get("file") == exc.filename else _text(exc)
        what = f"{type(exc).__name__}: {said}" if said else type(exc).__name__
        raise ConfigError(f"reference {shown} failed to load: {what}", **where) from None


def _text(exc: BaseException) -> str:
    """str(exc), or a stand-in where the exception's own __str__ fails (user code)."""
    try:
        return str(exc)
    except Exception:   # noqa: BLE001 - any failure of the user's __str__
        return "(its message cannot be shown: its __str__ raises)"


def _failed_in(exc: BaseException, file: str | None, program_path: str | None) -> dict:
    """ConfigError's place for `exc`, raised loading reference file `file`: the line of
    its syntax error, or the innermost line of `file` it passed through (where a
    function called at import failed in another module too), with its text and the
    columns to mark; the program if `file` is not known or not among them."""
    if file is not None:
        linecache.checkcache(file)   # (a file edited since an earlier load in this process)
        if isinstance(exc, SyntaxError) and exc.filename == file and exc.lineno:
            line = linecache.getline(file, exc.lineno) or exc.text or ""
            end = exc.end_offset if exc.end_lineno in (None, exc.lineno) and exc.end_offset else None
            return {"file": file, "line": exc.lineno, "column": _char_column(line, exc.offset or 1),
                    "end_column": _char_column(line, end) if end else None,
                    "source_line": line.rstrip("\r\n") or None}
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == file]
        if frames:
            frame = frames[-1]
            line = linecache.getline(file, frame.lineno)
            column = _char_column(line, frame.colno + 1) if frame.colno is not None else None
            end = (_char_column(line, frame.end_colno + 1)
                   if frame.end_colno is not None and frame.end_lineno == frame.lineno else None)
            return {"file": file, "line": frame.lineno, "column": column, "end_column": end,
                    "source_line": line.rstrip("\r\n") or None}
    return {"file": program_path}


def _char_column(line: str, byte_column: int) -> int:
    """The 1-based column, in characters, of 1-based UTF-8 byte column `byte_column` of
    `line` (Python counts a file's columns in bytes; a caret goes under characters)."""
    return len(line.encode("utf-8")[:max(byte_column - 1, 0)].decode("utf-8", "ignore")) + 1


def call_reference(fn, inputs: dict, kwargs: dict, program_path: str | None):
    """fn(inputs, **kwargs): a reference function that raises is the user's error,
    reported naming the function and the line of its file it failed at."""
    try:
        inspect.signature(fn).bind(inputs, **kwargs)
    except TypeError as exc:
        # Not the contract's signature: say so at the function, not inside mkemu.
        raise ConfigError(f"reference function {fn.__qualname__} cannot be called as reference(inputs, *, "
                          f"{', '.join(kwargs)}): {exc}{defined_at(fn)}", file=program_path) from None
    except ValueError:   # (a builtin without a signature: just call it)
        pass
    try:
        return fn(inputs, **kwargs)
    except MkemuError:
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a broken reference is the user's error, not ours
        hint = ""
        if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str) and exc.args[0] not in inputs:
            # (most often `inputs["x"]`: the inputs are by buffer and chip)
            keys = sorted(map(str, inputs))
            hint = f"; its inputs are {', '.join(keys[:8])}{', ...' if len(keys) > 8 else ''} (name@chip)"
        raise _raised(f"reference function {fn.__qualname__}", exc, fn, program_path, hint) from None


def call_driver(fn, session, options: dict, program_path: str | None) -> dict:
    """fn(session, options), a program's driver: one that raises (an error of its own,
    not one of mkemu's), or returns anything but a dict of figures, is the program's
    error, named at the line of the driver it failed at."""
    progress = options.get("progress")
    if progress is not None:
        options = {**options, "progress": _callers(progress)}
    try:
        figures = fn(session, options)
    except MkemuError as exc:
        moved = _at_the_drivers_call(exc, fn)
        if moved is exc:
            raise
        raise moved from None
    except _CallerRaised as raised:    # (the caller's own exception, from its progress callable)
        raise raised.error from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - the driver is the program's code, not ours
        raise _raised(f"the program's driver {fn.__qualname__}", exc, fn, program_path) from None
    if not isinstance(figures, dict):
        raise ConfigError(f"the program's driver {fn.__qualname__} returned {type(figures).__name__}, not a dict "
                          f"of figures{defined_at(fn)}", file=program_path)
    problem = _figures_problem(figures)
    if problem:
        raise ConfigError(f"the program's driver {fn.__qualname__} returned figures whose {problem}"
                          f"{defined_at(fn)}", file=program_path)
    # (numpy scalars as the Python values they hold: a numpy bool_ bit_exact was no check
    # in the text and False in the JSON; tuples as the lists the JSON holds)
    return {name: as_json_lists(value.item() if isinstance(value, np.generic) else value)
            for name, value in figures.items()}


def call_hook(fn, *args, program_path: str | None = None):
    """A driver module's hook (`params`, `check_overrides`, `render`) called: an exception
    of its own is the program's error, named at the line it failed at."""
    try:
        return fn(*args)
    except MkemuError:
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - the driver module is the program's code, not ours
        raise _raised(f"the program's driver hook {fn.__qualname__}", exc, fn, program_path) from None


def _at_the_drivers_call(exc: MkemuError, fn) -> MkemuError:
    """A session method's refusal of its arguments (a buffer the program does not have,
    a wrong shape), raised into the driver `fn`: named at the line of the driver that
    called it, as the driver's own failures are (docs/api.md). Any other error as it is."""
    if not isinstance(exc, ConfigError) or exc.file is not None:
        return exc
    from mkemu import session

    frames = traceback.extract_tb(exc.__traceback__)
    home = getattr(getattr(fn, "__code__", None), "co_filename", None)
    mine = [i for i, f in enumerate(frames) if f.filename == home]
    # (raised in a session method the driver called, or in what that method called)
    if not mine or not any(os.path.normcase(f.filename) == os.path.normcase(session.__file__)
                           for f in frames[mine[-1] + 1:]):
        return exc
    at = frames[mine[-1]]
    return ConfigError(exc.message, file=at.filename, key=exc.key, line=at.lineno)


class _CallerRaised(Exception):
    """An exception of the caller's `progress` callable, carried through the driver."""

    def __init__(self, error: Exception):
        super().__init__(error)
        self.error = error


def _callers(progress):
    """`progress` as the driver calls it: an exception it raises (a caller stopping a long
    run early) reaches the caller as it was raised, not as the driver's error."""
    def report(*args, **kwargs):
        try:
            return progress(*args, **kwargs)
        except MkemuError:
            raise
        except Exception as exc:  # noqa: BLE001 - the caller's own, passed back unchanged
            raise _CallerRaised(exc) from exc
    return report


def _figures_problem(figures: dict) -> str | None:
    """What is wrong with the figures a driver returned, if anything: names that are not
    strings, or a `bit_exact`, `cycles` or `cycles_per_step` that the report, the
    JSON output and the exit status could not agree on."""
    odd = [name for name in figures if not isinstance(name, str)]
    if odd:
        return f"names are not all strings ({odd[0]!r})"

    def count(value) -> bool:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_) and value >= 0

    if "bit_exact" in figures and figures["bit_exact"] not in (True, False, None):
        return f"bit_exact is {figures['bit_exact']!r}, not True, False or None (no check)"
    if "cycles" in figures and not count(figures["cycles"]):
        return f"cycles is {figures['cycles']!r}, not a whole number of cycles >= 0"
    if "cycles_per_step" in figures:
        steps = figures["cycles_per_step"]
        if not isinstance(steps, list | tuple) or not all(count(c) for c in steps):
            return f"cycles_per_step is {steps!r}, not a list of whole numbers of cycles >= 0"
    for name, value in figures.items():
        try:
            json.dumps(value, default=json_default)
        except (TypeError, ValueError, RecursionError) as exc:
            return (f"{name} holds {exc}, which a report cannot hold (numbers, strings, booleans, None, and lists "
                    "and dicts of them: `mkemu run --json` prints it)")
    return None


def json_default(value):
    """A numpy scalar as the value it holds, for `json.dumps`; anything else JSON cannot hold."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"a value of type {type(value).__name__}")


def as_json_lists(value, leaf=lambda v: v):
    """`value` (dicts, lists and tuples, at any depth) as the JSON holds it: its tuples as
    lists, and `leaf` of every other value."""
    if isinstance(value, dict):
        return {k: as_json_lists(v, leaf) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_json_lists(v, leaf) for v in value]
    return leaf(value)


def finite(value):
    """`value` (dicts, lists and numbers) with every number that is not finite (an absurd
    profile's figure) as None: what `json.dumps` would write as `Infinity` or `NaN`,
    which is not JSON, is null."""
    return as_json_lists(value, lambda v: None if isinstance(v, (float, np.floating)) and not np.isfinite(v) else v)


def _raised(who: str, exc: BaseException, fn, program_path: str | None, hint: str = "") -> ConfigError:
    """The error for the program's own code (`who`, function `fn`) raising `exc`: named
    at the line of its file it failed at."""
    return ConfigError(f"{who} raised {type(exc).__name__}: {_text(exc)}{_failed_at(exc, fn)}{hint}",
                       file=program_path)


def defined_at(fn) -> str:
    """' (defined at FILE:LINE)' for a Python function, else ''."""
    code = getattr(fn, "__code__", None)
    return f" (defined at {code.co_filename}:{code.co_firstlineno})" if code else ""


def _failed_at(exc: Exception, fn) -> str:
    """' (at FILE:LINE)': the innermost frame in fn's own file, else the innermost one."""
    frames = traceback.extract_tb(exc.__traceback__)
    home = getattr(getattr(fn, "__code__", None), "co_filename", None)
    mine = [f for f in frames if f.filename == home] or frames[-1:]
    return f" (at {mine[-1].filename}:{mine[-1].lineno})" if mine else ""


def _package_of(path: Path) -> str | None:
    """The import name of a file inside the installed `mkemu.programs` package, or
    None for a file elsewhere."""
    import mkemu.programs

    root = Path(mkemu.programs.__file__).parent.resolve()
    try:
        rel = path.resolve().relative_to(root)
    except ValueError:
        return None
    if not all((root / Path(*rel.parts[:i]) / "__init__.py").is_file() for i in range(1, len(rel.parts))):
        return None
    return ".".join(("mkemu.programs", *rel.with_suffix("").parts))


def compare(expected: np.ndarray, actual: np.ndarray, name: str, chip: int, dtype: str = "") -> Mismatch | None:
    """Bit-exact comparison; any NaN equals any NaN (payloads are not part of the contract).
    `dtype`: the buffer's, for a note when a bf16 one's expected values are not bf16 values."""
    expected = np.asarray(expected)
    actual = np.asarray(actual)
    if object_numbers(expected) is not None and actual.dtype.kind == "f":
        expected = object_floats(expected)   # (an i32 buffer compares them as the numbers they are)
    if expected.shape != actual.shape:
        return Mismatch(name, chip, (), f"shape {expected.shape}", f"shape {actual.shape}", -1)
    if actual.dtype.kind in "iu":
        # An integer buffer: compared exactly (float32 would take 2^24 + 1 for 2^24); an
        # expected float is compared as the number it is (float64 holds every int32).
        same = expected.astype(np.float64) == actual.astype(np.float64) if expected.dtype.kind == "f" else (
            expected == actual)
    elif expected.dtype.kind in "fbiu":
        # A float buffer: the expected values converted to float32 (integers and bools
        # too), then compared bit for bit (+0 and -0 differ).
        e32, a32 = expected.astype(np.float32), actual.astype(np.float32)
        same = (e32.view(np.uint32) == a32.view(np.uint32)) | (np.isnan(e32) & np.isnan(a32))
    else:
        same = expected == actual
    if same.all():
        return None
    bad = np.argwhere(~same)
    idx = tuple(int(i) for i in bad[0])
    note = ""
    if dtype == "bf16" and expected.dtype.kind == "f":
        e32 = expected.astype(np.float32)
        if ((bf16_round(e32).view(np.uint32) != e32.view(np.uint32)) & ~np.isnan(e32)).any():
            note = ("; the expected values are not all bf16 values: the buffer holds bf16, so round the "
                    "reference's result to bf16 where the program does")
    shown = _show(expected[idx])
    if actual.dtype.kind == "f" and expected.dtype.kind in "biu":
        shown += f", as float32 {_show(expected[idx].astype(np.float32))}"   # (what was compared)
    return Mismatch(name, chip, idx, shown, _show(actual[idx]), len(bad), note)


def _show(value) -> str:
    if isinstance(value, np.floating):
        return f"{float(value)!r} ({np.float32(value).view(np.uint32):#010x})"
    return repr(value.item() if hasattr(value, "item") else value)


def is_chip(chip, chips: int) -> bool:
    """`chip` is a chip number of a mesh of `chips`: an int (not a bool), 0 .. chips - 1."""
    return isinstance(chip, (int, np.integer)) and not isinstance(chip, bool) and 0 <= chip < chips


def is_chip_text(text: str, chips: int) -> bool:
    """The chip of a `name@chip` key: decimal (no sign, no leading zeros), 0 .. chips - 1."""
    # (its length first: int() refuses a text of over 4,300 digits with a ValueError)
    return (text.isdecimal() and len(text) <= len(str(chips)) and str(int(text)) == text
            and int(text) < chips)


def bad_chip_key(key: str, chips: int, source: str | None) -> ConfigError:
    """The error for a `name@chip` key whose chip `is_chip_text` refuses."""
    return ConfigError(f"{key!r}: chip must be 0..{chips - 1}, written as a plain decimal number (no sign, "
                       "no leading zeros)",
                       file=source, key=key)


def check_writable(path: str, key: str) -> None:
    """An output file that will be written after a long run: its folder must exist and
    take files (checked before the run, not after it)."""
    if not path:
        raise ConfigError("wants the path of a file to write, got an empty one", key=key)
    target = Path(path)
    try:
        if target.is_dir():
            raise ConfigError(f"{path} is a directory, not a file to write", key=key)
        if _is_device(target):
            return   # written into, never replaced
        folder = target.parent
        blocker = _file_on_the_way(folder)
        if blocker is not None:
            raise ConfigError(f"cannot write {path}: {blocker} is a file, not a folder", key=key)
        if not folder.is_dir():
            raise ConfigError(f"cannot write {path}: the folder {folder} does not exist", key=key)
    except OSError as exc:   # e.g. a name too long for the file system
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}", key=key) from None
    # A file made there, not `os.access`: that says yes to root whatever the file system
    # (a read-only mount, /sys) then refuses.
    from mkemu.cache import takes_files

    if not takes_files(folder):
        raise ConfigError(f"cannot write {path}: the folder {folder} is not writable", key=key)


def check_dump_folder(path: str, key: str) -> None:
    """The folder a run dumps into (made by the run if need be): not a file, nor under
    one (checked before the run, not after it)."""
    target = Path(path)
    try:
        if target.exists() and not target.is_dir():
            raise ConfigError(f"{path} is a file, not a folder to dump into", key=key)
        blocker = _file_on_the_way(target)
    except OSError as exc:   # e.g. a name too long for the file system
        raise ConfigError(f"cannot create dump directory: {exc.strerror or exc}", file=path) from None
    if blocker is not None:
        raise ConfigError(f"cannot create dump directory: {blocker} is a file, not a folder", file=path)


def _file_on_the_way(folder: Path) -> Path | None:
    """The first leading part of `folder` that is there but no folder (a file, a
    device), so that nothing is under it: in `a.json/../x`, `a.json`. (`folder` itself
    then does not exist, and saying so would send the user looking in the wrong place.)"""
    for part in (*reversed(folder.parents), folder):
        if part.exists() and not part.is_dir():
            return part
    return None


def _is_device(target: Path) -> bool:
    """A device or a pipe: there, but neither a file nor a directory."""
    return target.exists() and not target.is_file() and not target.is_dir()


def atomic_write(path: str, data: bytes) -> None:
    """Write a file so that a crash leaves either the old file or the new one."""
    if not path:
        raise ConfigError("cannot write output: the path is empty")
    check_path(os.fspath(path) if isinstance(path, os.PathLike) else path, "path")
    target = Path(path)
    try:
        device = _is_device(target)
    except OSError as exc:   # e.g. a name too long for the file system
        raise ConfigError(f"cannot write output: {exc.strerror or exc}", file=str(path)) from None
    if device:
        # A device or a pipe (/dev/null, /dev/stdout, a FIFO): write into it, never replace it.
        try:
            with open(target, "wb") as fh:
                fh.write(data)
        except OSError as exc:
            raise ConfigError(f"cannot write output: {exc.strerror}", file=str(path)) from None
        return
    atomic_write_all({path: data})


def atomic_write_all(files: dict) -> None:
    """Write several files (path -> bytes, regular files) as one: an error or an interrupt
    leaves either all the old files or all the new ones, and each file is whole however
    the process ends. Each is written to a temporary file next to it first; then all are
    renamed into place, Ctrl-C and SIGTERM held back for those few renames."""
    written = []      # (temporary file, target)
    path = None       # (the one being written, for an error)
    try:
        for path, data in files.items():
            target = Path(path)
            # (the name cut so that the temporary file's name is no longer than the target's may be)
            # (and the process's and thread's own: threads of one process writing one output,
            # e.g. a kernel called from several at once, must not replace each other's)
            tmp = target.with_name(f".{target.name[:200]}.tmp{os.getpid()}.{threading.get_ident()}")
            written.append((tmp, target))
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        with signals_held():
            while written:
                path = written[0][1]
                os.replace(*written[0])
                written.pop(0)
    except BaseException as exc:
        # Any way out, Ctrl-C included, leaves no half-written temporary file behind.
        for tmp, _ in written:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:   # never created: its folder is missing or not a folder
                pass
        if not isinstance(exc, OSError):
            raise
        raise ConfigError(f"cannot write output: {exc.strerror or exc}", file=str(path)) from None


@contextlib.contextmanager
def signals_held(signums=(signal.SIGINT, signal.SIGTERM)):
    """Ctrl-C and SIGTERM held back from this thread while the block runs, delivered as
    it ends (where the OS holds signals per thread; elsewhere, nothing is held)."""
    hold = getattr(signal, "pthread_sigmask", None)
    if hold is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    hold(signal.SIG_BLOCK, set(signums))
    try:
        yield
    finally:
        hold(signal.SIG_UNBLOCK, set(signums))
