"""ISA audit (helper-71): what the emulator must do the same way whether its issue loop
is compiled by numba or run as plain Python (NUMBA_DISABLE_JIT=1, the debugging mode
isa/semantics.py promises), and matrix-unit shapes past the 128-wide `test` profile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

import mkemu
from mkemu.isa import numerics as nx

# One tile of words from VMEM 0 written to `out`, after `body`.
_DUMP = """
    li s29, 512
    vst.w v9, 0(s0), s29, m0
    li s29, @out
    li s30, 4096
    dma.start hbm[s29], vmem[s0], s0, s0
    sem.wait s0, s30
"""

# Registers holding more than 32 bits broadcast and insert their low 32 bits; an MXFP4
# scale below 127 is a negative power of two (in plain Python a uint8 scale byte minus
# 127 wrapped around, and indexing the power table with it overflowed).
_PROGRAM = """
.buffer out i32 8x128 output
.kernel main
    .smem 0 4096 1 0 0 1 0 0
    rdsr s14, gcore
    bne s14, s0, end
    lui.d s1, 1
    addi.d s1, s1, 7
    vbcast v1, s1
    li s2, 5
    vinsert v2, s1, s2
    vli.i32 v3, 0x21212121          ; e2m1 codes 1 (0.5, even columns) and 2 (1.0, odd)
    li s3, 512
    vst.w v3, 0(s0), s3, m0
    vli.i32 v4, 0x02020202          ; e8m0 scale 2: 2^-125
    vst.w v4, 4096(s0), s3, m0
    li s4, 64
    li s5, 0x10080                  ; one row of 128 values
    li s6, 4096
    mxu.ldw.mx x0, 0(s0), s4, s5, s6
    vli.f32 v5, 1.0
    mxu.push x0, v5, 0
    mxu.mac x0, a0, 1
    mxu.pop v6, x0, a0, 0
    vli.i32 v9, 0
    vextract s7, v1, s0
    vinsert v9, s7, s0
    vextract s7, v2, s2
    li s8, 1
    vinsert v9, s7, s8
    li s8, 2
    vextract s7, v6, s0
    vinsert v9, s7, s8
    li s8, 3
    vextract s7, v6, s8
    vinsert v9, s7, s8
""" + _DUMP + """
end:
    halt
"""

_RUNNER = """
import json, sys, mkemu
run = mkemu.compile_source(sys.stdin.read(), "jit.s", hw="test", mesh="1")()
print(json.dumps(run.output("out").reshape(-1)[:4].tolist()))
"""


def _expected() -> list[int]:
    # weight (0, n) = e2m1 * 2^(2 - 127); LHS row of ones: column n of the product is it.
    w = nx.mxfp4_decode(np.array([[0x21] * 64], np.uint8), np.full((1, 128), 2, np.uint8))
    assert w[0, 0] == 2.0 ** -126 and w[0, 1] == 2.0 ** -125
    return [7, 7, int(w[0, 0:1].view(np.int32)[0]), int(w[0, 3:4].view(np.int32)[0])]


def test_compiled_loop_broadcasts_low_bits_and_decodes_small_mxfp4_scales():
    run = mkemu.compile_source(_PROGRAM, "jit.s", hw="test", mesh="1")()
    assert run.output("out").reshape(-1)[:4].tolist() == _expected()


def test_the_uncompiled_loop_gives_the_same_values(tmp_path):
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", XDG_CACHE_HOME=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_RUNNER)], input=_PROGRAM, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == _expected()


# --- a 256-wide matrix unit: two LHS chunks, two accumulator chunks -----------------

D = 256


def _same_bits(expected, actual) -> bool:
    e, a = np.asarray(expected, np.float32), np.asarray(actual, np.float32)
    return bool(np.all((e.view(np.uint32) == a.view(np.uint32)) | (np.isnan(e) & np.isnan(a))))


def _run_d256(tmp_path, body: str, lhs: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """lhs (8 x 256 f32) into v0 (columns 0..127) and v1; `raw` bytes at VMEM 65536; run
    `body`, which leaves the 8 x 256 result in v10 and v11."""
    hw = tmp_path / "d256.toml"
    hw.write_text(f'extends = "test"\n[core]\nmxu_dim = {D}\n')
    raw = np.concatenate([raw, np.zeros(-len(raw) % 4, np.uint8)])
    source = f"""
