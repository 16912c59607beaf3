"""Every instruction is implemented, and the compiled loop is built from the table."""

from __future__ import annotations

import ast
import builtins
import os
import re
import subprocess
import symtable
import sys
import textwrap

import pytest

from mkemu.cache import cache_dir
from mkemu.emulator.decode import LOCAL_ROWS
from mkemu.emulator.loop import compiled_loop, generate_source
from mkemu.emulator.machine import GLOBAL_OPS
from mkemu.isa.table import GLOBAL_KINDS, TABLE


def test_every_row_is_implemented_once():
    source = generate_source()
    for mnemonic, instr in TABLE.items():
        if instr.is_global:
            assert instr.global_kind in GLOBAL_OPS, mnemonic
        else:
            assert source.count(f"# {mnemonic}\n") == 1, mnemonic
    assert set(GLOBAL_OPS) == set(GLOBAL_KINDS)
    assert {i.mnemonic for i in LOCAL_ROWS} == {m for m, i in TABLE.items() if not i.is_global}


def undefined_names(source: str) -> set[str]:
    """The names the generated loop function reads that nothing defines: neither the
    function (its arguments, its locals) nor the module (its imports, constants,
    functions) nor Python's builtins."""
    defined = set(dir(builtins))
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.FunctionDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    run = next(c for c in symtable.symtable(source, "loop", "exec").get_children() if c.get_name() == "run")
    return {s.get_name() for s in run.get_symbols() if s.is_global() and s.get_name() not in defined}


def test_every_name_an_exec_clause_reads_is_defined_in_the_loop():
    # An exec clause naming a helper of isa/semantics.py that emulator/loop.py does not
    # import (its `_HELPERS`), or an operand the row does not have, passed every test
    # and failed only at a run, after numba's compile, as a NameError naming no row.
    source = generate_source()
    assert undefined_names(source.replace("w32(", "w33(", 1)) == {"w33"}     # (the check itself)
    missing = undefined_names(source)
    rows = {name: [m for m, i in TABLE.items() if i.exec and re.search(rf"\b{name}\b", i.exec)] for name in missing}
    assert not missing, (f"exec clauses read names the generated loop does not define: {rows} (a helper of "
                         "isa/semantics.py is imported into the loop through emulator/loop.py's _HELPERS)")


REGISTER_ARRAYS = {"S", "V", "VF", "VI", "M", "MR"}


def test_an_exec_clause_writes_only_the_registers_its_row_declares_written():
    # A register written by the clause but declared read ("r") is missing from the
    # row's scoreboard destinations: a later reader would not wait for it, silently.
    for mnemonic, instr in TABLE.items():
        if instr.exec is None:
            continue
        access = {op.name: op.access for op in instr.operands}
        for node in ast.walk(ast.parse(textwrap.dedent(instr.exec.replace("{check}", "pass")))):
            if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id in REGISTER_ARRAYS):
                first = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) else node.slice
                if isinstance(first, ast.Name) and first.id in access:
                    assert access[first.id] == "w", (mnemonic, f"writes {node.value.id}[{first.id}]")


def test_the_loop_is_compiled_outside_the_source_tree():
    compiled_loop()
    cached = list(cache_dir().glob("mkemu_loop_*.py"))
    assert cached and all("/emulator/" not in str(p) for p in cached)
    assert any(p.read_text() == generate_source() for p in cached)



def test_a_machine_loads_a_compiled_loop_ahead_on_a_thread_of_its_own():
    # In a fresh process: the loop was compiled on this machine (above, or by an earlier
    # run), so building a machine starts loading it, and the run finds it loaded.
    compiled_loop()
    script = (
        "from mkemu.emulator import loop\n"
        "from mkemu.emulator.machine import Machine\n"
        "from mkemu.isa.hardware import load_profile\n"
        "from mkemu.isa.asm import assemble\n"
        "machine = Machine(load_profile('test'))\n"
        "assert loop._loading is not None and loop._loading.name == 'mkemu-loop-load'\n"
        "machine.load(assemble('.kernel main\\n    li s1, 7\\n    halt\\n'))\n"
        "result = machine.run()\n"
        "loop._loading.join()\n"
        "assert loop._compiled is not None and result.instructions == 2 * len(machine.cores)\n"
        "print('ok')\n")
    assert in_fresh_processes(script) == "ok\n"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
@pytest.mark.parametrize("holding", [False, True], ids=["a fork", "a fork holding numba's compiler lock"])
def test_a_fork_while_the_loop_loads_waits_for_it_unless_it_holds_numba_s_lock(holding):
    # A fork copied the loading thread's locks as held, without the thread: the child's
    # first launch waited for them forever (in 2 of 4 such forks). A fork holding numba's
    # compiler lock (as the K3 driver forks its reference's child) must not wait: the
    # loading thread needs that lock. Its child leaves the loop alone.
    compiled_loop()
    script = (
        "import contextlib, faulthandler, os, sys\n"
        "from numba.core.compiler_lock import global_compiler_lock\n"
        "import mkemu\n"
        "kernel = mkemu.compile('vector_add', hw='test', mesh='1')\n"
        "session = kernel.session()      # (a machine: its loop loading on a thread)\n"
        f"with global_compiler_lock if {holding} else contextlib.nullcontext():\n"
        "    pid = os.fork()\n"
        "if pid == 0:\n"
        "    faulthandler.dump_traceback_later(60, exit=True)\n"
        f"    os._exit(0 if {holding} or kernel().check() is None else 7)\n"
        "code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n"
        "sys.exit(code or (0 if kernel().check() is None else 7))\n")
    in_fresh_processes(script, times=3)


def in_fresh_processes(script: str, times: int = 1) -> str:
    """Run `script` in `times` fresh interpreters (nothing loaded yet), each to exit
    status 0; the last one's standard output."""
    for _ in range(times):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    return done.stdout
