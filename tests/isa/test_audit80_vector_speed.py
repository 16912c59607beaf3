"""Vector-unit speed work (helper-80): what the faster forms must keep exactly.

The issue loop's elementwise rows now have a second loop for a destination that is
also the first source (LLVM vectorises a loop whose destination row may overlap a
source row only when the two are spelled alike), integer and mask rows whose operands
commute also serve `vd == vb` with it, and the helpers of isa/semantics.py lost the
early returns that stopped their loops vectorising (bf16 rounding, f32 max/min and
conversions, the transcendentals, reductions, permutes, the matrix unit's LHS staging,
result popping and weight loading). Pinned here:

- every row that writes a vector register from vector registers gives the same bits
  whichever of its registers coincide (vd == va, vd == vb, all three) as with
  distinct ones, on tiles full of NaN payloads (quiet and signalling, both signs),
  signed zeros, subnormals, infinities, bf16 rounding ties and integer edges; the
  mask rows likewise;
- the same program gives the same bits with the loop compiled and run as plain
  Python (NUMBA_DISABLE_JIT=1, the debugging mode);
- the rewritten element helpers equal the old ones bit for bit (NaN payloads too):
  the old ones are kept below as plain-Python models;
- f32 sum reductions keep the first operand's NaN where two NaNs meet, in every pass
  (compiled one element at a time they did so only where LLVM happened to order the
  operands that way; NaN payloads are not part of the numeric contract);
- the weight loaders (transposed, MXFP4) equal a numpy model.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numba
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mkemu.emulator.config import RunConfig
from mkemu.emulator.machine import Machine
from mkemu.emulator.topology import Mesh
from mkemu.isa import numerics as nx
from mkemu.isa import semantics as sem
from mkemu.isa.asm import assemble
from mkemu.isa.encoding import REG_M, REG_V, UIMM8
from mkemu.isa.hardware import load_profile
from mkemu.isa.table import TABLE

TILE_BYTES = 4096
OUT = 1 << 20                     # VMEM byte address of the results
INPUTS = ("v0", "v1")
# Every kind of float32 bit pattern whose handling could tell two implementations apart.
SPECIAL = np.array([
    0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF,
    0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FC01234,
    0xFFC04321, 0x7FBFFFFF, 0x3F800000, 0xBF800000, 0x3F808000, 0x3F818000, 0x3F808001,
    0xBF808000, 0x7F7F8000, 0x00018000, 0x4F000000, 0xCF000000, 0x4EFFFFFF, 0x42B17218,
    0xC2CFF1B5, 0x0000001F], np.uint32)     # 30: every pair fits in a tile, 124 lanes to spare
IMMEDIATE = {"idx": 3, "amount": 5, "block": 2}    # (vbcast.lane: lane 77)


def special_tiles(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two tiles (raw bits): every pair of SPECIAL values meets somewhere, the rest is a
    seeded mix of specials, normal floats, small integers and random bits."""
    rng = np.random.default_rng(seed)
    n = SPECIAL.size
    a = np.empty(1024, np.uint32)
    b = np.empty(1024, np.uint32)
    a[:n * n] = np.repeat(SPECIAL, n)
    b[:n * n] = np.tile(SPECIAL, n)
    rest = 1024 - n * n
    for t in (a, b):
        kind = rng.integers(0, 4, rest)
        mix = rng.integers(0, 2**32, rest, dtype=np.uint64).astype(np.uint32)
        mix[kind == 1] = rng.choice(SPECIAL, (kind == 1).sum())
        mix[kind == 2] = rng.normal(0, 3, (kind == 2).sum()).astype(np.float32).view(np.uint32)
        mix[kind == 3] = rng.integers(-40, 40, (kind == 3).sum()).astype(np.int32).view(np.uint32)
        t[n * n:] = mix
    if seed:
        order = rng.permutation(1024)
        a, b = a[order], b[rng.permutation(1024)]
    return a, b


def _operand_sets():
    """The rows that write a vector register from vector registers (and immediates,
    and a mask read), each with its read vector operands."""
    rows = []
    for ins in TABLE.values():
        if not ins.vector_side or ins.memory or ins.reads:
            continue
        vw = [op.name for op in ins.operands if op.kind is REG_V and op.access == "w"]
        vr = [op.name for op in ins.operands if op.kind is REG_V and op.access == "r"]
        others = [op for op in ins.operands if op.kind not in (REG_V,)]
        if vw != ["vd"] or not vr or any(op.kind not in (UIMM8, REG_M) for op in others):
            continue
        rows.append((ins, vr))
    return rows


