"""One TensorCore: registers, VMEM, SMEM, matrix units, and the in-order issue loop.

The core runs ahead of the machine's clock on its own: an instruction issues at
the first cycle where the previous one has issued, its unit is free and its
source registers are ready; it then occupies its unit for `occupancy` cycles and
its results are ready `latency` cycles later. Local instructions execute at once,
in program order. When the core meets an instruction that touches other cores or
the DMA engines (`Op.is_global`), it stops and reports that instruction's issue
time; the machine executes it when global time gets there. Waiting therefore costs
no wall time: nothing steps through idle cycles.
"""

from __future__ import annotations

import numpy as np

from mkemu.isa import numerics as nx
from mkemu.isa.hardware import HardwareProfile

from mkemu.emulator.decode import Op, scoreboard_size, unit_names
from mkemu.emulator.memory import LANES, ROWS, Trap, _align, load_tile, row_view, store_tile

I32_MASK = 0xFFFFFFFF


def wrap32(value: int) -> int:
    value &= I32_MASK
    return value - (1 << 32) if value >> 31 else value


class Core:
    def __init__(self, profile: HardwareProfile, chip: int, index: int, gid: int):
        self.profile = profile
        self.chip, self.index, self.gid = chip, index, gid
        self.units = unit_names(profile)
        self.special = {}
        self.instructions = 0
        self.unit_busy = [0] * len(self.units)
        self.stalls = {"unit": 0, "dependency": 0, "semaphore": 0, "barrier": 0}
        self.reset()

    def reset(self) -> None:
        """Fresh state for a kernel launch: kernels see nothing of each other's memories."""
        p = self.profile
        self.s = [0] * p.sregs
        self.vu = np.zeros((p.vregs, ROWS, LANES), np.uint32)
        self.vf = self.vu.view(np.float32)
        self.vi = self.vu.view(np.int32)
        self.m = np.zeros((p.mregs, ROWS, LANES), bool)
        self.m[0] = True
        # Masks known to be a (rows, lanes) rectangle (set by mrows), else None.
        self.m_rect: list[tuple[int, int] | None] = [(ROWS, LANES)] + [(0, 0)] * (p.mregs - 1)
        self.vmem = np.zeros(p.vmem_bytes, np.uint8)
        self.smem = np.zeros(p.smem_bytes, np.uint8)
        self.sems = [0] * p.semaphores
        d = p.mxu_dim
        self.mx_w = np.zeros((p.mxus_per_core, d, d), np.float32)
        self.mx_rows = [0] * p.mxus_per_core
        self.mx_lhs = np.zeros((p.mxus_per_core, ROWS, d), np.float32)
        self.mx_acc = np.zeros((p.mxus_per_core, p.mxu_accumulators, ROWS, d), np.float32)
        self.t = 0
        self.unit_free = [0] * len(self.units)
        self.ready = [0] * scoreboard_size(p)
        self.pc = 0
        self.ops: list[Op] = []
        self.halted = True
        self.regions: list[tuple[int, int, int]] = []   # (region id, index, start cycle)
        self.region_cycles: dict[int, int] = {}         # region id -> cycles spent inside
        self.region_entries: dict[int, int] = {}        # region id -> times entered (and left)
        self.dma_wait_cycles: dict[int, int] = {}       # innermost region id (-1: none) -> cycles
        self.in_flight: list = []   # DMAs issued by or landing on this core, for race checks

    def start(self, ops: list[Op], smem_init: bytes, args: tuple[int, ...], t: int) -> None:
        self.reset()
        self.ops = ops
        self.smem[:len(smem_init)] = np.frombuffer(smem_init, np.uint8)
        # Launch arguments form the SMEM argument block: word i at byte 4*i.
        if args:
            self.smem[:4 * len(args)] = np.array([wrap32(v) for v in args], np.int32).view(np.uint8)
        self.t = t
        self.halted = False

    # -- the issue loop ------------------------------------------------------

    def retire(self, op: Op, issue: int) -> None:
        """Book the unit and the results of `op` issued at `issue`."""
        self.unit_free[op.unit] = issue + op.occupancy
        self.unit_busy[op.unit] += op.occupancy
        done = issue + op.latency
        for d in op.dsts:
            self.ready[d] = done
        self.t = issue + (1 if op.occupancy else 0)
        self.instructions += 1

    def run_local(self, limit: int) -> tuple[Op, int]:
        """Run until the next global instruction; return it and its issue time."""
        ops, ready, unit_free, busy, stalls = self.ops, self.ready, self.unit_free, self.unit_busy, self.stalls
        pc, t = self.pc, self.t
        count = 0
        try:
            while True:
                if pc >= len(ops):
                    raise Trap("ran-off-end", f"pc {pc} is past the end of the kernel ({len(ops)} instructions); "
                                              "a kernel must end with halt")
                op = ops[pc]
                issue = t
                free = unit_free[op.unit]
                if free > issue:
                    stalls["unit"] += free - issue
                    issue = free
                for r in op.srcs:
                    if ready[r] > issue:
                        stalls["dependency"] += ready[r] - issue
                        issue = ready[r]
                if op.is_global:
                    return op, issue
                if issue > limit:
                    raise Trap("max-cycles", f"the run passed the max-cycle guard of {limit} cycles")
                unit_free[op.unit] = issue + op.occupancy
                busy[op.unit] += op.occupancy
                done = issue + op.latency
                for d in op.dsts:
                    ready[d] = done
                t = issue + (1 if op.occupancy else 0)
                self.pc, self.t = pc, issue
                count += 1
                nxt = op.run(self, op)
                pc = pc + 1 if nxt is None else nxt
        finally:
            self.instructions += count
            self.t = t
            self.pc = pc

    # -- helpers used by handlers --------------------------------------------

    def mask(self, index: int) -> np.ndarray | None:
        return None if index == 0 else self.m[index]

    def set_s(self, index: int, value: int) -> None:
        if index:
            self.s[index] = wrap32(value)


