"""Elaboration: what the back end receives from `load_program`."""

import textwrap
from pathlib import Path

import pytest

from mkemu.dsl import ir, pretty
from mkemu.dsl.frontend import load_program

DATA = Path(__file__).with_name("data")


def program(tmp_path, text: str, params=None, **files):
    for name, body in files.items():
        (tmp_path / name.replace("__", "/")).write_text(textwrap.dedent(body))
    path = tmp_path / "prog.mk"
    path.write_text(textwrap.dedent(text))
    return load_program(path, params)


VECTOR_ADD = """\
    param N = 1024;
    kernel vector_add(a: hbm f32[8, N], b: hbm f32[8, N], out: hbm f32[8, N]) {
        vmem xa: f32[8, N];
        vmem xb: f32[8, N];
        sem s;
        start copy(a, xa, s);
        start copy(b, xb, s);
        wait copy(a, xa, s);
        wait copy(b, xb, s);
        xa = xa + xb;
        start copy(xa, out, s);
        wait copy(xa, out, s);
    }
    host {
        input a: f32[8, N];
        input b: f32[8, N];
        output out: f32[8, N];
        launch vector_add(a, b, out);
    }
"""


def test_vector_add_elaborates(tmp_path):
    p = program(tmp_path, VECTOR_ADD, {"N": 256})
    assert p.params == {"N": 256}
    assert pretty.kernel(p.kernels["vector_add"]) == textwrap.dedent("""\
        kernel vector_add
          param a: hbm f32[8, 256]
          param b: hbm f32[8, 256]
          param out: hbm f32[8, 256]
          vmem xa: f32[8, 256]
          vmem xb: f32[8, 256]
          sem s
            start copy(a{0 +: 8, 0 +: 256}, xa{0 +: 8, 0 +: 256}, s) /* 8192 B */;
            start copy(b{0 +: 8, 0 +: 256}, xb{0 +: 8, 0 +: 256}, s) /* 8192 B */;
            wait local copy(a{0 +: 8, 0 +: 256}, xa{0 +: 8, 0 +: 256}, s) /* 8192 B */;
            wait local copy(b{0 +: 8, 0 +: 256}, xb{0 +: 8, 0 +: 256}, s) /* 8192 B */;
            xa{0 +: 8, 0 +: 256} = (xa{0 +: 8, 0 +: 256} + xb{0 +: 8, 0 +: 256}) : f32[8, 256];
            start copy(xa{0 +: 8, 0 +: 256}, out{0 +: 8, 0 +: 256}, s) /* 8192 B */;
            wait local copy(xa{0 +: 8, 0 +: 256}, out{0 +: 8, 0 +: 256}, s) /* 8192 B */;""")
    (launch,) = p.host.launches
    assert [b.name for b in p.host.inputs] == ["a", "b"]
    assert [b.name for b in p.host.outputs] == ["out"]
    assert launch.kernel is p.kernels["vector_add"]


def test_full_program_uses_every_construct():
    p = load_program(DATA / "full.mk")
    k = p.kernels["layer"]
    text = pretty.kernel(k)
    # fn locals are renamed per inlined call; constant scalar arguments are folded.
    assert "var topk#" in text and "let prefetch#" in text
    assert "wait recv copy(" in text and "@ right" in text
    assert "signal(flag @ global_core(" in text
    assert len(p.host.launches) == 3
    assert [a for a in p.host.launches[2].args if isinstance(a, int)] == [4]


def test_inlining_substitutes_buffers_and_constants(tmp_path):
    p = program(tmp_path, """\
        fn axpy(x: vmem f32[8, n], y: vmem f32[8, n], n: i32, a: i32) {
            let t = x * f32(a);
            y = y + t;
        }
        kernel k() {
            vmem p: f32[8, 128];
            vmem q: f32[8, 256];
            axpy(p, q[:, 128 +: 128], 128, 3);
            axpy(p, q[:, 0:128], 128, 4);
        }
    """)
    body = pretty.stmts(p.kernels["k"].body)
    assert body == [
        "let axpy#1.t = (p{0 +: 8, 0 +: 128} * 3.0:f32) : f32[8, 128];",
        "q{0 +: 8, 128 +: 128} = (q{0 +: 8, 128 +: 128} + axpy#1.t) : f32[8, 128];",
        "let axpy#2.t = (p{0 +: 8, 0 +: 128} * 4.0:f32) : f32[8, 128];",
        "q{0 +: 8, 0 +: 128} = (q{0 +: 8, 0 +: 128} + axpy#2.t) : f32[8, 128];",
    ]


