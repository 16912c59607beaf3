"""Every instruction's semantics, run through the emulator and checked against numpy.

Each test names the mnemonics it exercises with `@covers`; the last test checks
that together they are every row of the instruction table.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mkemu.isa import numerics as nx
from mkemu.isa.encoding import SPECIAL_REGS
from mkemu.isa.table import TABLE

COVERED: set[str] = set()
I32_MIN, I32_MAX = -(2**31), 2**31 - 1


def covers(*mnemonics):
    unknown = set(mnemonics) - set(TABLE)
    assert not unknown, unknown
    COVERED.update(mnemonics)
    return lambda fn: fn


def same_bits(expected, actual) -> bool:
    """Bit-equal float32 arrays; any NaN matches any NaN (payloads are not contract)."""
    e = np.asarray(expected, np.float32)
    a = np.asarray(actual, np.float32)
    return bool(np.all((e.view(np.uint32) == a.view(np.uint32)) | (np.isnan(e) & np.isnan(a))))


def wrap(x) -> int:
    return int(nx.i32_wrap(np.int64(x)))


def f32_tile(seed: int, scale: float = 3.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((8, 128)) * scale).astype(np.float32)
    x[0, :12] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-40, -3e38, 3e38, 0.5, 2.0]
    return x


def i32_tile(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.integers(I32_MIN, I32_MAX, (8, 128), dtype=np.int64, endpoint=True).astype(np.int32)
    x[0, :8] = [0, 1, -1, I32_MIN, I32_MAX, 31, 32, 16777217]
    x[1] = rng.integers(-40, 40, 128)   # small values: shift amounts, near-equal compares
    return x


def tile_of(ty: str, seed: int) -> np.ndarray:
    return {"f32": f32_tile, "i32": i32_tile, "u32": lambda s: i32_tile(s).view(np.uint32)}[ty](seed)


# --- scalar -------------------------------------------------------------------

SCALAR_PAIRS = [(7, 3), (-7, 3), (7, -3), (-7, -3), (0, 5), (I32_MAX, 1), (I32_MIN, -1),
                (I32_MIN, 1), (123456789, 1000), (-1, 31), (1, 32), (5, -1), (3, 3), (65537, 65537)]


def _trunc_div(a, b):
    return int(nx.i32_div(np.int64(a), np.int64(b)))


SCALAR_REF = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "and": lambda a, b: a & b,
    "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
    "shl": lambda a, b: a << (b & 31), "shr": lambda a, b: (a & 0xFFFFFFFF) >> (b & 31),
    "sra": lambda a, b: a >> (b & 31), "slt": lambda a, b: int(a < b), "sle": lambda a, b: int(a <= b),
    "seq": lambda a, b: int(a == b), "sne": lambda a, b: int(a != b), "min": min, "max": max,
    "mul": lambda a, b: a * b, "div": _trunc_div,
    "rem": lambda a, b: int(nx.i32_rem(np.int64(a), np.int64(b))),
}


@covers("li", *SCALAR_REF, *(m + "i" for m in SCALAR_REF))
@pytest.mark.parametrize("name", sorted(SCALAR_REF))
def test_scalar_alu_register_and_immediate_forms(emu, name):
    body = []
    for i, (a, b) in enumerate(SCALAR_PAIRS):
        body += [f"li s1, {a}", f"li s2, {b}", f"{name} s3, s1, s2", f"sts s3, {1024 + 8 * i}(s0)",
                 f"{name}i s4, s1, {b}", f"sts s4, {1028 + 8 * i}(s0)"]
    body.append(f"{name} s0, s1, s2")        # writes to s0 are dropped
    ran = emu.run_vec("\n".join(body))
    got = ran.core.smem[1024:1024 + 8 * len(SCALAR_PAIRS)].view(np.int32).reshape(-1, 2)
    for (a, b), (reg, imm) in zip(SCALAR_PAIRS, got):
        expected = wrap(SCALAR_REF[name](a, b))
        assert (int(reg), int(imm)) == (expected, expected), (name, a, b)
    assert ran.core.s[0] == 0


def test_div_and_rem_truncate_toward_zero(emu):
    ran = emu.run_vec("li s1, -7\nli s2, 2\ndiv s3, s1, s2\nrem s4, s1, s2\n"
                      "divi s5, s1, -2\nremi s6, s1, -2\nli s1, -2147483648\nli s2, -1\n"
                      "div s7, s1, s2\nrem s8, s1, s2")
    assert ran.core.s[3:9] == [-3, -1, 3, -1, I32_MIN, 0]


@covers("beq", "bne", "blt", "bge")
@pytest.mark.parametrize("name, op", [("beq", int.__eq__), ("bne", int.__ne__),
                                      ("blt", int.__lt__), ("bge", int.__ge__)])
def test_branches_taken_and_not_taken(emu, name, op):
    pairs = [(1, 1), (1, 2), (2, 1), (-5, 3), (3, -5), (I32_MIN, I32_MAX)]
    body = []
    for i, (a, b) in enumerate(pairs):
        body += [f"li s1, {a}", f"li s2, {b}", "li s3, 0", f"{name} s1, s2, taken{i}",
                 "li s3, 1", f"taken{i}:", f"sts s3, {1024 + 4 * i}(s0)"]
    ran = emu.run_vec("\n".join(body))
    got = ran.core.smem[1024:1024 + 4 * len(pairs)].view(np.int32)
    assert [int(g) == 0 for g in got] == [op(a, b) for a, b in pairs]


@covers("jmp", "nop")
def test_jump_skips_and_loop_counts(emu):
    ran = emu.run_vec("""
        li s5, 0
        li s1, 0
        li s2, 10
    loop:
        add s5, s5, s1
        addi s1, s1, 1
        nop
        blt s1, s2, loop
        jmp over
        li s5, -1
    over:
        nop
    """)
    assert ran.core.s[5] == sum(range(10))
    assert ran.core.s[1] == 10


@covers("lds", "sts")
def test_smem_load_store_with_offsets(emu):
    ran = emu.run_vec("""
        li s1, 2048
        li s2, -123456
        sts s2, -4(s1)
        sts s1, 8(s1)
        lds s3, 2044(s0)
        lds s4, 0(s1)
        lds s5, 2056(s0)
    """, smem="2048 77")
    assert ran.core.s[3:6] == [-123456, 77, 2048]


@covers("add.d", "addi.d", "muli.d", "shli.d", "lui.d", "lds.d", "sts.d")
def test_wide_address_arithmetic_keeps_64_bits(emu):
    # An HBM address past 4 GiB: 3 << 32 plus 5 * 1_000_000_000 + 12, built, stored,
    # reloaded and offset; the int32 add of the same registers wraps.
    ran = emu.run_vec("""
        lui.d s1, 3
        li s2, 1000000000
        muli.d s3, s2, 5
        add.d s4, s1, s3
        addi.d s4, s4, 12
        sts.d s4, 1024(s0)
        lds.d s5, 1024(s0)
        shli.d s6, s2, 33
        addi.d s7, s5, -13
        add s8, s1, s3
        lui.d s9, -1
        lds s10, 1028(s0)
        lui.d s0, 9
    """)
    big = (3 << 32) + 5 * 1_000_000_000 + 12
    assert ran.core.s[3:8] == [5_000_000_000, big, big, 1_000_000_000 << 33, big - 13]
    assert ran.core.s[8] == wrap(5_000_000_000)
    assert ran.core.s[9] == -(1 << 32)
    assert ran.core.s[10] == big >> 32 and ran.core.s[0] == 0
    assert int(ran.core.smem[1024:1032].view(np.int64)[0]) == big


def test_int32_operations_read_all_64_bits_and_wrap_only_the_result(emu):
    # docs/isa.md: a register holding more than int32 (from a `.d` operation) is compared,
    # divided and shifted right as the 64-bit value; branches compare all 64 bits.
    ran = emu.run_vec("""
        lui.d s1, 1
        srai s2, s1, 1
        slti s3, s1, 1
        li s9, 2
        div s4, s1, s9
        addi s5, s1, 7
        li s6, 1
        blt s1, s6, skip
        li s7, 1
    skip:
        shri s8, s1, 1
    """)
    assert ran.core.s[2:9] == [I32_MIN, 0, I32_MIN, 7, 1, 1, 0]


def test_tile_bounds_cover_only_the_elements_the_mask_selects(emu):
    # docs/isa.md: every element the mask selects inside VMEM; masked-off rows and lanes
    # are not checked (a rectangle from mrows, or any mask from a compare).
    end = emu.profile().vmem_bytes
    ran = emu.run_vec(f"""
        li s1, 1
        li s2, 128
        mrows m1, s1, s2
        li s3, {end}
        li s4, 512
        vli.f32 v2, 2.5
        vst.w v2, -512(s3), s4, m1
        vld.w v3, -512(s3), s4, m1
        viota.sub v4
        vbcast v5, s1
        vcmplt.i32 m2, v4, v5
        vld.w v6, -512(s3), s4, m2
    """)
    for reg in (3, 6):
        tile = ran.core.vf[reg].reshape(8, 128)
        assert (tile[0] == 2.5).all() and (tile[1:] == 0).all()
    with pytest.raises(Exception, match="outside VMEM"):
        emu.run_vec(f"li s1, 2\nli s2, 128\nmrows m1, s1, s2\nli s3, {end}\nli s4, 512\n"
                    "vld.w v3, -512(s3), s4, m1")


def test_wide_smem_access_faults_past_the_end(emu):
    with pytest.raises(Exception, match="outside SMEM"):
        emu.run_vec(f"li s1, {emu.profile().smem_bytes - 4}\nlds.d s2, 0(s1)")


@covers("rdsr")
def test_rdsr_reads_identity_and_machine_size(emu):
    body = "".join(f"rdsr s{i + 1}, {name}\n" for i, name in enumerate(SPECIAL_REGS))
    ran = emu.run(emu.kernel(body, solo=False))
    for core in (0, 1):
        regs = dict(zip(SPECIAL_REGS, ran.machine.cores[core].s[1:]))
        assert regs == dict(core=core, chip=0, chip_x=0, chip_y=0, chip_z=0, mesh_x=1, mesh_y=1,
                            mesh_z=1, cores=2, chips=1, gcore=core)


# --- vector memory ----------------------------------------------------------------

def _two_tiles() -> tuple[np.ndarray, np.ndarray]:
    """Sixteen 128-word rows staged contiguously (rows of 512 bytes)."""
    a = f32_tile(1)
    b = f32_tile(2)
    return a, np.concatenate([a, b])


@covers("vld.w")
@pytest.mark.parametrize("off, stride, rows", [
    (0, 512, range(8)), (0, 1024, range(0, 16, 2)), (512 * 3, 0, [3] * 8),
    (512 * 15, -512, range(15, 7, -1)), (512 * 2, 512, range(2, 10))])
def test_vld_words_with_strides(emu, off, stride, rows):
    a, rows16 = _two_tiles()
    ran = emu.run_vec(f"li s2, {emu.STAGE_VMEM}\nli s3, {stride}\nvld.w v5, {off}(s2), s3, m0",
                      vregs=[a, rows16[8:]])
    assert same_bits(rows16[list(rows)], ran.core.vf[5])


@covers("vld.bf16", "mrows")
def test_vld_bf16_widens_exactly_and_masks_load_zero(emu):
    values = nx.bf16_round(np.concatenate([f32_tile(3), f32_tile(4)]))    # 16 x 128
    packed = nx.f32_to_bf16_bits(values).view(np.int32).reshape(8, 128)    # 16 rows of 256 bytes
    ran = emu.run_vec(f"""
        li s2, {emu.STAGE_VMEM}
        li s3, 256
        vld.bf16 v5, 0(s2), s3, m0
        li s3, 512
        vld.bf16 v6, 256(s2), s3, m0
        li s4, 3
        li s5, 100
        mrows m2, s4, s5
        li s3, 256
        vld.bf16 v7, 0(s2), s3, m2
    """, vregs=[packed])
    assert same_bits(values[:8], ran.core.vf[5])
    assert same_bits(values[1::2], ran.core.vf[6])
    mask = (np.arange(8)[:, None] < 3) & (np.arange(128)[None, :] < 100)
    assert np.array_equal(ran.core.m[2], mask)
    assert same_bits(np.where(mask, values[:8], 0), ran.core.vf[7])


@covers("vst.w")
def test_vst_words_strided_and_masked(emu):
    a, b = f32_tile(5), f32_tile(6)
    ran = emu.run_vec(f"""
        li s2, 4096
        li s3, 1024
        vst.w v0, 0(s2), s3, m0
        li s4, 5
        li s5, 17
        mrows m1, s4, s5
        li s6, {emu.STAGE_VMEM + emu.TILE_BYTES}
        li s3, 512
        vst.w v0, 0(s6), s3, m1
    """, vregs=[a, b])
    strided = ran.vmem(4096, 16 * 128).reshape(16, 128)
    assert same_bits(a, strided[0::2])
    assert not strided[1::2].any()
    mask = (np.arange(8)[:, None] < 5) & (np.arange(128)[None, :] < 17)
    assert same_bits(np.where(mask, a, b), ran.vmem(emu.STAGE_VMEM + emu.TILE_BYTES, 1024).reshape(8, 128))


@covers("vst.bf16")
def test_vst_bf16_rounds_to_nearest_even(emu):
    a = f32_tile(7)
    a[1, :4] = np.array([0x3F808000, 0x3F818000, 0x3F80C000, 0x7F7FFFFF], np.uint32).view(np.float32)
    ran = emu.run_vec("li s2, 8192\nli s3, 256\nvst.bf16 v0, 0(s2), s3, m0", vregs=[a])
    got = ran.core.vmem[8192:8192 + 2048].view(np.uint16).reshape(8, 128)
    expected = a.astype(ml_dtypes.bfloat16).view(np.uint16)
    nan = np.isnan(a)
    assert np.array_equal(got[~nan], expected[~nan])
    assert np.all((got[nan] & 0x7FFF) > 0x7F80)
    assert list(got[1, :4]) == [0x3F80, 0x3F82, 0x3F81, 0x7F80]


# --- vector ALU -------------------------------------------------------------------

def _i64(x):
    return np.asarray(x, np.int64)


def _f32_to_i32(x):
    x64 = np.asarray(x, np.float64)
    return np.clip(np.trunc(np.where(np.isnan(x64), 0, x64)), I32_MIN, I32_MAX).astype(np.int32)


VALU_REF = {
    "vadd.f32": np.add, "vsub.f32": np.subtract, "vmul.f32": np.multiply, "vdiv.f32": np.divide,
    "vmax.f32": nx.f32_max, "vmin.f32": nx.f32_min,
    "vadd.i32": lambda a, b: nx.i32_wrap(_i64(a) + b),
    "vsub.i32": lambda a, b: nx.i32_wrap(_i64(a) - b),
    "vmul.i32": lambda a, b: nx.i32_wrap(_i64(a) * b),
    "vand.i32": np.bitwise_and, "vor.i32": np.bitwise_or, "vxor.i32": np.bitwise_xor,
    "vshl.i32": lambda a, b: nx.i32_wrap(_i64(a) << (b & 31)),
    "vshr.i32": lambda a, b: (a.view(np.uint32) >> (b & 31).astype(np.uint32)).view(np.int32),
    "vsra.i32": lambda a, b: a >> (b & 31),
    "vmax.i32": np.maximum, "vmin.i32": np.minimum,
    "vabs.f32": np.abs, "vmov": lambda a: a,
    "vcvt.f32.i32": lambda a: a.astype(np.float32),
    "vcvt.i32.f32": _f32_to_i32,
    "vround.bf16": lambda a: a.astype(ml_dtypes.bfloat16).astype(np.float32),
    "vpack.bf16": lambda a: a.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32),
    "vunpack.bf16": lambda a: (a & 0xFFFF).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float32),
    **{f"v{name}.f32": getattr(nx, fn) for name, fn in [
        ("exp", "exp"), ("log", "log"), ("exp2", "exp2"), ("log2", "log2"), ("rcp", "reciprocal"),
        ("rsqrt", "rsqrt"), ("sqrt", "sqrt"), ("sigmoid", "sigmoid"), ("tanh", "tanh"), ("silu", "silu")]},
}
VIEW = {"f32": "vf", "i32": "vi", "u32": "vu"}


@covers(*VALU_REF)
@pytest.mark.parametrize("name", sorted(VALU_REF))
def test_elementwise_ops_against_numpy(emu, name):
    instr = TABLE[name]
    *in_types, out_type = instr.types
    inputs = [tile_of(ty, 10 + i) for i, ty in enumerate(in_types)]
    if name == "vcvt.i32.f32":
        inputs[0] = np.clip(inputs[0], -3, 3) * np.float32(1e9)     # reach the saturating range
    srcs = ", ".join(f"v{i}" for i in range(len(inputs)))
    ran = emu.run_vec(f"{name} v9, {srcs}\n{name} v0, {srcs}", vregs=inputs)
    with np.errstate(all="ignore"):
        expected = np.asarray(VALU_REF[name](*inputs))
    for reg in (9, 0):     # also with the destination one of the sources
        got = getattr(ran.core, VIEW[out_type])[reg]
        if out_type == "f32":
            assert same_bits(expected, got), name
        elif name == "vpack.bf16":
            nan = np.isnan(inputs[0])
            assert np.array_equal(expected[~nan], got[~nan]) and np.all((got[nan] & 0x7FFF) > 0x7F80)
        else:
            assert np.array_equal(expected.astype(got.dtype), got), name


def test_every_elementwise_row_has_a_reference():
    assert set(VALU_REF) == {m for m, ins in TABLE.items() if ins.family == "elementwise"}


@covers("vbcast", "vli.f32", "vli.i32", "viota.lane", "viota.sub")
def test_broadcast_constants_and_iota(emu):
    ran = emu.run_vec("""
        li s1, -7
        vbcast v1, s1
        vli.f32 v2, -1.5e-3
        vli.f32 v3, f32:0x7fc00001
        vli.i32 v4, -2147483648
        viota.lane v5
        viota.sub v6
    """)
    c = ran.core
    assert np.all(c.vi[1] == -7)
    assert np.all(c.vf[2] == np.float32(-1.5e-3))
    assert np.all(c.vu[3] == 0x7FC00001)
    assert np.all(c.vi[4] == I32_MIN)
    assert np.array_equal(c.vi[5], np.broadcast_to(np.arange(128), (8, 128)))
    assert np.array_equal(c.vi[6], np.broadcast_to(np.arange(8)[:, None], (8, 128)))


CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
       "gt": np.greater, "ge": np.greater_equal}


@covers("vsel", *(f"vcmp{c}.{t}" for c in CMP for t in ("f32", "i32")))
@pytest.mark.parametrize("ty", ["f32", "i32"])
@pytest.mark.parametrize("cmp", sorted(CMP))
def test_compare_and_select(emu, cmp, ty):
    a, b = tile_of(ty, 20), tile_of(ty, 21)
    b[2] = a[2]          # some equal elements
    if ty == "f32":
        b[0, :12] = a[0, ::-1][-12:]
    ran = emu.run_vec(f"vcmp{cmp}.{ty} m3, v0, v1\nvsel v4, m3, v0, v1\nvcmp{cmp}.{ty} m0, v0, v1",
                      vregs=[a, b])
    expected = CMP[cmp](a, b)
    assert np.array_equal(ran.core.m[3], expected)
    assert np.array_equal(ran.core.vu[4], np.where(expected, a.view(np.uint32), b.view(np.uint32)))
    assert ran.core.m[0].all()       # m0 is read-only all-true


@covers("mand", "mor", "mnot")
def test_mask_logic(emu):
    ran = emu.run_vec("""
        li s1, 3
        li s2, 50
        mrows m1, s1, s2
        li s1, 6
        li s2, 20
        mrows m2, s1, s2
        mand m3, m1, m2
        mor m4, m1, m2
        mnot m5, m1
        mnot m0, m0
    """)
    sub, lane = np.arange(8)[:, None], np.arange(128)[None, :]
    m1, m2 = (sub < 3) & (lane < 50), (sub < 6) & (lane < 20)
    m = ran.core.m
    assert np.array_equal(m[3], m1 & m2) and np.array_equal(m[4], m1 | m2)
    assert np.array_equal(m[5], ~m1) and m[0].all()


# --- cross-lane -----------------------------------------------------------------

REDUCE_F32 = {"sum": nx.tree_sum_f32, "max": nx.tree_max_f32, "min": nx.tree_min_f32}
REDUCE_I32 = {"sum": lambda x, axis: nx.i32_wrap(_i64(x).sum(axis)),
              "max": lambda x, axis: x.max(axis), "min": lambda x, axis: x.min(axis)}


@covers(*(f"vred{k}.{ax}.{t}" for k in REDUCE_F32 for ax in ("lane", "sub") for t in ("f32", "i32")))
@pytest.mark.parametrize("ty", ["f32", "i32"])
@pytest.mark.parametrize("kind", ["sum", "max", "min"])
def test_reductions_in_tree_order_broadcast_back(emu, kind, ty):
    x = tile_of(ty, 30)
    if ty == "f32":
        x[0, :12] = [1e8, 1.0, -1e8, 1.0, 3.0, -0.0, 0.0, 2.5, 7.0, -7.0, 1e-3, 5.0]
        x[3, 5] = np.nan
    ran = emu.run_vec(f"vred{kind}.lane.{ty} v2, v0\nvred{kind}.sub.{ty} v3, v0", vregs=[x])
    ref = (REDUCE_F32 if ty == "f32" else REDUCE_I32)[kind]
    lane = np.broadcast_to(np.asarray(ref(x, axis=1))[:, None], (8, 128))
    sub = np.broadcast_to(np.asarray(ref(x, axis=0))[None, :], (8, 128))
    view = getattr(ran.core, VIEW[ty])
    if ty == "f32":
        assert same_bits(lane, view[2]) and same_bits(sub, view[3])
        assert np.isnan(view[2][3]).all() and not np.isnan(view[2][0]).any()
    else:
        assert np.array_equal(lane, view[2]) and np.array_equal(sub, view[3])


def test_f32_lane_sum_uses_the_tree_not_left_to_right(emu):
    x = np.zeros((8, 128), np.float32)
    x[0, 0], x[0, 1], x[0, 64] = 1e8, 1.0, -1e8      # tree: (1e8 + -1e8) + 1 = 1
    ran = emu.run_vec("vredsum.lane.f32 v2, v0", vregs=[x])
    assert ran.core.vf[2][0, 0] == 1.0


@covers("vbcast.lane", "vbcast.sub", "vrot.lane", "vrot.sub")
@pytest.mark.parametrize("amount", [0, 1, 5, 127, 200])
def test_index_broadcasts_and_rotates(emu, amount):
    x = i32_tile(40)
    lane_idx, sub_idx = amount % 128, amount % 8
    ran = emu.run_vec(f"vbcast.lane v2, v0, {lane_idx}\nvbcast.sub v3, v0, {sub_idx}\n"
                      f"vrot.lane v4, v0, {amount}\nvrot.sub v5, v0, {amount}", vregs=[x])
    v = ran.core.vi
    assert np.array_equal(v[2], np.broadcast_to(x[:, lane_idx:lane_idx + 1], (8, 128)))
    assert np.array_equal(v[3], np.broadcast_to(x[sub_idx], (8, 128)))
    lanes, subs = np.arange(128), np.arange(8)
    assert np.array_equal(v[4], x[:, (lanes - amount) % 128])
    assert np.array_equal(v[5], x[(subs - amount) % 8, :])


@covers("vcol")
@pytest.mark.parametrize("block", [0, 3, 15])
def test_vcol_turns_eight_lanes_of_sublane_zero_into_a_column(emu, block):
    x = i32_tile(42)
    ran = emu.run_vec(f"vcol v2, v0, {block}", vregs=[x])
    column = x[0, 8 * block:8 * block + 8]
    assert np.array_equal(ran.core.vi[2], np.broadcast_to(column[:, None], (8, 128)))


@covers("vextract", "vinsert")
def test_extract_and_insert_elements(emu):
    x = i32_tile(41)
    ran = emu.run_vec("""
        li s1, 0
        vextract s3, v0, s1
        li s1, 1023
        vextract s4, v0, s1
        li s1, 130
        vextract s5, v0, s1
        li s6, -99
        vinsert v0, s6, s1
        vextract s7, v0, s1
    """, vregs=[x])
    assert ran.core.s[3:6] == [int(x[0, 0]), int(x[7, 127]), int(x[1, 2])]
    expected = x.copy()
    expected[1, 2] = -99
    assert np.array_equal(ran.core.vi[0], expected) and ran.core.s[7] == -99


# --- matrix unit ------------------------------------------------------------------

@covers("mxu.ldw", "mxu.push", "mxu.mac", "mxu.pop")
@pytest.mark.parametrize("rows", [128, 43, 40, 3, 1])   # (mac takes weight rows four at a time)
def test_matrix_unit_against_the_contract(emu, rows):
    rng = np.random.default_rng(rows)
    lhs = rng.standard_normal((8, 128)).astype(np.float32)             # rounded to bf16 by push
    w = nx.bf16_round(rng.standard_normal((128, 128)).astype(np.float32))
    w_tiles = list(nx.f32_to_bf16_bits(w).view(np.int32).reshape(8, 8, 128))   # 128 rows of 256 B
    ran = emu.run_vec(f"""
        li s2, {emu.STAGE_VMEM + emu.TILE_BYTES}
        li s3, 256
        li s4, {(rows << 16) | 128}
        mxu.ldw x1, 0(s2), s3, s4
        mxu.push x1, v0, 0
        mxu.mac x1, a2, 1
        mxu.pop v10, x1, a2, 0
        mxu.mac x1, a2, 0
        mxu.pop v11, x1, a2, 0
    """, vregs=[lhs, *w_tiles])
    once = nx.mxu_matmul_numpy(np.zeros((8, 128), np.float32), lhs[:, :rows], w[:rows])
    twice = nx.mxu_matmul_numpy(once, lhs[:, :rows], w[:rows])
    assert same_bits(once, ran.core.vf[10])
    assert same_bits(twice, ran.core.vf[11])


@covers("mxu.ldw", "mxu.push", "mxu.mac", "mxu.pop")
@pytest.mark.parametrize("weights", ["finite", "inf", "nan", "inf_past_rows"])
def test_zero_lhs_rows_against_the_contract(emu, weights):
    # A batch smaller than 8 leaves LHS rows of zeros (+0.0 and -0.0 here). Times finite
    # weights they add nothing; times an inf or NaN weight they make NaN.
    rng = np.random.default_rng(len(weights))
    rows = 100
    lhs = [rng.standard_normal((8, 128)).astype(np.float32) for _ in range(2)]
    lhs[0][2:] = 0.0        # live rows 0 and 1, then live rows 0 and 2
    lhs[1][1] = 0.0
    lhs[1][3:] = 0.0
    lhs[1][0, 7] = 0.0
    for x in lhs:
        x[5, ::3] = -0.0
    w = nx.bf16_round(rng.standard_normal((128, 128)).astype(np.float32))
    if weights in ("inf", "nan"):
        w[37, 90] = np.inf if weights == "inf" else np.nan
    elif weights == "inf_past_rows":
        w[rows + 5, 3] = np.inf       # loaded memory past the tile's rows: never multiplied
    w_tiles = list(nx.f32_to_bf16_bits(w).view(np.int32).reshape(8, 8, 128))
    ran = emu.run_vec(f"""
        li s2, {emu.STAGE_VMEM + 2 * emu.TILE_BYTES}
        li s3, 256
        li s4, {(rows << 16) | 128}
        mxu.ldw x1, 0(s2), s3, s4
        mxu.push x1, v0, 0
        mxu.mac x1, a2, 1
        mxu.push x1, v1, 0
        mxu.mac x1, a2, 0
        mxu.pop v10, x1, a2, 0
    """, vregs=[*lhs, *w_tiles])
    once = nx.mxu_matmul_numpy(np.zeros((8, 128), np.float32), lhs[0][:, :rows], w[:rows])
    expected = nx.mxu_matmul_numpy(once, lhs[1][:, :rows], w[:rows])
    assert same_bits(expected, ran.core.vf[10])
    assert np.isnan(expected[3:]).any() == (weights in ("inf", "nan"))


@covers("mxu.ldw", "mxu.ldwt", "mxu.mac", "mxu.pop")
@pytest.mark.parametrize("special", ["finite", "negative", "inf", "nan", "past_rows"])
@pytest.mark.parametrize("transposed", [False, True])
def test_narrow_tile_leaves_the_columns_past_it_as_the_contract_does(emu, special, transposed):
    # A 256-wide unit: a full tile fills all 256 accumulator columns, then a narrower
    # tile accumulates into them. Past its columns the weights are +0.0, so the contract
    # adds LHS x +0.0 there: nothing for finite LHS values, NaN for inf or NaN.
    profile = emu.profile("mxu256", "[core]\nmxu_dim = 256\n")
    rng = np.random.default_rng(len(special) + transposed)
    rows, cols = (128, 72) if transposed else (200, 128)     # reduction rows, output columns
    lhs = [rng.standard_normal((8, 256)).astype(np.float32) for _ in range(2)]
    lhs[0][1::2] = -lhs[0][1::2]
    if special == "negative":
        lhs[1] = -np.abs(lhs[1])
    elif special in ("inf", "nan"):
        lhs[1][3, 17] = np.inf if special == "inf" else np.nan
    elif special == "past_rows":
        lhs[1][5, rows + 3] = np.inf        # beyond the tile's rows: never multiplied
    full = nx.bf16_round(rng.standard_normal((256, 256)).astype(np.float32))
    narrow = nx.bf16_round(rng.standard_normal((rows, cols)).astype(np.float32))
    stored = narrow.T.copy() if transposed else narrow      # ldwt: memory row j is weight column j
    lhs_at = 2 * (full.size + stored.size)
    data = np.concatenate([nx.f32_to_bf16_bits(full).reshape(-1), nx.f32_to_bf16_bits(stored).reshape(-1),
                           *(x.view(np.uint32).reshape(-1).view(np.uint16) for x in lhs)])
    words = data.view(np.int32)
    shape = (stored.shape[0] << 16) | stored.shape[1]
    source = emu.kernel(f"""
        li s1, @inp
        li s2, 0
        dma.start vmem[s2], hbm[s1], s0, s0
        li s3, {words.size * 4}
        sem.wait s0, s3
        li s3, 512
        li s4, {(256 << 16) | 256}
        mxu.ldw x0, 0(s2), s3, s4
        li s5, {lhs_at}
        li s6, 1024
        vld.w v0, 0(s5), s6, m0
        vld.w v1, 512(s5), s6, m0
        mxu.push x0, v0, 0
        mxu.push x0, v1, 1
        mxu.mac x0, a1, 1
        li s7, {2 * stored.shape[1]}
        li s4, {shape}
        {"mxu.ldwt" if transposed else "mxu.ldw"} x0, {2 * full.size}(s2), s7, s4
        vld.w v2, 8192(s5), s6, m0
        vld.w v3, 8704(s5), s6, m0
        mxu.push x0, v2, 0
        mxu.push x0, v3, 1
        mxu.mac x0, a1, 0
        mxu.pop v10, x0, a1, 0
        mxu.pop v11, x0, a1, 1
    """, buffers=f".buffer inp i32 {words.size} input\n",
        smem=f"0 {words.size * 4} 1 0 0 1 0 0")
    ran = emu.run(source, profile=profile, inputs={"inp": words})
    once = nx.mxu_matmul_numpy(np.zeros((8, 256), np.float32), lhs[0], full)
    padded = np.zeros((rows, 256), np.float32)
    padded[:, :cols] = narrow
    expected = nx.mxu_matmul_numpy(once, lhs[1][:, :rows], padded)
    got = np.concatenate([ran.core.vf[10], ran.core.vf[11]], axis=1)
    assert same_bits(expected, got)
    assert np.isnan(expected[:, cols:]).any() == (special in ("inf", "nan"))


@covers("mxu.ldwt")
@pytest.mark.parametrize("tokens", [128, 24])
def test_transposed_weight_load(emu, tokens):
    # Memory holds `tokens` rows of 128 bf16 (e.g. a key cache, one token per row);
    # the transposed load makes row j weight column j, so LHS @ W = LHS @ rows^T.
    rng = np.random.default_rng(tokens)
    lhs = rng.standard_normal((8, 128)).astype(np.float32)
    rows = nx.bf16_round(rng.standard_normal((128, 128)).astype(np.float32))
    tiles = list(nx.f32_to_bf16_bits(rows).view(np.int32).reshape(8, 8, 128))
    ran = emu.run_vec(f"""
        li s2, {emu.STAGE_VMEM + emu.TILE_BYTES}
        li s3, 256
        li s4, {(tokens << 16) | 128}
        mxu.ldwt x0, 0(s2), s3, s4
        mxu.push x0, v0, 0
        mxu.mac x0, a0, 1
        mxu.pop v10, x0, a0, 0
    """, vregs=[lhs, *tiles])
    w = np.zeros((128, 128), np.float32)
    w[:, :tokens] = rows[:tokens].T
    expected = nx.mxu_matmul_numpy(np.zeros((8, 128), np.float32), lhs, w)
    assert same_bits(expected, ran.core.vf[10])


@covers("mxu.ldw.mx")
@pytest.mark.parametrize("rows", [128, 40])
def test_mxfp4_weight_load_decodes_the_contract(emu, rows):
    rng = np.random.default_rng(rows)
    lhs = rng.standard_normal((8, 128)).astype(np.float32)
    w = (rng.standard_normal((128, 128)) * 2.0 ** rng.integers(-20, 20, (128, 1))).astype(np.float32)
    values, scales = nx.mxfp4_encode(w)                  # [128, 64] and [4, 128] bytes
    scales[0, :4] = [0, 254, 255, 127]                   # extremes: 2^-127, 2^127 (2 and more times that are inf), NaN
    tiles = list(values.view(np.int32).reshape(2, 8, 128))
    scale_tile = np.zeros(4096, np.uint8)
    scale_tile[:scales.size] = scales.reshape(-1)        # one row of 128 scales per 32 rows: pitch 128
    tiles.append(scale_tile.view(np.int32).reshape(8, 128))
    base = emu.STAGE_VMEM + emu.TILE_BYTES
    ran = emu.run_vec(f"""
        li s2, {base}
        li s3, 64
        li s4, {(rows << 16) | 128}
        li s5, {base + 2 * emu.TILE_BYTES}
        mxu.ldw.mx x1, 0(s2), s3, s4, s5
        mxu.push x1, v0, 0
        mxu.mac x1, a1, 1
        mxu.pop v10, x1, a1, 0
    """, vregs=[lhs, *tiles])
    decoded = nx.mxfp4_decode(values, scales)
    assert np.array_equal(nx.bf16_round(decoded).view(np.uint32), decoded.view(np.uint32))   # exact in bf16
    assert np.array_equal(ran.core.mx_w[1, :rows, :128], nx.f32_to_bf16_bits(decoded[:rows]))   # the tile: bf16 bits
    expected = nx.mxu_matmul_numpy(np.zeros((8, 128), np.float32), lhs[:, :rows], decoded[:rows])
    assert same_bits(expected, ran.core.vf[10])


def test_mxfp4_weight_load_out_of_vmem_faults(emu):
    with pytest.raises(Exception, match="outside VMEM"):
        emu.run_vec(f"li s2, {emu.profile().vmem_bytes - 64}\nli s3, 64\nli s4, {(32 << 16) | 128}\n"
                    "li s5, 0\nmxu.ldw.mx x0, 0(s2), s3, s4, s5")


# --- DMA, semaphores, barriers, regions ---------------------------------------------

@pytest.mark.parametrize("between", [[], ["quiet"], ["quiet", "quiet"]])
def test_a_launch_starts_with_clear_registers_and_matrix_units(emu, between):
    # `dirty` leaves a vector register, a mask and a matrix unit's weights, LHS and
    # accumulator set; `probe`, launched after it (and after kernels that write no
    # vector, mask or matrix state), must see all of them clear.
    launches = "".join(f".launch {name}\n" for name in ["dirty", *between, "probe"])
    source = f"""
