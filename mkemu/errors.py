"""The one error hierarchy of mkemu.

Every problem a user can cause (a bad profile, a malformed program, a fault while
running) is raised as a subclass of `MkemuError`. The command line catches exactly
this type, prints `render()` and exits non-zero; anything else is a bug in mkemu.
"""

from __future__ import annotations

import attrs


class MkemuError(Exception):
    """Base of every error meant for a user. `render()` gives the text to print.

    Errors pickle and copy with every attribute (a process pool or a tuning worker sends
    them back to its parent): rebuilt from their attributes, not by calling `__init__`
    again with the rendered text, which none of the subclasses takes."""

    def render(self) -> str:
        return f"error: {self}"

    def __reduce__(self):
        return _rebuilt, (type(self), dict(self.__dict__))


def _rebuilt(cls: type, state: dict) -> MkemuError:
    error = cls.__new__(cls)
    error.__dict__.update(state)
    Exception.__init__(error, error.render())
    return error


# Control characters as escapes (`\n`, `\x1b`): a name given with a newline or a
# carriage return in it keeps its error on one line.
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(32), 127)} | {10: "\\n", 13: "\\r", 9: "\\t"}


def one_line(text: str) -> str:
    return text.translate(_ESCAPES)


def shown(value, limit: int = 100) -> str:
    """`repr(value)` for a message, at most `limit` characters. An integer too long for
    Python to write out in decimal (past 4,300 digits: repr raises ValueError), or a
    value holding one, is described instead."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        return f"an integer of {value.bit_length():,} bits"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__} too large to show"
    return text if len(text) <= limit else text[:limit] + "..."


def grouped(n: int) -> str:
    """An integer with thousands separators, or described when too long to write out."""
    return f"{n:,}" if n.bit_length() <= 1000 else shown(n)


class ConfigError(MkemuError):
    """A bad hardware profile, model config, mesh or run option. Names file and key."""

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None,
                 line: int | None = None, column: int | None = None, end_column: int | None = None,
                 source_line: str | None = None):
        self.message = message
        # (a file or key that came from the user as something else, e.g. a buffer named 3)
        self.file = None if file is None else str(file)
        self.key = None if key is None else str(key)
        self.line, self.column = line, column      # where in the file, when known (TOML syntax)
        # The text of that line, shown under the error with a caret as a SourceError's is
        # (a reference that fails to load); end_column: where the caret ends, exclusive.
        self.end_column, self.source_line = end_column, source_line
        super().__init__(self.render())

    def render(self) -> str:
        place = self.file
        if place and self.line is not None:
            place += f":{self.line}" + (f":{self.column}" if self.column is not None else "")
        where = one_line(": ".join(p for p in (place, self.key) if p))
        message = one_line(self.message)
        text = f"{where}: error: {message}" if where else f"error: {message}"
        if self.source_line is None or self.line is None:
            return text
        return text + excerpt(self.source_line, self.column or 1, self.end_column)


@attrs.frozen
class SourceSpan:
    """A region of a source file: 1-based line and column, end exclusive."""

    file: str
    line: int
    column: int
    end_line: int | None = None
    end_column: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


def as_read(text: str) -> str:
    """A program's text as reading its file gives it to the front ends: a byte-order mark
    (which some editors write first) dropped, CR and CRLF line ends made LF (universal
    newlines; `compile_source` passes a text as given)."""
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def source_lines(text: str) -> list[str]:
    """A source text's lines as its positions number them (the .mk lexer and the
    assembler): split at newlines only (str.splitlines also splits at a form feed, a
    vertical tab or a Unicode line separator, which a comment, a string or the whitespace
    may hold, and would shift every line after it), the carriage return of a CRLF dropped."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


SHOWN_CHARS = 160     # of a source line, at most, under an error


@attrs.frozen
class Diagnostic:
    span: SourceSpan
    message: str
    source_line: str | None = None

    def render(self) -> str:
        text = f"{self.span}: error: {self.message}"
        if self.source_line is None:
            return text
        one_line_span = self.span.end_line in (None, self.span.line)
        return text + excerpt(self.source_line, self.span.column, self.span.end_column if one_line_span else None)