def test_static_if_keeps_only_the_taken_branch(tmp_path):
    src = """\
        param WIDE = 0;
        kernel k() {
            vmem x: f32[8, 128];
            if WIDE == 1 { x = x * 2.0; } else { x = x + 1.0; }
        }
    """
    narrow = pretty.stmts(program(tmp_path, src).kernels["k"].body)
    wide = pretty.stmts(program(tmp_path, src, {"WIDE": 1}).kernels["k"].body)
    assert narrow == ["x{0 +: 8, 0 +: 128} = (x{0 +: 8, 0 +: 128} + 1.0:f32) : f32[8, 128];"]
    assert wide == ["x{0 +: 8, 0 +: 128} = (x{0 +: 8, 0 +: 128} * 2.0:f32) : f32[8, 128];"]


def test_dynamic_slices_and_slots(tmp_path):
    p = program(tmp_path, """\
        kernel k(w: hbm bf16[4, 256, 256], n: i32) {
            vmem buf: bf16[2][256, 256];
            smem sel: i32[4];
            sem s[2];
            for i in 0..n {
                let e = sel[i % 4];
                start copy(w[e, :, i * 128 : (i + 1) * 128], buf[i % 2][:, 0 +: 128], s[i % 2]);
                wait copy(w[e, :, i * 128 : (i + 1) * 128], buf[i % 2][:, 0 +: 128], s[i % 2]);
            }
        }
    """)
    (loop,) = p.kernels["k"].body
    let, start, _ = loop.body
    dma = start.dma
    assert dma.src.sizes == (None, 256, 128) and dma.size_bytes == 256 * 128 * 2
    assert isinstance(dma.src.offsets[0], ir.ScalarRead) and dma.src.offsets[0].var is let.var
    assert pretty.scalar(dma.dst.slot) == "(i % 2)"


def test_consts_fold_with_c_semantics(tmp_path):
    p = program(tmp_path, """\
        const A = -7 / 2;
        const B = -7 % 2;
        const C = max(3, min(10, 1 << 3)) + i32(5 > 2) * 100;
        const F = 0x10 | 3 ^ 1;
    """)
    assert p.consts == {"A": -3, "B": -1, "C": 108, "F": 16 | (3 ^ 1)}


def test_diamond_imports_load_each_file_once(tmp_path):
    (tmp_path / "lib").mkdir()
    p = program(
        tmp_path,
        'import "lib/a.mk";\nimport "lib/b.mk";\nconst T = A + B + C;\n',
        **{
            "lib__a.mk": 'import "c.mk";\nconst A = C + 1;\n',
            "lib__b.mk": 'import "c.mk";\nconst B = C + 2;\n',
            "lib__c.mk": "param C = 10;\n",
        },
    )
    assert p.consts["T"] == 33


def test_reference_is_resolved_next_to_the_program(tmp_path):
    (tmp_path / "ref.py").write_text("def reference(inputs):\n    return {}\n")
    p = program(tmp_path, 'reference "ref.py:reference";\n')
    assert p.reference.path == str(tmp_path / "ref.py") and p.reference.function == "reference"


@pytest.mark.parametrize("name", ["full.mk", "lib.mk"])
def test_sample_programs_check(name):
    load_program(DATA / name)


def test_param_info_lists_every_param_as_declared(tmp_path):
    p = program(tmp_path, """\
        import "lib.mk";
        param ES = 2 in {1, 2, 4} "expert slots in flight";
        param TK = 256 in 128..513 step 128;
        param N = 2 * L "columns";
        const C = ES * TK;
        """, {"ES": 4}, **{"lib.mk": "param L = 512;\n"})
    info = {i.name: i for i in p.param_info}
    assert list(info) == ["L", "ES", "TK", "N"]            # imported files first
    assert (info["ES"].value, info["ES"].default, info["ES"].values) == (4, 2, (1, 2, 4))
    assert info["ES"].description == "expert slots in flight"
    assert (info["ES"].span.file, info["ES"].span.line) == (str(tmp_path / "prog.mk"), 2)
    assert info["TK"].values == (128, 256, 384, 512)
    assert (info["N"].value, info["N"].values, info["N"].description) == (1024, None, "columns")
    assert p.consts == {"C": 1024}


def test_pretty_prints_a_bool_kernel_parameter_as_bool(tmp_path):
    p = program(tmp_path, """\
        kernel k(n: i32, flag: bool) { }
        host { launch k(3, true); }
        """)
    text = pretty.kernel(p.kernels["k"])
    assert "  param n: i32\n  param flag: bool" in text


def test_a_byte_order_mark_starting_a_file_is_not_part_of_the_program(tmp_path):
    # (some editors save UTF-8 with a BOM first: it was "1:1: unexpected character '\ufeff'")
    (tmp_path / "lib.mk").write_text("\ufeffconst A = 3;\n", encoding="utf-8")
    p = program(tmp_path, '\ufeffimport "lib.mk";\nconst T = A + 1;\n')
    assert p.consts["T"] == 4