.buffer lhs f32 16x128 input
.buffer w i32 {len(raw) // 4} input
.buffer out f32 16x128 output
.kernel main
    .smem 0 8192 1 0 0 1 0 0
    .smem 32 {len(raw)} 1 0 0 1 0 0
    rdsr s14, gcore
    bne s14, s0, end
    li s1, @lhs
    dma.start vmem[s0], hbm[s1], s0, s0
    li s1, @w
    li s2, 65536
    li s3, 32
    dma.start vmem[s2], hbm[s1], s3, s0
    li s3, {8192 + len(raw)}
    sem.wait s0, s3
    li s3, 512
    vld.w v0, 0(s0), s3, m0
    vld.w v1, 4096(s0), s3, m0
{textwrap.indent(textwrap.dedent(body).strip(), "    ")}
    vst.w v10, 0(s0), s3, m0
    vst.w v11, 4096(s0), s3, m0
    li s1, @out
    li s3, 8192
    dma.start hbm[s1], vmem[s0], s0, s0
    sem.wait s0, s3
end:
    halt
"""
    run = mkemu.compile_source(source, "d256.s", hw=str(hw), mesh="1")(
        {"lhs": np.concatenate([lhs[:, :128], lhs[:, 128:]]), "w": raw.view(np.int32)})
    out = run.output("out")
    return np.concatenate([out[:8], out[8:]], axis=1)


_MAC_TWICE = """
    {load}
    mxu.push x1, v0, 0
    mxu.push x1, v1, 1
    mxu.mac x1, a3, 1
    mxu.mac x1, a3, 0
    mxu.pop v10, x1, a3, 0
    mxu.pop v11, x1, a3, 1
"""


def _lhs(rng) -> np.ndarray:
    lhs = rng.standard_normal((8, D)).astype(np.float32)
    lhs[3, 133] = np.inf      # multiplied only where the tile has loaded row 133
    return lhs


def test_wide_weight_tiles_against_the_contract(tmp_path):
    rng = np.random.default_rng(71)
    # (rows, cols, transposed): ldw rows x cols; ldwt memory rows = weight columns (any
    # count), cols = K (a multiple of 128).
    for rows, cols, transposed in [(200, 256, False), (256, 128, False), (100, 256, True), (130, 128, True)]:
        lhs = _lhs(rng)
        mem = nx.bf16_round(rng.standard_normal((rows, cols)).astype(np.float32))
        op = "mxu.ldwt" if transposed else "mxu.ldw"
        load = f"li s2, 65536\nli s4, {2 * cols}\nli s5, {(rows << 16) | cols}\n{op} x1, 0(s2), s4, s5"
        got = _run_d256(tmp_path, _MAC_TWICE.format(load=load), lhs,
                        nx.f32_to_bf16_bits(mem).reshape(-1).view(np.uint8))
        w = np.zeros((D, D), np.float32)
        if transposed:
            w[:cols, :rows], k = mem.T, cols
        else:
            w[:rows, :cols], k = mem, rows
        once = nx.mxu_matmul_numpy(np.zeros((8, D), np.float32), lhs[:, :k], w[:k])
        assert _same_bits(nx.mxu_matmul_numpy(once, lhs[:, :k], w[:k]), got), (rows, cols, transposed)
        assert (~np.isfinite(got[3])).any() == (k > 133)      # the inf is inside K or not


def test_wide_mxfp4_tile_reads_scales_two_strides_apart(tmp_path):
    # "the e8m0 scale of (k, n) is the byte at sc + (k>>5)*2*stride + n", with a row
    # stride (200) that is not the row's 128 bytes.
    rng = np.random.default_rng(72)
    rows, cols, stride = 70, 256, 200
    lhs = _lhs(rng)
    w = (rng.standard_normal((rows, cols)) * 2.0 ** rng.integers(-20, 20, (rows, 1))).astype(np.float32)
    values, scales = nx.mxfp4_encode(w)
    scales[0, :3] = [0, 254, 255]
    sc = rows * stride + 64
    raw = np.zeros(sc + 2 * stride * (len(scales) - 1) + cols, np.uint8)
    for k in range(rows):
        raw[k * stride:k * stride + cols // 2] = values[k]
    for g in range(len(scales)):
        raw[sc + 2 * stride * g:sc + 2 * stride * g + cols] = scales[g]
    load = (f"li s2, 65536\nli s4, {stride}\nli s5, {(rows << 16) | cols}\nli s6, {65536 + sc}\n"
            "mxu.ldw.mx x1, 0(s2), s4, s5, s6")
    got = _run_d256(tmp_path, _MAC_TWICE.format(load=load), lhs, raw)
    decoded = nx.mxfp4_decode(values, scales)
    once = nx.mxu_matmul_numpy(np.zeros((8, D), np.float32), lhs[:, :rows], decoded)
    assert _same_bits(nx.mxu_matmul_numpy(once, lhs[:, :rows], decoded), got)
