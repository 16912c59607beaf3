"""A plain (non-editable) install runs the shipped programs from any folder.

The source tree is copied to a temporary folder, built into a wheel there (`pip wheel
--no-deps --no-build-isolation`, offline), and the wheel installed into a fresh
virtual environment; its dependencies are the current interpreter's numpy, numba,
lark and attrs (a `.pth` file names their folder: no network). The environment's
`mkemu` command is run from another temporary folder, where neither the checkout nor
its `programs/` folder is in reach.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import NamedTuple

import pytest

from mkemu.cache import cache_dir

ROOT = Path(__file__).parents[1]
PACKAGE_DATA = ("isa/profiles/tpu-v7-like.toml", "dsl/grammar.lark", "programs/k3_megakernel.mk",
                "programs/k3/model.mk", "programs/k3/configs/k3-mini.toml", "programs/lib/collectives.mk",
                "programs/examples/vector_add.s", "programs/examples/refs.py", "programs/k3/driver.py")


class Install(NamedTuple):
    venv: Path          # the fresh virtual environment
    package: Path       # the installed `mkemu` package folder
    mkemu: str          # its `mkemu` command


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Install:
    src = tmp_path_factory.mktemp("src") / "mkemu"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", "tests", "bench"))
    wheels = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(wheels), str(src)], check=True, capture_output=True)
    [wheel] = wheels.glob("mkemu-*.whl")
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(venv)], check=True,
                   capture_output=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # The dependencies, from this interpreter's environment: after the venv's own
    # site-packages on the path, so the installed mkemu is the one imported.
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_mkemu_test_deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True)
    return Install(venv, site / "mkemu", str(venv / "bin" / "mkemu"))


def _run(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_install_holds_every_data_file(installed):
    package = installed.package
    missing = [p for p in PACKAGE_DATA if not (package / p).is_file()]
    assert not missing


def test_shipped_programs_run_by_name_from_any_folder(installed, tmp_path):
    mkemu = installed.mkemu
    listed = _run(tmp_path, mkemu, "programs")
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert {"k3_megakernel", "k3_per_op", "vector_add", "all_reduce"} <= set(names)
    assert all(len(line.split(None, 1)) == 2 for line in listed.stdout.splitlines()), "a description each"

    where = _run(tmp_path, str(installed.venv / "bin" / "python"), "-c", "import mkemu, "
                 "mkemu.programs.k3.driver as d; print(mkemu.__file__); print(d.__name__)")
    assert where.stdout.split() == [str(installed.package / "__init__.py"), "mkemu.programs.k3.driver"], where.stderr

    # The K3 driver has relative imports: it must load as a module of the package.
    k3 = _run(tmp_path, mkemu, "run", "k3_megakernel", "--model", "k3-tiny",
              "--prompt-len", "1", "--steps", "1")
    assert k3.returncode == 0, k3.stderr
    assert k3.stdout.startswith("PASS")
    example = _run(tmp_path, mkemu, "run", "all_reduce", "--hw", "test", "--mesh", "2x1x1")
    assert example.returncode == 0 and example.stdout.startswith("PASS"), example.stderr
    # numba keeps compiled code next to the file defining a function: every compiled
    # function is defined in a module of the user cache, so none lands in the install.
    assert not [str(p) for p in installed.package.rglob("*.nb[ic]")]


def test_a_users_program_names_its_own_reference_file(installed, tmp_path):
    shutil.copy(ROOT / "programs/examples/vector_add.mk", tmp_path / "mine.mk")
    shutil.copy(ROOT / "programs/examples/vector_add_ref.py", tmp_path / "vector_add_ref.py")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = _run(elsewhere, installed.mkemu, "run", "../mine.mk", "--hw", "test")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("PASS: outputs bit-exact against vector_add_ref.py:reference")
    missing = _run(elsewhere, installed.mkemu, "run", "no_such_program")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "no program file or shipped program named 'no_such_program'" in missing.stderr


def test_an_install_that_cannot_be_written_runs_and_stays_as_installed(installed, tmp_path):
    """Compiled code goes to the user cache directory, never into the install (a
    read-only site-packages, or a read-only checkout, works the same way)."""
    def listing() -> dict[str, int]:
        return {str(p.relative_to(installed.venv)): p.stat().st_size for p in installed.venv.rglob("*")}

    before = listing()
    modes = {p: p.stat().st_mode for p in [installed.venv, *installed.venv.rglob("*")]}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    try:
        for p, mode in modes.items():
            p.chmod(mode & ~0o222)
        run = subprocess.run([installed.mkemu, "run", "vector_add", "--hw", "test"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
    assert run.returncode == 0 and run.stdout.startswith("PASS"), run.stderr
    assert "Warning" not in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert listing() == before
    assert list(cache_dir().glob("mkemu_loop_*.compiled")), "the issue loop is compiled into the user cache"


def test_every_package_the_code_imports_is_a_declared_dependency():
    """A module the package imports (at its top or inside a function) is either the
    standard library, mkemu itself, a declared dependency, or one of the optional
    extras' (each import of those is guarded with a message naming the extra). An
    MXFP4 run used to need ml_dtypes, which only the test extra brought."""
    import ast
    import re
    import tomllib

    root = Path(__file__).parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]

    def names(requirements) -> set[str]:
        return {re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0].lower().replace("-", "_") for r in requirements}

    declared = names(project["dependencies"])
    optional = names(r for extra, reqs in project["optional-dependencies"].items() if extra != "test" for r in reqs)
    imported = set()
    for folder in ("mkemu", "isa", "emulator", "dsl", "tools", "programs"):
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    imported |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    imported.add(node.module.split(".")[0])
    third_party = {m.lower() for m in imported} - set(sys.stdlib_module_names) - {"mkemu", "__future__"}
    optional |= {"dask"}                 # (the `distributed` extra brings it)
    assert third_party - optional <= declared, third_party - optional - declared
    assert "ml_dtypes" in declared
