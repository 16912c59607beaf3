"""docs/isa.md, read and run: the 64-bit register note, shift and rotate amounts, the
assembler's field ranges and every operand rule checked at run time, each at its
bound (the last value that passes and the first that faults). Expected values are
read from the doc (the fault kind from its rule's row, the numbers from its text) so
that a doc that goes stale fails here. Programs run through `mkemu.compile_source`
on the `test` profile (VMEM 4 MiB, SMEM 64 KiB, 16 semaphores, 2 cores, two 128-wide
matrix units with 4 accumulators each)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

import mkemu
from mkemu.errors import EmulatorFault, SourceError

ISA = (Path(__file__).parents[2] / "docs" / "isa.md").read_text()
FLAT = " ".join(ISA.split())
VMEM, SMEM = 4 * 1024 * 1024, 64 * 1024
SOLO = "    rdsr s14, gcore\n    bne s14, s0, __end\n"      # only core 0 runs the body
MASK32 = 0xFFFFFFFF


def _w32(x: int) -> int:
    x &= MASK32
    return x - (1 << 32) if x >= 1 << 31 else x


def _quotient(a: int, b: int) -> int:
    """a / b truncated toward zero."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _program(body: str, smem: str = "", buffers: str = "", hw: str = "test") -> mkemu.Kernel:
    source = (buffers + ".kernel main\n" + (f"    .smem {smem}\n" if smem else "") + SOLO
              + textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n__end:\n    halt\n")
    return mkemu.compile_source(source, "isa_audit.s", hw=hw, mesh="1")


def _values(setup: str, regs: list[str]) -> list[int]:
    """Run `setup`, then return the low 32 bits (signed) of each scalar register in
    `regs`, read back through a vector register, VMEM and an HBM buffer."""
    body = [setup]
    for i, reg in enumerate(regs):
        body += [f"li s29, {i}", f"vinsert v30, {reg}, s29"]
    body += ["li s29, 512", "vst.w v30, 0(s0), s29, m0", "li s29, @out", "li s30, 4096",
             "dma.start hbm[s29], vmem[s0], s0, s0", "sem.wait s0, s30"]
    run = _program("\n".join(body), smem="0 4096 1 0 0 1 0 0", buffers=".buffer out i32 8x128 output\n")()
    return run.output("out").reshape(-1)[:len(regs)].tolist()


# --- the register note -------------------------------------------------------------

def test_the_64_bit_register_example():
    m = re.search(r"\(`(lui\.d s1, 1)` then `(srai s2, s1, 1)` gives (-?)2\^(\d+), `(slti s3, s1, 1)` gives (-?\d+)\)",
                  FLAT)
    assert m, "the example of the register note"
    lui, srai, sign, power, slti, flag = m.groups()
    expected = [-(2 ** int(power)) if sign else 2 ** int(power), int(flag)]
    assert _values(f"{lui}\n{srai}\n{slti}", ["s2", "s3"]) == expected


def test_which_int32_operations_see_all_64_bits():
    # "the compares, `min`, `max`, `div`, `rem` and `sra` see the 64-bit value ...,
    # `shr` and the rest only its low 32 bits; branches compare all 64 bits"
    m = re.search(r"On a register holding more \(from a `\.d` operation\) the compares, (.*?) see the 64-bit value", FLAT)
    wide = set(re.findall(r"`(\w+)`", m.group(1))) | {"slt", "sle", "seq", "sne"}
    assert wide == {"min", "max", "div", "rem", "sra", "slt", "sle", "seq", "sne"}
    assert "`shr` and the rest only its low 32 bits; branches compare all 64 bits" in FLAT
    ops = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "and": lambda a, b: a & b,
           "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b, "mul": lambda a, b: a * b,
           "shl": lambda a, b: a << (b & 31), "shr": lambda a, b: a >> (b & 31), "sra": lambda a, b: a >> (b & 31),
           "slt": lambda a, b: int(a < b), "sle": lambda a, b: int(a <= b), "seq": lambda a, b: int(a == b),
           "sne": lambda a, b: int(a != b), "min": min, "max": max,
           "div": _quotient, "rem": lambda a, b: a - b * _quotient(a, b)}
    value = (1 << 32) + 5           # lui.d + addi.d: its low 32 bits are 5
    names = list(ops)
    for batch in (names[:9], names[9:]):
        setup = ["lui.d s1, 1", "addi.d s1, s1, 5", "li s2, 5", "li s3, 7"]
        regs, expected = [], []
        for op in batch:
            for b_reg, b in (("s2", 5), ("s3", 7)):
                reg = f"s{4 + len(regs)}"
                setup.append(f"{op} {reg}, s1, {b_reg}")
                regs.append(reg)
                expected.append(_w32(ops[op](value if op in wide else value & MASK32, b)))
        assert _values("\n".join(setup), regs) == expected, batch
    # blt: 2^32 + 5 < 7 is false on 64 bits (true on the low 32).
    taken = ["lui.d s1, 1", "addi.d s1, s1, 5", "li s3, 7", "li s4, 1", "blt s1, s3, skip",
             "li s4, 2", "skip: nop"]
    assert _values("\n".join(taken), ["s4"]) == [2]


