"""Parsing .mk text into `mkemu.dsl.ast` nodes.

The Lark LALR parser is built once per process, on first use, from `grammar.lark`.
A text parsed before in the process (the K3 programs and their imports, compiled
again for every set of parameters) gives back its tree: the nodes are immutable.
Every Lark exception becomes a `SourceError` with file, line, column, the source
line, carets and the expected tokens spelled as a reader would write them.
"""

from __future__ import annotations

import functools
import hashlib
import re
import sys
from pathlib import Path

import lark
from lark import Token, Transformer, v_args
from lark.lexer import PatternStr

from mkemu.dsl import ast
from mkemu.dsl.folding import MAX_INT_BITS
from mkemu.errors import Diagnostic, SourceError, SourceSpan, source_lines

GRAMMAR_PATH = Path(__file__).with_name("grammar.lark")

# Human names for the regex terminals; string terminals are shown quoted.
_TERMINAL_NAMES = {
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "STRING": "a string",
    "RECV": "'recv'",
    "$END": "end of file",
}


# Keywords only in their place, names elsewhere (`for step in 0..2`): `in`, `step` (loop
# and pipeline headers), `depth`, `part`, `via` (pipeline headers and streams) and `recv`,
# `input`, `output` (at the start of a statement).
CONTEXTUAL = frozenset("in step depth part via recv input output".split())
# Keywords that are never names: the grammar's other words. The contextual lexer reads a
# keyword where the grammar cannot take it as a NAME, so without this check `let for = 1;`
# would declare 'for'.
RESERVED = frozenset(re.findall(r'"([a-z_]+)"', GRAMMAR_PATH.read_text())) - CONTEXTUAL


class _KeywordAsName(Exception):
    def __init__(self, token: Token):
        self.token = token


def _check_name(token: Token) -> Token:
    if token in RESERVED:
        raise _KeywordAsName(token)
    return token


@functools.cache
def _parser() -> lark.Lark:
    grammar = GRAMMAR_PATH.read_text()
    return lark.Lark(
        grammar,
        parser="lalr",
        propagate_positions=True,
        cache=_tables_file(grammar),
        maybe_placeholders=True,
        lexer_callbacks={"NAME": _check_name},
    )


def _tables_file(grammar: str) -> str | bool:
    """Where Lark keeps the LALR tables (a pickle it loads: about 0.1 s saved per
    process) in mkemu's own cache folder, which only this user can write; False (built
    each time) without one. Not Lark's `cache=True`: a file of a predictable name in the
    shared temporary folder, which another user could plant first."""
    from mkemu.cache import cache_dir

    try:
        folder = cache_dir("grammar")
    except OSError:
        return False
    digest = hashlib.sha256("\0".join((grammar, lark.__version__, sys.version)).encode()).hexdigest()[:20]
    return str(folder / f"lalr_{digest}.pickle")


@functools.cache
def _terminal_display() -> dict[str, str]:
    names = dict(_TERMINAL_NAMES)
    for term in _parser().terminals:
        if term.name not in names and isinstance(term.pattern, PatternStr):
            names[term.name] = f"'{term.pattern.value}'"
    return names


def describe_terminal(name: str) -> str:
    return _terminal_display().get(name, name.lower())


_EXPR_START = {"'('", "'-'", "'!'", "a name", "an integer", "a number"}
_STMT_KEYWORDS = {
    "'assert'", "'for'", "'hbm'", "'if'", "'input'", "'launch'", "'let'", "'output'",
    "'pipeline'", "'region'", "'sem'", "'smem'", "'start'", "'var'", "'vmem'", "'wait'",
}
_BINARY_OPS = {
    "'!='", "'%'", "'&&'", "'&'", "'*'", "'+'", "'-'", "'/'", "'<'", "'<<'", "'<='",
    "'=='", "'>'", "'>='", "'>>'", "'^'", "'|'", "'||'", "'.'",
}
_ASSIGN_OPS = {"'='", "'+='", "'-='", "'*='", "'/='"}


