"""Assembler and disassembler, both derived from the instruction table.

`encode`/`decode` map between an instruction with operand values and its 64-bit
word; `format_instr`/`parse_instr` map between operand values and assembly text
using the row's syntax template, so the two directions cannot disagree.

The assembly file format (`.s`) adds a few directives:

    ; comment (or #)
    .reference vector_add_ref.py:reference   numpy reference "file:function"
    .buffer NAME DTYPE 8x128 KIND             an HBM buffer (kind: input, output, ...)
    .kernel NAME                              start a kernel (at least one instruction)
    .smem OFFSET WORD ...                     initial SMEM words at a byte offset
    label:                                    a branch target
    .launch NAME [ARG ...]                    append a launch (default: each kernel once);
                                              the args are SMEM words 0, 1, ... at start

Immediates may be numbers, `@buffer` (the buffer's HBM address) or labels. Numbers
are decimal, `0x` hex or `0b` binary; a decimal with a leading zero (`010`) is an
error rather than a guess between decimal and octal. SMEM words (`.smem`, `.launch`
arguments) are 32-bit: -2^31 .. 2^32 - 1.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from mkemu.errors import Diagnostic, SourceError, SourceSpan, as_read, source_lines
from mkemu.isa.encoding import OPCODE_SHIFT, TARGET, OperandKind, parse_f32_bits
from mkemu.isa.hardware import MAX_SMEM_BYTES
from mkemu.isa.program import BUFFER_KINDS, DTYPES, Kernel, Launch, Program, layout_buffers
from mkemu.isa.table import BY_OPCODE, TABLE, Instr


class EncodingError(ValueError):
    """A word that is not a valid instruction, or a value that does not fit."""


WORD_MIN, WORD_MAX = -(1 << 31), (1 << 32) - 1   # an SMEM word, signed or unsigned spelling


# How a register operand is spelled (s3, v0, m1, x0, a2): a label's name in a branch target only.
REGISTER_NAME = r"[svmxa][0-9]+"
# The most significant digits a number (or register number, or buffer dimension) may
# have: far more than any operand, SMEM word or size needs (each is then checked against
# its own range), and few enough for int() and str(), which refuse integers of thousands
# of decimal digits with a ValueError.
MAX_DIGITS = 100


def _digits(text: str) -> int:
    """How many significant digits the number `text` has (sign, 0x/0b and leading zeros aside)."""
    return len(re.sub(r"^[-+]?(?:0[xXbB])?0*", "", text))


def _short(text: str, quoted: bool = False) -> str:
    """A piece of the source shown in a message (a number, a shape; `quoted`, a name in
    quotes): at most 40 characters of it (a mistyped megabyte of a line is not echoed
    back whole)."""
    head = repr(text[:40]) if quoted else text[:40]
    return head if len(text) <= 40 else f"{head}... ({len(text):,} characters)"


def _quoted(text: str) -> str:
    return _short(text, quoted=True)


def _too_long(text: str, what: str = "number") -> str:
    return (f"{what} {text[:20]}... has {_digits(text)} digits; no operand, SMEM word or size "
            f"has more than {MAX_DIGITS}")


def parse_int(text: str) -> int:
    """An integer as the assembler writes them: decimal, 0x hex, 0b binary, with a sign.
    Raises EncodingError naming the text (a leading zero is not guessed at)."""
    if not re.fullmatch(_NUMBER, text):
        raise EncodingError(f"bad number {_quoted(text)}")
    if _digits(text) > MAX_DIGITS:
        raise EncodingError(_too_long(text))
    if re.fullmatch(r"[-+]?0[0-9]+", text):
        # (the digits as written, not int(): zeros in front count toward Python's limit of
        # 4,300 digits a conversion takes)
        decimal = re.sub(r"^([-+]?)0+(?=[0-9])", r"\1", text).removeprefix("+")
        raise EncodingError(f"bad number {_quoted(text)}: a decimal number does not start with 0 "
                            f"(write {_short(decimal)} for decimal, or 0x... for hex)")
    return int(text, 0)


def _first_wide(texts: list[str], values: list[int]) -> str | None:
    """The first of the SMEM words (as written) that does not fit in 32 bits, or None."""
    return next((t for t, w in zip(texts, values) if not WORD_MIN <= w <= WORD_MAX), None)


def encode(instr: Instr, values: dict[str, int]) -> int:
    word = instr.opcode << OPCODE_SHIFT
    for field in instr.fields:
        kind = field.operand.kind
        value = values[field.operand.name]
        problem = kind.check_value(value)
        if problem:
            raise EncodingError(f"{instr.mnemonic}: operand {field.operand.name}: {problem}")
        word |= kind.encode(value) << field.shift
    return word


def decode(word: int) -> tuple[Instr, dict[str, int]]:
    word = int(word)
    plan = _decoding(word >> OPCODE_SHIFT)
    if plan is None:
        raise EncodingError(f"illegal instruction word {word:#018x} (opcode {word >> OPCODE_SHIFT:#x})")
    instr, fields, used = plan
    stray = word & ((1 << OPCODE_SHIFT) - 1) & ~used
    if stray:
        raise EncodingError(f"illegal instruction word {word:#018x}: bits {stray:#x} set outside {instr.mnemonic}'s fields")
    values = {}
    bad_enum = False
    for name, shift, mask, kind, choices in fields:
        value = values[name] = kind.decode((word >> shift) & mask)
        if choices and value >= choices:
            bad_enum = True
    if bad_enum:
        raise EncodingError(f"illegal instruction word {word:#018x}: bad enum field in {instr.mnemonic}")
    return instr, values


@functools.cache
def _decoding(opcode: int) -> tuple[Instr, tuple, int] | None:
    """How `decode` takes apart a word of this opcode: its row, each field's (operand
    name, shift, mask, kind, number of enum choices) and the bits its fields use."""
    instr = BY_OPCODE.get(opcode)
    if instr is None:
        return None
    fields = tuple((f.operand.name, f.shift, (1 << f.operand.kind.bits) - 1, f.operand.kind,
                    len(f.operand.kind.choices)) for f in instr.fields)
    used = 0
    for f in instr.fields:
        used |= f.mask
    return instr, fields, used


def format_instr(instr: Instr, values: dict[str, int]) -> str:
    text = instr.syntax.format(**{op.name: op.kind.format(values[op.name]) for op in instr.operands})
    return f"{instr.mnemonic} {text}".rstrip()


def disassemble(word: int) -> str:
    return format_instr(*decode(word))


# --- parsing assembly text ----------------------------------------------------

# ASCII digits only ([0-9], not \d: Python's \d also matches other scripts' digits, which
# int() would read, so `li s١, ١٢` assembled as `li s1, 12`).
_NUMBER = r"[-+]?(?:0[xX][0-9a-fA-F]+|0[bB][01]+|[0-9]+)"
_SYMBOL = r"@?[A-Za-z_][\w.]*"
_LABEL = re.compile(r"([A-Za-z_][\w.]*):\s*")     # a label and the space after it


def _operand_regex(kind: OperandKind) -> str:
    if kind.prefix:
        return rf"{kind.prefix}([0-9]+)"
    if kind.choices:
        return "(" + "|".join(kind.choices) + ")"
    if kind.name == "f32":
        # (one way only to split digits around the point: `[0-9]+\.?[0-9]*` could split a
        # run of n digits n ways, and a long failing line took time growing as n squared)
        return r"(f32:0[xX][0-9a-fA-F]+|[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?inf|nan)"
    return rf"({_NUMBER}|{_SYMBOL})"


def _syntax_regex(instr: Instr) -> re.Pattern:
    kinds = {op.name: op.kind for op in instr.operands}
    parts, pos = [], 0
    for m in re.finditer(r"\{(\w+)\}", instr.syntax):
        parts.append(_literal(instr.syntax[pos:m.start()]))
        parts.append(_operand_regex(kinds[m.group(1)]))
        pos = m.end()
    parts.append(_literal(instr.syntax[pos:]))
    # One `\s*` where the pieces put several side by side (`, ` and `]@` do): runs of
    # them backtrack multiplicatively when a line fails to match (a 300-character line
    # with spaces around its punctuation and a stray word at its end took 20 s to refuse).
    return re.compile(re.sub(r"(?:\\s\*)+", lambda _: r"\s*", r"\s*" + "".join(parts) + r"\s*$"))


def _literal(text: str) -> str:
    return "".join(r"\s*" if ch == " " else r"\s*" + re.escape(ch) + r"\s*" for ch in text)


_REGEX = {m: _syntax_regex(ins) for m, ins in TABLE.items()}
_ORDER = {m: re.findall(r"\{(\w+)\}", ins.syntax) for m, ins in TABLE.items()}


def parse_instr(text: str, symbols: dict[str, int] | None = None) -> tuple[Instr, dict[str, int]]:
    """Parse one instruction's text. Raises EncodingError with a readable message."""
    text = text.strip()
    mnemonic, rest = (re.split(r"\s+", text, maxsplit=1) + [""])[:2]
    instr = TABLE.get(mnemonic)
    if instr is None:
        close = _closest(mnemonic) if len(mnemonic) <= 40 else None
        hint = f" (did you mean {close!r}?)" if close else ""
        raise EncodingError(f"unknown instruction {_quoted(mnemonic)}{hint}")
    m = _REGEX[mnemonic].match(rest)
    if m is None:
        raise EncodingError(f"bad operands for {mnemonic}: expected `{format_syntax(instr)}`")
    values = {}
    for name, raw in zip(_ORDER[mnemonic], m.groups()):
        kind = instr.operand(name).kind
        values[name] = _operand_value(kind, raw, symbols or {}, name)
        problem = kind.check_value(values[name])
        if problem and kind.name == "imm32":
            problem = (f"imm32 value {values[name]} does not fit in 32 bits ({WORD_MIN}..{WORD_MAX})"
                       if re.fullmatch(_NUMBER, raw) else
                       f"{raw} is {values[name]}, beyond a 32-bit immediate, which is sign-extended "
                       f"({WORD_MIN}..{(1 << 31) - 1})")
        if problem:
            raise EncodingError(f"{mnemonic}: operand {name}: {problem}")
    return instr, values