# --- handlers: one per effect, each `fn(core, op) -> next pc or None` ----------

def _nop(core, op):
    return None


def _li(core, op):
    core.set_s(op.args[0], op.args[1])


def _salu(core, op):
    sd, sa, sb = op.args
    b = core.s[sb]
    if op.instr.param in ("div", "rem") and b == 0:
        raise Trap("divide-by-zero", f"{op.instr.param} by zero (s{sb} = 0)")
    core.set_s(sd, op.instr.fn(core.s[sa], b))


def _salui(core, op):
    sd, sa, imm = op.args
    if op.instr.param in ("div", "rem") and imm == 0:
        raise Trap("divide-by-zero", f"{op.instr.param} by zero (immediate 0)")
    core.set_s(sd, op.instr.fn(core.s[sa], imm))


def _branch(core, op):
    sa, sb, target = op.args
    if op.instr.fn(core.s[sa], core.s[sb]):
        return _target(core, target)
    return None


def _jump(core, op):
    return _target(core, op.args[0])


def _target(core, target):
    if target >= len(core.ops):
        raise Trap("bad-branch", f"branch target {target} is past the end of the kernel ({len(core.ops)} instructions)")
    return target


def _smem_addr(core, sa, off):
    addr = core.s[sa] + off
    if addr % 4:
        raise Trap("misaligned", f"SMEM address {addr} is not 4-byte aligned")
    if not 0 <= addr <= core.smem.size - 4:
        raise Trap("out-of-bounds", f"SMEM access at {addr} is outside SMEM of {core.smem.size} bytes")
    return addr


def _lds(core, op):
    sd, off, sa = op.args
    addr = _smem_addr(core, sa, off)
    core.set_s(sd, int(core.smem[addr:addr + 4].view(np.int32)[0]))


def _sts(core, op):
    sb, off, sa = op.args
    addr = _smem_addr(core, sa, off)
    core.smem[addr:addr + 4] = np.array([core.s[sb]], np.int32).view(np.uint8)


def _rdsr(core, op):
    from mkemu.isa.encoding import SPECIAL_REGS

    core.set_s(op.args[0], core.special[SPECIAL_REGS[op.args[1]]])


