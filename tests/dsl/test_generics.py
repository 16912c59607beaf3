"""Generic fns and kernels: one projection kernel for two shapes runs bit-exact; generics
that conflict or cannot be inferred are caret errors."""

from __future__ import annotations

from pathlib import Path

from tests.dsl.test_compiler import bf16, f32, mm, run, same
from tests.dsl.test_errors import errors

DATA = Path(__file__).with_name("data")


def test_one_generic_kernel_two_instances():
    x, w1, w2 = f32(8, 256), bf16(256, 512), bf16(512, 128)
    outs, _, program = run((DATA / "generics.mk").read_text(), {"x": x, "w1": w1, "w2": w2})
    same(mm(mm(x, w1), w2), outs["y"])
    assert sorted(program.kernels) == ["proj<256,512>", "proj<512,128>"]
    assert [launch.kernel for launch in program.launches] == ["proj<256,512>", "proj<512,128>"]


def test_generic_dtype_sizes_a_local_buffer():
    text = """
fn double<T, R, C>(src: vmem T[R, C], dst: vmem T[R, C]) {
    vmem t: T[R, C];
    t = src;
    dst = t + t;
}
kernel k(x: hbm i32[8, 128], y: hbm i32[8, 128]) {
    vmem xv: i32[8, 128];
    sem s;
    start copy(x, xv, s);
    wait copy(x, xv, s);
    double(xv, xv);
    start copy(xv, y, s);
    wait copy(xv, y, s);
}
"""
    x = (f32(8, 128) * 1000).astype("int32")
    outs, _, _ = run(text, {"x": x})
    same(x * 2, outs["y"])


def test_conflicting_and_uninferable_generics(tmp_path, monkeypatch):
    src = """\
fn f<R, C>(a: vmem f32[R, C], b: vmem f32[R, C]) { a = b; }
fn g<N>(a: vmem f32[8, N * 2]) { a = 0.0; }
kernel k<K>(x: hbm f32[8, K], y: hbm f32[8, K]) { }
kernel run() {
    vmem u: f32[8, 128];
    vmem v: f32[8, 256];
    f(u, v);
    g(v);
}
host { input x: f32[8, 128]; input y: f32[8, 256]; launch k(x, y); }
"""
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:2:6: error: generic 'N' of fn 'g' cannot be inferred from the arguments (use it as a whole "
        "dimension, count or dtype of a buffer or semaphore parameter)\n"
        "  fn g<N>(a: vmem f32[8, N * 2]) { a = 0.0; }\n"
        "       ^\n"
        "prog.mk:7:10: error: generic 'C' of fn 'f' is 128 from parameter 'a' but 256 here (parameter 'b')\n"
        "      f(u, v);\n"
        "           ^\n"
        "prog.mk:10:64: error: generic 'K' of kernel 'k' is 128 from parameter 'x' but 256 here (parameter 'y')\n"
        "  host { input x: f32[8, 128]; input y: f32[8, 256]; launch k(x, y); }\n"
        "                                                                 ^"
    )