ROWS_V = _operand_sets()


def _line(ins, **regs) -> str:
    text = dict(regs)
    for op in ins.operands:
        if op.kind is UIMM8:
            text[op.name] = "77" if ins.mnemonic == "vbcast.lane" else str(IMMEDIATE[op.name])
        elif op.kind is REG_M:
            text[op.name] = "m1"
    return f"    {ins.mnemonic} " + ins.syntax.format(**text)


def aliasing_program() -> tuple[str, list[tuple[str, str]]]:
    """One kernel running every row of ROWS_V in each form: its results (and the
    matching distinct-register results) stored to VMEM from OUT on, one tile each."""
    body, slots = [], []

    def store(reg, what):
        body.append(f"    vst.w {reg}, {OUT + len(slots) * TILE_BYTES}(s0), s3, m0")
        slots.append(what)

    for ins, reads in ROWS_V:
        m = ins.mnemonic
        regs = {"vd": "v10", "va": "v0", "vb": "v1"}
        body.append(_line(ins, **regs))
        store("v10", f"{m} distinct")
        body += ["    vmov v11, v0", _line(ins, **dict(regs, vd="v11", va="v11"))]
        store("v11", f"{m} vd=va")
        if "vb" in reads:
            body += ["    vmov v12, v1", _line(ins, **dict(regs, vd="v12", vb="v12"))]
            store("v12", f"{m} vd=vb")
            body.append(_line(ins, **dict(regs, vd="v14", va="v0", vb="v0")))
            store("v14", f"{m} va=vb")
            body += ["    vmov v13, v0", _line(ins, **dict(regs, vd="v13", va="v13", vb="v13"))]
            store("v13", f"{m} vd=va=vb")
    # The mask rows, on m1 = v0 < v1 and m2 = v1 <= v0 (m3 set to the one it stands
    # for); each result exported through vsel (distinct registers) as 0/1 words.
    body += ["    vli.i32 v20, 1", "    vli.i32 v21, 0", "    vcmple.f32 m2, v1, v0"]
    setup = {"m1": "    vcmplt.f32 m3, v0, v1", "m2": "    vcmple.f32 m3, v1, v0"}
    for name in ("mand", "mor", "mnot"):
        forms = [("distinct", "m5", "m1", "m2", None), ("md=ma", "m3", "m3", "m2", "m1")]
        if name != "mnot":
            forms += [("md=mb", "m3", "m1", "m3", "m2"), ("ma=mb", "m5", "m1", "m1", None),
                      ("md=ma=mb", "m3", "m3", "m3", "m1")]
        for form, md, ma, mb, m3 in forms:
            if m3:
                body.append(setup[m3])
            body.append(f"    {name} {md}, {ma}" + (f", {mb}" if name != "mnot" else ""))
            body.append(f"    vsel v22, {md}, v20, v21")
            store("v22", f"{name} {form}")
    source = f"""
.buffer inp i32 2x1024 input
.kernel main
    .smem 0 {2 * TILE_BYTES} 1 0 0 1 0 0
    rdsr s31, core
    bne s31, s0, end
    li s1, @inp
    dma.start vmem[s0], hbm[s1], s0, s0
    li s3, {2 * TILE_BYTES}
    sem.wait s0, s3
    li s3, 512
    vld.w v0, 0(s0), s3, m0
    vld.w v1, {TILE_BYTES}(s0), s3, m0
    vcmplt.f32 m1, v0, v1
""" + "\n".join(body) + "\nend:\n    halt\n"
    return source, slots


def run_program(source: str, a: np.ndarray, b: np.ndarray, nslots: int) -> np.ndarray:
    machine = Machine(load_profile("test"), Mesh((1, 1, 1)), RunConfig())
    machine.load(assemble(source, "audit80.s"))
    machine.write_buffer(0, "inp", np.stack([a, b]).view(np.int32))
    machine.run()
    return np.asarray(machine.cores[0].vmem[OUT:OUT + nslots * TILE_BYTES]).view(np.uint32).reshape(nslots, 1024).copy()