def _vld(core, op):
    vd, off, sa, stride, mask = op.args
    addr = core.s[sa] + off
    m = core.mask(mask)
    core.check_vmem(addr, core.s[stride], op.instr.param, m, write=False)
    core.vu[vd] = load_tile(core.vmem, "VMEM", addr, core.s[stride], op.instr.param, m,
                            core.m_rect[mask])


def _vst(core, op):
    va, off, sa, stride, mask = op.args
    addr = core.s[sa] + off
    m = core.mask(mask)
    core.check_vmem(addr, core.s[stride], op.instr.param, m, write=True)
    store_tile(core.vmem, "VMEM", addr, core.s[stride], op.instr.param, core.vu[va], m,
               core.m_rect[mask])


_VIEWS = {"f32": "vf", "i32": "vi", "u32": "vu"}


def _valu(core, op):
    ins = op.instr
    out_view = getattr(core, _VIEWS[ins.types[-1]])
    inputs = [getattr(core, _VIEWS[t])[r] for t, r in zip(ins.types[:-1], op.args[1:])]
    out_view[op.args[0]] = ins.fn(*inputs)


def _vbcast(core, op):
    core.vi[op.args[0]] = core.s[op.args[1]]


def _vli(core, op):
    core.vu[op.args[0]] = op.args[1] & I32_MASK


def _vcmp(core, op):
    ins = op.instr
    view = getattr(core, _VIEWS[ins.types[0]])
    md, va, vb = op.args
    if md:
        core.m[md] = ins.fn(view[va], view[vb])
        core.m_rect[md] = None


def _vsel(core, op):
    vd, mk, va, vb = op.args
    core.vu[vd] = np.where(core.m[mk], core.vu[va], core.vu[vb])


def _mlogic(core, op):
    md, *srcs = op.args
    if md:
        core.m[md] = op.instr.fn(*(core.m[r] for r in srcs))
        core.m_rect[md] = None


_SUB = np.arange(ROWS)[:, None]
_LANE = np.arange(LANES)[None, :]


def _mrows(core, op):
    md, sa, sb = op.args
    if md:
        rows, lanes = min(max(core.s[sa], 0), ROWS), min(max(core.s[sb], 0), LANES)
        core.m[md] = (_SUB < rows) & (_LANE < lanes)
        core.m_rect[md] = (rows, lanes)   # memory accesses take the rectangle fast path


def _viota(core, op):
    core.vi[op.args[0]] = np.broadcast_to(_LANE if op.instr.param == 1 else _SUB, (ROWS, LANES))


def _vreduce(core, op):
    ins = op.instr
    view = getattr(core, _VIEWS[ins.types[0]])
    vd, va = op.args
    axis = ins.param
    view[vd] = np.broadcast_to(np.expand_dims(ins.fn(view[va], axis), axis), (ROWS, LANES))


def _vbcastidx(core, op):
    vd, va, idx = op.args
    src = core.vu[va]
    if op.instr.param == 1:
        if idx >= LANES:
            raise Trap("bad-operand", f"lane index {idx} >= {LANES}")
        core.vu[vd] = np.broadcast_to(src[:, idx:idx + 1], (ROWS, LANES))
    else:
        if idx >= ROWS:
            raise Trap("bad-operand", f"sublane index {idx} >= {ROWS}")
        core.vu[vd] = np.broadcast_to(src[idx:idx + 1, :], (ROWS, LANES))


def _vrot(core, op):
    vd, va, amount = op.args
    core.vu[vd] = np.roll(core.vu[va], amount, axis=op.instr.param)


def _vcol(core, op):
    vd, va, block = op.args
    if block * ROWS >= LANES:
        raise Trap("bad-operand", f"vcol block {block} is beyond lane {LANES - 1}")
    column = core.vu[va, 0, block * ROWS:(block + 1) * ROWS]
    core.vu[vd] = np.broadcast_to(column[:, None], (ROWS, LANES))


def _element(core, index):
    if not 0 <= index < ROWS * LANES:
        raise Trap("bad-operand", f"element index {index} is outside 0..{ROWS * LANES - 1}")
    return divmod(index, LANES)