def format_syntax(instr: Instr) -> str:
    return f"{instr.mnemonic} {instr.syntax}".rstrip()


def _operand_value(kind: OperandKind, raw: str, symbols: dict[str, int], name: str) -> int:
    if kind.prefix:
        if _digits(raw) > MAX_DIGITS:
            raise EncodingError(f"register {kind.prefix}{raw[:20]}... has {_digits(raw)} digits: no such register")
        if len(raw) > 1 and raw.startswith("0"):
            shown = raw if len(raw) <= 20 else raw[:20] + "..."
            raise EncodingError(f"register {kind.prefix}{shown}: a register number has no leading zero "
                                f"(write {kind.prefix}{raw.lstrip('0') or '0'})")
        return int(raw)
    if kind.choices:
        return kind.choices.index(raw)
    if kind.name == "f32":
        bits = parse_f32_bits(raw)
        if bits is None and raw.startswith("f32:"):
            raise EncodingError(f"raw float32 bits {_short(raw[4:])} do not fit in 32 bits (0x0..0xffffffff)")
        if bits is None:
            raise EncodingError(f"bad float32 immediate {_quoted(raw)}")
        if re.match(r"[-+]?0[0-9]", raw):
            raise EncodingError(f"float32 immediate {_short(raw)}: a decimal with a leading zero is an error, as in "
                                "an integer (not octal)")
        if "inf" not in raw and not raw.startswith("f32:") and bits & 0x7FFFFFFF == 0x7F800000:
            raise EncodingError(f"float32 immediate {_short(raw)} is beyond the largest float32 "
                                f"(3.4028235e38); write inf for infinity")
        return bits
    if re.fullmatch(_NUMBER, raw):
        value = parse_int(raw)
        if kind.name == "imm32" and 1 << 31 <= value < 1 << 32:
            value -= 1 << 32   # allow unsigned spelling of 32-bit constants
        return value
    if re.fullmatch(REGISTER_NAME, raw) and (raw not in symbols or kind is not TARGET):
        # A label spelled like a register (`a0:`) is taken as a branch target only: in any
        # other field, `addi s1, s2, s3` (add meant) would silently take its index.
        also = " (a label of that name is taken only as a branch target)" if raw in symbols else ""
        raise EncodingError(f"operand {name} takes a number or a symbol, not the register {_short(raw)}{also}")
    if raw not in symbols:
        raise EncodingError(f"unknown symbol {_quoted(raw)} in operand {name}")
    return symbols[raw]


