"""Audit 76: the compiler on very large and deeply nested programs (the kind a code
generator writes). Each either compiles (and computes the right thing) or fails with one
error naming the limit: never a RecursionError, a hang or memory without bound."""

import textwrap

import numpy as np
import pytest

import mkemu
from mkemu.dsl import statements
from mkemu.dsl.compiler import compile_text
from mkemu.dsl.frontend import load_program
from mkemu.errors import SourceError

# A kernel that adds BODY to a f32[8, 128] input.
KERNEL = """\
kernel k(a: hbm f32[8, 128], out: hbm f32[8, 128]) {{
    vmem x: f32[8, 128];
    sem s;
    start copy(a, x, s);
    wait copy(a, x, s);
{body}
    start copy(x, out, s);
    wait copy(x, out, s);
}}
host {{
    input a: f32[8, 128];
    output out: f32[8, 128];
    launch k(a, out);
}}
"""


def kernel(body: str) -> str:
    return KERNEL.format(body=textwrap.indent(body, "    "))


def error_lines(src: str) -> list[str]:
    with pytest.raises(SourceError) as info:
        load_program("prog.mk", text=src)
    return [line for line in str(info.value).splitlines() if ": error: " in line]


def run(src: str, tmp_path) -> tuple[np.ndarray, np.ndarray]:
    k = mkemu.compile_source(src, tmp_path / "prog.mk", hw="test", mesh="1")
    a = np.random.default_rng(0).standard_normal((8, 128)).astype(np.float32)
    return a, k({"a": a}).output("out")


def test_import_chain_of_thousands_of_files(tmp_path):
    # Each import was loaded inside the loading of its importer: RecursionError past ~300 files.
    n = 1200
    for i in range(n):
        nxt = f'import "l{i + 1}.mk";\n' if i + 1 < n else ""
        (tmp_path / f"l{i}.mk").write_text(nxt + f"const C{i} = {i};\n")
    (tmp_path / "prog.mk").write_text('import "l0.mk";\n' + kernel(f"x = x + f32(C{n - 1});"))
    program = load_program(tmp_path / "prog.mk")
    assert program.consts[f"C{n - 1}"] == n - 1 and len(program.sources) == n + 1


def test_import_cycle_at_the_end_of_a_long_chain(tmp_path):
    # (the same chain, closed: the cycle is still named whole, at the import that closes it)
    for i in range(400):
        (tmp_path / f"l{i}.mk").write_text(f'import "l{(i + 1) % 400}.mk";\n')
    (tmp_path / "prog.mk").write_text('import "l0.mk";\n' + kernel(""))
    with pytest.raises(SourceError) as info:
        load_program(tmp_path / "prog.mk")
    (line,) = [line for line in str(info.value).splitlines() if ": error: " in line]
    assert line.startswith(f"{tmp_path / 'l399.mk'}:1:1: error: import cycle: ")
    assert line.count(" -> ") == 400


def test_kernels_share_the_listing_source_lines():
    # Every kernel split every source into lines for its listing: time and memory quadratic
    # in a program of many kernels (1,000 small kernels took 8.6 s and 1.3 GB, now 3.5 s).
    kernels = "".join(
        f"kernel k{i}(a: hbm f32[8, 128]) {{ vmem x: f32[8, 128]; sem s; start copy(a, x, s); "
        f"wait copy(a, x, s); }}\n" for i in range(50))
    host = "host {\n    input a: f32[8, 128];\n" + "".join(f"    launch k{i}(a);\n" for i in range(50)) + "}\n"
    program = compile_text(kernels + host, "prog.mk", "test")
    texts = {id(k.source_text) for k in program.kernels.values()}
    assert len(texts) == 1 and program.kernels["k7"].source_text["prog.mk"][7].startswith("kernel k7(")


def test_host_loop_launches_share_their_views():
    # A million-trip host loop made two fresh views per launch (962 MB, 37 s; now 430 MB, 23 s).
    src = kernel("x = x + 1.0;").replace("launch k(a, out);", "for i in 0..1000 { launch k(a, out); }")
    launches = load_program("prog.mk", text=src).host.launches
    assert len(launches) == 1000
    assert all(launch.args[0] is launches[0].args[0] for launch in launches)


def test_fn_chain_past_the_depth_limit_is_one_error():
    # Every fn deeper than 64 in the chain reported the limit again in its own check: 236
    # errors for a chain of 300.
    fns = "fn g0(x: vmem f32[8, 128]) { x = x + 1.0; }\n" + "".join(
        f"fn g{i}(x: vmem f32[8, 128]) {{ g{i - 1}(x); }}\n" for i in range(1, 300))
    assert error_lines(fns + kernel("g299(x);")) == [
        "prog.mk:2:30: error: fn calls nested more than 64 deep (fns are inlined): g64 -> g63 -> g62 -> ... -> g0 "
        "(in fn 'g1' inlined at prog.mk:3:30, in fn 'g2' inlined at prog.mk:4:30, 61 calls more, "
        "in fn 'g64' inlined at prog.mk:66:31)"]