def _check_forms(out: np.ndarray, slots: list[str]) -> None:
    results = dict(zip(slots, out))
    for what, bits in results.items():
        name, form = what.split(" ")
        if form in ("vd=va", "vd=vb", "md=ma", "md=mb"):
            base = results[f"{name} distinct"]
        elif form in ("vd=va=vb", "md=ma=mb"):
            base = results[f"{name} {'va=vb' if form == 'vd=va=vb' else 'ma=mb'}"]
        else:
            continue
        bad = np.flatnonzero(bits != base)
        assert bad.size == 0, (what, [(int(i), hex(int(base[i])), hex(int(bits[i]))) for i in bad[:4]])


SOURCE, SLOTS = aliasing_program()


def test_every_register_to_register_row_is_exercised():
    names = {ins.mnemonic for ins, _ in ROWS_V}
    expected = {"vadd.f32", "vmax.f32", "vsra.i32", "vshr.i32", "vmin.i32", "vabs.f32", "vmov", "vsel",
                "vcvt.f32.i32", "vcvt.i32.f32", "vround.bf16", "vpack.bf16", "vunpack.bf16",
                "vredsum.lane.f32", "vredmin.sub.i32", "vbcast.lane", "vbcast.sub", "vrot.lane",
                "vrot.sub", "vcol", "vexp.f32", "vsilu.f32", "vtanh.f32", "vlog2.f32"}
    assert expected <= names, expected - names
    assert all(f"{name} vd=va" in SLOTS for name in names)
    assert {"mand md=mb", "mor md=ma=mb", "mnot md=ma"} <= set(SLOTS)


def test_coinciding_registers_give_the_same_bits_on_special_values():
    a, b = special_tiles(0)
    _check_forms(run_program(SOURCE, a, b, len(SLOTS)), SLOTS)


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 2**32 - 1))
def test_coinciding_registers_give_the_same_bits_on_mixed_tiles(seed):
    a, b = special_tiles(seed)
    _check_forms(run_program(SOURCE, a, b, len(SLOTS)), SLOTS)


def test_results_match_the_numeric_contract_on_special_values():
    """The distinct forms against isa/numerics.py (NaN for NaN: payloads are not
    contract), so that the forms above are compared with something right."""
    a, b = special_tiles(0)
    out = dict(zip(SLOTS, run_program(SOURCE, a, b, len(SLOTS))))
    fa, fb = a.view(np.float32), b.view(np.float32)
    with np.errstate(all="ignore"):
        expected = {
            "vadd.f32": fa + fb, "vsub.f32": fa - fb, "vmul.f32": fa * fb, "vdiv.f32": fa / fb,
            "vmax.f32": nx.f32_max(fa, fb), "vmin.f32": nx.f32_min(fa, fb),
            "vround.bf16": nx.bf16_round(fa), "vcvt.i32.f32": nx.f32_to_i32(fa).view(np.float32),
            "vexp.f32": nx.exp(fa), "vlog.f32": nx.log(fa), "vtanh.f32": nx.tanh(fa), "vsilu.f32": nx.silu(fa),
            "vsigmoid.f32": nx.sigmoid(fa), "vlog2.f32": nx.log2(fa), "vexp2.f32": nx.exp2(fa),
        }
    for name, want in expected.items():
        got = out[f"{name} distinct"].view(np.float32)
        want = np.asarray(want, np.float32)
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), (name, np.flatnonzero(~same)[:4])


def test_the_uncompiled_loop_gives_the_same_bits(tmp_path):
    a, b = special_tiles(0)
    compiled = run_program(SOURCE, a, b, len(SLOTS))
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    runner = textwrap.dedent(f"""
        import sys, numpy as np
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import test_audit80_vector_speed as t
        out = t.run_program(t.SOURCE, np.load({str(tmp_path / 'a.npy')!r}), np.load({str(tmp_path / 'b.npy')!r}),
                            len(t.SLOTS))
        np.save({str(tmp_path / 'out.npy')!r}, out)
    """)
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", XDG_CACHE_HOME=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", runner], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    plain = np.load(tmp_path / "out.npy")
    bad = []
    for k, what in enumerate(SLOTS):
        differ = plain[k] != compiled[k]
        if what.split()[0] in ("vadd.f32", "vmul.f32"):
            # Of two NaNs, numpy's scalar + and * give the second operand's, the compiled
            # loop the first's (so it was before these changes too): NaN for NaN there.
            differ &= ~(np.isnan(plain[k].view(np.float32)) & np.isnan(compiled[k].view(np.float32)))
        if differ.any():
            bad.append((what, int(np.flatnonzero(differ)[0])))
    assert not bad, bad


