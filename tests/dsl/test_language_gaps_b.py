"""Gaps found by checking issues #3 and #14 and docs/language.md against the compiler
(helper audit b): each test failed before its fix."""

import textwrap

import pytest

from mkemu.dsl.frontend import load_program
from mkemu.errors import SourceError


def errors(source: str, tmp_path, monkeypatch) -> str:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prog.mk").write_text(textwrap.dedent(source))
    with pytest.raises(SourceError) as info:
        load_program("prog.mk")
    return info.value.render()


# -- "integer tiles have no / or %: a compile error" (docs/language.md, Tile expressions), and
#    "collects all semantic errors in the file sorted by position" (#3): the front end reports
#    them with the program's other errors (the back end, which reports its first error alone,
#    was the only one to see them), and '%' on f32 tiles does not suggest i32 tiles can take it


def test_integer_tile_division_is_a_front_end_error_reported_with_the_others(tmp_path, monkeypatch):
    src = """\
    kernel k(a: hbm i32[8, 128]) {
        vmem x: i32[8, 128];
        vmem f: f32[8, 128];
        x = x / 2;
        x /= x;
        f = f32(iota(1, 128) % 3);
        f = f % 2.0;
        x = x + nope;
    }
    """
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:4:9: error: '/' is not defined on an i32 tile: integer tile division and remainder are not "
        "supported (tile '/' is f32 only; use shifts or '&' for powers of two)\n"
        "      x = x / 2;\n"
        "          ^^^^^\n"
        "prog.mk:5:5: error: '/' is not defined on an i32 tile: integer tile division and remainder are not "
        "supported (tile '/' is f32 only; use shifts or '&' for powers of two)\n"
        "      x /= x;\n"
        "      ^^^^^^^\n"
        "prog.mk:6:13: error: '%' is not defined on an i32 tile: integer tile division and remainder are not "
        "supported (tile '/' is f32 only; use shifts or '&' for powers of two)\n"
        "      f = f32(iota(1, 128) % 3);\n"
        "              ^^^^^^^^^^^^^^^^\n"
        "prog.mk:7:9: error: '%' is not defined on f32 tiles: integer tile division and remainder are not "
        "supported (tile '/' is f32 only; use shifts or '&' for powers of two)\n"
        "      f = f % 2.0;\n"
        "          ^^^^^^^\n"
        "prog.mk:8:13: error: unknown name 'nope'\n"
        "      x = x + nope;\n"
        "              ^^^^"
    )


def test_scalar_division_and_f32_tile_division_still_check(tmp_path, monkeypatch):
    src = """\
    kernel k(a: hbm i32[8, 128]) {
        vmem f: f32[8, 128];
        smem q: i32[4];
        q[0] = q[1] / 3 % 2;
        f = f / 3.0;
        f /= f;
        f = f32(7 % 3) + f;
    }
    """
    (tmp_path / "prog.mk").write_text(textwrap.dedent(src))
    load_program(tmp_path / "prog.mk")


# -- "An error inside an inlined fn that depends on the call (its arguments ...) names the
#    call": the semaphore checks run after the kernel's body, when the fn call they came
#    from was gone from the context


def test_a_semaphore_error_in_an_fn_names_the_call_that_passed_the_semaphore(tmp_path, monkeypatch):
    src = """\
    fn take(s: sem) { wait(s, 1); }
    fn give(s: sem) { signal(s, 1); }
    kernel k(a: hbm f32[8, 128]) {
        sem t;
        sem u;
        take(t);
        give(u);
    }
    """
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:1:19: error: wait on semaphore 't', but no started DMA or signal ever targets it "
        "(in fn 'take' inlined at prog.mk:6:5)\n"
        "  fn take(s: sem) { wait(s, 1); }\n"
        "                    ^^^^^^^^^^^\n"
        "prog.mk:2:19: error: signal on semaphore 'u' is never waited (every semaphore must be back to 0 "
        "when the kernel ends) (in fn 'give' inlined at prog.mk:7:5)\n"
        "  fn give(s: sem) { signal(s, 1); }\n"
        "                    ^^^^^^^^^^^^"
    )


def test_an_fns_own_semaphore_errors_are_reported_once_at_the_fn_called_or_not(tmp_path, monkeypatch):
    """Its own semaphores and DMAs no caller can start or wait: the fn's own check finds
    these (reported once, without a call), as it finds its other errors."""
    src = """\
    fn g() {
        sem t;
        wait(t, 1);
    }
    fn h(s: sem) {
        vmem x: f32[8, 128];
        let c = copy(x, x, s);
    }
    fn unused() {
        sem v;
        signal(v, 1);
    }
    kernel k(a: hbm f32[8, 128]) {
        sem s;
        g();
        g();
        h(s);
    }
    """
    assert errors(src, tmp_path, monkeypatch) == (
        "prog.mk:3:5: error: wait on semaphore 't', but no started DMA or signal ever targets it\n"
        "      wait(t, 1);\n"
        "      ^^^^^^^^^^^\n"
        "prog.mk:7:5: error: DMA 'c' is described but never started or waited\n"
        "      let c = copy(x, x, s);\n"
        "      ^^^^^^^^^^^^^^^^^^^^^^\n"
        "prog.mk:11:5: error: signal on semaphore 'v' is never waited (every semaphore must be back to 0 "
        "when the kernel ends)\n"
        "      signal(v, 1);\n"
        "      ^^^^^^^^^^^^"
    )


def test_an_fn_may_start_on_a_semaphore_parameter_its_caller_waits(tmp_path):
    src = """\
    fn fetch(a: hbm f32[8, 128], x: vmem f32[8, 128], s: sem) { start copy(a, x, s); }
    fn done(s: sem) { wait(s, 4096); }
    fn ping(s: sem) { signal(s, 1); }
    kernel k(a: hbm f32[8, 128]) {
        vmem x: f32[8, 128];
        sem s;
        sem p;
        fetch(a, x, s);
        wait copy(a, x, s);
        fetch(a, x, s);
        done(s);
        ping(p);
        wait(p, 1);
    }
    """
    (tmp_path / "prog.mk").write_text(textwrap.dedent(src))
    load_program(tmp_path / "prog.mk")


# -- "every syntax ... error prints file:line:col: error: message" with what went wrong: a
#    string missing its closing quote was 'unexpected character'


def test_an_unterminated_string_says_so(tmp_path, monkeypatch):
    assert errors('import "lib.mk\nconst A = 1;\n', tmp_path, monkeypatch) == (
        "prog.mk:1:8: error: unterminated string (a string closes with '\"' on the line it opens)\n"
        '  import "lib.mk\n'
        "         ^"
    )