def _expected_text(expected) -> str:
    """Spell the expected terminals for a reader, folding big families into one word."""
    shown = {describe_terminal(t) for t in expected}
    groups = []
    if {"'let'", "'for'"} <= shown:
        shown -= _STMT_KEYWORDS | _EXPR_START
        groups.append("a statement")
    elif {"'('", "a name", "an integer"} <= shown:
        shown -= _EXPR_START
        groups.append("an expression")
    if len(shown & _BINARY_OPS) >= 4:
        shown -= _BINARY_OPS
        groups.append("an operator")
    if len(shown & _ASSIGN_OPS) >= 3:
        shown -= _ASSIGN_OPS
        groups.append("an assignment")
    items = sorted(shown) + groups
    if not items:
        return ""
    if len(items) == 1:
        return f"expected {items[0]}"
    return "expected one of: " + ", ".join(items)



def _source_line(text: str, line: int) -> str | None:
    lines = source_lines(text)
    return lines[line - 1] if 1 <= line <= len(lines) else None


def _syntax_error(text: str, filename: str, line: int, column: int, width: int, msg: str):
    span = SourceSpan(filename, line, column, line, column + max(width, 1))
    return SourceError([Diagnostic(span, msg, _source_line(text, line))])


def _end_position(text: str) -> tuple[int, int]:
    lines = source_lines(text)
    # Point just past the last non-blank character: that is where something is missing.
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].strip():
            return i + 1, len(lines[i].rstrip()) + 1
    return 1, 1


def _accepted(e: lark.exceptions.UnexpectedToken) -> set[str]:
    """The terminals that really could come next (LALR's state lists more)."""
    try:
        return set(e.interactive_parser.accepts()) - {"$END"} or set(e.expected)
    except Exception:  # noqa: BLE001 - accepts() replays the parser; fall back on failure
        return set(e.expected)


def parse(text: str, filename: str = "<string>") -> ast.Module:
    """Parse one .mk file. Raises `SourceError` on any syntax error."""
    return _parse_text(text, filename)


# Levels of the parse tree (the shipped programs reach 27).
MAX_NESTING = 100