.buffer out f32 3x8x128 output
{launches}
.kernel dirty
    rdsr s31, core
    bne s31, s0, d_end
    vli.f32 v5, 1.5
    li s2, 0
    li s3, 256
    li s6, 3
    li s7, 5
    mrows m2, s6, s7
    vst.bf16 v5, 0(s2), s3, m0
    li s4, {(8 << 16) | 128}
    mxu.ldw x0, 0(s2), s3, s4
    mxu.push x0, v5, 0
    mxu.mac x0, a0, 1
d_end:
    halt
.kernel quiet
    li s1, 7
    halt
.kernel probe
    .smem 0 12288 1 0 0 1 0 0
    rdsr s31, core
    bne s31, s0, p_end
    mxu.pop v6, x0, a0, 0
    li s2, 0
    li s3, 512
    vst.w v6, 0(s2), s3, m0
    vst.w v5, 4096(s2), s3, m0
    vli.f32 v8, 2.0
    vsel v7, m2, v8, v6
    vst.w v7, 8192(s2), s3, m0
    mxu.mac x0, a1, 1
p_end:
    halt
"""
    with pytest.raises(Exception, match="before any weight tile was loaded"):
        emu.run(source)     # the probe's mac: the weights are gone
    ran = emu.run(source.replace("    mxu.mac x0, a1, 1\n", "    li s1, @out\n    dma.start hbm[s1], vmem[s2], s0, s0\n"
                                 "    li s5, 12288\n    sem.wait s0, s5\n"))
    assert not ran.buffer("out").any()
    dirty_only = emu.run(source.replace(launches, ".launch dirty\n"))     # (what the probe must not see)
    assert dirty_only.core.vf[5].min() == 1.5 and dirty_only.core.mx_acc[0, 0].view(np.float32).max() == 18.0
    assert dirty_only.core.m[2].sum() == 15


@pytest.mark.parametrize("schedule", ["normal", "shuffle", "late"])
def test_a_dma_delivers_its_source_as_it_was_at_issue(emu, schedule):
    # A copies 64 KiB out of HBM buffer x; B, issued just after it, writes zeros over
    # x's first KiB and lands first. With the race check off (it reports exactly this),
    # A still delivers x as it was when A was issued.
    from mkemu.emulator.config import RunConfig

    x = np.arange(16384, dtype=np.int32) * 7 + 1
    source = emu.kernel("""
        li s1, @x
        li s2, 0
        li s3, 1
        dma.start vmem[s2], hbm[s1], s0, s0
        li s4, 200000
        li s5, 28
        dma.start hbm[s1], vmem[s4], s5, s3
        li s6, 1024
        sem.wait s3, s6
        li s6, 65536
        sem.wait s0, s6
        li s7, @y
        dma.start hbm[s7], vmem[s2], s0, s3
        sem.wait s3, s6
    """, buffers=".buffer x i32 16384 input\n.buffer y i32 16384 output\n",
        smem="0 65536 1 0 0 1 0 0\n28 1024 1 0 0 1 0 0")
    ran = emu.run(source, inputs={"x": x}, config=RunConfig(checks=("semaphores",), schedule=schedule))
    assert np.array_equal(ran.buffer("y"), x)
    assert not ran.buffer("x")[:256].any() and np.array_equal(ran.buffer("x")[256:], x[256:])
    with pytest.raises(Exception, match="race"):
        emu.run(source, inputs={"x": x})


@covers("dma.start", "sem.wait", "halt")
def test_dma_strided_between_all_spaces(emu):
    src = np.arange(64 * 64, dtype=np.int32).reshape(64, 64)
    # 2-D gather: 8 rows of 32 bytes, every 4th row of the 256-byte-wide source,
    # into rows 64 bytes apart in VMEM; then VMEM -> SMEM -> HBM back out.
    source = emu.kernel("""
        li s1, @src
        li s2, 1000
        li s3, 0
        li s4, 3
        li s9, 256
        dma.start vmem[s2], hbm[s1], s3, s4
        sem.wait s4, s9
        li s10, 1000
        li s11, 32
        dma.start smem[s10], vmem[s2], s11, s4
        sem.wait s4, s9
        li s1, @dst
        dma.start hbm[s1], smem[s10], s11, s4
        sem.wait s4, s9
    """, buffers=".buffer src i32 64x64 input\n.buffer dst i32 8x8 output\n",
        smem="0 32 8 1024 64 1 0 0\n32 256 1 0 0 1 0 0")
    ran = emu.run(source, inputs={"src": src})
    rows = src[0::4][:8, :8]
    got = ran.core.vmem[1000:1000 + 8 * 64].view(np.int32).reshape(8, 16)[:, :8]
    assert np.array_equal(rows, got)
    assert np.array_equal(ran.buffer("dst").reshape(-1), ran.core.vmem[1000:1256].view(np.int32))
    assert np.array_equal(ran.core.smem[1000:1256], ran.core.vmem[1000:1256])
    assert ran.result.dma_count == 3


@covers("dma.start.r", "sem.signal", "sem.signal.r", "barrier", "mark.push", "mark.pop")
def test_remote_copy_signals_and_barrier_between_two_cores(emu):
    source = emu.kernel("""
        rdsr s1, core
        mark.push 7, s1
        li s2, 4096
        li s3, 2
        li s8, 4
        bne s1, s0, receiver
        vli.i32 v1, 1234
        li s6, 512
        vst.w v1, 0(s2), s6, m0
        li s7, 1
        dma.start.r vmem[s2]@s7, vmem[s2], s0, s3, s8
        sem.wait s3, s2
        li s9, 5
        sem.signal.r s9, s7, s7
        sem.signal s9, s7
        sem.wait s9, s7
        jmp done
    receiver:
        sem.wait s8, s2
        li s9, 5
        li s7, 1
        sem.wait s9, s7
        li s6, 512
        vld.w v1, 0(s2), s6, m0
    done:
        mark.pop
        barrier chip
    """, smem="0 4096 1 0 0 1 0 0", solo=False)
    ran = emu.run(source)
    assert np.all(ran.machine.cores[1].vi[1] == 1234)
    assert all(c.sems == [0] * 16 for c in ran.machine.cores)


def test_every_instruction_is_covered():
    assert COVERED == set(TABLE), sorted(set(TABLE) - COVERED)
