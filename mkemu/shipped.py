"""The programs shipped inside the package (`mkemu.programs`): found by name, listed
with a one-line description.

`mkemu run k3_megakernel` and `mkemu.compile("vector_add")` work from any folder
after a plain `pip install`: a name that is not an existing file is looked up among
the shipped programs (`programs/*.mk` and `programs/examples/*.mk|.s`). Library files
(`programs/lib`, `programs/k3`) are imported by those programs and are not listed.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from mkemu.errors import ConfigError

SUFFIXES = (".mk", ".s")
SHIPPED = "mkemu:"   # `import "mkemu:lib/collectives.mk";`: a file of the installed mkemu.programs
_FOLDERS = ("", "examples")


@attrs.frozen
class ShippedProgram:
    name: str           # what `mkemu run NAME` takes
    path: Path
    description: str


def programs_root() -> Path:
    import mkemu.programs

    return Path(mkemu.programs.__file__).parent


def list_programs() -> list[ShippedProgram]:
    root = programs_root()
    out = []
    for folder in _FOLDERS:
        for path in sorted((root / folder).iterdir()):
            if path.suffix in SUFFIXES and path.is_file():
                # vector_add.mk and vector_add.s share a stem: the .s goes by its file name.
                stem_taken = path.suffix == ".s" and path.with_suffix(".mk").is_file()
                out.append(ShippedProgram(path.name if stem_taken else path.stem, path, _description(path)))
    return out


MAX_SOURCE_BYTES = 16 << 20     # the shipped K3 programs with every import: about 0.2 MB


def resolve(program: str) -> str:
    """`program` itself if it is a file, else the path of the shipped program of that name
    (also where a folder or device has that name: it could never be a program)."""
    if not program:
        raise ConfigError("no program given: the name is empty (`mkemu programs` lists the shipped ones)",
                          key="PROGRAM")
    problem = None
    try:
        if Path(program).is_file():
            size = Path(program).stat().st_size
            if size > MAX_SOURCE_BYTES:   # (read whole, a 3 GB file took minutes and all memory)
                raise ConfigError(f"cannot read program: it is {size:,} bytes, and a .mk or .s program is text of "
                                  f"at most {MAX_SOURCE_BYTES >> 20} MiB", file=program)
            return program
        if Path(program).is_dir():
            problem = "cannot read program: it is a directory"
        elif Path(program).exists():   # (/dev/zero would never end; a pipe cannot be read twice)
            problem = "cannot read program: it is not a regular file (a device or a pipe); give a .mk or .s file"
    except OSError as exc:   # e.g. a name too long for the file system
        raise ConfigError(f"cannot read program: {exc.strerror or exc}", file=program) from None
    for shipped in list_programs():
        if program in (shipped.name, shipped.path.name):
            return str(shipped.path)
    if problem:
        raise ConfigError(problem, file=program)
    if "/" in program or "\\" in program:
        raise ConfigError("cannot read program: No such file", file=program)
    if Path(program).suffix in SUFFIXES:
        raise ConfigError("cannot read program: No such file (nor a shipped program of that name; "
                          "`mkemu programs` lists them)", file=program)
    raise ConfigError(f"no program file or shipped program named {program!r} (`mkemu programs` lists them)",
                      file=program)


def _description(path: Path) -> str:
    """The first sentence of the comment that opens the file, at most one line long."""
    words = []
    for line in path.read_text().splitlines():
        m = re.match(r"\s*(//|#|;)\s?(.*)", line)
        if not m or not m.group(2).strip():
            break
        words.append(m.group(2).strip())
    text = " ".join(words)
    sentence = re.split(r"(?<=\.)\s", text, maxsplit=1)[0] if text else ""
    if not sentence:
        return "(assembly)" if path.suffix == ".s" else ""
    return sentence if len(sentence) <= 90 else sentence[:89].rstrip() + "…"