def _too_deep(tree: lark.Tree) -> lark.Tree | None:
    """The first node nested more than MAX_NESTING levels deep, or None. A statement's
    block is on the statement's level: a nested loop, `if` or region is one level, as
    the language's limits count them."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING and not getattr(node.meta, "empty", True):
            return node
        stack.extend((c, depth + (c.data != "block")) for c in reversed(node.children) if isinstance(c, lark.Tree))
    return None


# Declarations only a file's top level holds.
_TOP_LEVEL_ONLY = frozenset("import param const reference fn kernel host struct".split())


def _declaration_in_block(text: str, tok: Token) -> str | None:
    """The message for a top-level declaration (`const` in a kernel) starting a statement
    inside a block, if `tok` is one; None otherwise."""
    before = re.sub(r'//[^\n]*|"[^"\n]*"', "", text[:tok.start_pos])
    if tok in _TOP_LEVEL_ONLY and before.rstrip()[-1:] in (";", "{", "}") and before.count("{") > before.count("}"):
        return f"'{tok}' declarations belong at the top level of a file, not inside a block"
    return None


def _keyword_message(text: str, tok: Token) -> str:
    """What a keyword the grammar could not take here means: a top-level declaration
    starting a statement inside a block (`const` in a kernel), else a keyword written
    as a name (`let for = 1;`)."""
    return _declaration_in_block(text, tok) or f"'{tok}' is a keyword; it cannot be used as a name"


def _contextual_keyword_hint(text: str, tok: Token) -> str | None:
    """Why the parse broke at `tok` if the word before it is a name the lexer read as a
    contextual keyword: `recv` right after `wait` (`wait recv * h;`, a count named recv),
    `input` or `output` starting a statement (`input = 3;`, a var named input); or
    `scratch`, the role a host array declared `hbm` takes, written as if a keyword. None
    otherwise."""
    before = re.sub(r'//[^\n]*|"[^"\n]*"', "", text[:tok.start_pos])
    if re.search(r"\bwait\s+recv\s*$", before):
        return ("'recv' right after 'wait' is the receive keyword (`wait recv h;`), so a count or copy "
                "named 'recv' must be in parentheses there: `wait (recv) * h;`")
    if re.search(r"(?:^|[;{}])\s*scratch\s*$", before):
        return ("'scratch' is the role of a host array that is neither input nor output, not a keyword: "
                "declare one `hbm NAME: TYPE;`")
    stream = re.search(r"(?:^|[;{}])\s*(input|output)\s*$", before)
    if stream:
        word = stream.group(1)
        return (f"'{word}' at the start of a statement declares an {word} or a pipeline stream "
                f"(`{word} NAME: TYPE;`, `{word} NAME = VIEW;`), so a name '{word}' cannot start one: rename it")
    return None


@functools.lru_cache(maxsize=64)
def _parse_text(text: str, filename: str) -> ast.Module:
    from mkemu.cache import cached_parse

    return cached_parse(text, filename, _parse_afresh, lark.__version__)


def _parse_afresh(text: str, filename: str) -> ast.Module:
    try:
        tree = _parser().parse(text)
    except _KeywordAsName as e:
        tok = e.token
        raise _syntax_error(text, filename, tok.line, tok.column, len(tok), _keyword_message(text, tok)) from None
    except lark.exceptions.UnexpectedCharacters as e:
        char = text[e.pos_in_stream] if e.pos_in_stream < len(text) else ""
        shown = repr(char) if char else "end of file"
        message = f"unexpected character {shown}"
        if char == '"':   # (a string runs to its closing quote on the same line)
            message = "unterminated string (a string closes with '\"' on the line it opens)"
        raise _syntax_error(text, filename, e.line, e.column, 1, message) from None
    except lark.exceptions.UnexpectedEOF as e:
        line, col = _end_position(text)
        msg = "unexpected end of file"
        if e.expected:
            msg += "; " + _expected_text(set(e.expected))
        raise _syntax_error(text, filename, line, col, 1, msg) from None
    except lark.exceptions.UnexpectedToken as e:
        tok = e.token
        if tok.type == "$END":
            line, col = _end_position(text)
            msg, width = "unexpected end of file", 1
        else:
            line, col = tok.line, tok.column
            width = len(str(tok))
            if tok.type == "NAME":
                msg = f"unexpected name '{tok}'"
            elif tok.type in ("INT", "FLOAT", "STRING"):
                kind = {"INT": "integer", "FLOAT": "number", "STRING": "string"}[tok.type]
                msg = f"unexpected {kind} {tok}"
            else:
                msg = f"unexpected '{tok}'"
        # (after a statement a top-level statement may also end, `assert ...;` or a block's
        # `}`, the lexer reads `const` as the keyword, not as a name: the same mistake)
        in_block = _declaration_in_block(text, tok) if tok.type != "$END" else None
        hint = _contextual_keyword_hint(text, tok) if tok.type != "$END" else None
        expected = _expected_text(_accepted(e))
        if in_block:
            msg = in_block
        elif hint:
            msg += "; " + hint
        elif expected:
            msg += "; " + expected
        raise _syntax_error(text, filename, line, col, width, msg) from None
    except lark.exceptions.LarkError as e:  # pragma: no cover - any other Lark failure
        raise _syntax_error(text, filename, 1, 1, 1, f"cannot parse: {e}") from None
    deep = _too_deep(tree)
    if deep is not None:   # (the builder and the elaborator recurse: Python's stack would overflow)
        meta = deep.meta
        width = meta.end_column - meta.column if meta.end_line == meta.line else 1
        raise _syntax_error(text, filename, meta.line, meta.column, width,
                            f"nested too deeply (more than {MAX_NESTING} levels of blocks and expressions)")
    try:
        return _Builder(filename, text).transform(tree)
    except lark.exceptions.VisitError as e:   # a builder's own error (a bad literal), wrapped by Lark
        if isinstance(e.orig_exc, SourceError):
            raise e.orig_exc from None
        raise


# ---------------------------------------------------------------- tree -> AST


@v_args(meta=True)
class _Builder(Transformer):
    def __init__(self, filename: str, text: str):
        super().__init__()
        self.filename = filename
        self.text = text

    # -- helpers
    def _span(self, meta) -> SourceSpan:
        if getattr(meta, "empty", True):
            return SourceSpan(self.filename, 1, 1)
        return SourceSpan(self.filename, meta.line, meta.column, meta.end_line, meta.end_column)

    def _error(self, span: SourceSpan, message: str) -> SourceError:
        """An error the builder finds (a bad literal or argument list), at `span`."""
        return SourceError([Diagnostic(span, message, _source_line(self.text, span.line))])

    def _tspan(self, tok: Token) -> SourceSpan:
        return SourceSpan(self.filename, tok.line, tok.column, tok.end_line, tok.end_column)

    @staticmethod
    def _string(tok: Token) -> str:
        return str(tok)[1:-1]

    @staticmethod
    def _nonnull(items):
        return tuple(x for x in items if x is not None)

    # -- items
    def start(self, meta, items):
        return ast.Module(self.filename, tuple(items), self._span(meta))

    def import_decl(self, meta, c):
        return ast.Import(self._string(c[0]), self._span(meta))

    def param_decl(self, meta, c):
        name, value, domain, description = c
        text = None if description is None else self._string(description)
        return ast.ParamDecl(str(name), value, self._span(meta), self._tspan(name), domain, text)

    def param_set(self, meta, c):
        return ast.ParamSet(tuple(c), self._span(meta))

    def param_range(self, meta, c):
        return ast.ParamRange(c[0], c[1], c[2], self._span(meta))

    def const_decl(self, meta, c):
        return ast.ConstDecl(str(c[0]), c[1], self._span(meta), self._tspan(c[0]))

    def reference_decl(self, meta, c):
        return ast.Reference(self._string(c[0]), self._span(meta))

    def fn_decl(self, meta, c):
        return ast.FnDecl(str(c[0]), c[2], c[3], self._span(meta), self._tspan(c[0]), c[1] or ())

    def kernel_decl(self, meta, c):
        return ast.KernelDecl(str(c[0]), c[2], c[3], self._span(meta), self._tspan(c[0]), c[1] or ())

    def generics(self, meta, c):
        return tuple(ast.Generic(str(tok), self._tspan(tok)) for tok in c)

    def host_decl(self, meta, c):
        return ast.HostDecl(c[0], self._span(meta))

    def struct_decl(self, meta, c):
        return ast.StructDecl(str(c[0]), tuple(c[1:]), self._span(meta), self._tspan(c[0]))

    def params(self, meta, c):
        return self._nonnull(c)

    def param(self, meta, c):
        return ast.Param(str(c[0]), c[1], self._span(meta), self._tspan(c[0]))

    # -- types
    def space(self, meta, c):
        return str(c[0])

    def dims(self, meta, c):
        return tuple(c)

    def mem_type(self, meta, c):
        space, dtype, first = c[0], str(c[1]), c[2]
        second = c[3] if len(c) > 3 else None
        if second is None:
            return ast.MemType(space, dtype, first, None, self._span(meta))
        return ast.MemType(space, dtype, second, first, self._span(meta))

    def sem_type(self, meta, c):
        return ast.SemType(c[0] if c else None, self._span(meta))

    def scalar_type(self, meta, c):
        return ast.ScalarType(str(c[0]), self._span(meta))

    # -- statements
    def block(self, meta, c):
        return ast.Block(tuple(c), self._span(meta))

    def buffer_decl(self, meta, c):
        space, name, dtype = c[0], c[1], str(c[2])
        first = c[3] if len(c) > 3 else None
        second = c[4] if len(c) > 4 else None
        span = self._span(meta)
        if second is None:
            return ast.BufferDecl(space, str(name), dtype, first, None, span, self._tspan(name))
        return ast.BufferDecl(space, str(name), dtype, second, first, span, self._tspan(name))

    def sem_decl(self, meta, c):
        count = c[1] if len(c) > 1 else None
        return ast.SemDecl(str(c[0]), count, self._span(meta), self._tspan(c[0]))

    def var_decl(self, meta, c):
        name, dtype = c[0], str(c[1])
        dims = c[2] if len(c) > 3 else None
        init = c[-1]
        return ast.VarDecl(str(name), dtype, dims, init, self._span(meta), self._tspan(name))

    def let_stmt(self, meta, c):
        return ast.Let(str(c[0]), c[1], self._span(meta), self._tspan(c[0]))

    def assign_stmt(self, meta, c):
        return ast.Assign(c[0], str(c[1]), c[2], self._span(meta))

    def expr_stmt(self, meta, c):
        return ast.ExprStmt(c[0], self._span(meta))

    def start_stmt(self, meta, c):
        return ast.Start(c[0], self._span(meta))

    def wait_stmt(self, meta, c):
        recv = len(c) == 2
        return ast.Wait(c[-1], recv, self._span(meta))

    def wait_sem_stmt(self, meta, c):
        return ast.WaitSem(c[0], c[1], self._span(meta))

    def for_stmt(self, meta, c):
        var, start, stop, step, body = c
        return ast.For(str(var), start, stop, step, body, self._span(meta), self._tspan(var))

    def pipeline_stmt(self, meta, c):
        var, start, stop, step, depth, part, body = c
        return ast.Pipeline(str(var), start, stop, step, depth, part, body, self._span(meta), self._tspan(var))

    def pipe_stream(self, meta, c):
        kind, name, view = str(c[0]), c[1], c[3]
        via = (c[5], c[7]) if len(c) > 5 and c[5] is not None and c[5] != ";" else None
        return ast.PipeStream(kind, str(name), view, via, self._span(meta), self._tspan(name))

    def if_stmt(self, meta, c):
        return ast.If(c[0], c[1], c[2] if len(c) > 2 else None, self._span(meta))

    def region_stmt(self, meta, c):
        return ast.Region(self._string(c[0]), c[1], c[2], self._span(meta))

    def launch_stmt(self, meta, c):
        args, keywords = c[1]
        return ast.Launch(str(c[0]), args + keywords, self._span(meta), self._tspan(c[0]))

    def io_decl(self, meta, c):
        kind, name, dtype = str(c[0]), c[1], str(c[3])
        dims = c[4] if len(c) > 4 and c[4] != ";" else None
        return ast.IoDecl(kind, str(name), dtype, dims, self._span(meta), self._tspan(name))

    def assert_stmt(self, meta, c):
        message = self._string(c[1]) if len(c) > 1 and c[1] is not None else None
        return ast.Assert(c[0], message, self._span(meta))

    # -- expressions
    def _op(self, meta, c):
        return str(c[0])

    assign_op = cmp_op = bor_op = bxor_op = band_op = shift_op = add_op = mul_op = _op
    unary_op = _op

    def binary(self, meta, c):
        return ast.Binary(str(c[1]), c[0], c[2], self._span(meta))

    def or_op(self, meta, c):
        return ast.Binary("||", c[0], c[1], self._span(meta))

    def and_op(self, meta, c):
        return ast.Binary("&&", c[0], c[1], self._span(meta))

    def unary(self, meta, c):
        return ast.Unary(str(c[0]), c[1], self._span(meta))

    def index(self, meta, c):
        return ast.Index(c[0], tuple(c[1:]), self._span(meta))

    def field(self, meta, c):
        return ast.Field(c[0], str(c[1]), self._span(meta), self._tspan(c[1]))

    def name(self, meta, c):
        return ast.Name(str(c[0]), self._span(meta))

    def int_lit(self, meta, c):
        text = str(c[0]).replace("_", "")
        hexadecimal = text[:2] in ("0x", "0X")
        digits = text[2:] if hexadecimal else text
        # (int() refuses `0x_`, which has no digits, and literals of thousands of digits)
        value = int(digits, 16 if hexadecimal else 10) if 0 < len(digits) <= MAX_INT_BITS else None
        if value is None or value.bit_length() > MAX_INT_BITS:
            what = f"is too large (at most {MAX_INT_BITS} bits)" if digits else "has no digits"
            raise self._error(self._span(meta), f"integer literal {what}")
        return ast.IntLit(value, self._span(meta))

    def neg_int_lit(self, meta, c):
        return ast.IntLit(-self.int_lit(meta, c).value, self._span(meta))

    def float_lit(self, meta, c):
        text = str(c[0])
        return ast.FloatLit(float(text), self._span(meta), text)

    def call(self, meta, c):
        name, (args, keywords) = c[0], c[1]
        return ast.Call(str(name), args, keywords, self._span(meta), self._tspan(name))

    def args(self, meta, c):
        given = [a for a in c if a is not None]
        first = next((i for i, a in enumerate(given) if isinstance(a, ast.Keyword)), len(given))
        late = next((a for a in given[first:] if not isinstance(a, ast.Keyword)), None)
        if late is not None:
            raise self._error(late.span, "a positional argument follows a keyword argument")
        args = tuple(a for a in c if a is not None and not isinstance(a, ast.Keyword))
        keywords = tuple(a for a in c if isinstance(a, ast.Keyword))
        return args, keywords

    def remote(self, meta, c):
        return ast.Remote(c[0], c[1], self._span(meta))

    def keyword(self, meta, c):
        return ast.Keyword(str(c[0]), c[1], self._span(meta))

    def slice(self, meta, c):
        return ast.Slice(c[0], c[1], self._span(meta))

    def sized_slice(self, meta, c):
        return ast.SizedSlice(c[0], c[1], self._span(meta))
