"""Error rendering (mkemu/errors.py): what a user sees under a source line."""

import pytest

from mkemu.errors import Diagnostic, SourceSpan


def test_the_caret_under_a_tab_indented_line_keeps_the_tabs():
    # The terminal expands a tab in the source line and in the caret line alike, so the
    # caret stays under the column the span names however wide a tab is drawn.
    line = "\tlet a = @;"
    text = Diagnostic(SourceSpan("k.mk", 2, 10, 2, 11), "unexpected '@'", line).render()
    source, caret = text.splitlines()[1:]
    assert source == "  " + line
    assert caret == "  \t        ^"
    assert caret.expandtabs(8).index("^") == source.expandtabs(8).index("@")


def test_the_caret_spans_the_named_columns():
    text = Diagnostic(SourceSpan("k.mk", 1, 5, 1, 8), "bad", "let abc = 1;").render()
    assert text.splitlines()[2] == "      ^^^"


def test_control_characters_in_a_source_line_are_shown_as_escapes_with_the_caret_under_them():
    # A stray escape sequence in a program is shown, not sent to the terminal (it could
    # recolour or clear it); the caret spans the escapes as shown.
    import mkemu

    with pytest.raises(mkemu.MkemuError) as info:
        mkemu.compile_source("kernel k() {\n    vmem a: f32[8, 128];\n    a = a + \x1b[31m 1.0;\n}\n"
                             "host { launch k(); }\n", "x.mk", hw="test")
    text = info.value.render()
    assert "\x1b" not in text
    assert text.splitlines() == ["x.mk:3:13: error: unexpected character '\\x1b'",
                                 "      a = a + \\x1b[31m 1.0;",
                                 "              ^^^^"]
    # (C1 controls and DEL too; a tab stays a tab)
    text = Diagnostic(SourceSpan("k.mk", 1, 4, 1, 5), "bad", "\ta\x85\x7fb").render()
    assert text.splitlines()[1:] == ["  \ta\\x85\\x7fb", "  \t     ^^^^"]


@pytest.mark.parametrize("argv, line", [
    (["run", "x\ny"], "x\\ny: error: no program file or shipped program named 'x\\ny'"),
    (["hw", "show", "a\nb"], "hw show: error: unknown hardware profile 'a\\nb'."),
    (["run", "x\rBOGUS"], "x\\rBOGUS: error: no program file or shipped program named"),
])
def test_a_name_with_a_newline_or_carriage_return_keeps_its_error_on_one_line(capsys, argv, line):
    from mkemu.cli import main

    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1 and "\r" not in err


def test_a_config_error_with_its_source_line_shows_it_with_a_caret_as_a_diagnostic_does():
    import pickle

    from mkemu.errors import ConfigError

    error = ConfigError("reference r.py failed to load: ZeroDivisionError: division by zero", file="r.py", line=3,
                        column=9, end_column=14, source_line="SCALE = 1 / 0\n")
    shown = Diagnostic(SourceSpan("r.py", 3, 9, 3, 14), error.message, "SCALE = 1 / 0\n").render()
    assert error.render() == shown == ("r.py:3:9: error: reference r.py failed to load: ZeroDivisionError: division "
                                       "by zero\n  SCALE = 1 / 0\n          ^^^^^")
    assert pickle.loads(pickle.dumps(error)).render() == shown     # (a worker sends it back whole)
    assert ConfigError("bad", file="hw.toml", line=2, column=1).render() == "hw.toml:2:1: error: bad"


def test_a_trace_error_is_one_line_whatever_names_the_file_carries():
    # (a kernel or column name with a newline and terminal escapes came out as raw text)
    from mkemu.errors import TraceError

    error = TraceError("corrupted trace: column a\nb\x1b[2J is bad", file="t\n.mkt")
    assert error.render() == "t\\n.mkt: error: corrupted trace: column a\\nb\\x1b[2J is bad"