def excerpt(source_line: str, column: int, end_column: int | None) -> str:
    """The lines under a located error: its source line, then a caret under columns
    `column` to `end_column` (exclusive; None: to the end of the line)."""
    line = source_line.rstrip("\n")
    start = max(column, 1)
    if end_column:
        width = max(end_column - start, 1)
    else:
        width = max(len(line) - start + 1, 1)
    if len(line) > SHOWN_CHARS:
        # A long line (minified, or a file of one huge line) shows the part around
        # the error, its cut ends marked, not megabytes of it.
        lo = max(min(start - 1 - SHOWN_CHARS // 4, len(line) - SHOWN_CHARS), 0)
        hi = lo + SHOWN_CHARS
        head, tail = ("..." if lo else ""), ("..." if hi < len(line) else "")
        width = max(min(width, hi - (start - 1)), 1)
        line, start = head + line[lo:hi] + tail, start - lo + len(head)
    # Control characters (a stray escape sequence, a carriage return) are shown as
    # escapes, never sent to the terminal; the caret spans what they are shown as. (Its
    # padding keeps the line's tabs, so it lands under the same column however the
    # terminal expands them.)
    shown = [ch if ch == "\t" else _control_escape(ch) for ch in line]
    pad = "".join(ch if ch == "\t" else " " * len(ch) for ch in shown[:start - 1])
    width = max(sum(map(len, shown[start - 1:start - 1 + width])), 1)
    return f"\n  {''.join(shown)}\n  {pad}{'^' * width}"


def _control_escape(ch: str) -> str:
    """`ch`, or its escape if it is a control character (C0, DEL or C1)."""
    code = ord(ch)
    return ch if 32 <= code < 127 or code > 159 else _ESCAPES.get(code, f"\\x{code:02x}")


class SourceError(MkemuError):
    """One or more errors in a source file (assembly or .mk), sorted by position."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = sorted(
            diagnostics, key=lambda d: (d.span.file, d.span.line, d.span.column)
        )
        super().__init__(self.render())

    def render(self) -> str:
        return "\n".join(d.render() for d in self.diagnostics)


class EmulatorFault(MkemuError):
    """A fault while running: names chip, core, cycle, pc, the instruction and its source."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        chip: int | None = None,
        core: int | None = None,
        cycle: int | None = None,
        pc: int | None = None,
        instruction: str | None = None,
        source: str | None = None,
        details: tuple[str, ...] = (),
        context: str | None = None,
    ):
        self.kind = kind
        self.message = message
        self.chip = chip
        self.core = core
        self.cycle = cycle
        self.pc = pc
        self.instruction = instruction
        self.source = source
        self.details = details
        self.context = context
        super().__init__(self.render())

    def render(self) -> str:
        where = []
        if self.chip is not None:
            where.append(f"chip {self.chip}")
        if self.core is not None:
            where.append(f"core {self.core}")
        if self.cycle is not None:
            where.append(f"cycle {self.cycle}")
        if self.pc is not None:
            where.append(f"pc {self.pc:#06x}")
        head = f"fault [{self.kind}]" + (f" at {', '.join(where)}" if where else "")
        lines = [f"{head}: {self.message}"]
        if self.instruction:
            lines.append(f"  instruction: {self.instruction}")
        if self.source:
            lines.append(f"  source: {self.source}")
        if self.context:
            lines.append(f"  {self.context}")
        lines.extend(f"  {d}" for d in self.details)
        return "\n".join(lines)


class TraceError(MkemuError):
    """A trace file that cannot be read: not a trace, a newer format, truncated or corrupted."""

    def __init__(self, message: str, *, file: str | None = None):
        self.message = message
        self.file = file
        super().__init__(self.render())

    def render(self) -> str:
        # (one line: a name the file carries, a kernel's or a column's, may hold control characters)
        message = one_line(self.message)
        return f"{one_line(self.file)}: error: {message}" if self.file else f"error: {message}"


def not_text(exc: UnicodeDecodeError) -> str:
    """Why a file is not a program's text: the first byte that is not UTF-8."""
    return f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})"


def check_regular_file(path, what: str) -> None:
    """A ConfigError naming `path` unless it is a regular file: a device or a pipe may
    never end (/dev/zero would fill memory) or block until a writer comes, and a
    directory has no bytes. (An OSError of the look itself is the caller's to word.)"""
    import os
    import stat

    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ConfigError(f"cannot read {what}: it is not a regular file (a directory, a device or a pipe)",
                          file=os.fspath(path))


def read_user_file(path, what: str) -> bytes:
    """The bytes of a file a user named (a profile, a model config, a record), or a
    ConfigError naming it. Only a regular file is read (`check_regular_file`)."""
    import os

    try:
        check_regular_file(path, what)
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as err:
        raise ConfigError(f"cannot read {what}: {err.strerror or err}", file=os.fspath(path)) from None
