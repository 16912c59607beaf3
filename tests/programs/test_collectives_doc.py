"""docs/collectives.md against the runs it quotes: the examples' timings on 2x2x2, the
all-reduce's regions, the semaphore budget error, and the fault texts of "When a
collective goes wrong" (on 2x2x2 with `--hw test`, as the doc says), line for line.

The doc's figures and excerpts are read from the doc itself, so a change that moves
them fails here until the doc is updated.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from mkemu.cli import main
from mkemu.dsl.compiler import compile_text
from mkemu.errors import SourceError
from mkemu.isa.hardware import load_profile
from tests.programs.test_collectives import (BAD_TARGET, EXAMPLES, LIBRARY, MISMATCH_PROGRAM, fault_file,
                                             run_fault, run_json)

ROOT = Path(__file__).parents[2]
DOC = (ROOT / "docs" / "collectives.md").read_text()
SECTION_FAULTS = DOC[DOC.index("## When a collective goes wrong"):DOC.index("## Limits")]


def doc_block(after: str) -> list[str]:
    """The lines of the first fenced block in "When a collective goes wrong" after the
    bullet that starts with `after`, without the `...` elisions, stripped."""
    start = SECTION_FAULTS.index(after)
    block = SECTION_FAULTS[start:].split("```")[1]
    return [line.strip() for line in block.strip().splitlines() if line.strip() != "..."]


def as_in_doc(err: str, tmp_path) -> str:
    """The run's report with its paths as the doc prints them (run from the repo root)."""
    return err.replace(str(LIBRARY), "programs/lib/collectives.mk").replace(f"{tmp_path}/", "")


def write_mismatched(tmp_path, odd_chip: int, odd_size: int) -> tuple[str, str]:
    path = tmp_path / "mismatched.mk"
    path.write_text(MISMATCH_PROGRAM.format(library=LIBRARY))
    sizes = {f"n@{chip}": np.array([odd_size if chip == odd_chip else 4], np.int32) for chip in range(8)}
    np.savez(tmp_path / "n.npz", **sizes)
    return str(path), str(tmp_path / "n.npz")


# ---------------------------------------------------------------- timings


def test_the_examples_take_the_doc_s_time_on_one_chip_and_2x2x2(capsys):
    header, *rows = [line for line in DOC[DOC.index("## Timings"):].splitlines() if line.startswith("| ")][:4]
    columns = [c.strip() for c in header.strip("|").split("|")]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        name = cells[0].split()[0]
        for mesh in ("1 chip", "2x2x2"):
            report = run_json(capsys, str(EXAMPLES / name), "--mesh", mesh.split()[0])
            assert report["bit_exact"] is True
            assert cells[columns.index(mesh)] == f"{report['seconds'] * 1e6:.1f} µs", (name, mesh)


def test_the_all_reduce_regions_on_chip_0_core_0_are_the_doc_s(capsys, tmp_path):
    whole, level0 = (int(n.replace(",", "")) for n in re.search(
        r"The all-reduce itself on 2x2x2 takes ([\d,]+) cycles.*?([\d,]+) of\s+them on level 0", DOC, re.S).groups())
    trace = tmp_path / "t.mkt"
    assert main(["run", str(EXAMPLES / "all_reduce.mk"), "--mesh", "2x2x2", "--trace", str(trace)]) == 0
    capsys.readouterr()
    assert main(["trace", str(trace), "--chip", "0", "--core", "0"]) == 0
    summary = capsys.readouterr().out
    cycles = {m[0]: int(m[1].replace(",", "")) for m in re.findall(r"^  (\S+)\s+1\s+([\d,]+)\s", summary, re.M)}
    assert cycles["reduce_scatter[0]"] + cycles["all_gather[0]"] == level0
    assert sum(v for k, v in cycles.items() if re.fullmatch(r"(reduce_scatter|all_gather)\[\d\]", k)) == whole


def test_two_calls_add_up_to_the_semaphore_error_the_doc_quotes(tmp_path):
    quoted = re.search(r'\("(kernel \'k\' uses \d+ semaphores; the profile has \d+)"', DOC).group(1)
    text = f"""
import "{LIBRARY}";
kernel k(x: hbm f32[2, 64, 128]) {{
    vmem buf: f32[64, 128];
    sem s;
    start copy(x[core_id()], buf, s);
    wait copy(x[core_id()], buf, s);
    reduce_scatter(buf, 64, 128, 8, 2, 8);
    all_gather(buf, 64, 128, 8, 2, 8);
}}
host {{
    input x: f32[2, 64, 128];
    launch k(x);
}}
"""
    with pytest.raises(SourceError) as info:
        compile_text(text, str(tmp_path / "k.mk"), load_profile("test"))
    assert quoted in str(info.value)


