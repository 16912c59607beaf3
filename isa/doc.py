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
        "Timing classes map to a latency and an occupancy in each hardware profile.",
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
        out.append(f"| {instr.opcode:#05x} | `{syntax}` | {instr.timing or 'free'} | {fields} | "
                   f"{instr.doc.replace('|', '/')} |")
    return "\n".join(out)


if __name__ == "__main__":
    print(render())
