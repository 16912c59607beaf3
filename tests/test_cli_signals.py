"""The `mkemu` command terminated (SIGTERM) ends as an interrupted one does: exit status
143, one line, and nothing half-written or empty left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGTERM") or sys.platform == "win32",
                                reason="POSIX signals")


def test_a_terminated_run_exits_143_and_leaves_no_dump_folder(tmp_path):
    dump = tmp_path / "dump"
    argv = ["mkemu", "run", "k3_megakernel", "--prompt-len", "2", "--steps", "12", "--dump", str(dump)]
    proc = subprocess.Popen([sys.executable, "-c", f"import sys; from mkemu.cli import entry; sys.argv = {argv!r}; "
                             "sys.exit(entry())"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not dump.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)                      # (steps under way)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "terminated" and "Traceback" not in err
    assert not dump.exists()             # created for the run, empty: removed
    assert not list(tmp_path.rglob(".*.tmp*"))