# ---------------------------------------------------------------- fault texts


def test_the_bad_target_text_is_the_doc_s(capsys, tmp_path):
    err = as_in_doc(run_fault(capsys, fault_file(tmp_path, BAD_TARGET), "--mesh", "2x2x2", "--hw", "test"), tmp_path)
    lines = [line.strip() for line in err.splitlines()]
    for line in doc_block("- **A remote DMA to a chip outside the mesh**"):
        assert line in lines, line


def test_the_mismatched_collective_text_is_the_doc_s(capsys, tmp_path):
    odd_chip, odd_size = map(int, re.search(r"\(chip (\d) passed `nblocks = (\d+)`, the others 4\.\)",
                                            SECTION_FAULTS).groups())
    path, sizes = write_mismatched(tmp_path, odd_chip, odd_size)
    err = as_in_doc(run_fault(capsys, path, "--mesh", "2x2x2", "--hw", "test", "--inputs", sizes), tmp_path)
    lines = [line.strip() for line in err.splitlines()]
    quoted = doc_block("- **A mismatched collective**")
    assert len(quoted) == 3
    for line in quoted:
        assert line in lines, line


def test_a_mismatched_collective_can_end_in_the_race_the_doc_quotes(capsys, tmp_path):
    odd_chip, odd_size, at, against = re.search(
        r"\(chip (\d) passing `nblocks = (\d+)`, the\s+others 4: `(fault \[race\] at chip \d, core \d), \.\.\.` "
        r"against a DMA `(of chip \d core \d)`\)", SECTION_FAULTS).groups()
    path, sizes = write_mismatched(tmp_path, int(odd_chip), int(odd_size))
    err = run_fault(capsys, path, "--mesh", "2x2x2", "--hw", "test", "--inputs", sizes)
    first = err.splitlines()[0]
    assert first.startswith(at + ",") and against in first
    assert "collectives.mk:" in first


def test_a_barrier_reached_after_the_others_halted_lists_every_one_of_them(capsys, tmp_path):
    # The others copy for a while first, so chip 3's cores halt before anyone reaches it.
    body = """
    if chip_id() != 3 {
        for round in 0..20 {
            start copy(x, buf, s);
            wait copy(x, buf, s);
        }
        barrier();
    }"""
    err = run_fault(capsys, fault_file(tmp_path, body), "--mesh", "2x2x2", "--hw", "test")
    assert "fault [deadlock]" in err and "14 core(s) wait forever" in err
    waiting = re.findall(r"^  chip (\d) core (\d) pc \S+ `barrier all` waits at the all barrier since cycle \d+ "
                         r"\(([^)]*)\)", err, re.M)
    assert sorted((int(c), int(k)) for c, k, _ in waiting) == [(c, k) for c in range(8) if c != 3 for k in (0, 1)]
    for _, _, halted in waiting:
        assert re.fullmatch(r"chip 3 core 0 halted at cycle \d+, chip 3 core 1 halted at cycle \d+ "
                            r"without reaching it", halted), halted


ROOM_PROGRAM = """
import "{library}";
const MAXP = 4;
const CAP = 8;

kernel a2a(x: hbm f32[2, MAXP * CAP, 128], y: hbm f32[2, MAXP * CAP, 128]) {{
    vmem xv: f32[MAXP * CAP, 128];
    vmem yv: f32[MAXP * CAP, 128];
    smem cnt: i32[MAXP];
    smem rcnt: i32[MAXP];
    sem s;
    start copy(x[core_id()], xv, s);
    wait copy(x[core_id()], xv, s);
    for d in 0..MAXP {{
        cnt[d] = 1;
    }}
    all_to_all(xv, yv, cnt, rcnt, MAXP, CAP, 128);
    start copy(yv, y[core_id()], s);
    wait copy(yv, y[core_id()], s);
}}

host {{
    input x: f32[2, MAXP * CAP, 128];
    output y: f32[2, MAXP * CAP, 128];
    launch a2a(x, y);
}}
"""


def test_all_to_all_on_more_participants_than_its_room_stops_at_the_check(capsys, tmp_path):
    # Room for 4 participants, 2x2x2 has 16: every core stops at the room check.
    path = tmp_path / "room.mk"
    path.write_text(ROOM_PROGRAM.format(library=LIBRARY))
    err = run_fault(capsys, str(path), "--mesh", "2x2x2", "--hw", "test")
    assert "fault [deadlock]" in err and "16 core(s) wait forever" in err
    waiting = re.findall(r"^  chip \d+ core \d+ pc .*$", err, re.M)
    assert len(waiting) == 16
    for line in waiting:
        assert "wait(fits, 1);      // stuck here? more participants than the buffers have room for (maxp)" in line

