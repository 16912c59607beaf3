"""The K3 programs' tuning knobs that were consts (issue 16): the megakernel's collective
buffer rotation `GROT` and the depths of the attention's two small-ring pipelines,
`HR_SLOTS` (a head's rows of wo) and `CR_SLOTS` (one sequence's MLA cache), are params
with declared values (docs/k3_programs.md, docs/tuning.md).

- `mkemu asm PROGRAM --params` lists them with their defaults and values;
- every declared value other than the default compiles to another program and runs
  bit-exact at k3-tiny (the race check on);
- `--set` of a value outside the declared ones is a clean error naming the values.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mkemu.cli import main

ROOT = Path(__file__).parents[2]
PROGRAMS = {name: str(ROOT / "programs" / f"{name}.mk") for name in ("k3_megakernel", "k3_superop", "k3_per_op")}
SMALL = ("--model", "k3-tiny", "--prompt-len", "1", "--steps", "2")

# name -> (default, declared values) per program
KNOBS = {
    "k3_megakernel": {"GROT": ("2", "2, 3"), "HR_SLOTS": ("2", "1, 2, 3, 4"), "CR_SLOTS": ("2", "1, 2, 3, 4")},
    "k3_superop": {"GROT": ("1", "1"), "HR_SLOTS": ("2", "1, 2, 3, 4"), "CR_SLOTS": ("2", "1, 2, 3, 4")},
    "k3_per_op": {"GROT": ("1", "1")},
}


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def params_table(capsys, program: str, *extra) -> dict[str, dict[str, str]]:
    """`mkemu asm PROGRAM --params` as {name: {column: text}} (columns cut at the header's offsets)."""
    code, out, err = run(capsys, "asm", PROGRAMS[program], "--params", *extra)
    assert code == 0, err
    header, *rows = out.splitlines()
    names = ("NAME", "VALUE", "DEFAULT", "VALUES", "DESCRIPTION", "WHERE")
    starts = [header.index(n) for n in names] + [None]
    return {row[:starts[1]].strip(): {n: row[starts[i]:starts[i + 1]].strip() for i, n in enumerate(names)}
            for row in rows}


@pytest.mark.parametrize("program", sorted(KNOBS))
def test_the_knobs_are_listed_with_their_values(capsys, program):
    table = params_table(capsys, program)
    for name, (default, values) in KNOBS[program].items():
        row = table[name]
        assert (row["VALUE"], row["DEFAULT"], row["VALUES"]) == (default, default, values), row
        assert row["DESCRIPTION"], row
    assert table["GROT"]["WHERE"].startswith(PROGRAMS[program] + ":")    # declared by the program itself


def test_a_set_value_is_listed_as_the_value(capsys):
    table = params_table(capsys, "k3_megakernel", "--set", "GROT=3", "--set", "CR_SLOTS=4")
    assert (table["GROT"]["VALUE"], table["GROT"]["DEFAULT"]) == ("3", "2")
    assert (table["CR_SLOTS"]["VALUE"], table["CR_SLOTS"]["DEFAULT"]) == ("4", "2")


def _build(program: str, mesh: str, params: dict[str, int]) -> str:
    import mkemu
    from mkemu.tune import program_hash

    return program_hash(mkemu.compile(PROGRAMS[program], model="k3-tiny", mesh=mesh, params=params).program)


# One small run per declared non-default value: GROT on 2x2x2 (its barriers order cores
# of several chips), the ring depths on one chip (2 cores: each core has more than one
# head, so its rings hold more than one tile).
VARIANTS = ([("k3_megakernel", "2x2x2", "8", {"GROT": 3})]
            + [("k3_megakernel", "1", "8", {name: v}) for name in ("HR_SLOTS", "CR_SLOTS") for v in (1, 3, 4)]
            + [("k3_superop", "1", "8", {"HR_SLOTS": 1, "CR_SLOTS": 4}),
               ("k3_superop", "1", "1", {"HR_SLOTS": 4, "CR_SLOTS": 1})])


@pytest.mark.parametrize("program, mesh, batch, params", VARIANTS,
                         ids=[f"{p}-{m}-b{b}-" + "-".join(f"{k}{v}" for k, v in s.items()) for p, m, b, s in VARIANTS])
def test_every_declared_value_runs_bit_exact(capsys, program, mesh, batch, params):
    # (the knob reaches the program: another build than the default's)
    assert _build(program, mesh, params) != _build(program, mesh, {})
    sets = [a for k, v in params.items() for a in ("--set", f"{k}={v}")]
    code, out, err = run(capsys, "run", PROGRAMS[program], *SMALL, "--mesh", mesh, "--batch", batch, *sets, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["bit_exact"] is True, report.get("mismatch")


@pytest.mark.parametrize("program, setting, values", [
    ("k3_megakernel", "GROT=1", "2, 3"),     # a barrier every layer: the debug copies race (docs/k3_programs.md)
    ("k3_megakernel", "GROT=4", "2, 3"),     # more semaphores than the profile has
    ("k3_superop", "GROT=2", "1"),
    ("k3_per_op", "GROT=2", "1"),
    ("k3_megakernel", "HR_SLOTS=0", "1, 2, 3, 4"),
    ("k3_superop", "CR_SLOTS=5", "1, 2, 3, 4"),
])
def test_a_value_outside_the_declared_ones_is_a_clean_error(capsys, program, setting, values):
    name, value = setting.split("=")
    for argv in (("run", PROGRAMS[program], *SMALL, "--mesh", "1", "--set", setting),
                 ("asm", PROGRAMS[program], "--set", setting)):
        code, out, err = run(capsys, *argv)
        assert code == 1 and not out and "Traceback" not in err, err
        first = err.splitlines()[0]
        assert f"error: {name} = {value} (set from outside) is not one of its declared values: {values}" in first, err
