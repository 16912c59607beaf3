"""Assembler listings: address, encoding, disassembly, grouped under their source lines."""

from __future__ import annotations

from collections import Counter

from mkemu.isa.asm import EncodingError, decode, format_instr
from mkemu.isa.encoding import OPCODE_SHIFT
from mkemu.isa.table import BY_OPCODE
from mkemu.isa.program import Program


def listing(program: Program, stats: bool = False, compile_s: float | None = None) -> str:
    out: list[str] = []
    for kernel in program.kernels.values():
        out.append(f"kernel {kernel.name}: {len(kernel.code)} instructions")
        last = None
        labels: dict[int, list[str]] = {}
        for name, pc in kernel.labels.items():
            labels.setdefault(pc, []).append(name)
        for pc, word in enumerate(kernel.code):
            span = kernel.source_of(pc)
            key = (span.file, span.line) if span else None
            if key != last and span is not None:
                lines = kernel.source_text.get(span.file, [])
                text = lines[span.line - 1].rstrip() if 0 < span.line <= len(lines) else ""
                out.append(f"; {span.file}:{span.line}: {text.strip()}")
                last = key
            out.extend(f"{name}:" for name in labels.get(pc, ()))
            try:
                text = format_instr(*decode(int(word)))
            except EncodingError:
                text = f".word {int(word):#018x}  ; not an instruction"
            out.append(f"  {pc:06x}:  {int(word):016x}  {text}")
        out.append("")
    if stats:
        out.extend(_stats(program, compile_s))
    return "\n".join(out) + "\n"


def _stats(program: Program, compile_s: float | None) -> list[str]:
    out = ["statistics:"]
    if compile_s is not None:
        out.append(f"  compile time: {compile_s * 1000:.1f} ms")
    for kernel in program.kernels.values():
        units = Counter(BY_OPCODE[int(w) >> OPCODE_SHIFT].unit if int(w) >> OPCODE_SHIFT in BY_OPCODE
                        else "illegal" for w in kernel.code)
        counts = ", ".join(f"{u} {n}" for u, n in sorted(units.items()))
        out.append(f"  kernel {kernel.name}: {len(kernel.code)} instructions ({counts})")
        out.append(f"    VMEM {kernel.vmem_bytes:,} bytes, SMEM {kernel.smem_bytes:,} bytes")
        for line in kernel.allocation:
            out.append(f"    {line}")
    for buf in program.buffers:
        shape = "x".join(map(str, buf.shape))
        out.append(f"  HBM {buf.offset_bytes:#010x} {buf.name} {buf.dtype}[{shape}] {buf.kind} "
                   f"({buf.size_bytes:,} bytes)")
    return out
