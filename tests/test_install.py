"""A plain (non-editable) install runs the shipped programs from any folder.

The source tree is copied to a temporary folder, installed from there with
`pip install --no-deps --no-build-isolation --target` (offline: the current
interpreter's numpy, numba, lark and attrs serve as the dependencies), and the
installed `mkemu` command is run from another temporary folder, where neither the
checkout nor its `programs/` folder is in reach.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mkemu.cache import cache_dir

ROOT = Path(__file__).parents[1]
PACKAGE_DATA = ("isa/profiles/tpu-v7-like.toml", "dsl/grammar.lark", "programs/k3_megakernel.mk",
                "programs/k3/model.mk", "programs/k3/configs/k3-mini.toml", "programs/lib/collectives.mk",
                "programs/examples/vector_add.s", "programs/examples/refs.py", "programs/k3/driver.py")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    src = tmp_path_factory.mktemp("src") / "mkemu"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", "tests", "bench"))
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(src)], check=True, capture_output=True)
    return target


def _run(target: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(target))
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_install_holds_every_data_file(installed):
    package = installed / "mkemu"
    missing = [p for p in PACKAGE_DATA if not (package / p).is_file()]
    assert not missing


def test_shipped_programs_run_by_name_from_any_folder(installed, tmp_path):
    mkemu = str(installed / "bin" / "mkemu")
    listed = _run(installed, tmp_path, mkemu, "programs")
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert {"k3_megakernel", "k3_per_op", "vector_add", "all_reduce"} <= set(names)
    assert all(len(line.split(None, 1)) == 2 for line in listed.stdout.splitlines()), "a description each"

    where = _run(installed, tmp_path, sys.executable, "-c", "import mkemu, mkemu.programs.k3.driver as d; "
                 "print(mkemu.__file__); print(d.__name__)")
    assert where.stdout.split() == [str(installed / "mkemu" / "__init__.py"), "mkemu.programs.k3.driver"]

    # The K3 driver has relative imports: it must load as a module of the package.
    k3 = _run(installed, tmp_path, mkemu, "run", "k3_megakernel", "--model", "k3-tiny",
              "--prompt-len", "1", "--steps", "1")
    assert k3.returncode == 0, k3.stderr
    assert k3.stdout.startswith("PASS")
    example = _run(installed, tmp_path, mkemu, "run", "all_reduce", "--hw", "test", "--mesh", "2x1x1")
    assert example.returncode == 0 and example.stdout.startswith("PASS"), example.stderr
    # numba keeps compiled code next to the file defining a function: every compiled
    # function is defined in a module of the user cache, so none lands in the install.
    assert not [str(p) for p in installed.rglob("*.nb[ic]")]


def test_a_users_program_names_its_own_reference_file(installed, tmp_path):
    shutil.copy(ROOT / "programs/examples/vector_add.mk", tmp_path / "mine.mk")
    shutil.copy(ROOT / "programs/examples/vector_add_ref.py", tmp_path / "vector_add_ref.py")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = _run(installed, elsewhere, str(installed / "bin" / "mkemu"), "run", "../mine.mk", "--hw", "test")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("PASS: outputs bit-exact against vector_add_ref.py:reference")
    missing = _run(installed, elsewhere, str(installed / "bin" / "mkemu"), "run", "no_such_program")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "no program file or shipped program named 'no_such_program'" in missing.stderr


def test_an_install_that_cannot_be_written_runs_and_stays_as_installed(installed, tmp_path):
    """Compiled code goes to the user cache directory, never into the install (a
    read-only site-packages, or a read-only checkout, works the same way)."""
    def listing() -> dict[str, int]:
        return {str(p.relative_to(installed)): p.stat().st_size for p in installed.rglob("*")}

    before = listing()
    modes = {p: p.stat().st_mode for p in [installed, *installed.rglob("*")]}
    env = dict(os.environ, PYTHONPATH=str(installed))
    try:
        for p, mode in modes.items():
            p.chmod(mode & ~0o222)
        run = subprocess.run([str(installed / "bin" / "mkemu"), "run", "vector_add", "--hw", "test"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
    assert run.returncode == 0 and run.stdout.startswith("PASS"), run.stderr
    assert "Warning" not in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert listing() == before
    assert list(cache_dir().glob("mkemu_loop_*.compiled")), "the issue loop is compiled into the user cache"
