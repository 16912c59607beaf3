"""Every instruction is implemented, and the compiled loop is built from the table."""

from __future__ import annotations

import os
import subprocess
import sys

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