# --- the element helpers against the forms they replaced -----------------------------
# The old helpers, as they were (plain Python, run on numpy scalars): the new ones,
# compiled as the loop compiles them, must give exactly their bits.

def old_f32_max(a, b):
    if a != a:
        return a
    if b != b:
        return b
    if a > b or (a == b and math.copysign(1.0, a) > 0):
        return a
    return b


def old_f32_min(a, b):
    if a != a:
        return a
    if b != b:
        return b
    if a < b or (a == b and math.copysign(1.0, a) < 0):
        return a
    return b


def old_bf16_round_bits(bits):
    bits = int(bits)
    if (bits & 0x7FFFFFFF) > 0x7F800000:
        return ((bits >> 16) & 0x8000 | 0x7FC0) << 16
    return ((((bits >> 16) & 1) + 0x7FFF + bits) & 0xFFFF0000) & 0xFFFFFFFF


def old_f32_to_i32(x):
    x64 = float(x)
    if x64 != x64:
        return 0
    return int(min(max(x64, -2147483648.0), 2147483647.0))


@numba.njit(error_model="numpy")
def _new_helpers(a, b):
    n = a.size
    mx, mn = np.empty(n, np.float32), np.empty(n, np.float32)
    rnd, cvt = np.empty(n, np.uint32), np.empty(n, np.int32)
    for i in range(n):
        mx[i] = sem.f32_max(a[i], b[i])
        mn[i] = sem.f32_min(a[i], b[i])
        rnd[i] = sem.bf16_round_bits(a.view(np.uint32)[i])
        cvt[i] = sem.f32_to_i32(a[i])
    return mx, mn, rnd, cvt


def _check_helpers(a_bits: np.ndarray, b_bits: np.ndarray) -> None:
    a, b = a_bits.view(np.float32), b_bits.view(np.float32)
    mx, mn, rnd, cvt = _new_helpers(a, b)
    for i in range(a.size):
        x, y = a[i], b[i]
        assert mx.view(np.uint32)[i] == np.float32(old_f32_max(x, y)).view(np.uint32), (hex(a_bits[i]), hex(b_bits[i]))
        assert mn.view(np.uint32)[i] == np.float32(old_f32_min(x, y)).view(np.uint32), (hex(a_bits[i]), hex(b_bits[i]))
        assert rnd[i] == old_bf16_round_bits(a_bits[i]), hex(a_bits[i])
        assert cvt[i] == old_f32_to_i32(x), hex(a_bits[i])


def test_element_helpers_equal_the_old_ones_on_every_pair_of_special_values():
    a, b = special_tiles(0)
    _check_helpers(a[:SPECIAL.size ** 2], b[:SPECIAL.size ** 2])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)), min_size=1, max_size=64))
def test_element_helpers_equal_the_old_ones_on_any_bits(pairs):
    bits = np.array(pairs, np.uint32)
    # (also each value against itself with the sign flipped: +-0, equal magnitudes)
    _check_helpers(np.concatenate([bits[:, 0], bits[:, 0]]), np.concatenate([bits[:, 1], bits[:, 0] ^ 0x80000000]))


def test_scale2_builds_every_power_of_two_exactly():
    @numba.njit(error_model="numpy")
    def scale(m, ks):
        out = np.empty(ks.size)
        for i in range(ks.size):
            out[i] = sem._scale2(m, ks[i])
        return out
    ks = np.arange(-1100, 300)
    for m in (1.0, 0.7071, 1.4142135):
        want = np.array([0.0 if k < -1021 else math.inf if k > 200 else math.ldexp(m, int(k)) for k in ks])
        assert np.array_equal(scale(m, ks), want)
        assert np.array_equal(np.array([sem._scale2(m, int(k)) for k in ks]), want)   # uncompiled


