"""A readable text form of the checked program (`ir`), for tests and debugging.

The text looks like .mk but shows what the front end decided: inlined fn bodies with
renamed locals, folded constants, every view as `buffer[slot]{offset +: size, ...}`
(`{i}` for a point), and `: dtype[rows, cols]` after every stored tile expression.
"""

from __future__ import annotations

import numpy as np

from mkemu.dsl import ir


def scalar(e) -> str:
    match e:
        case ir.Const():
            return ("false", "true")[e.value] if e.dtype == "bool" else str(e.value)
        case ir.ScalarRead():
            return e.var.name
        case ir.ScalarOp() if len(e.args) == 1:
            return f"{'-' if e.op == 'neg' else e.op}{scalar(e.args[0])}"
        case ir.ScalarOp() if e.op in ("min", "max", "select"):
            return f"{e.op}({', '.join(scalar(a) for a in e.args)})"
        case ir.ScalarOp():
            return f"({scalar(e.args[0])} {e.op} {scalar(e.args[1])})"
        case ir.SmemLoad():
            return ref(e.ref)
        case ir.TileToScalar():
            return f"scalar({tile(e.tile)})"
        case ir.Spmd():
            return f"{e.name}({', '.join(scalar(a) for a in e.args)})"
    return repr(e)


def ref(r: ir.Ref) -> str:
    parts = []
    for off, size in zip(r.offsets, r.sizes):
        parts.append(scalar(off) if size is None else f"{scalar(off)} +: {size}")
    slot = f"[{scalar(r.slot)}]" if r.slot is not None else ""
    return f"{r.buffer.name}{slot}{{{', '.join(parts)}}}"


def sem(s: ir.SemRef) -> str:
    return s.sem.name + (f"[{scalar(s.index)}]" if s.index is not None else "")


def tile(e) -> str:
    match e:
        case ir.Load():
            return ref(e.ref)
        case ir.ValueRead():
            return e.value.name
        case ir.Literal() if e.dtype in ("f32", "bf16"):
            return f"{np.float32(e.value)}:{e.dtype}"   # (the shortest text of the float32 value)
        case ir.Literal():
            return f"{e.value}:{e.dtype}"
        case ir.Splat():
            return f"splat({scalar(e.scalar)})"
        case ir.Elementwise() if len(e.args) == 2 and not e.op.isalpha():
            return f"({tile(e.args[0])} {e.op} {tile(e.args[1])})"
        case ir.Elementwise():
            return f"{e.op}({', '.join(tile(a) for a in e.args)})"
        case ir.Convert():
            return f"{e.dtype}({tile(e.arg)})"
        case ir.Reduce():
            return f"{e.op}({tile(e.arg)}, axis={e.axis})"
        case ir.Matmul():
            return f"matmul({tile(e.lhs)}, {tile(e.rhs)})"
        case ir.Transpose():
            return f"transpose({tile(e.arg)})"
        case ir.Iota():
            return f"iota({e.axis}, {max(e.shape)})"
        case ir.TileSlice():
            return f"{tile(e.arg)}[{e.starts[0]} +: {e.shape[0]}, {e.starts[1]} +: {e.shape[1]}]"
    return repr(e)


def typed(e) -> str:
    return f"{tile(e)} : {e.dtype}[{e.shape[0]}, {e.shape[1]}]"


def dma(d: ir.Dma) -> str:
    dst = ref(d.dst) + (f" @ {scalar(d.target)}" if d.target is not None else "")
    sems = sem(d.sem) + (f", {sem(d.recv_sem)}" if d.recv_sem is not None else "")
    return f"copy({ref(d.src)}, {dst}, {sems}) /* {d.size_bytes} B */"


def stmts(body, indent: int = 0) -> list[str]:
    pad = "    " * indent
    lines: list[str] = []
    for s in body:
        match s:
            case ir.LetScalar():
                lines.append(f"{pad}let {s.var.name} = {scalar(s.value)};")
            case ir.SetScalar():
                lines.append(f"{pad}{s.var.name} = {scalar(s.value)};")
            case ir.LetTile():
                lines.append(f"{pad}let {s.value.name} = {typed(s.expr)};")
            case ir.StoreTile():
                op = f"{s.op}=" if s.op else "="
                lines.append(f"{pad}{ref(s.ref)} {op} {typed(s.value)};")
            case ir.StoreSmem():
                lines.append(f"{pad}{ref(s.ref)} = {scalar(s.value)};")
            case ir.DmaStart():
                lines.append(f"{pad}start {dma(s.dma)};")
            case ir.DmaWait():
                lines.append(f"{pad}wait {s.side} {dma(s.dma)};")
            case ir.Signal():
                where = f" @ {scalar(s.target)}" if s.target is not None else ""
                lines.append(f"{pad}signal({sem(s.sem)}{where}, {scalar(s.amount)});")
            case ir.SemWait():
                lines.append(f"{pad}wait({sem(s.sem)}, {scalar(s.amount)});")
            case ir.Barrier():
                lines.append(f"{pad}barrier({'' if s.axis is None else s.axis});")
            case ir.For():
                lines.append(f"{pad}for {s.var.name} in {scalar(s.start)}..{scalar(s.stop)} step {s.step} {{")
                lines += stmts(s.body, indent + 1) + [f"{pad}}}"]
            case ir.If():
                lines.append(f"{pad}if {scalar(s.cond)} {{")
                lines += stmts(s.then, indent + 1)
                if s.orelse:
                    lines += [f"{pad}}} else {{"] + stmts(s.orelse, indent + 1)
                lines.append(f"{pad}}}")
            case ir.Region():
                idx = f" ({scalar(s.index)})" if s.index is not None else ""
                lines.append(f'{pad}region "{s.name}"{idx} {{')
                lines += stmts(s.body, indent + 1) + [f"{pad}}}"]
    return lines


def kernel(k: ir.Kernel) -> str:
    lines = [f"kernel {k.name}"]
    for b in k.params:
        if isinstance(b, ir.Buffer):
            lines.append(f"  param {b.name}: {b.space} {b.dtype}{list(b.shape)}")
        else:
            lines.append(f"  param {b.name}: {b.dtype}")
    for b in k.buffers:
        slots = f"[{b.slots}]" if b.slots else ""
        lines.append(f"  {b.space} {b.name}: {b.dtype}{slots}{list(b.shape)}")
    for s in k.sems:
        lines.append(f"  sem {s.name}" + (f"[{s.count}]" if s.count else ""))
    return "\n".join(lines + stmts(k.body, 1))


def program(p: ir.Program) -> str:
    out = [kernel(k) for k in p.kernels.values()]
    if p.host is not None:
        lines = ["host"]
        for b in p.host.arrays:
            lines.append(f"  {b.role} {b.name}: {b.dtype}{list(b.shape)}")
        for launch in p.host.launches:
            args = [a if isinstance(a, int) else ref(a) for a in launch.args]
            lines.append(f"  launch {launch.kernel.name}({', '.join(map(str, args))})")
        out.append("\n".join(lines))
    return "\n\n".join(out)
