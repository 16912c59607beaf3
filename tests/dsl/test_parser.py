"""Parsing: every construct of the .mk language, and syntax errors."""

from pathlib import Path

import pytest

from mkemu.dsl import ast
from mkemu.dsl.parser import parse
from mkemu.errors import SourceError

DATA = Path(__file__).with_name("data")


def kernel_body(text: str):
    module = parse(f"kernel k() {{\n{text}\n}}", "t.mk")
    return module.items[0].body.stmts


def one(text: str):
    (stmt,) = kernel_body(text)
    return stmt


def test_every_item_kind():
    module = parse((DATA / "full.mk").read_text(), "full.mk")
    kinds = {type(i) for i in module.items}
    assert {ast.Import, ast.ParamDecl, ast.ConstDecl, ast.Assert, ast.FnDecl,
            ast.KernelDecl, ast.HostDecl} <= kinds
    ref = parse('reference "ref.py:reference";', "r.mk").items[0]
    assert ref == ast.Reference("ref.py:reference", ref.span)


def test_spans_point_at_the_source():
    module = parse("param D = 512;\nconst NT = D / 128;\n", "a.mk")
    const = module.items[1]
    assert (const.span.line, const.span.column) == (2, 1)
    assert (const.name_span.line, const.name_span.column, const.name_span.end_column) == (2, 7, 9)
    assert const.value.span.column == 12


def test_param_values_and_description():
    module = parse('param ES = 2 in {1, 2, -4, (1 << 3)} "slots in flight";\n'
                   "param TK = 256 in 128..1024 step 128;\n"
                   'param N = 1024 "columns";\nparam M = 8;\n', "a.mk")
    es, tk, n, m = module.items
    assert [v.value if isinstance(v, ast.IntLit) else v.op for v in es.domain.values] == [1, 2, -4, "<<"]
    assert es.description == "slots in flight"
    assert (es.domain.span.column, es.domain.span.end_column) == (14, 37)
    assert isinstance(tk.domain, ast.ParamRange)
    assert (tk.domain.start.value, tk.domain.stop.value, tk.domain.step.value) == (128, 1024, 128)
    assert tk.description is None
    assert (n.domain, n.description) == (None, "columns")
    assert (m.domain, m.description) == (None, None)


def test_param_values_are_literals_names_or_parenthesised():
    assert syntax_error("param Y = 2 in 1..ES+1;\n") == (
        "bad.mk:1:21: error: unexpected '+'; expected one of: ';', 'step', a string\n"
        "  param Y = 2 in 1..ES+1;\n"
        "                      ^"
    )


@pytest.mark.parametrize(
    "text, kind",
    [
        ("vmem x: f32[8, 128];", ast.BufferDecl),
        ("vmem w: bf16[2][256, 256];", ast.BufferDecl),
        ("smem idx: i32[16];", ast.BufferDecl),
        ("sem s;", ast.SemDecl),
        ("sem ws[2];", ast.SemDecl),
        ("var acc: f32[8, 256];", ast.VarDecl),
        ("var k: i32 = 0;", ast.VarDecl),
        ("let h = copy(a, x, s);", ast.Let),
        ("x[:, 0:128] = x + y;", ast.Assign),
        ("acc += matmul(a, b);", ast.Assign),
        ("start h;", ast.Start),
        ("start copy(a[i], x, s);", ast.Start),
        ("wait h;", ast.Wait),
        ("wait recv h;", ast.Wait),
        ("wait(s, 1);", ast.WaitSem),
        ("signal(s @ peer(0, 1), 1);", ast.ExprStmt),
        ("barrier(0);", ast.ExprStmt),
        ("f(x, y);", ast.ExprStmt),
        ("for i in 0..n step 2 { }", ast.For),
        ("if e == 3 { } else if e < 2 { } else { }", ast.If),
        ('region "attn" { }', ast.Region),
        ('region "layer" (l) { }', ast.Region),
        ("launch k(a, 8);", ast.Launch),
        ("input a: f32[8, 128];", ast.IoDecl),
        ("output y: f32[8, 128];", ast.IoDecl),
        ('assert D > 0, "positive";', ast.Assert),
    ],
)
def test_statements(text, kind):
    assert isinstance(one(text), kind)


