"""Mutated programs (tokens and lines deleted, duplicated, swapped) never raise
anything but mkemu's own errors: no Python traceback reaches a user."""

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mkemu.dsl.frontend import load_program
from mkemu.errors import MkemuError

DATA = Path(__file__).with_name("data")
SOURCE = (DATA / "full.mk").read_text()
TOKEN = re.compile(r'"[^"\n]*"|//[^\n]*|[A-Za-z_][A-Za-z0-9_]*|\d+\.\d+(?:[eE][+-]?\d+)?|\d+|\+:|\.\.|[<>=!]=|&&|\|\||<<|>>|[-+*/]=|\S')


def tokens(text: str) -> list[str]:
    # Comments are dropped: joined with spaces, one would swallow the rest of the file.
    return [t for t in TOKEN.findall(text) if not t.startswith("//")]


TOKENS = tokens(SOURCE)
# Replacement tokens that keep programs parseable more often, to reach the checker.
VOCAB = sorted(set(TOKENS)) + ["0", "-1", "999", "1.5", "inf", "idx", "ws", "wbuf", "hx", "rmsnorm"]
LINES = SOURCE.split("\n")

mutation = st.tuples(
    st.sampled_from(["delete", "duplicate", "swap", "replace", "vocab"]),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
)


def mutate(units: list[str], ops) -> list[str]:
    units = list(units)
    for op, i, j in ops:
        if not units:
            break
        i %= len(units)
        j %= len(units)
        if op == "delete":
            del units[i]
        elif op == "duplicate":
            units.insert(i, units[i])
        elif op == "swap":
            units[i], units[j] = units[j], units[i]
        elif op == "replace":
            units[i] = units[j]
        else:
            units[i] = VOCAB[j % len(VOCAB)]
    return units


def compile_text(tmp_path: Path, text: str) -> None:
    (tmp_path / "lib.mk").write_text((DATA / "lib.mk").read_text())
    try:
        load_program(tmp_path / "full.mk", text=text)
    except MkemuError as e:
        assert e.render()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(mutation, min_size=1, max_size=4))
def test_token_mutations(tmp_path, ops):
    compile_text(tmp_path, " ".join(mutate(TOKENS, ops)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(mutation, min_size=1, max_size=4))
def test_line_mutations(tmp_path, ops):
    compile_text(tmp_path, "\n".join(mutate(LINES, ops)))