def test_const_chain_past_the_limit_is_one_error():
    src = "".join(f"const C{i} = C{i + 1} + 1;\n" for i in range(1000)) + "const C1000 = 0;\n" + kernel("")
    assert error_lines(src) == [
        "prog.mk:102:7: error: 'C101' is defined through a chain of more than 100 consts and params (from 'C0')"]


def chain(fns: int, body: str) -> str:
    """fns fns, each calling the next inside a loop of one trip (two levels of statements
    each); the last holds `body`."""
    src = f"fn g0(x: vmem f32[8, 128]) {{ {body} }}\n"
    for i in range(1, fns):
        src += f"fn g{i}(x: vmem f32[8, 128]) {{ for t in 0..1 {{ g{i - 1}(x); }} }}\n"
    return src + kernel(f"g{fns - 1}(x);")


def test_statements_nested_through_fns_at_the_limit(tmp_path):
    # 1 + 2 * 49 + 1 = 100 levels with an 85-operand sum at the bottom: the deepest Python
    # stack a program that passes the limits makes (checked and run here, under pytest).
    a, out = run(chain(50, "x = x" + " + x" * 85 + ";"), tmp_path)
    np.testing.assert_allclose(out, a * 86, rtol=1e-5)


def test_statements_nested_through_fns_past_the_limit():
    # 30 fns of 10 nested loops each were 300 levels deep: RecursionError.
    loops = "".join(f"for t{i} in 0..1 {{ " for i in range(10))
    src = "fn g0(x: vmem f32[8, 128]) { x = x + 1.0; }\n" + "".join(
        f"fn g{i}(x: vmem f32[8, 128]) {{ {loops}g{i - 1}(x); {'} ' * 10}}}\n" for i in range(1, 30))
    (line,) = error_lines(src + kernel("g29(x);"))
    assert line.startswith("prog.mk:2:") and ": error: statements nested more than 100 deep (" in line
    # one level more than the test above: past it
    (line,) = error_lines(chain(51, "x = x + 1.0;"))
    assert ": error: statements nested more than 100 deep (" in line


def test_copying_more_statements_than_the_budget(monkeypatch):
    # 2**10 calls of an fn of 200 statements: within the 50,000 calls, but 85 s, 765 MB and a
    # kernel of a million instructions; now an error past 100,000 statements copied (4 s).
    # (The budget made small here to keep the test fast: the same program, scaled down.)
    monkeypatch.setattr(statements, "MAX_COPIED_STMTS", 2_000, raising=False)
    def doubling(levels: int) -> str:
        return "fn g0(x: vmem f32[8, 128]) {\n" + "    x = x + 1.0;\n" * 20 + "}\n" + "".join(
            f"fn g{i}(x: vmem f32[8, 128]) {{ g{i - 1}(x); g{i - 1}(x); }}\n" for i in range(1, levels + 1))

    (line,) = error_lines(doubling(10) + kernel("g10(x);"))
    assert ": error: more than 2,000 statements to copy in this program (every fn call copies the fn's body" in line
    assert "(in fn 'g0' inlined at prog.mk:" in line
    # under it, the same calls compile (and run) in full
    a, out = run_text(doubling(4) + kernel("g4(x);"))
    np.testing.assert_allclose(out, a + 16 * 20)


def test_generic_kernel_instances_count_as_copies(monkeypatch):
    monkeypatch.setattr(statements, "MAX_COPIED_STMTS", 2_000, raising=False)
    body = "".join("    x = x + 1.0;\n" for _ in range(40))
    src = "kernel k<C>(a: hbm f32[8, C]) {\n    vmem x: f32[8, C];\n" + body + "}\nhost {\n" + "".join(
        f"    input a{i}: f32[8, {i + 1}];\n    launch k(a{i});\n" for i in range(60)) + "}\n"
    (line,) = error_lines(src)
    assert "error: more than 2,000 statements to copy" in line and "(in kernel 'k<49>' launched at" in line


def run_text(src: str) -> tuple[np.ndarray, np.ndarray]:
    k = mkemu.compile_source(src, "prog.mk", hw="test", mesh="1")
    a = np.random.default_rng(1).standard_normal((8, 128)).astype(np.float32)
    return a, k({"a": a}).output("out")
