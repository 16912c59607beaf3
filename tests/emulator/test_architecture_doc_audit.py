"""docs/architecture.md, read and measured: the timing-class table, the issue rules,
what a launch clears and when it ends, the HBM a program addresses, DMA rates and
rounding, and where blocked waits resume. Each expected figure is read from the doc
(or the profile this file writes) or derived from the doc's rules, so a doc that goes
stale fails here. Programs run through the public API (`mkemu.compile_source`) on
the `test` profile or on small profiles that extend it; cycles come from the trace.
"""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import pytest

import mkemu
from mkemu.cli import main
from mkemu.errors import EmulatorFault

DOCS = Path(__file__).parents[2] / "docs"
ARCH = (DOCS / "architecture.md").read_text()
FLAT = " ".join(ARCH.split())      # the doc's prose with every line break and run of spaces one space
ISA = (DOCS / "isa.md").read_text()
LAUNCH = 1000           # kernel_launch_cycles of `test`
SOLO = "    rdsr s31, gcore\n    bne s31, s0, __end\n"      # core 1 (and others) halt at once


def _profile(tmp_path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text('extends = "test"\n' + textwrap.dedent(body))
    return str(path)


def _run(source: str, hw: str = "test", mesh: str = "1", **options):
    kernel = mkemu.compile_source(textwrap.dedent(source), "audit.s", hw=hw, mesh=mesh, trace=True, **options)
    return kernel()


def _fault(source: str, **options) -> EmulatorFault:
    with pytest.raises(EmulatorFault) as info:
        _run(source, **options)
    return info.value


def _issue_by_pc(run, core: int = 0, launch: int = 0) -> dict[int, int]:
    instr = run.report.trace.instr
    sel = (instr["core"] == core) & (instr["launch"] == launch)
    return dict(zip(instr["pc"][sel].tolist(), instr["issue"][sel].tolist()))


def _table(text: str, header: str) -> list[list[str]]:
    """The rows (cells stripped) of the markdown table whose header line starts `header`."""
    lines = text[text.index(header):].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


# --- the timing-class table ------------------------------------------------------

def _class_units() -> dict[str, str]:
    """class -> unit, from the doc's table (`mxuN.w (its weight path)` -> `mxuN.w`)."""
    out = {}
    for cls, unit, _ in _table(ARCH, "| class | unit | instructions |"):
        out[cls.strip("`")] = unit.split()[0].strip("`")
    return out


def _isa_rows() -> dict[str, tuple[str, str]]:
    """mnemonic -> (unit section, timing class) of every instruction in docs/isa.md."""
    rows, unit = {}, None
    for line in ISA.splitlines():
        m = re.match(r"## unit `([\w.]+)`", line)
        if m:
            unit = m.group(1)
            continue
        m = re.match(r"\| 0x[0-9a-f]+ \| `([\w.]+)[ `]", line)
        if m and unit:
            rows[m.group(1)] = (unit, line.split("|")[3].strip())
    return rows


def test_class_table_names_every_class_once_and_agrees_with_the_isa_tables():
    units = _class_units()
    table = _table(ARCH, "| class | unit | instructions |")
    assert len(units) == len(table)
    isa = _isa_rows()
    assert len(isa) > 100
    for mnemonic, (unit, cls) in isa.items():
        if cls == "free":
            assert unit == "meta" and mnemonic.startswith("mark.")
            continue
        # docs/isa.md names the unit kind (`mxu.w`); the doc a unit instance (`mxuN.w`).
        assert units[cls].replace("mxuN", "mxu") == unit, (mnemonic, cls, unit)
    for cls, _, instructions in table:
        for mnemonic in re.findall(r"`([\w.]+)`", instructions):
            assert isa[mnemonic][1] == cls.strip("`"), (mnemonic, cls)
    # Classes no instruction uses are said to be unused.
    used = {cls for _, cls in isa.values()}
    for cls, _, instructions in table:
        assert (cls.strip("`") in used) == (instructions != "none at present"), cls


# Distinct latency and occupancy per class, so a class or unit mixed up shows. The
# matrix unit's weight load gets a latency below its occupancy to tell them apart.
TIMING = {
    "scalar": (2, 1), "scalar_mul": (3, 2), "scalar_div": (7, 5), "branch": (9, 3),
    "smem": (4, 2), "vextract": (6, 3), "vld": (5, 2), "vst": (9, 4), "valu": (3, 2),
    "vcvt": (8, 4), "xlu": (10, 3), "eup": (11, 2), "mxu_ldw": (13, 17), "mxu_push": (4, 2),
    "mxu_mac": (23, 6), "mxu_pop": (5, 3), "dma_issue": (6, 4), "sync": (5, 3),
}
GAP = 40                # nops between probes: longer than any latency or occupancy above

# class -> two independent instances (text, registers and matrix-unit state written,
# read); the first is the probe's producer, the second its follower when the classes
# are the same. TARGET is a label on the next instruction (the branch is taken).
FORMS = {
    "scalar": [("add s10, s1, s2", {"s10"}, {"s1", "s2"}), ("add s11, s1, s2", {"s11"}, {"s1", "s2"})],
    "scalar_mul": [("mul s10, s1, s2", {"s10"}, {"s1", "s2"}), ("mul s11, s1, s2", {"s11"}, {"s1", "s2"})],
    "scalar_div": [("div s10, s1, s2", {"s10"}, {"s1", "s2"}), ("div s11, s1, s2", {"s11"}, {"s1", "s2"})],
    "branch": [("bne s1, s0, TARGET", set(), {"s1"}), ("bne s1, s0, TARGET", set(), {"s1"})],     # taken
    "smem": [("lds s10, 0(s0)", {"s10"}, set()), ("lds s11, 4(s0)", {"s11"}, set())],
    "vextract": [("vextract s10, v1, s0", {"s10"}, {"v1"}), ("vextract s11, v1, s0", {"s11"}, {"v1"})],
    "vld": [("vld.w v10, 0(s0), s3, m0", {"v10"}, {"s3"}), ("vld.w v11, 0(s0), s3, m0", {"v11"}, {"s3"})],
    "vst": [("vst.w v1, 0(s0), s3, m0", set(), {"v1", "s3"}), ("vst.w v1, 4096(s0), s3, m0", set(), {"v1", "s3"})],
    "valu": [("vadd.f32 v10, v1, v2", {"v10"}, {"v1", "v2"}), ("vadd.f32 v11, v1, v2", {"v11"}, {"v1", "v2"})],
    "vcvt": [("vcvt.f32.i32 v10, v1", {"v10"}, {"v1"}), ("vcvt.f32.i32 v11, v1", {"v11"}, {"v1"})],
    "xlu": [("vrot.lane v10, v1, 1", {"v10"}, {"v1"}), ("vrot.lane v11, v1, 1", {"v11"}, {"v1"})],
    "eup": [("vexp.f32 v10, v1", {"v10"}, {"v1"}), ("vexp.f32 v11, v1", {"v11"}, {"v1"})],
    "mxu_ldw": [("mxu.ldw x0, 0(s0), s4, s5", {"w0"}, {"s4", "s5"}),
                ("mxu.ldw x0, 0(s0), s4, s5", {"w0"}, {"s4", "s5"})],
    "mxu_push": [("mxu.push x0, v1, 0", {"l0"}, {"v1"}), ("mxu.push x0, v2, 0", {"l0"}, {"v2"})],
    "mxu_mac": [("mxu.mac x0, a1, 1", {"a1"}, {"w0", "l0"}), ("mxu.mac x0, a2, 1", {"a2"}, {"w0", "l0"})],
    "mxu_pop": [("mxu.pop v10, x0, a0, 0", {"v10"}, {"a0"}), ("mxu.pop v11, x0, a0, 0", {"v11"}, {"a0"})],
    "dma_issue": [("dma.start vmem[s6], vmem[s7], s8, s9", set(), {"s6", "s7", "s8", "s9"})] * 2,
    "sync": [("sem.signal s0, s0", set(), set())] * 2,
}
# A reader of each producer's result, on another unit than the producer's.
READERS = {"s10": "vbcast v12, s10", "v10": "vst.w v10, 8192(s0), s3, m0",
           "w0": "mxu.mac x0, a3, 1", "l0": "mxu.mac x0, a3, 1", "a1": "mxu.pop v12, x0, a1, 0"}
SETUP = """li s1, 1
li s2, 1
li s3, 512
li s4, 256
li s5, 8388736
li s6, 65536
li s7, 69632
li s8, 64
li s9, 1
mxu.ldw x0, 0(s0), s4, s5
mxu.push x0, v1, 0
mxu.mac x0, a0, 1"""


def test_each_class_takes_its_latency_and_occupancy_on_the_unit_the_doc_names(tmp_path):
    """Every ordered pair of classes: the second issues max(1, the first's occupancy if
    they share a unit, its latency if the second reads or rewrites its result)."""
    assert set(TIMING) | {"misc"} == set(_class_units())
    timing = "\n".join(f"{c} = {{ latency_cycles = {lat}, occupancy_cycles = {occ} }}"
                       for c, (lat, occ) in TIMING.items())
    hw = _profile(tmp_path, "classes", "[timing]\n" + timing + "\n")
    units = _class_units()
    probes = []        # (first class, second class or a reader, expected distance)
    for first, ((text, writes, _), _) in FORMS.items():
        lat, occ = TIMING[first]
        for second, (_, (text2, writes2, reads2)) in FORMS.items():
            wait = 1
            if units[first] == units[second]:
                wait = max(wait, occ)
            if writes & (reads2 | writes2):
                wait = max(wait, lat)
            probes.append((text, text2, wait, f"{first} then {second}"))
        for reg in writes:
            reader = READERS[reg]
            same = reader.startswith("mxu.pop") and units[first] == units["mxu_pop"]
            probes.append((text, reader, max(lat, occ if same else 1), f"{first} then its reader"))
    lines, at = SETUP.splitlines() + ["nop"] * GAP, []
    for n, (a, b, _, _) in enumerate(probes):
        at.append(len(lines) + 2)       # (SOLO's two instructions come first)
        lines += [a.replace("TARGET", f"a{n}"), f"a{n}: " + b.replace("TARGET", f"b{n}"), f"b{n}: nop"]
        lines += ["nop"] * GAP
    dmas = sum("dma.start" in line for line in lines)
    lines += [f"li s12, {16 * dmas}", "sem.wait s9, s12"]
    source = (".kernel main\n    .smem 64 16 1 0 0 1 0 0\n" + SOLO
              + "".join(f"    {line}\n" for line in lines) + "__end:\n    halt\n")
    issue = _issue_by_pc(_run(source, hw=hw, checks={"semaphores"}))    # (the copies overlap)
    wrong = [(what, a, b, issue[pc + 1] - issue[pc], wait) for pc, (a, b, wait, what) in zip(at, probes)
             if issue[pc + 1] - issue[pc] != wait]
    assert not wrong, wrong[:10]


def test_stalls_count_as_unit_until_the_unit_is_free_then_as_dependency():
    # test: scalar_div latency 4, occupancy 4; scalar_mul latency 2; eup latency 4.
    run = _run(".kernel main\n" + SOLO + """
    li s1, 3
    div s2, s1, s1
    add s3, s2, s2
    mul s4, s1, s1
    vbcast v1, s4
    vexp.f32 v2, v3
    vadd.f32 v4, v2, v2
__end:
    halt
""")
    instr = run.report.trace.instr
    sel = instr["core"] == 0
    rows = list(zip(instr["stall_unit"][sel].tolist(), instr["stall_dep"][sel].tolist()))[2:9]
    # add: the unit is free 4 cycles after the div, when s2 is ready too: unit 3, none
    # for the operand. vbcast: s4 ready 2 after the mul (1 waited). vadd: v2 after 4 (3).
    assert rows == [(0, 0), (0, 0), (3, 0), (0, 0), (0, 1), (0, 0), (0, 3)]


# --- launches ----------------------------------------------------------------------

def test_a_launch_ends_when_its_dmas_and_signals_have_landed_not_at_halt():
    assert "every DMA and signal its cores started has landed" in FLAT
    run = _run("""
    .buffer a f32 8x128 input
    .buffer out f32 8x128 output
    .kernel first
        .smem 0 4096 1 0 0 1 0 0
    """ + SOLO + """
        li s1, @a
        li s2, @out
        dma.start hbm[s2], hbm[s1], s0, s0
    __end:
        halt
    .kernel second
        halt
    """, checks={"races"})
    t = run.report.trace
    first, second = t.launches
    (issued,), (done,) = t.dma["issued"].tolist(), t.dma["done"].tolist()
    assert done == issued + 10 + 4096 // 32            # start latency, then the 32 B/cycle engine
    assert first["end"] == done > max(_issue_by_pc(run).values())      # (core 0 halted at issue 5)
    assert second["start"] == done + LAUNCH
    # A signal still travelling (one hop, 50 cycles) when every core has halted.
    run = _run(".kernel main\n" + SOLO + """
        li s1, 1
        li s2, 2
        sem.signal.r s0, s1, s2
    __end:
        halt
    """, mesh="2", checks={"races"})
    (launch,), (arrival,) = run.report.trace.launches, run.report.trace.signal["arrival"].tolist()
    assert launch["end"] == arrival == LAUNCH + 4 + 50 == run.report.cycles


def test_a_launch_clears_matrix_units_and_semaphores_and_keeps_hbm():
    assert "an `mxu.mac` before this launch's first load faults" in FLAT
    fault = _fault("""
    .kernel first
        li s1, 256
        li s2, 8388736
        mxu.ldw x0, 0(s0), s1, s2
        mxu.mac x0, a0, 1
        halt
    .kernel second
        mxu.mac x0, a0, 0
        halt
    """)
    assert fault.kind == "bad-operand" and "before any weight tile was loaded" in fault.message
    # first: li 0, li 1, ldw 2, mac 18 (waits for the tile), halt 19; second starts 1000 later.
    assert fault.cycle == LAUNCH + 19 + LAUNCH
    assert "a count left with `--no-check semaphores` does not carry over" in FLAT
    fault = _fault("""
    .kernel first
        li s1, 3
        sem.signal s0, s1
        halt
    .kernel second
        li s1, 3
        sem.wait s0, s1
        halt
    """, checks={"races"})
    assert fault.kind == "deadlock" and "(it is 0)" in fault.details[0]
    assert "HBM keeps its bytes from launch to launch" in FLAT
    run = _run("""
    .buffer tmp f32 8x128 scratch
    .buffer out f32 8x128 output
    .kernel first
        .smem 0 4096 1 0 0 1 0 0
    """ + SOLO + """
        vli.f32 v1, 5.0
        li s5, 512
        vst.w v1, 0(s0), s5, m0
        li s1, @tmp
        li s6, 4096
        dma.start hbm[s1], vmem[s0], s0, s0
        sem.wait s0, s6
    __end:
        halt
    .kernel second
        .smem 0 4096 1 0 0 1 0 0
    """ + SOLO + """
        li s1, @tmp
        li s2, @out
        li s6, 4096
        dma.start hbm[s2], hbm[s1], s0, s0
        sem.wait s0, s6
    __end:
        halt
    """)
    assert (run.output("out") == 5.0).all()


# --- memory and DMA ------------------------------------------------------------------

def test_the_hbm_a_program_addresses_ends_with_its_last_buffer():
    assert "A DMA reaching past that end faults `out-of-bounds` even inside the profile's `hbm_bytes`" in FLAT
    source = """
    .buffer a f32 8x100 input
    .buffer b f32 8x100 input
    .kernel main
        .smem 0 128 1 0 0 1 0 0
    """ + SOLO + """
        li s1, @b
        addi s1, s1, {offset}
        li s6, 128
        dma.start vmem[s0], hbm[s1], s0, s0
        sem.wait s0, s6
    __end:
        halt
    """
    # a: 3200 bytes, padded to 3584; b: 3200 bytes from 3584, so the HBM ends at 6784.
    _run(source.format(offset=3200 - 128))              # the last 128 bytes of b: fine
    fault = _fault(source.format(offset=3200 - 64))     # 64 bytes past b, inside 64 MiB
    assert fault.kind == "out-of-bounds" and "outside HBM (DMA source) of 6784 bytes" in fault.message


def test_hbm_is_shared_only_where_the_engines_could_outrun_it_and_dmas_land_on_whole_cycles(tmp_path):
    # "4096 bytes at 24 bytes per cycle, begun at cycle t, land at t + 171"
    size, rate, cycles = (int(v) for v in re.search(
        r"(\d+) bytes at (\d+) bytes per cycle, begun at cycle t, land at t \+ (\d+)", FLAT).groups())
    assert cycles == math.ceil(size / rate)
    # Two engines of 32 bytes per cycle against an HBM of 2 x 24: shared, 24 each.
    hw = _profile(tmp_path, "hbm48", f"[chip]\nhbm_bw_bytes_per_s = {2 * rate}e9\n")
    body = f"""
    .buffer a f32 8x128 input
    .kernel main
        .smem 0 {size} 1 0 0 1 0 0
    {{solo}}
        li s1, @a
        li s6, {size}
        dma.start vmem[s0], hbm[s1], s0, s0
        sem.wait s0, s6
    __end:
        halt
    """
    t = _run(body.format(solo=""), hw=hw).report.trace
    assert (t.dma["done"] - t.dma["begun"]).tolist() == [cycles, cycles]
    assert sorted(t.resources[i]["kind"] for i in t.dma_res["resource"]) == ["engine", "engine", "hbm", "hbm"]
    t = _run(body.format(solo=SOLO), hw=hw).report.trace        # one core alone: its engine's 32
    assert (t.dma["done"] - t.dma["begun"]).tolist() == [size // 32]


def test_which_hbm_a_dma_crosses(tmp_path, capsys):
    assert "(otherwise it is left out, as on every shipped profile: the chip's own engines can never outrun it" in FLAT
    capsys.readouterr()
    assert main(["hw", "list"]) == 0
    shipped = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert "tpu-v7-like" in shipped
    source = """
    .buffer a f32 8x128 input
    .kernel main
        .smem 0 4096 1 0 0 1 0 0
        li s1, @a
        li s6, 4096
        dma.start vmem[s0], hbm[s1], s0, s0
        sem.wait s0, s6
        halt
    """
    for name in shipped:        # every core of the chip streams from HBM at once
        t = _run(source, hw=name).report.trace
        assert {t.resources[i]["kind"] for i in t.dma_res["resource"]} == {"engine"}, name
    # Where HBM is a resource, a push from VMEM into chip 1's HBM counts against chip 1's
    # (it counted against the issuer's, which it never touches, slowing the issuer's own
    # HBM traffic).
    assert "a push from VMEM into another chip's HBM counts against that chip's HBM, not the issuer's" in FLAT
    hw = _profile(tmp_path, "hbm_push", "[chip]\nhbm_bw_bytes_per_s = 48e9\n")
    t = _run(""".buffer a f32 8x128 input
    .kernel main
        .smem 0 4096 1 0 0 1 0 0
    """ + SOLO + """
        li s1, @a
        li s6, 4096
        li s7, 2
        dma.start.r hbm[s1]@s7, vmem[s0], s0, s0, s0
        sem.wait s0, s6
    __end:
        halt
    """, hw=hw, mesh="2", checks={"races"}).report.trace
    names = [t.resources[i]["name"] for i in t.dma_res["resource"]]
    assert names[:2] == ["chip0 core0 DMA engine", "chip1 HBM"] and "chip0 HBM" not in names


@pytest.mark.parametrize("vmem_bw, cycles", [(8, 4096 // 8), (64, 4096 // 32)])
def test_copies_within_a_core_move_at_the_slower_of_the_engine_and_vmem_bw(tmp_path, vmem_bw, cycles):
    # (vmem_bw was shown by `mkemu hw show` and used by nothing: a copy within a core
    # moved at the engine's 32 B/cycle whatever it said)
    assert "each such copy moving at most the profile's `vmem_bw_bytes_per_cycle`" in FLAT
    hw = _profile(tmp_path, f"vmem_bw{vmem_bw}", f"[core]\nvmem_bw_bytes_per_cycle = {vmem_bw}\n")
    t = _run(".kernel main\n    .smem 0 4096 1 0 0 1 0 0\n" + SOLO + """
        li s6, 4096
        li s1, 8192
        dma.start vmem[s1], vmem[s0], s0, s0
        sem.wait s0, s6
        dma.start smem[s1], vmem[s0], s0, s0
        sem.wait s0, s6
    __end:
        halt
    """, hw=hw).report.trace
    assert (t.dma["begun"] - t.dma["issued"]).tolist() == [10, 10]
    assert (t.dma["done"] - t.dma["begun"]).tolist() == [cycles, cycles]


@pytest.mark.parametrize("links, share", [(1, 2), (2, 1)])
def test_per_core_ports_and_the_pooled_link(tmp_path, links, share):
    # Both cores of chip 0 push 8000 bytes to chip 1: each through its own 8 B/cycle
    # port, then the pooled links_per_neighbor x 8 B/cycle of the pair.
    assert "the cores of a chip together at most the pooled `links_per_neighbor x link_bw`" in FLAT
    hw = _profile(tmp_path, f"links{links}", f"[ici]\nper_core_links = true\nlinks_per_neighbor = {links}\n")
    t = _run(""".kernel main
        .smem 0 8000 1 0 0 1 0 0
        rdsr s1, chip
        rdsr s2, core
        li s4, 1
        li s5, 8000
        bne s1, s0, receive
        muli s6, s2, 8192
        addi s3, s2, 2
        dma.start.r vmem[s6]@s3, vmem[s6], s0, s4, s4
        sem.wait s4, s5
        jmp done
    receive:
        sem.wait s4, s5
    done:
        halt
    """, hw=hw, mesh="2").report.trace
    assert (t.dma["done"] - t.dma["begun"]).tolist() == [8000 // 8 * share] * 2


# --- waits --------------------------------------------------------------------------

def test_a_blocked_wait_resumes_in_the_cycle_its_count_is_reached():
    assert "one that blocks lets the next instruction issue in the cycle the count is reached" in FLAT
    run = _run("""
    .buffer a f32 8x128 input
    .kernel main
        .smem 0 4096 1 0 0 1 0 0
    """ + SOLO + """
        li s1, @a
        li s6, 4096
        dma.start vmem[s0], hbm[s1], s0, s0
        sem.wait s0, s6
        li s7, 1
    __end:
        halt
    """)
    issue = _issue_by_pc(run)
    (done,) = run.report.trace.dma["done"].tolist()
    assert issue[6] == done == issue[4] + 10 + 4096 // 32
    # A signal from the sibling core (sibling_signal_latency 40) and a chip barrier
    # (arrivals to the root, core 0, then its release: 40 each way).
    run = _run(""".kernel main
        rdsr s9, gcore
        li s1, 1
        bne s9, s0, other
        sem.signal.r s0, s1, s1
        barrier chip
        halt
    other:
        sem.wait s0, s1
        li s2, 2
        barrier chip
        li s3, 3
        halt
    """)
    c0, c1 = _issue_by_pc(run, 0), _issue_by_pc(run, 1)
    assert c1[7] == c0[3] + 40                      # li s2: when the signal arrives
    release = max(c0[4], c1[8] + 40)                # both arrivals at the root, core 0
    assert (c0[5], c1[9]) == (release, release + 40)    # halt, li s3: at their release


# --- profile limits ---------------------------------------------------------------

@pytest.mark.parametrize("key, ok, bad", [
    ("mxu_dim", "1024", "1152"), ("mxu_dim", "256", "192"),
    ("sregs", "32", "33"), ("vregs", "32", "33"), ("mregs", "8", "9"),
])
def test_register_and_matrix_unit_limits(tmp_path, capsys, key, ok, bad):
    limits = FLAT[FLAT.index("Limits a profile or mesh must keep"):FLAT.index("## Machine model")]
    assert "`mxu_dim` at most 1,024 (a multiple of 128)" in limits
    assert "(32 scalar, 32 vector and 8 mask registers, 4 and 16)" in limits
    for value, status in ((ok, 0), (bad, 1)):
        path = _profile(tmp_path, f"{key}{value}", f"[core]\n{key} = {value}\n")
        capsys.readouterr()
        assert main(["hw", "show", path]) == status
        if status:
            assert key in capsys.readouterr().err
