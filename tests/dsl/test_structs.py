"""Structs: the MLP example runs bit-exact with its weights and working set declared once;
instances in the wrong place, unknown members and mismatched arguments are caret errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mkemu.dsl.compiler import compile_program
from mkemu.dsl.frontend import load_program
from mkemu.isa.hardware import load_profile
from mkemu.isa import numerics as nx
from tests.dsl.test_compiler import bf16, f32, mm, run, same
from tests.dsl.test_errors import errors

DATA = Path(__file__).with_name("data")

STRUCTS = """\
struct W { a: hbm f32[8, 128]; b: hbm f32[8, 128]; }
struct B { v: vmem f32[8, 128]; s: sem; }
"""


def test_structs_example_runs_and_host_arrays_take_the_member_names():
    text = (DATA / "structs.mk").read_text()
    w1, w2, x = bf16(256, 256), bf16(256, 256), f32(8, 256)
    outs, _, program = run(text, {"w1": w1, "w2": w2, "x": x})
    h = nx.f32_max(mm(x, w1), np.float32(0.0))
    same(mm(h, w2), outs["y"])
    assert [b.name for b in program.buffers] == ["w1", "w2", "x", "y"]


def test_struct_members_are_kernel_parameters_in_member_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.mk").write_text(STRUCTS + """
kernel k(w: W, n: i32) { let b = B(); start copy(w.a, b.v, b.s); wait copy(w.a, b.v, b.s);
    start copy(b.v, w.b, b.s); wait copy(b.v, w.b, b.s); }
host { input w: W; launch k(w, 3); }
""")
    program = load_program("p.mk")
    kernel = program.kernels["k"]
    assert [p.name for p in kernel.params] == ["w.a", "w.b", "n"]
    assert [b.name for b in kernel.buffers] == ["b.v"] and [s.name for s in kernel.sems] == ["b.s"]
    assert [a.buffer.name if hasattr(a, "buffer") else a for a in program.host.launches[0].args] == ["a", "b", 3]


def test_instances_in_the_wrong_place(tmp_path, monkeypatch):
    src = STRUCTS + """\
kernel k(w: W, b: B) {
    let c = W();
    vmem d: B;
}
host { input w: W; hbm x: B; input y: W; output b: f32[8]; }
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:3:19: error: member 'v' of struct 'B' is in vmem: kernel parameters are HBM arrays (kernels see "
        "nothing of each other's VMEM)\n"
        "  kernel k(w: W, b: B) {\n"
        "                    ^\n"
        "prog.mk:4:13: error: member 'a' of struct 'W' is in hbm: kernels cannot allocate HBM; make the instance in "
        "the host and pass it\n"
        "      let c = W();\n"
        "              ^^^\n"
        "prog.mk:5:5: error: a buffer needs dimensions (vmem d: dtype[...]); a struct instance in a kernel is "
        "`let d = B();`\n"
        "      vmem d: B;\n"
        "      ^^^^^^^^^^\n"
        "prog.mk:7:20: error: member 'v' of struct 'B' is in vmem: host arrays are HBM\n"
        "  host { input w: W; hbm x: B; input y: W; output b: f32[8]; }\n"
        "                     ^^^^^^^^^\n"
        "prog.mk:7:30: error: host array 'a' (a member of struct 'W') is already declared at prog.mk:7:8\n"
        "  host { input w: W; hbm x: B; input y: W; output b: f32[8]; }\n"
        "                               ^^^^^^^^^^^\n"
        "prog.mk:7:42: error: host array 'b' is already declared (a struct member) at prog.mk:7:8\n"
        "  host { input w: W; hbm x: B; input y: W; output b: f32[8]; }\n"
        "                                           ^^^^^^^^^^^^^^^^^"
    )


def test_members_and_arguments(tmp_path, monkeypatch):
    src = STRUCTS + """\
fn f(w: W) { }
kernel k(w: W, x: hbm f32[8, 128]) {
    let b = B();
    b.v = b.u;
    let q = x.a;
    f(b);
    let r = W;
    let s = B() ;
    start copy(x, b.v, b.s);
    wait copy(x, b.v, b.s);
}
host { input w: W; input x: f32[8, 128]; launch k(x, x); }
"""
    out = errors(src, tmp_path, monkeypatch)
    assert out == (
        "prog.mk:6:13: error: struct 'B' has no member 'u' (its members: v, s)\n"
        "      b.v = b.u;\n"
        "              ^\n"
        "prog.mk:7:13: error: '.a': only a struct instance has members, got hbm view f32[8, 128] of 'x'\n"
        "      let q = x.a;\n"
        "              ^^^\n"
        "prog.mk:8:7: error: parameter 'w' of fn 'f' is an instance of struct 'W', got an instance of struct 'B'\n"
        "      f(b);\n"
        "        ^\n"
        "prog.mk:9:13: error: 'W' is a struct, not a value; make an instance with let NAME = W();\n"
        "      let r = W;\n"
        "              ^\n"
        "prog.mk:14:51: error: argument 'w' must be a host instance of struct 'W', got hbm view f32[8, 128] of "
        "'x'\n"
        "  host { input w: W; input x: f32[8, 128]; launch k(x, x); }\n"
        "                                                    ^"
    )


VMEM_BYTES = """\
struct S {
    a: vmem bf16[2][3, 100];
    b: vmem f32[8, 256];
    m: smem i32[4];
    s: sem[2];
}
const N = vmem_bytes(S);
kernel k(x: hbm f32[8, 256]) {
    let t = S();
    start copy(x, t.b, t.s[0]);
    wait copy(x, t.b, t.s[0]);
}
host { input x: f32[8, 256]; launch k(x); }
"""


def test_vmem_bytes_is_what_the_back_end_allocates_for_an_instance(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.mk").write_text(VMEM_BYTES)
    program = load_program("p.mk")
    compiled = compile_program(program, load_profile("tpu-v7-like"))
    # The kernel's VMEM is the instance's alone (a copy needs no temporaries): padded
    # rows and slots included, SMEM and semaphores not.
    assert program.consts["N"] == compiled.kernels["k"].vmem_bytes
    assert program.consts["N"] > 2 * 3 * 100 * 2 + 8 * 256 * 4


def test_vmem_bytes_takes_a_struct_name(tmp_path, monkeypatch):
    src = STRUCTS + "const A = vmem_bytes(W, B);\nconst C = vmem_bytes(3);\nconst D = vmem_bytes(Q);\n"
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:3:11: error: vmem_bytes() takes the name of a struct: vmem_bytes(S)\n"
        "  const A = vmem_bytes(W, B);\n"
        "            ^^^^^^^^^^^^^^^^\n"
        "prog.mk:4:11: error: vmem_bytes() takes the name of a struct: vmem_bytes(S)\n"
        "  const C = vmem_bytes(3);\n"
        "            ^^^^^^^^^^^^^\n"
        "prog.mk:5:22: error: vmem_bytes(): 'Q' is not a struct\n"
        "  const D = vmem_bytes(Q);\n"
        "                       ^"
    )
