"""Random assembly programs (scalar, vector, mask, matrix unit, DMA local and remote,
semaphores, barriers, branches) on 1-4 chips of 2 cores: a run ends in outputs or an
`MkemuError` (a fault names chip, core and cycle), never another exception; two runs
agree; a trace and other DMA schedules change nothing but what they may."""

from __future__ import annotations

import hashlib

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mkemu
from mkemu.errors import EmulatorFault

SMEM_DESCS = (".smem 0 4096 1 0 0 1 0 0\n.smem 32 512 8 512 512 1 0 0\n"
              ".smem 64 0 1 0 0 1 0 0\n.smem 96 4 2 0 0 1 0 0\n")
# Values scalar operands take: edges of int32, of the memories and of the fields.
EDGES = [0, 1, -1, 4, 8, 128, 129, 512, 1023, 1024, 4096, 65532, 65536, 4194300, 4194304,
         2**31 - 1, -2**31, 0xFFFFFFFF, (1 << 16) | 128, (129 << 16) | 128]
S = st.integers(1, 27).map(lambda n: f"s{n}")
V = st.integers(0, 31).map(lambda n: f"v{n}")
M = st.integers(0, 7).map(lambda n: f"m{n}")
X = st.sampled_from(["x0", "x1", "x2"])
A = st.sampled_from(["a0", "a3", "a4"])
SPACE = st.sampled_from(["vmem", "hbm", "smem"])


def _fmt(template: str, *parts):
    return st.tuples(*parts).map(lambda p: template.format(*p))


LINES = st.one_of(
    _fmt("li {}, {}", S, st.sampled_from(EDGES)),
    _fmt("lui.d {}, {}", S, st.sampled_from([1, -1, 0x7FFFFFFF])),
    _fmt("{} {}, {}, {}", st.sampled_from(["add", "sub", "mul", "div", "rem", "sra", "shl", "slt",
                                            "min", "add.d"]), S, S, S),
    _fmt("{} {}, {}, {}", st.sampled_from(["addi", "divi", "remi", "shli.d", "muli.d", "srai"]), S, S,
         st.sampled_from(EDGES)),
    _fmt("{} {}, 0({})", st.sampled_from(["lds", "sts", "lds.d", "sts.d"]), S, S),
    _fmt("rdsr {}, {}", S, st.sampled_from(["gcore", "core", "chip", "chips", "mesh_x"])),
    _fmt("{} {}, 0({}), {}, {}", st.sampled_from(["vld.w", "vst.w", "vld.bf16", "vst.bf16"]), V, S, S, M),
    _fmt("{} {}, {}, {}", st.sampled_from(["vadd.f32", "vdiv.f32", "vmul.i32", "vsra.i32", "vmin.f32"]),
         V, V, V),
    _fmt("{} {}, {}", st.sampled_from(["vexp.f32", "vlog.f32", "vcvt.i32.f32", "vpack.bf16",
                                        "vredsum.lane.f32", "vredmax.sub.i32"]), V, V),
    _fmt("vli.f32 {}, {}", V, st.sampled_from(["nan", "-inf", "-0.0", "f32:0x00000001", "3.4028234e38"])),
    _fmt("{} {}, {}, {}", st.sampled_from(["vcmplt.f32", "vcmpeq.i32"]), M, V, V),
    _fmt("mrows {}, {}, {}", M, S, S),
    _fmt("vsel {}, {}, {}, {}", V, M, V, V),
    _fmt("{} {}, {}, {}", st.sampled_from(["vbcast.lane", "vrot.sub", "vcol"]), V, V,
         st.sampled_from([0, 7, 8, 16, 255])),
    _fmt("vextract {}, {}, {}", S, V, S),
    _fmt("vinsert {}, {}, {}", V, S, S),
    _fmt("{} {}, 0({}), {}, {}", st.sampled_from(["mxu.ldw", "mxu.ldwt"]), X, S, S, S),
    _fmt("mxu.push {}, {}, {}", X, V, st.sampled_from([0, 1])),
    _fmt("mxu.mac {}, {}, {}", X, A, st.sampled_from([0, 1])),
    _fmt("mxu.pop {}, {}, {}, 0", V, X, A),
    _fmt("dma.start {}[{}], {}[{}], {}, {}", SPACE, S, SPACE, S, S, S),
    _fmt("dma.start.r {}[{}]@{}, {}[{}], {}, {}, {}", SPACE, S, S, SPACE, S, S, S, S),
    _fmt("sem.signal {}, {}", S, S),
    _fmt("sem.signal.r {}, {}, {}", S, S, S),
    _fmt("sem.wait {}, {}", S, S),
    _fmt("barrier {}", st.sampled_from(["chip", "all", "x"])),
    _fmt("mark.push 5, {}\nmark.pop", S),
)


@st.composite
def programs(draw) -> str:
    body = []
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.integers(0, 9))
        if kind == 0:   # a bounded loop on s30 around a few lines
            inner = draw(st.lists(LINES, min_size=1, max_size=3))
            body += [f"li s30, {draw(st.integers(1, 3))}", f"L{len(body)}:", *inner,
                     "subi s30, s30, 1", f"bne s30, s0, L{len(body)}"]
        elif kind == 1:  # some cores skip a line: divergent barriers and signals
            body += ["rdsr s29, gcore", f"beq s29, s0, F{len(body)}", draw(LINES), f"F{len(body)}:"]
        else:
            body.append(draw(LINES))
    return (".buffer a f32 8x128 input\n.buffer o i32 8x128 output\n.kernel main\n" + SMEM_DESCS
            + "\n".join(body) + "\nhalt\n")


def outcome(text: str, mesh: str, **options):
    """(cycles, outputs digest, figures) of a run, or the fault's text; nothing else escapes."""
    kernel = mkemu.compile_source(text, filename="p.s", hw="test", mesh=mesh, max_instructions=100_000,
                                  **options)
    try:
        run = kernel()
    except EmulatorFault as fault:
        if fault.kind not in ("deadlock", "max-cycles"):
            assert None not in (fault.chip, fault.core, fault.cycle), fault.render()
        return fault.render()
    except mkemu.MkemuError as error:
        return error.render()
    digest = hashlib.sha256()
    for key in sorted(run.outputs):
        digest.update(key.encode() + np.ascontiguousarray(run.outputs[key]).tobytes())
    figures = {k: v for k, v in run.report.figures.items() if k not in ("trace", "wall_s", "compile_s")}
    return run.report.cycles, digest.hexdigest(), repr(sorted(figures.items()))


@settings(derandomize=True, max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(text=programs(), mesh=st.sampled_from(["1", "2x1x1", "2x2x1"]), checks=st.booleans())
def test_random_programs_end_cleanly_the_same_way_with_and_without_a_trace(text, mesh, checks):
    options = {} if checks else {"checks": set()}
    first = outcome(text, mesh, **options)
    assert outcome(text, mesh, **options) == first
    traced = outcome(text, mesh, trace=True, **options)
    # A trace changes no cycle, bit or fault (figures may name the trace).
    assert traced[:2] == first[:2] if isinstance(first, tuple) else traced == first
    for schedule in ("late", "shuffle"):
        outcome(text, mesh, schedule=schedule, schedule_seed=3, **options)