def test_shift_and_rotate_amounts_wrap():
    assert "Shift amounts are taken modulo 32 (`shli.d`: 64); `vrot` amounts modulo 128 or 8." in FLAT
    got = _values("""
        li s1, 3
        li s2, 33
        shli s3, s1, 33
        shl s4, s1, s2
        shli.d s5, s1, 65
        shli.d s6, s1, 33
        srai s7, s6, 33
        viota.lane v1
        vrot.lane v2, v1, 200
        li s8, 0
        vextract s9, v2, s8
        viota.sub v3
        vrot.sub v4, v3, 11
        vextract s10, v4, s8
        vli.i32 v5, -8
        vli.i32 v6, 33
        vshl.i32 v7, v5, v6
        vsra.i32 v8, v5, v6
        vshr.i32 v9, v5, v6
        vextract s11, v7, s8
        vextract s12, v8, s8
        vextract s13, v9, s8
    """, ["s3", "s4", "s5", "s7", "s9", "s10", "s11", "s12", "s13"])
    assert got == [6, 6, 6, _w32((3 << 33) >> 1), (0 - 200) % 128, (0 - 11) % 8, -16, -4, _w32(0xFFFFFFF8 >> 1)]


# --- the assembler's field ranges ---------------------------------------------------

def _assembles(line: str) -> bool:
    try:
        mkemu.compile_source(f".kernel main\n    {line}\n    halt\n", "fields.s", hw="test", mesh="1")
    except SourceError:
        return False
    return True


def _bounds(text: str) -> tuple[int, int]:
    """`-2^31 .. 2^32-1` or `0..255` as numbers."""
    def number(t: str) -> int:
        m = re.fullmatch(r"(-?)2\^(\d+)(-1)?", t.strip())
        if m:
            return (-1 if m.group(1) else 1) * 2 ** int(m.group(2)) - (1 if m.group(3) else 0)
        return int(t)
    lo, hi = text.split("..")
    return number(lo), number(hi)


@pytest.mark.parametrize("field, template", [
    ("imm", "li s1, {}"), ("off", "lds s1, {}(s0)"), ("idx", "vbcast.lane v1, v2, {}"),
    ("amount", "vrot.sub v1, v2, {}"), ("block", "vcol v1, v2, {}"), ("chunk", "mxu.push x0, v1, {}"),
    ("target", "jmp {}"), ("region", "mark.push {}, s0"), ("zero", "mxu.mac x0, a0, {}"),
])
def test_field_ranges(field, template):
    ranges = {}
    for names, text in re.findall(r"((?:`\w+`(?:,| and)? )+)(?:fields take |fields )?(-?[\d^]+(?:-1)? ?\.\. ?-?[\d^]+(?:-1)?)",
                                  FLAT[FLAT.index("`imm` fields take"):FLAT.index("a value outside its field")]):
        for name in re.findall(r"`(\w+)`", names):
            ranges[name] = _bounds(text)
    ranges["zero"] = (0, 1) if "`zero` 0 or 1" in FLAT else None
    lo, hi = ranges[field]
    assert _assembles(template.format(lo)) and _assembles(template.format(hi))
    assert not _assembles(template.format(lo - 1)) and not _assembles(template.format(hi + 1))


# --- operand rules checked at run time ---------------------------------------------

def _rule_kinds(key: str) -> set[str]:
    """The fault kinds of the operand-rule row whose rule starts with `key`."""
    table = ISA[ISA.index("| rule | fault |"):]
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        rule, kinds = line.rsplit("|", 2)[0], line.rsplit("|", 2)[1]
        if rule.lstrip("| ").startswith(key):
            return set(re.findall(r"`([\w-]+)`", kinds))
    raise AssertionError(f"no operand rule starting {key!r}")