def test_log_m_splits_like_frexp():
    @numba.njit(error_model="numpy")
    def split(x):
        e, lm = np.empty(x.size), np.empty(x.size)
        for i in range(x.size):
            e[i], lm[i] = sem._log_m(x[i])
        return e, lm
    rng = np.random.default_rng(3)
    special = np.abs(special_tiles(0)[0].view(np.float32))
    x = np.concatenate([special[np.isfinite(special)].astype(np.float64),
                        np.abs(rng.normal(0, 1, 1000) * 10.0 ** rng.integers(-40, 38, 1000))])
    x = x[x > 0]
    e, lm = split(x)
    for k in range(x.size):
        m, ee = math.frexp(x[k])
        if m < math.sqrt(0.5):
            m, ee = m * 2.0, ee - 1
        assert e[k] == ee, x[k]
        f = m - 1.0
        s = f / (2.0 + f)
        acc = sem._ATANH[11]
        for i in range(10, -1, -1):
            acc = acc * (s * s) + sem._ATANH[i]
        assert lm[k] == 2.0 * s * acc, x[k]


# --- reductions: the first operand's NaN ---------------------------------------------

def _tree_model(x: np.ndarray, axis: int) -> np.ndarray:
    """The contract's halving order; of two NaNs the first one's (quieted)."""
    rows = x.reshape(8, 128).view(np.float32)
    lines = [rows[r] for r in range(8)] if axis == 1 else [rows[:, l] for l in range(128)]
    out = []
    for line in lines:
        t = [np.float32(v) for v in line]
        n = len(t)
        while n > 1:
            n //= 2
            for i in range(n):
                a, b = t[i], t[i + n]
                with np.errstate(all="ignore"):
                    t[i] = a + a if a != a else a + b
        out.append(t[0])
    return np.array(out, np.float32).view(np.uint32)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([0, 1]))
def test_f32_sums_keep_the_first_nan_in_every_pass(seed, axis):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, 1024).astype(np.float32).view(np.uint32)
    spots = rng.choice(1024, int(rng.integers(1, 400)), replace=False)
    x[spots] = rng.integers(0, 1 << 22, spots.size).astype(np.uint32) | np.uint32(0x7F800001) \
        | (rng.integers(0, 2, spots.size).astype(np.uint32) << np.uint32(31))
    V = np.zeros((2, 1024), np.uint32)
    V[0] = x
    VF = V.view(np.float32)
    sem.reduce_f32(VF, 1, 0, axis, 0)
    got = V[1].reshape(8, 128)
    got = got[:, 0] if axis == 1 else got[0]
    assert np.array_equal(got, _tree_model(x, axis))
    assert np.all(V[1].reshape(8, 128) == (got[:, None] if axis == 1 else got[None, :]))
    sem.reduce_f32(VF, 0, 0, axis, 0)          # in place: the same
    assert np.array_equal(V[0], V[1])


# --- weight loading ------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(st.integers(1, 128), st.sampled_from([128, 256]), st.integers(0, 40), st.sampled_from([-1, 1]),
       st.booleans(), st.integers(0, 2**32 - 1))
