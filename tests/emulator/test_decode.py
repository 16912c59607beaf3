"""Pre-decoding: a word decoded once is kept for later kernels on the same profile,
and nothing of one profile or kernel leaks into another's decoding."""

from __future__ import annotations

import attrs
import numpy as np

from mkemu.emulator.decode import C_BOUND, C_LAT, C_NBOUND, decode_kernel
from mkemu.isa.asm import assemble
from mkemu.isa.hardware import load_profile
from mkemu.isa.program import Extent

SOURCE = """
.kernel main
    li s1, 64
    li s4, 512
    mul s2, s1, s1
    vld.w v1, 0(s1), s4, m0
    mul s3, s2, s1
    halt
"""


def _kernel():
    return assemble(SOURCE, "decode.s").kernels["main"]


def _slow_mul(tmp_path):
    path = tmp_path / "slow_mul.toml"
    path.write_text('extends = "test"\n[timing]\nscalar_mul = { latency_cycles = 9, occupancy_cycles = 2 }\n')
    return load_profile(str(path))


def test_a_kernel_decodes_from_kept_words_as_it_does_afresh(monkeypatch):
    from mkemu.emulator import decode

    profile = load_profile("test")
    monkeypatch.setattr(decode, "_kept_words", {})     # (nothing kept: decoded afresh)
    first = decode_kernel(_kernel(), profile)
    for _ in range(2):
        again = decode_kernel(_kernel(), profile)
        assert np.array_equal(again.code, first.code)
        assert again.ops == first.ops


def test_each_profile_gets_its_own_timing(tmp_path):
    plain, slow = load_profile("test"), _slow_mul(tmp_path)
    kernel = _kernel()
    muls = [pc for pc, op in enumerate(decode_kernel(kernel, plain).ops) if op.text.startswith("mul")]
    expected = plain.timing["scalar_mul"].latency_cycles
    assert expected != 9
    for profile, latency in ((plain, expected), (slow, 9), (plain, expected), (slow, 9)):
        decoded = decode_kernel(kernel, profile)
        assert [decoded.code[pc, C_LAT] for pc in muls] == [latency] * len(muls)
        assert {decoded.ops[pc].latency for pc in muls} == {latency}


def test_a_kernels_bounds_stay_its_own():
    """Two kernels share a word: the buffer one of them checks it against is not the
    other's (the compiler's checks are the kernel's, not the word's)."""
    profile = load_profile("test")
    plain = _kernel()
    vld = next(pc for pc, op in enumerate(decode_kernel(plain, profile).ops) if op.text.startswith("vld.w"))
    extent = Extent(name="x", space="vmem", lo=64, size=4096, shape=(8, 128), strides=(512, 4), dtype="f32")
    checked = attrs.evolve(plain, extents={vld: (extent,)})
    for kernel, bounds in ((checked, [1, 64, 64 + 4096]), (plain, [0, 0, 0]), (checked, [1, 64, 64 + 4096])):
        row = decode_kernel(kernel, profile).code[vld]
        assert [row[C_NBOUND], row[C_BOUND], row[C_BOUND + 1]] == bounds


def test_threads_decoding_at_once_get_what_one_thread_gets(tmp_path, monkeypatch):
    """Six profiles, with room kept for the words of about two, decoded from several
    threads at once: each decode is the one a single thread makes (kept words come and
    go meanwhile)."""
    from concurrent.futures import ThreadPoolExecutor

    from mkemu.emulator import decode

    monkeypatch.setattr(decode, "MAX_KEPT_WORDS", 12)

    profiles = []
    for n in range(6):
        path = tmp_path / f"mul{n}.toml"
        path.write_text(f'extends = "test"\n[timing]\nscalar_mul = {{ latency_cycles = {n + 2}, '
                        'occupancy_cycles = 1 }\n')
        profiles.append(load_profile(str(path)))
    kernel = _kernel()
    alone = [decode_kernel(kernel, p).code for p in profiles]
    jobs = [n % len(profiles) for n in range(60)]
    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(lambda n: decode_kernel(kernel, profiles[n]).code, jobs))
    assert all(np.array_equal(code, alone[n]) for n, code in zip(jobs, codes))