DESC = "0 16 1 0 0 1 0 0"
_DEPTH = int(re.search(r"`mark.push` at most (\d+) regions deep", ISA).group(1))
V_END, S_END = VMEM, SMEM
# (rule key, fault kind, body that passes at the bound, body that faults just past it:
# its last line faults; smem descriptor; profile)
RULES = [
    ("register numbers", "illegal-instruction", "mxu.push x1, v1, 0", "mxu.push x2, v1, 0"),
    ("register numbers", "illegal-instruction", "mxu.pop v1, x0, a3, 0", "mxu.pop v1, x0, a4, 0"),
    ("register numbers", "illegal-instruction", "mxu.pop v1, x0, a0, 0", "mxu.pop v1, x0, a0, 1"),
    ("register numbers", "illegal-instruction", "add s15, s1, s1", "add s16, s1, s1", "", "small"),
    ("register numbers", "illegal-instruction", "vmov v7, v1", "vmov v8, v1", "", "small"),
    ("register numbers", "illegal-instruction", "mnot m3, m1", "mnot m4, m1", "", "small"),
    ("`lds`/`sts`", "misaligned", "li s1, 4\nlds s2, 0(s1)", "li s1, 6\nlds s2, 0(s1)"),
    ("`lds`/`sts`", "misaligned", "li s1, 4\nlds.d s2, 0(s1)", "li s1, 2\nsts.d s2, 0(s1)"),
    ("`lds`/`sts`", "out-of-bounds", f"li s1, {S_END - 4}\nsts s2, 0(s1)", f"li s1, {S_END}\nsts s2, 0(s1)"),
    ("`lds`/`sts`", "out-of-bounds", f"li s1, {S_END - 8}\nlds.d s2, 0(s1)", f"li s1, {S_END - 4}\nlds.d s2, 0(s1)"),
    ("`vld`/`vst`", "misaligned", "li s1, 512\nvld.w v1, 4(s0), s1, m0", "li s1, 512\nvld.w v1, 2(s0), s1, m0"),
    ("`vld`/`vst`", "misaligned", "li s1, 256\nvst.bf16 v1, 2(s0), s1, m0", "li s1, 256\nvst.bf16 v1, 1(s0), s1, m0"),
    ("`vld`/`vst`", "misaligned", "li s1, 4\nvld.w v1, 0(s0), s1, m0", "li s1, 2\nvld.w v1, 0(s0), s1, m0"),
    ("`vld`/`vst`", "misaligned",      # whatever the mask selects, even nothing
     "li s1, 512\nmnot m1, m0\nvld.w v1, 4(s0), s1, m1", "li s1, 512\nmnot m1, m0\nvld.w v1, 2(s0), s1, m1"),
    ("`vld`/`vst`", "out-of-bounds",   # masked-off rows are not checked
     f"li s1, 512\nli s2, {V_END - 512}\nli s3, 1\nli s4, 128\nmrows m1, s3, s4\nvld.w v1, 0(s2), s1, m1",
     f"li s1, 512\nli s2, {V_END - 512}\nvld.w v1, 0(s2), s1, m0"),
    ("`vld`/`vst`", "out-of-bounds",   # masked-off lanes are not checked
     f"li s2, {V_END - 4}\nli s3, 8\nli s4, 1\nmrows m1, s3, s4\nvst.w v1, 0(s2), s0, m1",
     f"li s2, {V_END - 4}\nli s3, 8\nli s4, 2\nmrows m1, s3, s4\nvst.w v1, 0(s2), s0, m1"),
    ("`mxu.ldw`/`ldwt`/`ldw.mx`: shape", "bad-operand",
     "li s1, 256\nli s2, 0x800080\nmxu.ldw x0, 0(s0), s1, s2", "li s1, 256\nli s2, 0x810080\nmxu.ldw x0, 0(s0), s1, s2"),
    ("`mxu.ldw`/`ldwt`/`ldw.mx`: shape", "bad-operand",
     "li s1, 256\nli s2, 0x10080\nmxu.ldwt x0, 0(s0), s1, s2", "li s1, 256\nli s2, 0x10040\nmxu.ldwt x0, 0(s0), s1, s2"),
    ("`mxu.ldw`/`ldwt`/`ldw.mx`: shape", "bad-operand",
     "li s1, 256\nli s2, 0x10080\nmxu.ldw x1, 0(s0), s1, s2\nmxu.mac x1, a0, 1", "mxu.mac x1, a0, 1"),
    ("`mxu.ldw`/`ldwt`: address and stride even", "misaligned",
     "li s1, 256\nli s2, 0x10080\nli s3, 2\nmxu.ldw x0, 0(s3), s1, s2",
     "li s1, 256\nli s2, 0x10080\nli s3, 1\nmxu.ldw x0, 0(s3), s1, s2"),
    ("`mxu.ldw`/`ldwt`: address and stride even", "misaligned",   # ldw.mx reads bytes: no alignment
     "li s1, 65\nli s2, 0x10080\nli s3, 1\nli s4, 4096\nmxu.ldw.mx x0, 0(s3), s1, s2, s4",
     "li s1, 258\nli s2, 0x20080\nli s3, 1\nmxu.ldwt x0, 0(s3), s1, s2"),
    ("`mxu.ldw`/`ldwt`: address and stride even", "out-of-bounds",
     f"li s1, 256\nli s2, 0x10080\nli s3, {V_END - 256}\nmxu.ldw x0, 0(s3), s1, s2",
     f"li s1, 256\nli s2, 0x20080\nli s3, {V_END - 256}\nmxu.ldw x0, 0(s3), s1, s2"),
    ("`mxu.ldw`/`ldwt`: address and stride even", "out-of-bounds",
     f"li s1, 64\nli s2, 0x10080\nli s4, {V_END - 128}\nmxu.ldw.mx x0, 0(s0), s1, s2, s4",
     f"li s1, 64\nli s2, 0x10080\nli s4, {V_END - 127}\nmxu.ldw.mx x0, 0(s0), s1, s2, s4"),
    ("`vbcast.lane` idx < 128", "bad-operand", "vbcast.lane v1, v2, 127", "vbcast.lane v1, v2, 128"),
    ("`vbcast.lane` idx < 128", "bad-operand", "vbcast.sub v1, v2, 7", "vbcast.sub v1, v2, 8"),
    ("`vbcast.lane` idx < 128", "bad-operand", "vcol v1, v2, 15", "vcol v1, v2, 16"),
    ("`vbcast.lane` idx < 128", "bad-operand", "li s1, 1023\nvextract s2, v1, s1", "li s1, 1024\nvextract s2, v1, s1"),
    ("`vbcast.lane` idx < 128", "bad-operand", "li s1, 0\nvinsert v1, s2, s1", "li s1, -1\nvinsert v1, s2, s1"),
    ("`div`, `rem`", "divide-by-zero", "li s1, 7\ndivi s2, s1, -1", "li s1, 7\nremi s2, s1, 0"),
    ("`div`, `rem`", "divide-by-zero", "li s1, 7\nrem s2, s1, s1", "li s1, 7\ndiv s2, s1, s0"),
    ("branch target", "bad-branch", "li s1, 1\nbeq s1, s1, 4", "li s1, 1\nbeq s1, s1, 5"),   # 5 instructions
    ("DMA descriptor", "bad-descriptor", "li s6, 16\ndma.start vmem[s0], vmem[s0], s0, s0\nsem.wait s0, s6",
     "li s1, 0\nsts s1, 0(s0)\ndma.start vmem[s0], vmem[s0], s0, s0", DESC),
    ("DMA descriptor", "out-of-bounds",
     (f"li s1, {S_END - 28}\nli s6, 16\nsts s6, 0(s1)\nli s6, 1\nsts s6, 4(s1)\nsts s6, 16(s1)\n"
      "dma.start vmem[s0], vmem[s0], s1, s0\nli s6, 16\nsem.wait s0, s6"),
     f"li s1, {S_END - 24}\ndma.start vmem[s0], vmem[s0], s1, s0"),
    ("DMA descriptor", "out-of-bounds", "li s6, 16\ndma.start vmem[s0], vmem[s0], s0, s0\nsem.wait s0, s6",
     "li s1, 2\ndma.start vmem[s0], vmem[s0], s1, s0", DESC),
    # Rows overlapping inside a block at least as long as the bytes moved pass (rows of
    # 16 bytes at 0, 8, 64, 72: 88 bytes for 64); a block shorter than that (dst_stride2
    # 0: rows at 0, 8, 0, 8, 24 bytes) is refused.
    ("DMA descriptor", "bad-descriptor",
     "li s6, 64\nli s1, 4096\ndma.start vmem[s1], vmem[s0], s0, s0\nsem.wait s0, s6",
     "sts s0, 24(s0)\nli s1, 4096\ndma.start vmem[s1], vmem[s0], s0, s0",
     "0 16 2 16 8 2 32 64"),
    ("DMA descriptor", "out-of-bounds",
     f"li s6, 16\nli s1, {V_END - 16}\ndma.start vmem[s1], vmem[s0], s0, s0\nsem.wait s0, s6",
     f"li s1, {V_END - 8}\ndma.start vmem[s1], vmem[s0], s0, s0", DESC),
    ("`sem`, `rsem`", "bad-semaphore", "li s1, 15\nli s2, 1\nsem.signal s1, s2\nsem.wait s1, s2",
     "li s1, 16\nli s2, 1\nsem.signal s1, s2"),
    ("`sem`, `rsem`", "bad-target", "li s1, 1\nsem.signal.r s1, s0, s1", "li s1, 2\nsem.signal.r s1, s0, s1"),
    ("`mark.push`", "bad-region", "mark.push 7, s0\nmark.pop", "mark.pop"),
    ("`mark.push`", "bad-region", "\n".join(["mark.push 7, s0"] * _DEPTH),
     "\n".join(["mark.push 7, s0"] * (_DEPTH + 1))),
]


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("profiles") / "small.toml"
    path.write_text('extends = "test"\n[core]\nsregs = 16\nvregs = 8\nmregs = 4\n')
    return str(path)


