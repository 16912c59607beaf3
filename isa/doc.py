"""Generate docs/isa.md from the instruction table: `python -m mkemu.isa.doc > docs/isa.md`."""

from __future__ import annotations

from mkemu.isa.encoding import OPCODE_BITS, WORD_BITS
from mkemu.isa.table import TABLE, UNITS


def render() -> str:
    out = [
        "# The mkemu instruction set",
        "",
        "Generated from `isa/table.py` by `python -m mkemu.isa.doc`; do not edit by hand.",
        "",
        f"Every instruction is one {WORD_BITS}-bit word: a {OPCODE_BITS}-bit opcode in the top bits,",
        "then the operand fields packed downwards in the order shown (bit ranges inclusive).",
        "Registers: `s0..s31` scalar, 64 bits wide (`s0` reads 0; the int32 operations wrap",
        "their results to 32 bits, the `.d` ones keep all 64 for HBM addresses), `v0..v31`",
        "vector (8 x 128 x 32 bit), `m0..m7` masks (`m0` all true), `x0..x3` matrix units,",
        "`a0..a15` accumulators (as many as the profile has).",
        "An int32 operation reads its registers' full 64-bit values and wraps only its result: on",
        "values within int32 (what every int32 operation and `lds` leave) it is int32 arithmetic.",
        "On a register holding more (from a `.d` operation) the compares, `min`, `max`, `div`,",
        "`rem` and `sra` see the 64-bit value (`lui.d s1, 1` then `srai s2, s1, 1` gives -2^31,",
        "`slti s3, s1, 1` gives 0), `shr` and the rest only its low 32 bits; branches compare",
        "all 64 bits.",
        "Timing classes map to a latency and an occupancy in each hardware profile.",
        "The assembly file format and the operand rules checked at run time follow the tables.",
        "",
    ]
    group = None
    for instr in sorted(TABLE.values(), key=lambda i: (UNITS.index(i.unit), i.opcode)):
        if instr.unit != group:
            if group is not None:
                out.append("")
            group = instr.unit
            out += [f"## unit `{group}`", "", "| opcode | syntax | timing | fields | meaning |",
                    "|---|---|---|---|---|"]
        fields = ", ".join(f"{f.operand.name}[{f.shift + f.operand.kind.bits - 1}:{f.shift}]"
                           for f in instr.fields) or "-"
        syntax = f"{instr.mnemonic} {instr.syntax}".rstrip().replace("|", "\\|")
        meaning = instr.doc.replace("|", "\\|")   # (escaped: a bare bar would end the table cell)
        out.append(f"| {instr.opcode:#05x} | `{syntax}` | {instr.timing or 'free'} | {fields} | "
                   f"{meaning} |")
    out += ["", *ASSEMBLY.strip("\n").splitlines()]
    return "\n".join(out)