def test_slots_and_semaphore_arrays():
    decl = one("vmem w: bf16[2][256, 512];")
    assert [d.value for d in decl.dims] == [256, 512]
    assert [d.value for d in decl.slots] == [2]
    assert [c.value for c in one("sem ws[3];").count] == [3]


def test_wait_forms_do_not_collide():
    assert isinstance(one("wait (h);"), ast.Wait)
    assert isinstance(one("wait (s, 2);"), ast.WaitSem)
    assert one("wait recv h;").recv


def test_precedence():
    e = one("x = a + b * c << 1 & m == 0 || !p && q;").value
    # || is loosest, then &&, then ==, then &, <<, +, *.
    assert e.op == "||"
    assert e.right.op == "&&" and isinstance(e.right.left, ast.Unary)
    cmp = e.left
    assert cmp.op == "==" and cmp.left.op == "&"
    assert cmp.left.left.op == "<<" and cmp.left.left.left.op == "+"
    assert cmp.left.left.left.right.op == "*"


def test_slices_and_remote_arguments():
    call = one("start copy(a[0:8, k*128:(k+1)*128], x[i][:, e +: 128], s);").dma
    src, dst, _ = call.args
    assert isinstance(src.items[1], ast.Slice)
    assert isinstance(dst, ast.Index) and isinstance(dst.base, ast.Index)
    assert isinstance(dst.items[1], ast.SizedSlice) and isinstance(dst.items[0], ast.Slice)
    remote = one("start copy(x, y @ peer(0, 1), s, r);").dma.args[1]
    assert isinstance(remote, ast.Remote) and remote.target.func == "peer"
    kw = one("let m = sum(x, axis=1);").value.keywords[0]
    assert (kw.name, kw.value.value) == ("axis", 1)


def test_literals():
    values = one("x = 0x10 + 1_000 + 1.5 + 2e3 + 1e-5;").value
    lits = []
    while isinstance(values, ast.Binary):
        lits.append(values.right.value)
        values = values.left
    lits.append(values.value)
    assert sorted(lits) == sorted([16, 1000, 1.5, 2000.0, 1e-5])


def test_range_does_not_lex_as_float():
    loop = one("for i in 0..4 { }")
    assert (loop.start.value, loop.stop.value) == (0, 4)


def syntax_error(text: str) -> str:
    with pytest.raises(SourceError) as info:
        parse(text, "bad.mk")
    return info.value.render()


def test_syntax_error_missing_semicolon():
    assert syntax_error("kernel k() {\n    let x = 1\n}\n") == (
        "bad.mk:3:1: error: unexpected '}'; expected one of: ';', '[', an operator\n"
        "  }\n"
        "  ^"
    )


def test_syntax_error_expected_expression():
    assert syntax_error("kernel k() { let x = ; }") == (
        "bad.mk:1:22: error: unexpected ';'; expected an expression\n"
        "  kernel k() { let x = ; }\n"
        "                       ^"
    )


def test_syntax_error_bad_character_and_eof():
    assert syntax_error("kernel k() { x = a $ b; }").startswith(
        "bad.mk:1:20: error: unexpected character '$'"
    )
    assert syntax_error("kernel k() {\n  wait h;\n") == (
        "bad.mk:2:10: error: unexpected end of file; expected one of: '}', a statement\n"
        "    wait h;\n"
        "           ^"
    )


def test_syntax_error_names_keyword_with_carets():
    assert syntax_error("kernel k() { for i in 0..4 { } else }") == (
        "bad.mk:1:32: error: unexpected 'else'; expected one of: '}', a statement\n"
        "  kernel k() { for i in 0..4 { } else }\n"
        "                                 ^^^^"
    )


def test_the_lalr_tables_are_kept_in_mkemu_s_own_cache_folder(tmp_path, monkeypatch):
    """Not Lark's `cache=True`, a pickle of a predictable name in the shared temporary
    folder that another user could plant (and Lark would load)."""
    from mkemu.cache import cache_dir
    from mkemu.dsl import parser

    grammar = parser.GRAMMAR_PATH.read_text()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = Path(parser._tables_file(grammar))
    assert path.parent == cache_dir("grammar") and path.parent.is_relative_to(tmp_path)
    assert parser._tables_file(grammar + " ") != str(path)      # keyed by the grammar
    monkeypatch.setattr("mkemu.cache.cache_dir", lambda sub="": (_ for _ in ()).throw(OSError("none")))
    assert parser._tables_file(grammar) is False                 # built each time without a folder