@pytest.mark.parametrize("rule", RULES, ids=[f"{r[1]}-{n}" for n, r in enumerate(RULES)])
def test_operand_rule_at_its_bound(rule, small):
    key, kind, ok, bad, smem, hw = (*rule, "", "")[:6]
    assert kind in _rule_kinds(key), (key, kind)
    hw = small if hw == "small" else "test"
    _program(ok, smem=smem, hw=hw)()
    with pytest.raises(EmulatorFault) as info:
        _program(bad, smem=smem, hw=hw)()
    fault = info.value
    assert fault.kind == kind, fault.render()
    # Named by the faulting instruction: the body's last line, after SOLO's two.
    assert (fault.chip, fault.core, fault.pc) == (0, 0, 2 + len(bad.splitlines()) - 1), fault.render()
    assert fault.instruction == bad.splitlines()[-1].strip()


@pytest.mark.parametrize("sa, sb, rows, lanes", [
    ("li s1, 3", "li s2, 5", 3, 5),
    ("li s1, -1", "li s2, 5", 0, 0),                    # (negative: no sublane is below it)
    ("li s1, 0x7fffffff", "li s2, -1", 0, 0),
    ("lui.d s1, 1\naddi.d s1, s1, 2", "li s2, 3", 8, 3),   # (2^32 + 2: all 64 bits compared)
    ("lui.d s1, 1", "lui.d s2, 1", 8, 128),
])
def test_mrows_compares_signed_64_bit_values(sa, sb, rows, lanes):
    assert "the registers compared as signed 64-bit values" in FLAT
    body = f"""
        {sa}
        {sb}
        mrows m1, s1, s2
        vli.i32 v30, 1
        vli.i32 v31, 0
        vsel v2, m1, v30, v31
        li s29, 512
        vst.w v2, 0(s0), s29, m0
        li s29, @out
        li s30, 4096
        dma.start hbm[s29], vmem[s0], s0, s0
        sem.wait s0, s30
    """
    run = _program(body, smem="0 4096 1 0 0 1 0 0", buffers=".buffer out i32 8x128 output\n")()
    expected = [[int(r < rows and c < lanes) for c in range(128)] for r in range(8)]
    assert run.output("out").tolist() == expected


def test_the_last_instruction_executed_must_be_halt():
    assert "the last instruction executed is `halt` | `bad-branch`, `ran-off-end`" in FLAT
    kernel = mkemu.compile_source(".kernel main\n    li s1, 1\n    li s2, 2\n", "off.s", hw="test", mesh="1")
    with pytest.raises(EmulatorFault) as info:
        kernel()
    # Named by the last instruction, which fell through, at the cycle after it.
    assert (info.value.kind, info.value.pc, info.value.cycle) == ("ran-off-end", 1, 1000 + 2)


def test_semaphore_amounts_may_not_be_negative():
    for line in ("sem.signal", "sem.signal.r", "sem.wait"):
        doc = re.search(rf"\| `{re.escape(line)} .*?\| (.*?) \|\n", ISA).group(1)
        assert "(val < 0 faults: bad-operand)" in doc
    for body in ("li s1, -1\nsem.signal s0, s1", "li s1, -1\nsem.signal.r s0, s1, s0", "li s1, -1\nsem.wait s0, s1"):
        with pytest.raises(EmulatorFault) as info:
            _program(body)()
        assert info.value.kind == "bad-operand"
    _program("sem.wait s0, s0")()       # 0 is a count: it passes at once