ASSEMBLY = """
## Assembly files (`.s`)

`mkemu run FILE.s` assembles and runs a file, `mkemu asm FILE.s` lists it (address,
encoding, disassembly under each source line); `programs/examples/vector_add.s` is a
complete example. One instruction or directive a line; `;` or `#` starts a comment;
`name:` labels the next instruction (several labels may precede one instruction); a label
with no instruction after it in its kernel is an error. A label spelled like a register
(`a0:`, `s3:`) is taken as a branch target only: in any other field, `s3` is the
register, an error there (`addi s1, s2, s3` meant `add`).
Mnemonics are lower case as in the tables; spaces around `,` `(` `)` `[` `]` `@` are
optional.

| directive | meaning |
|---|---|
| `.buffer NAME DTYPE SHAPE KIND` | an HBM buffer at the same address on every chip, placed in declaration order, 512-byte aligned. DTYPE `bf16`, `f32`, `i32` or `mxfp4` (at least 2 dimensions, an even last one); SHAPE like `8x128` (positive dimensions); KIND `input`, `output`, `inout`, `weight` or `scratch`. NAME is a letter or `_`, then letters, digits, `_` or `.` (operands name the buffer's address as `@NAME`), declared once. |
| `.kernel NAME` | start a kernel: the instructions, labels and `.smem` lines that follow belong to it. A kernel has at least one instruction (its last one executed must be `halt`; an empty kernel is an error at its `.kernel` line). A name is defined once. |
| `.smem OFFSET WORD ...` | the kernel's initial SMEM words, from byte OFFSET (4-aligned), inside the profile's SMEM; each word set by one `.smem` line only |
| `.launch NAME [ARG ...]` | append a launch of kernel NAME; ARG i is SMEM word i (byte 4*i) at its start, over the `.smem` image. Without any `.launch`, every kernel runs once, in file order. |
| `.reference FILE.py:FUNCTION` | the numpy reference (or `module:function`; see docs/api.md), the function named; one per file |

Numbers are decimal, `0x` hex or `0b` binary, with an optional sign; a decimal with a
leading zero (`010`) is an error, not octal, and so is one in a float32 immediate's whole
part (`010.5`) or a register's number (`s01`). An immediate may also be `@NAME` (the HBM
byte address of buffer NAME) or a label (its instruction index). `imm` fields take
-2^31 .. 2^32-1 (`0xffffffff` is -1; an `imm` is sign-extended, so a buffer address used
as one must be below 2^31), `off` fields -2^26 .. 2^26-1, `idx`, `amount`, `block` and
`chunk` 0..255, `target` and `region` 0 .. 2^24-1, `zero` 0 or 1; a value outside its
field is an error. Float32 immediates are decimal (`1.5`, `-2e-3`), `inf`, `-inf`,
`nan`, or raw bits `f32:0x7fc00000` (at most 32 bits); a decimal is rounded once from
its exact value to the nearest float32 (ties to even, subnormals kept), and one that
rounds beyond the largest float32 is an error. SMEM words (`.smem`, `.launch`
arguments) take -2^31 .. 2^32-1. `rdsr` names: core, chip, chip_x, chip_y, chip_z,
mesh_x, mesh_y, mesh_z, cores (per chip), chips, gcore (the global core id, chip * cores +
core); barrier scopes: chip, all, x, y, z.

Every error is reported as `FILE:LINE:COL: error: ...` with the line and a caret, all
errors of a file at once, and `mkemu` exits with status 1.

## Operand rules checked at run time

A fault stops the run naming its kind, chip, core, cycle (for a faulting instruction, the
cycle it issued), pc, instruction and source line.

| rule | fault |
|---|---|
| register numbers below the profile's counts (`sregs`, `vregs`, `mregs`; `x` below `mxus_per_core`, `a` below `mxu_accumulators`); `chunk` below `mxu_dim / 128` | `illegal-instruction` |
| `lds`/`sts` (and `.d`): address 4-aligned and (both words) inside SMEM | `misaligned`, `out-of-bounds` |
| `vld`/`vst`: address and stride multiples of the element size (4 for `.w`, 2 for `.bf16`), whatever the mask selects (even nothing); every element the mask selects inside VMEM (masked-off rows and lanes are not checked against its bounds) | `misaligned`, `out-of-bounds` |
| `mxu.ldw`/`ldwt`/`ldw.mx`: shape = rows << 16 \\| cols (the whole 64-bit register) with 0 < rows <= D and 0 < cols <= D, cols a multiple of 128 (D = the profile's `mxu_dim`); `mxu.mac` only after a weight tile was loaded into that unit | `bad-operand` |
| `mxu.ldw`/`ldwt`: address and stride even; `mxu.ldw`/`ldwt`/`ldw.mx`: every byte read (rows, scales) inside VMEM | `misaligned`, `out-of-bounds` |
| `vbcast.lane` idx < 128, `vbcast.sub` idx < 8, `vcol` block < 16, `vextract`/`vinsert` element 0..1023 | `bad-operand` |
| `div`, `rem`, `divi`, `remi`: divisor not 0 | `divide-by-zero` |
| branch target below the kernel's length; the last instruction executed is `halt` | `bad-branch`, `ran-off-end` |
| DMA descriptor: 7 words (signed int32), 4-aligned, inside SMEM (else `out-of-bounds`); `inner_bytes`, `n1`, `n2` positive; both ends inside their memories (both checked before a byte moves; a chip's HBM ends at the end of the program's last buffer, not at the profile's capacity); the destination block, from its lowest row start to its highest row end, at least as long as the bytes moved (so rows that overlap that much, e.g. a destination stride of 0 over several rows, are refused; overlapping rows inside a longer block are not) | `out-of-bounds`, `bad-descriptor` |
| `sem`, `rsem` below the profile's `semaphores`; `tgt` a global core of the mesh | `bad-semaphore`, `bad-target` |
| `mark.push` at most 64 regions deep; `mark.pop` only inside a `mark.push` region | `bad-region` |

Shift amounts are taken modulo 32 (`shli.d`: 64); `vrot` amounts modulo 128 or 8.
docs/safety.md lists the checks of the schedule (races, deadlocks, semaphores left
non-zero, run-time bounds).
"""


if __name__ == "__main__":
    print(render())
