"""Error rendering (mkemu/errors.py): what a user sees under a source line."""

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
