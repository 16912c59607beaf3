"""Loading a .mk file and everything it imports.

`import "x.mk";` is resolved relative to the importing file; `import "mkemu:lib/x.mk";`
relative to the installed `mkemu.programs` package (the shipped library). Each file is parsed
once however often it is imported (diamonds are fine); an import cycle is an error
at the import that closes it, naming the whole chain; a missing file is an error at
its import statement. Syntax errors of all files are collected together.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from mkemu.dsl import ast
from mkemu.dsl.parser import parse
from mkemu.errors import ConfigError, SourceError, SourceSpan, as_read, not_text
from mkemu.shipped import SHIPPED, programs_root



@attrs.frozen
class LoadedFile:
    name: str  # the file name used in spans
    path: Path
    text: str
    module: ast.Module | None  # None when it did not parse


@attrs.define
class LoadResult:
    files: list[LoadedFile]  # imported files before their importers; main file last
    errors: list[tuple[SourceSpan, str]]
    parse_errors: list[SourceError]
    sources: dict[str, str]


def load_files(main: str | os.PathLike, main_text: str | None = None) -> LoadResult:
    """Read and parse `main` and its imports. `main_text` overrides reading main."""
    result = LoadResult([], [], [], {})
    main_name = str(main)
    loaded: dict[Path, LoadedFile] = {}

    def open_file(path: Path, name: str, text: str) -> tuple[LoadedFile, list]:
        """Parse a file; its entry and the imports it names, still to visit."""
        result.sources[name] = text
        try:
            module = parse(text, name)
        except SourceError as e:
            result.parse_errors.append(e)
            module = None
        entry = LoadedFile(name, path, text, module)
        loaded[path] = entry
        imports = [] if module is None else [item for item in module.items if isinstance(item, ast.Import)]
        return entry, imports[::-1]   # (popped from the end: in the order written)

    def visit(main_path: Path, main_name: str, main_text: str) -> None:
        # Depth first with a stack of its own, not by recursion: a chain of imports
        # thousands of files long would overflow Python's stack. A frame is a file being
        # visited and its imports not visited yet; `stack` holds the chain of paths to it.
        frames = [open_file(main_path, main_name, main_text)]
        stack, on_stack = [main_path], {main_path}
        while frames:
            entry, imports = frames[-1]
            if not imports:
                frames.pop()
                on_stack.discard(stack.pop())
                result.files.append(entry)  # after its imports: definitions in import order
                continue
            item = imports.pop()
            path, name = entry.path, entry.name
            bad = unusable_file_name(item.path)
            if bad:
                result.errors.append((item.span, f"imported file name {bad}"))
                continue
            if item.path.startswith(SHIPPED):
                # The shipped library, wherever mkemu is installed: a program outside the
                # checkout cannot reach it by a relative path.
                root = programs_root().resolve()
                target = (root / item.path[len(SHIPPED):]).resolve()
                target_name = str(target)
                if not target.is_relative_to(root):   # (an absolute path, or one climbing out with ..)
                    result.errors.append((item.span, f"'{SHIPPED}' names a file of the shipped programs, "
                                                     f"relative to them (e.g. '{SHIPPED}lib/collectives.mk'); "
                                                     f"'{item.path}' is outside them"))
                    continue
            else:
                try:
                    target = (path.parent / item.path).resolve()
                except (OSError, RuntimeError) as exc:   # (a symlink loop: RuntimeError before Python 3.13)
                    result.errors.append((item.span, f"cannot read imported file '{item.path}': "
                                                     f"{getattr(exc, 'strerror', None) or exc}"))
                    continue
                target_name = os.path.normpath(os.path.join(os.path.dirname(name), item.path))
            if target in on_stack:
                chain = stack[stack.index(target):] + [target]
                names = " -> ".join(_display(p, loaded) for p in chain)
                result.errors.append((item.span, f"import cycle: {names}"))
                continue
            if target in loaded:
                continue
            try:
                irregular = target.exists() and not target.is_file()
            except OSError as exc:     # (a name too long for the file system)
                result.errors.append((item.span, f"cannot read imported file '{item.path}': {exc.strerror or exc}"))
                continue
            if irregular:
                # (a device or a pipe may never end: /dev/zero would fill memory)
                result.errors.append((item.span, f"cannot read imported file '{item.path}': it is not a regular "
                                                 "file (a directory, a device or a pipe)"))
                continue
            try:
                target_text = target.read_text()
            except FileNotFoundError:
                result.errors.append(
                    (item.span, f"cannot find imported file '{item.path}' (looked for {target})")
                )
                continue
            except OSError as e:
                result.errors.append((item.span, f"cannot read imported file '{item.path}': {e.strerror}"))
                continue
            except UnicodeDecodeError as e:
                result.errors.append((item.span, f"imported file '{item.path}' is {not_text(e)}"))
                continue
            frames.append(open_file(target, target_name, as_read(target_text)))
            stack.append(target)
            on_stack.add(target)

    main_path = Path(main).resolve()
    if main_text is None:
        try:
            main_text = main_path.read_text()
        except OSError as e:
            raise ConfigError(f"cannot read program: {e.strerror}", file=main_name) from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"cannot read program: it is {not_text(e)}", file=main_name) from None
    visit(main_path, main_name, as_read(main_text))   # (a text given as a str, as reading its file would)
    return result


def unusable_file_name(name: str) -> str | None:
    """What keeps `name` from naming a file at all (resolving it would raise
    ValueError), or None: a NUL character, or one the file system's encoding cannot
    write (a lone surrogate, which a text given as a str may hold)."""
    if "\0" in name:
        return "contains a NUL character"
    try:
        os.fsencode(name)
    except UnicodeEncodeError as exc:
        return f"contains a character no file name can hold (U+{ord(exc.object[exc.start]):04X})"
    return None


def _display(path: Path, loaded: dict[Path, LoadedFile]) -> str:
    entry = loaded.get(path)
    return entry.name if entry else str(path)