def _vextract(core, op):
    sd, va, sb = op.args
    r, lane = _element(core, core.s[sb])
    core.set_s(sd, int(core.vi[va, r, lane]))


def _vinsert(core, op):
    vd, sa, sb = op.args
    r, lane = _element(core, core.s[sb])
    core.vi[vd, r, lane] = core.s[sa]


def _mxu_ldw(core, op):
    x, off, sa, stride, shape = op.args
    shape_value = core.s[shape]
    rows, cols = (shape_value >> 16) & 0xFFFF, shape_value & 0xFFFF
    d = core.profile.mxu_dim
    if not (0 < rows <= d and 0 < cols <= d and cols % LANES == 0):
        raise Trap("bad-operand", f"weight tile shape {rows}x{cols} does not fit the {d}x{d} matrix unit "
                                  "(columns must be a multiple of 128)")
    addr = core.s[sa] + off
    step = core.s[stride]
    core.check_vmem_span(addr, step, rows, cols * 2, write=False)
    _align("VMEM", addr, step, 2)
    raw = row_view(core.vmem, "VMEM", addr, step, cols * 2, rows).view(np.uint16)
    w = core.mx_w[x]
    if op.instr.param == "t":
        # Transposed load: memory row j holds weight column j (rows x cols in memory
        # become a cols x rows tile), e.g. a key cache stored one token per row.
        w[:cols, :rows] = nx.bf16_bits_to_f32(raw).T
        w[:cols, rows:] = 0
        core.mx_rows[x] = cols
    else:
        w[:rows, :cols] = nx.bf16_bits_to_f32(raw)
        w[:rows, cols:] = 0
        core.mx_rows[x] = rows


def _mxu_push(core, op):
    x, va, chunk = op.args
    core.mx_lhs[x][:, chunk * LANES:(chunk + 1) * LANES] = nx.bf16_round(core.vf[va])


def _mxu_mac(core, op):
    x, acc, zero = op.args
    rows = core.mx_rows[x]
    if rows == 0:
        raise Trap("bad-operand", f"mxu.mac on x{x} before any weight tile was loaded")
    start = np.zeros_like(core.mx_acc[x, acc]) if zero else core.mx_acc[x, acc]
    # Both operands are bf16 values already (push rounds, ldw loads bf16).
    core.mx_acc[x, acc] = nx.mxu_matmul_bf16(start, core.mx_lhs[x][:, :rows], core.mx_w[x][:rows])


def _mxu_pop(core, op):
    vd, x, acc, chunk = op.args
    core.vf[vd] = core.mx_acc[x, acc][:, chunk * LANES:(chunk + 1) * LANES]


def _illegal(core, op):
    raise Trap("illegal-instruction", op.values["problem"])


def _mark_push(core, op):
    region, sa = op.args
    core.regions.append((region, core.s[sa], core.t))


def _mark_pop(core, op):
    if not core.regions:
        raise Trap("bad-region", "mark.pop without a matching mark.push")
    region, _, start = core.regions.pop()
    core.region_cycles[region] = core.region_cycles.get(region, 0) + core.t - start
    core.region_entries[region] = core.region_entries.get(region, 0) + 1


HANDLERS = {
    "nop": _nop, "li": _li, "salu": _salu, "salui": _salui, "branch": _branch, "jump": _jump,
    "lds": _lds, "sts": _sts, "rdsr": _rdsr, "vld": _vld, "vst": _vst, "valu": _valu,
    "vbcast": _vbcast, "vli": _vli, "vcmp": _vcmp, "vsel": _vsel, "mlogic": _mlogic,
    "mrows": _mrows, "viota": _viota, "vreduce": _vreduce, "vbcastidx": _vbcastidx,
    "vrot": _vrot, "vcol": _vcol, "vextract": _vextract, "vinsert": _vinsert, "mxu_ldw": _mxu_ldw,
    "mxu_push": _mxu_push, "mxu_mac": _mxu_mac, "mxu_pop": _mxu_pop,
    "mark_push": _mark_push, "mark_pop": _mark_pop, "illegal": _illegal,
}