def _closest(mnemonic: str) -> str | None:
    import difflib

    found = difflib.get_close_matches(mnemonic, TABLE, n=1)
    return found[0] if found else None


def assemble(text: str, filename: str = "<asm>", smem_bytes: int | None = None) -> Program:
    """Assemble a `.s` file into a Program; all errors are collected and raised together.
    With `smem_bytes` (the profile's SMEM per core), initial SMEM words and launch
    arguments beyond it are errors at their line; without it, those beyond the largest
    SMEM any profile may have (`hardware.MAX_SMEM_BYTES`)."""
    if smem_bytes is None:
        smem_bytes = MAX_SMEM_BYTES
        smem_end, smem_has = (f"the largest SMEM a profile may have ({smem_bytes} bytes)",
                              f"no profile has more than {smem_bytes} bytes of SMEM")
    else:
        smem_end, smem_has = f"SMEM of {smem_bytes} bytes", f"SMEM has {smem_bytes}"
    lines = source_lines(as_read(text))   # (as reading its file gives it, as the .mk front end takes it)
    errors: list[Diagnostic] = []
    buffer_specs, launches, kernels = [], [], []
    buffer_lines: dict[str, int] = {}
    reference, reference_line = None, 0
    current = None  # dict: name, items [(line_no, col, text)], labels, smem

    def error(line_no, col, message, width=None):
        # (the end, line and column, where the width is known; else None, as docs/api.md says)
        end = (line_no, col + width) if width else (None, None)
        errors.append(Diagnostic(SourceSpan(filename, line_no, col, *end), message,
                                 lines[line_no - 1]))

    for line_no, raw in enumerate(lines, 1):
        code = re.split(r"[;#]", raw, maxsplit=1)[0]
        stripped = code.strip()
        if not stripped:
            continue
        col = len(code) - len(code.lstrip()) + 1
        pos = 0     # (labels are read by position: cutting the line after each was quadratic in them)
        while not stripped.startswith(".", pos) and (m := _LABEL.match(stripped, pos)):
            if current is None:
                error(line_no, col, "label outside a kernel (start one with .kernel NAME)")
            elif m.group(1) in current["labels"]:
                error(line_no, col, f"label {_quoted(m.group(1))} defined twice")
            else:
                current["labels"][m.group(1)] = len(current["items"])
                current["label_at"][m.group(1)] = (line_no, col)
            col += m.end() - pos
            pos = m.end()
        stripped = stripped[pos:].rstrip()
        if not stripped:
            continue
        words = stripped.split()
        if words[0].startswith("."):
            directive, args = words[0], words[1:]
            if directive == ".kernel" and len(args) == 1:
                current = {"name": args[0], "items": [], "labels": {}, "label_at": {}, "smem": {}, "smem_line": {},
                           "line": line_no, "col": col}
                kernels.append(current)
            elif directive == ".buffer" and len(args) == 4:
                name, dtype, shape_text, kind = args
                if not re.fullmatch(_SYMBOL[2:], name):   # (as an operand's `@NAME` reads it)
                    error(line_no, col, f"bad buffer name {_quoted(name)}: a letter or _, then letters, digits, _ "
                                        "or . (operands name it as @NAME)")
                elif dtype not in DTYPES:
                    error(line_no, col, f"unknown dtype {_quoted(dtype)} (one of {', '.join(DTYPES)})")
                elif kind not in BUFFER_KINDS:
                    error(line_no, col, f"unknown buffer kind {_quoted(kind)} (one of {', '.join(BUFFER_KINDS)})")
                elif not re.fullmatch(r"[0-9]+(x[0-9]+)*", shape_text):
                    error(line_no, col, f"bad shape {_quoted(shape_text)} (write e.g. 8x128)")
                elif any(_digits(d) > MAX_DIGITS for d in shape_text.split("x")):
                    error(line_no, col, f"buffer {_quoted(name)}: " + _too_long(
                        max(shape_text.split("x"), key=_digits), "dimension"))
                elif any(len(d) > 1 and d.startswith("0") for d in shape_text.split("x")):
                    error(line_no, col, f"bad shape {_quoted(shape_text)}: a dimension does not start with 0 "
                                        "(decimal, not octal)")
                elif any(int(d) == 0 for d in shape_text.split("x")):
                    error(line_no, col, f"buffer {_quoted(name)} has an empty dimension in shape {_short(shape_text)}")
                elif dtype == "mxfp4" and (len(shape_text.split("x")) < 2 or int(shape_text.split("x")[-1]) % 2):
                    error(line_no, col, f"an mxfp4 buffer needs at least 2 dimensions and an even last one, "
                                        f"got {_short(shape_text)}")
                elif name in buffer_lines:
                    error(line_no, col, f"buffer {_quoted(name)} declared twice (first at line {buffer_lines[name]})")
                else:
                    buffer_lines[name] = line_no
                    buffer_specs.append((name, dtype, tuple(int(d) for d in shape_text.split("x")), kind))
            elif directive == ".reference" and len(args) == 1:
                target, colon, function = args[0].rpartition(":")
                if not (colon and target and function.isidentifier()):
                    error(line_no, col, f".reference takes FILE.py:FUNCTION (or module:function), got {_quoted(args[0])}")
                elif reference is not None:     # (a program has one reference: the later would silently win)
                    error(line_no, col, f".reference given twice (first at line {reference_line})", len(words[0]))
                else:
                    reference, reference_line = args[0], line_no
            elif directive == ".launch" and args:
                try:
                    values = [parse_int(a) for a in args[1:]]
                except EncodingError as exc:
                    error(line_no, col, f"launch arguments must be integers: {exc}")
                    continue
                bad = _first_wide(args[1:], values)
                if bad:
                    error(line_no, col, f"launch argument {bad} does not fit in a 32-bit SMEM word "
                                        f"({WORD_MIN}..{WORD_MAX})")
                elif 4 * len(values) > smem_bytes:
                    error(line_no, col, f"{len(values)} launch arguments take {4 * len(values)} bytes; "
                                        f"{smem_has}")
                else:
                    launches.append((line_no, col, args[0], tuple(values)))
            elif directive == ".smem" and current is None:
                error(line_no, col, ".smem outside a kernel (start one with .kernel NAME)", len(words[0]))
            elif directive == ".smem" and len(args) >= 2:
                try:
                    offset = parse_int(args[0])
                    values = [parse_int(w) for w in args[1:]]
                except EncodingError as exc:
                    error(line_no, col, f".smem takes a byte offset and 32-bit integer words: {exc}")
                    continue
                bad = _first_wide(args[1:], values)
                if offset < 0 or offset % 4:
                    error(line_no, col, f".smem offset {offset} is not a 4-byte aligned SMEM address")
                elif bad:
                    error(line_no, col, f".smem word {bad} does not fit in 32 bits ({WORD_MIN}..{WORD_MAX})")
                elif offset + 4 * len(values) > smem_bytes:
                    error(line_no, col, f".smem words [{offset}, {offset + 4 * len(values)}) reach past "
                                        f"{smem_end}")
                elif (again := next((offset + 4 * i for i in range(len(values))
                                     if offset + 4 * i in current["smem"]), None)) is not None:
                    # (two lines giving one word: the later would silently win)
                    error(line_no, col, f".smem word at byte {again} is already set by the .smem at line "
                                        f"{current['smem_line'][again]}")
                else:
                    for i, w in enumerate(values):
                        current["smem"][offset + 4 * i] = w
                        current["smem_line"][offset + 4 * i] = line_no
            else:
                error(line_no, col, f"bad directive `{stripped if len(stripped) <= 80 else stripped[:80] + '...'}`", len(words[0]))
            continue
        if current is None:
            error(line_no, col, "instruction outside a kernel (start one with .kernel NAME)")
            continue
        current["items"].append((line_no, col, stripped))

    buffers = layout_buffers(buffer_specs, [f"{filename}:{buffer_lines[name]}" for name, *_ in buffer_specs])
    symbols_base = {"@" + b.name: b.offset_bytes for b in buffers}
    names = [k["name"] for k in kernels]
    built: dict[str, Kernel] = {}
    for k in kernels:
        if names.count(k["name"]) > 1 and k["name"] in built:
            error(k["line"], k["col"], f"kernel {_quoted(k['name'])} defined twice")
            continue
        if not k["items"]:
            # (it would assemble, and every run of it fault `ran-off-end` at pc 0, naming no line)
            error(k["line"], k["col"], f"kernel {k['name']!r} has no instructions (a kernel must end with halt)")
        for label, at in k["labels"].items():
            if at == len(k["items"]) and k["items"]:
                # (a branch to it would run off the kernel's end: a fault at run time, naming no line)
                error(*k["label_at"][label], f"label {_quoted(label)} labels no instruction (it is after the last of "
                                             f"kernel {k['name']!r})")
        symbols = dict(symbols_base, **k["labels"])
        code, spans = [], []
        for line_no, col, text in k["items"]:
            try:
                instr, values = parse_instr(text, symbols)
                code.append(encode(instr, values))
            except EncodingError as exc:
                error(line_no, col, str(exc), len(text))
                code.append(0)
            spans.append(SourceSpan(filename, line_no, col))
        smem = bytearray()
        for offset, value in sorted(k["smem"].items()):
            if len(smem) < offset + 4:
                smem.extend(b"\0" * (offset + 4 - len(smem)))
            smem[offset:offset + 4] = int(value & 0xFFFFFFFF).to_bytes(4, "little")
        built[k["name"]] = Kernel(
            name=k["name"], code=np.array(code, dtype=np.uint64), smem_init=bytes(smem),
            source_map=tuple(spans), source_text={filename: lines}, labels=dict(k["labels"]),
            smem_bytes=len(smem))
    if not kernels and not errors:
        errors.append(Diagnostic(SourceSpan(filename, 1, 1), "no kernel in file (start one with .kernel NAME)",
                                 lines[0] if lines else ""))
    launch_list = []
    for line_no, col, name, args in launches:
        if name not in built:
            error(line_no, col, f"launch of unknown kernel {_quoted(name)}")
        launch_list.append(Launch(name, args, SourceSpan(filename, line_no, col)))
    if errors:
        raise SourceError(errors)
    if not launch_list:
        launch_list = [Launch(name) for name in built]
    return Program(kernels=built, launches=tuple(launch_list), buffers=buffers,
                   reference=reference, path=filename)
