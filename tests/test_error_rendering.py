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
