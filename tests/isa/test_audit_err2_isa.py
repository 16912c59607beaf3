"""Audit err2: a long `extends` chain of profiles loads (it overflowed Python's stack),
and a `.s` kernel with no instructions is an error at its `.kernel` line (it assembled,
and every run faulted `ran-off-end` naming no file or line)."""

from __future__ import annotations

from pathlib import Path

import pytest

import mkemu
from mkemu.cli import main
from mkemu.errors import ConfigError, SourceError
from mkemu.isa.asm import assemble
from mkemu.isa.doc import render
from mkemu.isa.hardware import load_profile

# --------------------------------------------------------------------------- extends chains

CHAIN = 1000     # (a RecursionError from about 900 files deep)


def write_chain(folder: Path, n: int, last_extends: str = "test") -> Path:
    """p0.toml extends p1.toml ... extends p{n-1}.toml, which extends `last_extends`."""
    for i in range(n):
        base = f"p{i + 1}.toml" if i + 1 < n else last_extends
        (folder / f"p{i}.toml").write_text(f'extends = "{base}"\nname = "p{i}"\n')
    return folder / "p0.toml"


def test_a_chain_of_a_thousand_profiles_loads_with_every_override(tmp_path):
    top = write_chain(tmp_path, CHAIN)
    (tmp_path / f"p{CHAIN - 1}.toml").write_text(f'extends = "test"\nname = "p{CHAIN - 1}"\n[core]\nsemaphores = 3\n')
    (tmp_path / "p500.toml").write_text('extends = "p501.toml"\n[core]\nsemaphores = 5\nmregs = 4\n')
    (tmp_path / "p1.toml").write_text('extends = "p2.toml"\n[core]\nmregs = 6\n')
    p = load_profile(top)
    assert (p.name, p.semaphores, p.mregs, p.source) == ("p0", 5, 6, str(top))
    assert p.vmem_bytes == load_profile("test").vmem_bytes


def test_a_long_chain_shows_at_the_command_line(tmp_path, capsys):
    top = write_chain(tmp_path, CHAIN)
    assert main(["hw", "show", str(top)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"profile p0  ({top})") and "Traceback" not in out + err


def test_a_cycle_at_the_end_of_a_long_chain_is_an_error_at_its_key(tmp_path, capsys):
    top = write_chain(tmp_path, CHAIN, last_extends="p0.toml")
    with pytest.raises(ConfigError) as info:
        load_profile(top)
    assert (info.value.file, info.value.key) == (str(top), "extends")
    assert "profiles extend each other in a cycle: " in info.value.message
    assert main(["hw", "show", str(top)]) == 1
    out, err = capsys.readouterr()
    assert f"{top}: extends: error: profiles extend each other in a cycle" in err and "Traceback" not in out + err


def test_an_error_deep_in_a_long_chain_names_its_file_and_key(tmp_path):
    top = write_chain(tmp_path, CHAIN)
    bad = tmp_path / "p700.toml"
    bad.write_text('extends = "p701.toml"\n[core]\nsemaphores = 0\n')
    with pytest.raises(ConfigError) as info:
        load_profile(top)
    assert (info.value.file, info.value.key) == (str(bad), "core.semaphores")
    missing = tmp_path / "p900.toml"
    missing.write_text('extends = "nowhere.toml"\n')
    with pytest.raises(ConfigError) as info:
        load_profile(top)
    assert (info.value.file, info.value.key) == (str(missing), "extends")
    assert "nowhere.toml: no such file" in info.value.message


# --------------------------------------------------------------------------- empty kernels

MESSAGE = "kernel 'main' has no instructions (a kernel must end with halt)"


@pytest.mark.parametrize("source, where", [
    (".buffer out i32 1x128 output\n.kernel main\n", "prog.s:2:1"),                          # nothing after it
    (".buffer out i32 1x128 output\n.kernel main\n.kernel other\n    halt\n", "prog.s:2:1"),  # another follows
    (".kernel first\n    halt\n.kernel main\nlbl:\n.launch main\n", "prog.s:3:1"),          # a label only
    (".kernel first\n    halt\n  .kernel main\n  .smem 0 1\n.launch first\n", "prog.s:3:3"),  # never launched
])
def test_a_kernel_with_no_instructions_is_an_error_at_its_kernel_line(source, where):
    with pytest.raises(SourceError) as info:
        assemble(source, "prog.s")
    text = info.value.render()
    assert text.startswith(f"{where}: error: {MESSAGE}\n"), text
    assert len(info.value.diagnostics) == 1


@pytest.mark.parametrize("command", ["asm", "run"])
def test_an_empty_kernel_fails_at_the_command_line_naming_its_line(tmp_path, capsys, command):
    path = tmp_path / "empty.s"
    path.write_text(".buffer out i32 1x128 output\n.kernel main\n")
    args = [command, str(path)] + (["--hw", "test", "--mesh", "1"] if command == "run" else [])
    assert main(args) == 1
    out, err = capsys.readouterr()
    assert f"{path}:2:1: error: {MESSAGE}" in err
    assert "ran-off-end" not in err and "Traceback" not in out + err


def test_an_empty_kernel_is_a_source_error_when_compiled():
    with pytest.raises(SourceError, match=r"p\.s:1:1: error: kernel 'main' has no instructions"):
        mkemu.compile_source(".kernel main\nend:\n", filename="p.s", hw="test", mesh="1")


def test_a_kernel_of_one_halt_still_assembles():
    program = assemble(".kernel main\nstart:\n    halt\n", "ok.s")
    assert len(program.kernels["main"].code) == 1


def test_the_isa_doc_says_a_kernel_has_an_instruction():
    assert "A kernel has at least one instruction" in render()