def test_weight_loads_match_a_numpy_model(rows, cols, pad, sign, transposed, seed):
    d = 256
    rng = np.random.default_rng(seed)
    vmem = rng.integers(0, 256, 1 << 18, dtype=np.uint8)
    step = sign * (cols * 2 + 2 * pad)
    addr = 2 * int(rng.integers(0, 1000)) + (0 if sign > 0 else (rows - 1) * -step)
    W = rng.integers(0, 2**16, (2, d, d), dtype=np.uint64).astype(np.uint16)
    want = W.copy()
    MXR = np.zeros(4, np.int64)
    E = np.zeros(5, np.int64)
    tile = np.stack([vmem.view(np.uint16)[(addr + k * step) // 2:(addr + k * step) // 2 + cols] for k in range(rows)])
    if transposed:
        want[1, :cols, :rows] = tile.T
        want[1, :cols, rows:] = 0
    else:
        want[1, :rows, :cols] = tile
        want[1, :rows, cols:] = 0
    assert sem.load_weights(vmem, vmem.view(np.uint16), W, MXR, 1, addr, step, rows, cols, transposed, E) == 0
    assert np.array_equal(W, want)
    assert list(MXR) == [0, cols if transposed else rows, 0, rows if transposed else cols]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 100), st.sampled_from([128, 256]), st.integers(0, 2**32 - 1))
def test_mxfp4_weight_loads_match_the_contract(rows, cols, seed):
    d = 256
    rng = np.random.default_rng(seed)
    vmem = np.zeros(1 << 18, np.uint8)
    step = cols // 2 + 2 * int(rng.integers(0, 20))
    codes = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    groups = (rows + 31) // 32
    scales = rng.integers(100, 150, (groups, cols), dtype=np.uint8)
    scales[rng.random((groups, cols)) < 0.05] = 255
    addr, sc = 64, 100_000
    for k in range(rows):
        vmem[addr + k * step:addr + k * step + cols // 2] = codes[k]
    for g in range(groups):
        vmem[sc + g * 2 * step:sc + g * 2 * step + cols] = scales[g]
    W = np.full((2, d, d), 0x1234, np.uint16)
    MXR = np.zeros(4, np.int64)
    E = np.zeros(5, np.int64)
    assert sem.load_weights_mx(vmem, W, MXR, 0, addr, step, sc, rows, cols, E) == 0
    want = nx.mxfp4_decode(codes, scales)
    got = W[0, :rows, :cols].astype(np.uint32) << 16
    assert np.array_equal(got, want.view(np.uint32))
    assert not W[0, :rows, cols:].any() and (W[1] == 0x1234).all()
    assert list(MXR) == [rows, 0, cols, 0]


def test_mxfp4_bits_are_those_of_the_value():
    for scale in (0, 1, 100, 126, 127, 128, 200, 254, 255):
        for code in range(16):
            with np.errstate(over="ignore"):     # (2^128 and above: inf)
                value = np.float32(sem.E2M1_VALUES[code] * 2.0 ** (scale - 127))
                bits = int(sem.mxfp4_bits(code, scale))
            assert bits == (0x7FC00000 if scale == 255 else int(value.view(np.uint32))), (code, scale)


# --- the exec clauses ------------------------------------------------------------------

def test_inplace_versions_spell_the_destination_through_its_own_view():
    """A version for vd == va reads the destination where the source was, through the
    destination's view (two views of V are two arrays to LLVM), and is chosen exactly
    when the registers coincide."""
    cvt = TABLE["vcvt.f32.i32"].exec
    assert "if vd == va:" in cvt and "np.float32(VF[vd, i]).view(np.int32)" in cvt
    add = TABLE["vadd.f32"].exec
    assert add.splitlines()[0] == "if vd == va:" and "VF[vd, i] + VF[vb, i]" in add
    assert "vd == vb" not in add        # float32: the operands may not trade places
    iadd = TABLE["vadd.i32"].exec
    assert "if vd == va or vd == vb:" in iadd and "VI[vd, i] + VI[vb_other, i]" in iadd
    assert "vd == vb" not in TABLE["vsub.i32"].exec
    assert TABLE["vmov"].exec.startswith("if vd != va:")
    assert "for i in range(TILE)" in TABLE["vcmplt.f32"].exec and "if md == " not in TABLE["vcmplt.f32"].exec


def test_the_uncompiled_element_helpers_run_on_numpy_scalars():
    """NUMBA_DISABLE_JIT runs the helpers as plain Python on numpy scalars: the new
    forms (views of scalars, selects) must work there and give the same bits."""
    a, b = special_tiles(0)
    n = SPECIAL.size ** 2
    fa, fb = a.view(np.float32), b.view(np.float32)
    mx, mn, rnd, cvt = _new_helpers(fa[:n], fb[:n])
    with np.errstate(all="ignore"):
        for i in range(0, n, 7):
            assert np.float32(sem.f32_max(fa[i], fb[i])).view(np.uint32) == mx.view(np.uint32)[i]
            assert np.float32(sem.f32_min(fa[i], fb[i])).view(np.uint32) == mn.view(np.uint32)[i]
            assert int(sem.bf16_round_bits(a[i])) == int(rnd[i])
            assert int(sem.f32_to_i32(fa[i])) == int(cvt[i])


def test_bench_reports_every_vector_row(tmp_path):
    """bench/vector_ops.py iterates the table: every vector-side row has a bench form."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
    try:
        import vector_ops
    finally:
        sys.path.pop(0)
    for ins in vector_ops.rows():
        assert vector_ops.operand_text(ins, "distinct") is not None, ins.mnemonic
    assert json.dumps(vector_ops.FORMS)
