"""The front end's public API: load, check and elaborate a .mk program.

`load_program(path, params)` returns an `ir.Program` (see `mkemu.dsl.ir`): every
name resolved, params and consts folded, fn calls inlined, the host launch sequence
unrolled. It raises `SourceError` listing every syntax or semantic error of the
program sorted by position, or `ConfigError` for a bad parameter override.
"""

from __future__ import annotations

import os
from pathlib import Path

from mkemu.dsl import ast, ir
from mkemu.dsl.elaborate import Elaborator
from mkemu.dsl.folding import MAX_INT_BITS
from mkemu.dsl.imports import load_files
from mkemu.errors import ConfigError, Diagnostic, SourceError, SourceSpan, shown, source_lines
from mkemu.isa.program import ParamInfo


def load_program(
    path: str | os.PathLike, params: dict[str, int] | None = None, *, text: str | None = None
) -> ir.Program:
    """Load `path` (or `text`, named `path`) and its imports; check; elaborate.

    `params` overrides `param` declarations by name (model and hardware configs).
    """
    elaborator, sources = _elaborator(path, params, text)
    program = elaborator.program(str(path), Path(path).resolve().parent)
    _raise_collected(elaborator, sources)
    return program


def declared_params(path: str | os.PathLike, params: dict[str, int] | None = None) -> tuple[ParamInfo, ...]:
    """The params of `path` with `params` set (`ir.Program.param_info`), from the param
    and const declarations alone: what a program that fails with these values (a
    failed assert, a kernel too big for them) would have run with."""
    elaborator, sources = _elaborator(path, params, None)
    info = elaborator.param_info(elaborator.values()[0])
    _raise_collected(elaborator, sources)
    return info


def _elaborator(path, params: dict[str, int] | None, text: str | None) -> tuple[Elaborator, dict[str, str]]:
    """An elaborator of the program's files (parsed and checked for import errors), with
    `params` checked against the declared params."""
    loaded = load_files(path, text)
    diagnostics: list[Diagnostic] = []
    for error in loaded.parse_errors:
        diagnostics.extend(error.diagnostics)
    diagnostics.extend(_diagnostic(span, msg, loaded.sources) for span, msg in loaded.errors)
    if diagnostics:
        raise SourceError(diagnostics)
    modules = [f.module for f in loaded.files if f.module is not None]
    overrides = dict(params or {})
    declared = {
        item.name: item
        for m in modules
        for item in m.items
        if isinstance(item, (ast.ParamDecl, ast.ConstDecl))
    }
    for name, value in overrides.items():
        decl = declared.get(name)
        if decl is None:
            known = ", ".join(sorted(n for n, d in declared.items() if isinstance(d, ast.ParamDecl)))
            raise ConfigError(
                f"unknown program parameter '{name}' (the program's params: {known or 'none'})",
                file=str(path), key=name,
            )
        if isinstance(decl, ast.ConstDecl):
            raise ConfigError(f"'{name}' is a const, not a param; it cannot be set from outside",
                              file=str(path), key=name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"param '{name}' must be an integer, got {shown(value)}", file=str(path), key=name)
        if value.bit_length() > MAX_INT_BITS:    # (as a literal or a folded value is)
            raise ConfigError(f"param '{name}' is an integer of {value.bit_length():,} bits; a compile-time "
                              f"integer has at most {MAX_INT_BITS}", file=str(path), key=name)
    return Elaborator(modules, loaded.sources, overrides), loaded.sources


def _raise_collected(elaborator: Elaborator, sources: dict[str, str]) -> None:
    errors = elaborator.diagnostics()
    if errors:
        raise SourceError([_diagnostic(span, msg, sources) for span, msg in errors])


def _diagnostic(span: SourceSpan, message: str, sources: dict[str, str]) -> Diagnostic:
    lines = source_lines(sources.get(span.file, ""))
    line = lines[span.line - 1] if 1 <= span.line <= len(lines) else None
    return Diagnostic(span, message, line)
