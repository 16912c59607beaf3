"""Tile expressions to vector and matrix-unit code.

A tile of shape [R, C] is computed one block of 8 rows x 128 lanes at a time: the
expression tree is walked per block (`ev`), each leaf loaded with the block's
offsets (a broadcast operand with one row is loaded with row stride 0, one with one
column is loaded and its lane 0 broadcast), partial blocks masked. Few blocks are
unrolled; many become a scalar loop over blocks with computed addresses.

What is not elementwise (reductions, matmul, transposes, windows of computed
tiles) is first materialized into a VMEM temporary on the statement's stack, then
read like a buffer. Reductions follow the numeric contract's halving tree over the
padded length; matmuls feed the matrix unit in increasing k so every output is the
sequential-k f32 accumulation, independent of tiling.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from mkemu.dsl import ir, layout
from mkemu.dsl.values import count_of
from mkemu.isa.numerics import bf16_round

UNROLL_BLOCKS = 8
INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1

F32_BIN = {"+": "vadd.f32", "-": "vsub.f32", "*": "vmul.f32", "/": "vdiv.f32",
           "max": "vmax.f32", "min": "vmin.f32"}
I32_BIN = {"+": "vadd.i32", "-": "vsub.i32", "*": "vmul.i32", "&": "vand.i32", "|": "vor.i32",
           "^": "vxor.i32", "<<": "vshl.i32", ">>": "vsra.i32", "max": "vmax.i32", "min": "vmin.i32"}
CMP = {"==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}
EUP = {"exp": "vexp.f32", "log": "vlog.f32", "exp2": "vexp2.f32", "log2": "vlog2.f32",
       "sqrt": "vsqrt.f32", "rsqrt": "vrsqrt.f32", "recip": "vrcp.f32", "sigmoid": "vsigmoid.f32",
       "tanh": "vtanh.f32", "silu": "vsilu.f32"}
COMPLEX = (ir.Reduce, ir.Matmul, ir.Transpose)


@attrs.define
class View:
    """A 2-D window of VMEM: address = s[base_reg] + off + row * pitch + col * elem."""

    base_reg: int | None
    off: int
    pitch: int
    rows: int
    cols: int
    dtype: str                  # storage: bf16 | f32 | i32
    buf_cols: int               # columns of the underlying buffer
    lane_bcast: bool = False    # every lane of a row holds the value (compiler temporaries, C == 1)
    is_mask: bool = False       # a bool tile stored as i32 0/1
    extent: object = None       # the named buffer (isa.program.Extent) for bounds checks

    @property
    def elem(self) -> int:
        return layout.ELEM_BYTES[self.dtype]


@attrs.frozen
class Blk:
    """One 8 x 128 block: first row and column, and how many rows and columns are valid.
    Each is (register or None, constant): the value is s[reg] + constant."""

    r0: tuple
    c0: tuple
    vr: tuple
    vc: tuple


def S(v: int) -> tuple:
    return (None, v)


def _f32_bits(value: float) -> int:
    """The float32 bits of a literal, rounded once (a literal past float32's range is
    +-inf, as IEEE rounding makes it, without numpy's overflow warning)."""
    with np.errstate(over="ignore"):
        return int(np.array([value], np.float32).view(np.uint32)[0])


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class TileLowering:
    """Mixin of `KernelCompiler`: everything about tiles."""

    # -- registers -------------------------------------------------------------

    def vreg(self) -> int:
        if not self.free_vregs:
            n = self.profile.vregs
            self.error(f"this expression needs more than {count_of(n, 'vector register')}; split it with `let` "
                       f"{self.register_note(n, 'vector')}")
        return self.free_vregs.pop()

    def vfree(self, v: int) -> None:
        self.free_vregs.append(v)

    def mreg(self) -> int:
        if not self.free_mregs:
            arena = self.arenas[-1]
            if arena.masks:
                key = next(iter(arena.masks))
                self.free_mregs.append(arena.masks.pop(key))
        if not self.free_mregs:
            n = self.profile.mregs
            self.error(f"this expression needs more than {count_of(n - 1, 'mask register')}; split it with `let` "
                       f"{self.register_note(n, 'mask', ', m0 being the all-true mask')}")
        return self.free_mregs.pop()

    def mfree(self, m: int) -> None:
        if m not in self.arenas[-1].masks.values():
            self.free_mregs.append(m)

    def idx_reg(self, idx: tuple) -> int:
        """A register holding an index value (cached constant or a temp the caller releases)."""
        reg, const = idx
        if reg is None:
            return self.const_reg(const)
        if const == 0:
            return reg
        t = self.tmp()
        self.emit("addi", sd=t, sa=reg, imm=const)
        return t

    def geometry_mask(self, rows: tuple, cols: tuple) -> int:
        """Mask of elements with sublane < rows and lane < cols (0 = all)."""
        if rows == S(8) and cols == S(128):
            return 0
        arena = self.arenas[-1]
        key = (rows, cols)
        m = arena.masks.get(key)
        if m is not None:
            return m
        if len(arena.masks) >= 3:
            old = next(iter(arena.masks))
            self.free_mregs.append(arena.masks.pop(old))
        m = self.mreg()
        ra, rb = self.idx_reg(rows), self.idx_reg(cols)
        self.emit("mrows", md=m, sa=ra, sb=rb)
        for r, idx in ((ra, rows), (rb, cols)):
            if idx[0] is not None and r != idx[0]:
                self.release(r)
        arena.masks[key] = m
        return m

    # -- views -------------------------------------------------------------------

    def view_of_ref(self, ref: ir.Ref) -> View:
        buf = ref.buffer
        if buf.space not in ("vmem", "var"):
            self.error(f"'{buf.name}' is in {buf.space.upper()}: tile expressions read and write "
                       "VMEM buffers and vars (copy it into VMEM first)", ref.span)
        dims = [d for d, n in enumerate(ref.sizes) if n is not None]
        if len(buf.shape) == 2 and dims == [0]:
            self.error("a column of a VMEM buffer taken as a row vector is not supported; "
                       "slice it as x[:, j:j+1]", ref.span)
        reg, const = self.ref_address(ref)
        rows, cols = ref.tile_shape
        _, bcols = layout.tile_dims(buf.shape)
        return View(reg, const, layout.buffer_strides(buf)[0] if len(buf.shape) == 2 else 0,
                    rows, cols, buf.dtype, bcols, lane_bcast=False, extent=self.extent(buf))

    def temp_view(self, dtype: str, shape: tuple[int, int]) -> View:
        rows, cols = shape
        is_mask = dtype == "bool"
        store = "i32" if is_mask else dtype
        addr = self.vmem_push(layout.vmem_slot_bytes(store, (rows, cols)))
        return View(None, addr, layout.pitch_bytes(store, cols), rows, cols, store, cols,
                    lane_bcast=cols == 1, is_mask=is_mask)

    def sub_view(self, v: View, r: int, c: int, rows: int, cols: int) -> View:
        return attrs.evolve(v, off=v.off + r * v.pitch + c * v.elem, rows=rows, cols=cols,
                            lane_bcast=v.lane_bcast and cols == 1)

    # -- statements ----------------------------------------------------------------

    def let_tile(self, value: ir.TileValue, expr) -> None:
        view = self.temp_view(value.dtype, value.shape)
        self.values[value] = view
        self.lower_into(view, expr, None)

    def store_tile(self, ref: ir.Ref, value, op: str | None) -> None:
        col = _column_ref(ref)
        if col is not None:
            # x[:, j] = row: the [1, R] row goes down the column x[:, j:j+1].
            ref = col
            if value.shape != (1, 1):
                value = ir.Transpose(value, value.dtype, (value.shape[1], 1), value.span)
        dest = self.view_of_ref(ref)
        if self.hazard(ref, value):
            tmp = self.temp_view(value.dtype, value.shape)
            self.lower_into(tmp, value, None)
            value = TempRead(tmp, value.dtype, value.shape, value.span)
        self.lower_into(dest, value, op)

    def hazard(self, ref: ir.Ref, value) -> bool:
        """Would writing `ref` block by block change what `value` still has to read?"""
        if isinstance(value, COMPLEX):
            return any(isinstance(n, ir.Load) and n.ref.buffer is ref.buffer for n in _walk(value))
        key = _key(ref)

        def visit(node) -> bool:
            if isinstance(node, COMPLEX):
                return False        # materialized before the first store
            if isinstance(node, ir.Load) and node.ref.buffer is ref.buffer and _key(node.ref) != key:
                return True
            return any(visit(c) for c in _children(node))

        return visit(value)

    def lower_into(self, dest: View, value, op: str | None) -> None:
        """Compute `value` (broadcast to dest's shape) into `dest` (dest = dest op value)."""
        sink = lambda v, blk: self.store_block(dest, v, blk, op, value.dtype)  # noqa: E731
        if isinstance(value, ir.Matmul) and (value.shape == (dest.rows, dest.cols)):
            if dest.lane_bcast:
                # A one-column temporary holds its value in every lane; a popped
                # accumulator holds it in lane 0 only.
                def sink(v, blk, _sink=sink):
                    self.emit("vbcast.lane", vd=v, va=v, idx=0)
                    _sink(v, blk)
            self.matmul(value, sink)
            return
        if isinstance(value, ir.Reduce) and value.shape == (dest.rows, dest.cols):
            self.reduce(value, sink)
            return
        if isinstance(value, ir.Transpose) and value.shape == (dest.rows, dest.cols):
            self.transpose(value, sink)
            return
        self.prepare(value)
        self.for_blocks(dest.rows, dest.cols, lambda blk: sink(self.ev(value, blk), blk))

    def store_block(self, dest: View, v: int, blk: Blk, op: str | None, dtype: str) -> None:
        if dtype == "bool":
            # A mask stored as i32 0/1.
            one, zero = self.vreg(), self.vreg()
            self.emit("vli.i32", vd=one, imm=1)
            self.emit("vli.i32", vd=zero, imm=0)
            self.emit("vsel", vd=one, mk=v, va=one, vb=zero)
            self.vfree(zero)
            self.mfree(v)
            v = one
        if op is not None:
            table = I32_BIN if dest.dtype == "i32" else F32_BIN
            if op not in table:   # `ii /= ...` on an i32 buffer, as `ii = ii / ...` is
                self.error(f"'{op}=' on {dest.dtype} has no vector instruction "
                           "(integer tile division and remainder are not supported)")
            cur = self.load_view(dest, blk)
            self.emit(table[op], vd=cur, va=cur, vb=v)
            self.vfree(v)
            v = cur
        addr, off = self.view_address(dest, blk)
        stride = 0 if dest.rows == 1 else self.const_reg(dest.pitch)
        rows = S(8) if dest.rows == 1 else blk.vr
        cols = S(128) if (dest.cols == 1 and dest.buf_cols == 1) else (S(1) if dest.cols == 1 else blk.vc)
        mask = self.geometry_mask(rows, cols)
        self.emit("vst.bf16" if dest.dtype == "bf16" else "vst.w", va=v, off=off, sa=addr,
                  stride=stride, mask=mask, extents=(dest.extent,))
        self.vfree(v)

    # -- blocks ----------------------------------------------------------------------

    def for_blocks(self, rows: int, cols: int, body) -> None:
        nrb, ncb = -(-rows // 8), -(-cols // 128)
        if nrb * ncb <= UNROLL_BLOCKS:
            for rb in range(nrb):
                for cb in range(ncb):
                    self.block_cache = {}
                    body(Blk(S(rb * 8), S(cb * 128), S(min(8, rows - rb * 8)), S(min(128, cols - cb * 128))))
                    self.end_block()
            return
        self.flush_caches()
        rr = self.tmp() if nrb > 1 else None
        cr = self.tmp() if ncb > 1 else None
        loops = []
        if rr is not None:
            self.emit("li", sd=rr, imm=0)
            top = self.label("rows")
            self.place(top)
            loops.append((rr, 8, nrb * 8, top))
        vr = S(min(8, rows))
        if rr is not None:
            vr = self.valid_count(rr, rows, 8)
        if cr is not None:
            self.emit("li", sd=cr, imm=0)
            top = self.label("cols")
            self.place(top)
            loops.append((cr, 128, ncb * 128, top))
        vc = S(min(128, cols))
        if cr is not None:
            vc = self.valid_count(cr, cols, 128)
        self.block_cache = {}
        body(Blk((rr, 0) if rr is not None else S(0), (cr, 0) if cr is not None else S(0), vr, vc))
        self.end_block()
        for reg, step, end, top in reversed(loops):
            self.emit("addi", sd=reg, sa=reg, imm=step)
            t = self.tmp()
            self.emit("li", sd=t, imm=end)
            self.emit("blt", sa=reg, sb=t, target=top)
            self.release(t)
            if reg == rr and vr[0] is not None:
                self.release(vr[0])
            if reg == cr and vc[0] is not None:
                self.release(vc[0])
            self.flush_caches()
        self.release(rr)
        self.release(cr)

    def valid_count(self, reg: int, total: int, block: int) -> tuple:
        self.flush_caches()
        if total % block == 0:
            return S(block)
        t = self.tmp()
        self.emit("li", sd=t, imm=total)
        self.emit("sub", sd=t, sa=t, sb=reg)
        self.emit("mini", sd=t, sa=t, imm=block)
        return (t, 0)

    def end_block(self) -> None:
        for r in self.block_cache.values():
            self.release(r)
        self.block_cache = {}

    def view_address(self, v: View, blk: Blk) -> tuple[int, int]:
        """(register, offset) addressing the block's first element in view `v`. A computed
        register belongs to the block cache (released by `end_block`)."""
        off = v.off
        terms: list = []
        if v.base_reg is not None:
            terms.append(v.base_reg)
        if v.rows > 1:
            reg, const = blk.r0
            off += const * v.pitch
            if reg is not None:
                terms.append((reg, v.pitch))
        if v.cols > 1:
            reg, const = blk.c0
            off += const * v.elem
            if reg is not None:
                terms.append((reg, v.elem))
        if not terms:
            return 0, off
        if len(terms) == 1 and isinstance(terms[0], int):
            return terms[0], off
        key = tuple(terms)
        acc = self.block_cache.get(key)
        if acc is not None:
            return acc, off
        acc = self.tmp()
        for i, term in enumerate(terms):
            if isinstance(term, int):
                src = term
            else:
                reg, scale = term
                src = acc if i == 0 else self.tmp()
                if scale & (scale - 1) == 0:
                    self.emit("shli", sd=src, sa=reg, imm=scale.bit_length() - 1)
                else:
                    self.emit("muli", sd=src, sa=reg, imm=scale)
            if i == 0:
                if src != acc:
                    self.emit("add", sd=acc, sa=src, sb=0)
            else:
                self.emit("add", sd=acc, sa=acc, sb=src)
                if src != term:
                    self.release(src)
        self.block_cache[key] = acc
        return acc, off

    def load_view(self, v: View, blk: Blk) -> int:
        """Load the block of view `v` (broadcast where v has one row or column)."""
        reg, off = self.view_address(v, blk)
        stride = 0 if v.rows == 1 else self.const_reg(v.pitch)
        rows = S(8) if v.rows == 1 else blk.vr
        if v.cols == 1:
            cols = S(128) if v.lane_bcast else S(1)
        else:
            cols = blk.vc
        mask = self.geometry_mask(rows, cols)
        vd = self.vreg()
        self.emit("vld.bf16" if v.dtype == "bf16" else "vld.w", vd=vd, off=off, sa=reg,
                  stride=stride, mask=mask, extents=(v.extent,))
        if v.cols == 1 and not v.lane_bcast:
            self.emit("vbcast.lane", vd=vd, va=vd, idx=0)
        if v.is_mask:
            zero = self.vreg()
            self.emit("vli.i32", vd=zero, imm=0)
            m = self.mreg()
            self.emit("vcmpne.i32", md=m, va=vd, vb=zero)
            self.vfree(zero)
            self.vfree(vd)
            return m
        return vd

    # -- preparing an expression -----------------------------------------------------

    def prepare(self, node) -> None:
        """Before the block loop: compute views of loads, scalars of splats, and
        materialize whatever is not elementwise."""
        pre = self.pre = getattr(self, "pre", {})
        if id(node) in pre:
            return
        if isinstance(node, ir.Load):
            pre[id(node)] = self.view_of(node)
        elif isinstance(node, ir.ValueRead):
            pre[id(node)] = self.values[node.value]
        elif isinstance(node, TempRead):
            pre[id(node)] = node.view
        elif isinstance(node, ir.Splat):
            pre[id(node)] = self.sval(node.scalar)
        elif isinstance(node, ir.TileSlice):
            base = self.view_of(node.arg)
            pre[id(node)] = self.sub_view(base, node.starts[0], node.starts[1], *node.shape)
        elif isinstance(node, COMPLEX):
            pre[id(node)] = self.materialize(node)
        else:
            for child in _children(node):
                self.prepare(child)

    def view_of(self, node) -> View:
        """A VMEM view holding tile `node` (materializing it if needed)."""
        if isinstance(node, ir.Load):
            col = _column_ref(node.ref) if node.dtype != "mxfp4" else None
            if col is not None:
                # x[:, j] is the [1, R] row of column j: transposed into a temporary.
                rows = col.tile_shape[0]
                load = ir.Load(col, node.dtype, (rows, 1), node.span)
                return self.materialize(ir.Transpose(load, node.dtype, (1, rows), node.span))
            return self.view_of_ref(node.ref)
        if isinstance(node, ir.ValueRead):
            return self.values[node.value]
        if isinstance(node, TempRead):
            return node.view
        if isinstance(node, ir.TileSlice):
            base = self.view_of(node.arg)
            return self.sub_view(base, node.starts[0], node.starts[1], *node.shape)
        return self.materialize(node)

    def materialize(self, node, dtype: str | None = None) -> View:
        view = self.temp_view(dtype or node.dtype, node.shape)
        saved = self.pre
        self.pre = {}
        self.lower_into(view, node, None)
        self.pre = saved
        return view

    # -- the per-block tree walk -------------------------------------------------------

    def ev(self, node, blk: Blk) -> int:
        """The block `blk` of `node` (broadcast to the block): a vector register, or a
        mask register for bool tiles. The caller owns the result."""
        prev, self.span = self.span, node.span
        try:
            return self._ev(node, blk)
        finally:
            self.span = prev

    def _ev(self, node, blk: Blk) -> int:
        got = self.pre.get(id(node))
        if isinstance(got, View):
            return self.load_view(got, blk)
        if isinstance(node, ir.Splat):
            vd = self.vreg()
            self.emit("vbcast", vd=vd, sa=got)
            return vd
        if isinstance(node, ir.Literal):
            return self.literal(node.value, node.dtype)
        if isinstance(node, ir.Iota):
            return self.iota(node, blk)
        if isinstance(node, ir.Convert):
            return self.convert(node, blk)
        if isinstance(node, ir.Elementwise):
            return self.elementwise(node, blk)
        self.error(f"internal: cannot evaluate {type(node).__name__} per block")

    def literal(self, value, dtype: str) -> int:
        vd = self.vreg()
        if dtype == "i32":
            v = int(value)
            if not INT_MIN <= v <= INT_MAX:
                self.error(f"the constant {v:,} does not fit in 32 bits (int32 is {INT_MIN:,}..{INT_MAX:,})")
            self.emit("vli.i32", vd=vd, imm=v)
        elif dtype == "bool":
            self.vfree(vd)
            m = self.mreg()
            self.emit("mrows", md=m, sa=self.const_reg(8 if value else 0), sb=self.const_reg(128))
            return m
        else:
            x = float(value)
            if dtype == "bf16":
                with np.errstate(over="ignore"):
                    x = float(bf16_round(np.float32(x)))
            self.emit("vli.f32", vd=vd, imm=_f32_bits(x))
        return vd

    def iota(self, node: ir.Iota, blk: Blk) -> int:
        vd = self.vreg()
        n = node.shape[0] if node.axis == 0 else node.shape[1]
        if n == 1:
            self.emit("vli.i32", vd=vd, imm=0)
            return vd
        self.emit("viota.sub" if node.axis == 0 else "viota.lane", vd=vd)
        reg, const = blk.r0 if node.axis == 0 else blk.c0
        if reg is not None or const:
            t = self.vreg()
            if reg is None:
                self.emit("vli.i32", vd=t, imm=const)
            else:
                r = self.idx_reg((reg, const))
                self.emit("vbcast", vd=t, sa=r)
                if r != reg:
                    self.release(r)
            self.emit("vadd.i32", vd=vd, va=vd, vb=t)
            self.vfree(t)
        return vd

    def convert(self, node: ir.Convert, blk: Blk) -> int:
        src, dst = node.arg.dtype, node.dtype
        v = self.ev(node.arg, blk)
        if src == "bool":
            one, zero = self.vreg(), self.vreg()
            if dst == "i32":
                self.emit("vli.i32", vd=one, imm=1)
                self.emit("vli.i32", vd=zero, imm=0)
            else:
                self.emit("vli.f32", vd=one, imm=_f32_bits(1.0))
                self.emit("vli.f32", vd=zero, imm=0)
            self.emit("vsel", vd=one, mk=v, va=one, vb=zero)
            self.vfree(zero)
            self.mfree(v)
            return one
        if dst == "f32":
            if src == "i32":
                self.emit("vcvt.f32.i32", vd=v, va=v)
        elif dst == "bf16":
            if src == "i32":
                self.emit("vcvt.f32.i32", vd=v, va=v)
            if src != "bf16":
                self.emit("vround.bf16", vd=v, va=v)
        elif dst == "i32":
            if src in ("f32", "bf16"):
                self.emit("vcvt.i32.f32", vd=v, va=v)
        return v

    def elementwise(self, node: ir.Elementwise, blk: Blk) -> int:
        op, args = node.op, node.args
        if op == "where":
            m = self.ev(args[0], blk)
            a = self.ev(args[1], blk)
            b = self.ev(args[2], blk)
            self.emit("vsel", vd=a, mk=m, va=a, vb=b)
            self.vfree(b)
            self.mfree(m)
            return a
        dtype = args[0].dtype
        if dtype == "bool":
            return self.mask_op(op, args, blk)
        if op in EUP:
            v = self.ev(args[0], blk)
            self.emit(EUP[op], vd=v, va=v)
            return v
        if op == "neg":
            v = self.ev(args[0], blk)
            t = self.vreg()
            if dtype == "i32":
                self.emit("vli.i32", vd=t, imm=0)
                self.emit("vsub.i32", vd=v, va=t, vb=v)
            else:
                self.emit("vli.i32", vd=t, imm=INT_MIN)
                self.emit("vxor.i32", vd=v, va=v, vb=t)
            self.vfree(t)
            return v
        if op == "abs":
            v = self.ev(args[0], blk)
            if dtype == "i32":
                t = self.vreg()
                self.emit("vli.i32", vd=t, imm=0)
                self.emit("vsub.i32", vd=t, va=t, vb=v)
                self.emit("vmax.i32", vd=v, va=v, vb=t)
                self.vfree(t)
            else:
                self.emit("vabs.f32", vd=v, va=v)
            return v
        if op in CMP:
            a = self.ev(args[0], blk)
            b = self.ev(args[1], blk)
            m = self.mreg()
            self.emit(f"vcmp{CMP[op]}.{'i32' if dtype == 'i32' else 'f32'}", md=m, va=a, vb=b)
            self.vfree(a)
            self.vfree(b)
            return m
        table = I32_BIN if dtype == "i32" else F32_BIN
        if op not in table:
            self.error(f"tile operator '{op}' on {dtype} has no vector instruction "
                       "(integer tile division and remainder are not supported)")
        a = self.ev(args[0], blk)
        b = self.ev(args[1], blk)
        self.emit(table[op], vd=a, va=a, vb=b)
        self.vfree(b)
        return a

    def mask_op(self, op: str, args, blk: Blk) -> int:
        a = self.ev(args[0], blk)
        if op == "!":
            self.emit("mnot", md=a, ma=a)
            return a
        b = self.ev(args[1], blk)
        if op == "&":
            self.emit("mand", md=a, ma=a, mb=b)
        elif op == "|":
            self.emit("mor", md=a, ma=a, mb=b)
        elif op in ("^", "!="):
            t = self.mreg()
            self.emit("mand", md=t, ma=a, mb=b)
            self.emit("mor", md=a, ma=a, mb=b)
            self.emit("mnot", md=t, ma=t)
            self.emit("mand", md=a, ma=a, mb=t)
            self.mfree(t)
        elif op == "==":
            t = self.mreg()
            self.emit("mand", md=t, ma=a, mb=b)
            self.emit("mor", md=a, ma=a, mb=b)
            self.emit("mnot", md=a, ma=a)
            self.emit("mor", md=a, ma=a, mb=t)
            self.mfree(t)
        else:
            self.error(f"operator '{op}' on masks is not supported")
        self.mfree(b)
        return a

    # -- scalar(t) ---------------------------------------------------------------------

    def tile_to_scalar(self, tile, rd: int) -> None:
        saved = getattr(self, "pre", {})
        self.pre = {}
        self.prepare(tile)
        self.block_cache = {}
        v = self.ev(tile, Blk(S(0), S(0), S(1), S(1)))
        self.end_block()
        self.emit("vextract", sd=rd, va=v, sb=0)
        self.vfree(v)
        self.pre = saved

    # -- reductions ----------------------------------------------------------------------

    def reduce(self, node: ir.Reduce, sink) -> None:
        arg, axis, op = node.arg, node.axis, node.op
        R, C = arg.shape
        dtype = "i32" if arg.dtype == "i32" else "f32"
        self.prepare(arg)
        n_red, bs = (C, 128) if axis == 1 else (R, 8)
        n_keep, ks = (R, 8) if axis == 1 else (C, 128)
        nblocks = -(-n_red // bs)
        padded = next_pow2(max(n_red, bs)) // bs
        kind = "max" if op == "argmax" else op
        ident = {("sum", "f32"): 0.0, ("max", "f32"): -math.inf, ("min", "f32"): math.inf,
                 ("sum", "i32"): 0, ("max", "i32"): INT_MIN, ("min", "i32"): INT_MAX}[(kind, dtype)]
        combine = (I32_BIN if dtype == "i32" else F32_BIN)[{"sum": "+", "max": "max", "min": "min"}[kind]]
        lane = "lane" if axis == 1 else "sub"

        for kb in range(-(-n_keep // ks)):
            keep_valid = min(ks, n_keep - kb * ks)

            def blk_of(b: int) -> Blk:
                red_valid = min(bs, n_red - b * bs)
                if axis == 1:
                    return Blk(S(kb * 8), S(b * 128), S(keep_valid), S(red_valid))
                return Blk(S(b * 8), S(kb * 128), S(red_valid), S(keep_valid))

            def partial_mask(b: int) -> int | None:
                red_valid = min(bs, n_red - b * bs)
                if red_valid == bs:
                    return None
                return self.geometry_mask(S(8), S(red_valid)) if axis == 1 else \
                    self.geometry_mask(S(red_valid), S(128))

            def leaf(b: int):
                if b >= nblocks:
                    return None
                self.block_cache = {}
                v = self.ev(arg, blk_of(b))
                self.end_block()
                m = partial_mask(b)
                if m is not None:
                    t = self.literal(ident, dtype)
                    self.emit("vsel", vd=v, mk=m, va=v, vb=t)
                    self.vfree(t)
                return v

            def tree(idx: list[int]):
                if len(idx) == 1:
                    return leaf(idx[0])
                a = tree(idx[0::2])
                b = tree(idx[1::2])
                if a is None and b is None:
                    return None
                if kind != "sum" and (a is None or b is None):
                    return a if b is None else b      # max/min with the identity: exact
                if a is None:
                    a = self.literal(ident, dtype)
                if b is None:
                    b = self.literal(ident, dtype)
                self.emit(combine, vd=a, va=a, vb=b)
                self.vfree(b)
                return a

            v = tree(list(range(padded)))
            self.emit(f"vred{kind}.{lane}.{dtype}", vd=v, va=v)
            if op == "argmax":
                v = self.argmax_index(arg, v, nblocks, blk_of, partial_mask, axis, dtype)
            out = Blk(S(kb * 8), S(0), S(keep_valid), S(1)) if axis == 1 else \
                Blk(S(0), S(kb * 128), S(1), S(keep_valid))
            self.block_cache = {}
            sink(v, out)
            self.end_block()

    def argmax_index(self, arg, m: int, nblocks: int, blk_of, partial_mask, axis: int, dtype: str) -> int:
        """The lowest index along `axis` where the block row equals the maximum `m`."""
        best = None
        for b in range(nblocks):
            self.block_cache = {}
            x = self.ev(arg, blk_of(b))
            self.end_block()
            eq = self.mreg()
            self.emit(f"vcmpeq.{dtype}", md=eq, va=x, vb=m)
            if dtype == "f32":
                # The maximum is NaN exactly when some element is: then the first NaN.
                nan = self.mreg()
                self.emit("vcmpne.f32", md=nan, va=x, vb=x)
                self.emit("mor", md=eq, ma=eq, mb=nan)
                self.mfree(nan)
            pm = partial_mask(b)
            if pm is not None:
                self.emit("mand", md=eq, ma=eq, mb=pm)
            self.emit("viota.lane" if axis == 1 else "viota.sub", vd=x)
            if b:
                t = self.vreg()
                self.emit("vli.i32", vd=t, imm=b * (128 if axis == 1 else 8))
                self.emit("vadd.i32", vd=x, va=x, vb=t)
                self.vfree(t)
            big = self.literal(INT_MAX, "i32")
            self.emit("vsel", vd=x, mk=eq, va=x, vb=big)
            self.vfree(big)
            self.mfree(eq)
            if best is None:
                best = x
            else:
                self.emit("vmin.i32", vd=best, va=best, vb=x)
                self.vfree(x)
        self.vfree(m)
        self.emit(f"vredmin.{'lane' if axis == 1 else 'sub'}.i32", vd=best, va=best)
        return best

    # -- transposes --------------------------------------------------------------------------

    def transpose(self, node: ir.Transpose, sink) -> None:
        arg = node.arg
        R, C = arg.shape
        if arg.dtype == "bool":
            # A mask moves through lanes as i32 0/1 and is a mask again at the end.
            arg = ir.Convert(arg, "i32", arg.shape, arg.span)

            def sink(v, blk, _sink=sink):
                zero = self.vreg()
                self.emit("vli.i32", vd=zero, imm=0)
                m = self.mreg()
                self.emit("vcmpne.i32", md=m, va=v, vb=zero)
                self.vfree(zero)
                self.vfree(v)
                _sink(m, blk)
        self.prepare(arg)
        if R == 1 and C == 1:
            self.block_cache = {}
            sink(self.ev(arg, Blk(S(0), S(0), S(1), S(1))), Blk(S(0), S(0), S(1), S(1)))
            self.end_block()
            return
        if R == 1:
            # [1, N] -> [N, 1]: vcol turns 8 lanes of the row into a column.
            N = C
            row = None
            for ob in range(-(-N // 8)):
                cb = (ob * 8) // 128
                self.block_cache = {}
                if ob % 16 == 0:
                    if row is not None:
                        self.vfree(row)
                    row = self.ev(arg, Blk(S(0), S(cb * 128), S(1), S(min(128, N - cb * 128))))
                vd = self.vreg()
                self.emit("vcol", vd=vd, va=row, block=ob % 16)
                sink(vd, Blk(S(ob * 8), S(0), S(min(8, N - ob * 8)), S(1)))
                self.end_block()
            self.vfree(row)
            return
        if C == 1:
            # [N, 1] -> [1, N]: place each row block on the diagonal, then a max over sublanes.
            N = R
            f32 = arg.dtype != "i32"
            fill = -math.inf if f32 else INT_MIN
            diag = self.vreg()
            t = self.vreg()
            self.emit("viota.lane", vd=diag)
            self.emit("viota.sub", vd=t)
            self.emit("vsub.i32", vd=diag, va=diag, vb=t)
            self.vfree(t)
            for cb in range(-(-N // 128)):
                acc = self.literal(fill, "f32" if f32 else "i32")
                for j in range(16):
                    r0 = cb * 128 + j * 8
                    if r0 >= N:
                        break
                    self.block_cache = {}
                    v = self.ev(arg, Blk(S(r0), S(0), S(min(8, N - r0)), S(1)))
                    self.end_block()
                    k = self.literal(j * 8, "i32")
                    m = self.mreg()
                    self.emit("vcmpeq.i32", md=m, va=diag, vb=k)
                    self.emit("vsel", vd=acc, mk=m, va=v, vb=acc)
                    self.mfree(m)
                    self.vfree(k)
                    self.vfree(v)
                self.emit("vredmax.sub.f32" if f32 else "vredmax.sub.i32", vd=acc, va=acc)
                self.block_cache = {}
                sink(acc, Blk(S(0), S(cb * 128), S(1), S(min(128, N - cb * 128))))
                self.end_block()
            self.vfree(diag)
            return
        self.error(f"transpose of a [{R}, {C}] tile is only supported as the right operand of "
                   "matmul (a row [1, N] or a column [N, 1] transposes anywhere)")

    # -- matmul ----------------------------------------------------------------------------------

    def matmul(self, node: ir.Matmul, sink) -> None:
        lhs, rhs = node.lhs, node.rhs
        M, K = lhs.shape
        N = node.shape[1]
        transposed = isinstance(rhs, ir.Transpose)
        base = rhs.arg if transposed else rhs
        w = mx = None
        if isinstance(base, ir.Load) and base.dtype == "mxfp4":
            mx = self.mx_weights(base.ref)
        elif isinstance(base, (ir.Load, ir.ValueRead, ir.TileSlice, TempRead)):
            w = self.view_of(base)
        p = self.profile
        D, A, U = p.mxu_dim, p.mxu_accumulators, p.mxus_per_core
        # A weight tile is loaded in whole 128-column rows: a column block of a view that
        # ends near its buffer's right edge would read past the end of the buffer's last
        # row. Such a block is loaded from a window shifted left (so it ends at the row's
        # padded end) and its columns are rotated back into place when popped.
        shift: dict[int, int] = {}
        if not transposed and isinstance(base, ir.Load) and (mx is not None or w is not None and w.dtype == "bf16"):
            shift = self.weight_shifts(base.ref, N, D)
            if shift is None:
                if mx is not None:
                    self.error(f"matmul reads mxfp4 weights in tiles of whole 128-column rows: this view of "
                               f"'{base.ref.buffer.name}' (its column start known only at run time) may reach "
                               "past the end of the buffer; give it a static column start, or a start and "
                               "width that are multiples of 128", rhs.span)
                shift = {}
                w = self.materialize(base, "bf16")
        if mx is None and (w is None or w.dtype != "bf16"):
            # The matrix unit rounds its operands to bf16 anyway: a bf16 copy is exact.
            w = self.materialize(base, "bf16")
        if transposed and K % 128 and 1 in base.shape:
            # A row or a column transposes anywhere (docs/language.md): into a bf16
            # temporary as it is, loaded as any weights are, with no condition on K.
            w, transposed, shift = self.materialize(rhs, "bf16"), False, {}
        if transposed and K % 128:
            self.error(f"matmul with a transposed right operand needs K % 128 == 0 (K = {K})", rhs.span)
        self.prepare(lhs)
        nrb = -(-M // 8)
        stride = self.tmp()
        self.emit("li", sd=stride, imm=w.pitch if mx is None else mx.pitch)
        shape_reg = self.tmp()
        sc_reg = self.tmp() if mx is not None else None
        n_blocks = list(range(0, N, D))
        loaded_shape = None

        def load_weights(x: int, n0: int, k0: int) -> None:
            nonlocal loaded_shape
            kr, nc = min(D, K - k0), min(D, N - n0)
            n0 -= shift.get(n0, 0)
            if mx is not None:
                # Values of rows k0.. from byte n0/2 of each row; their scales from the
                # scale row of block k0/32, byte n0 (D is a multiple of 32).
                shape = (kr << 16) | layout.round_up(nc, 128)
                if shape != loaded_shape:
                    self.emit("li", sd=shape_reg, imm=shape)
                    loaded_shape = shape
                sc = mx.scales_off + k0 // layout.MX_BLOCK * 2 * mx.pitch + n0
                if mx.scales_reg is None:
                    self.emit("li", sd=sc_reg, imm=sc)
                else:
                    self.emit("addi", sd=sc_reg, sa=mx.scales_reg, imm=sc)
                self.emit("mxu.ldw.mx", x=x, off=mx.values_off + k0 * mx.pitch + n0 // 2,
                          sa=mx.values_reg or 0, stride=stride, shape=shape_reg, sc=sc_reg, extents=mx.extents)
                return
            if transposed:
                shape = (nc << 16) | layout.round_up(kr, 128)
                off = w.off + n0 * w.pitch + k0 * 2
            else:
                shape = (kr << 16) | layout.round_up(nc, 128)
                off = w.off + k0 * w.pitch + n0 * 2
            if shape != loaded_shape:
                self.emit("li", sd=shape_reg, imm=shape)
                loaded_shape = shape
            self.emit("mxu.ldwt" if transposed else "mxu.ldw", x=x, off=off,
                      sa=w.base_reg or 0, stride=stride, shape=shape_reg, extents=(w.extent,))

        def load_lhs(rb: int, k0: int) -> list[int]:
            kr = min(D, K - k0)
            regs = []
            for c in range(-(-kr // 128)):
                self.block_cache = {}
                regs.append(self.ev(lhs, Blk(S(rb * 8), S(k0 + c * 128), S(min(8, M - rb * 8)),
                                             S(min(128, kr - c * 128)))))
                self.end_block()
            return regs

        # Blocks of up to A row blocks (one accumulator each) x one output column block per
        # matrix unit; in each, the units' k loops interleaved so their accumulation
        # chains overlap: for each K tile, each row block's LHS is pushed to every unit
        # and multiplied into its accumulator. The order of passes, and so the bits, is
        # fixed; the instructions around them are software-pipelined so that the
        # single-issue core keeps the units fed: a row block's LHS is loaded before the
        # previous row block's passes (several at once at the start of a K tile, while
        # the passes wait for the new weights), each unit's next weight tile is loaded
        # as soon as its last pass on the current tile has started (a unit holds two
        # weight tiles, docs/architecture.md), and the next block's first tiles load
        # while this block's results are popped.
        blocks = [(list(range(g0, min(nrb, g0 + A))),
                   [(x, n_blocks[u0 + x]) for x in range(min(U, len(n_blocks) - u0))])
                  for g0 in range(0, nrb, A) for u0 in range(0, len(n_blocks), U)]
        ahead: list[list[int]] = []     # the LHS registers of the next steps, in order

        def prefetch(steps: list, s: int, depth: int) -> None:
            while len(ahead) < depth and s + len(ahead) < len(steps):
                _, k0, _, rb = steps[s + len(ahead)]
                ahead.append(load_lhs(rb, k0))

        for x, n0 in blocks[0][1]:
            load_weights(x, n0, 0)
        for b, (group, chunk) in enumerate(blocks):
            steps = [(kk, k0, i, rb) for kk, k0 in enumerate(range(0, K, D)) for i, rb in enumerate(group)]
            for s, (kk, k0, i, rb) in enumerate(steps):
                prefetch(steps, s, 1)
                for c, v in enumerate(ahead.pop(0)):
                    for x, _ in chunk:
                        self.emit("mxu.push", x=x, va=v, chunk=c)
                    self.vfree(v)
                depth = 1
                if i == 0:   # the rest of this tile's row blocks, as registers allow
                    chunks = -(-min(D, K - k0) // 128)
                    depth = max(1, min(len(group) - 1, len(self.free_vregs) // 2 // chunks))
                prefetch(steps, s + 1, depth)
                nxt = steps[s + 1] if s + 1 < len(steps) else None
                for x, n0 in chunk:
                    self.emit("mxu.mac", x=x, acc=i, zero=int(kk == 0))
                    if nxt is not None and nxt[0] != kk:
                        load_weights(x, n0, nxt[1])
            if b + 1 < len(blocks):
                for x, n0 in blocks[b + 1][1]:
                    load_weights(x, n0, 0)
            # Accumulator by accumulator across the units: in the order their last
            # passes finished.
            for i, rb in enumerate(group):
                for x, n0 in chunk:
                    nc = min(D, N - n0)
                    d = shift.get(n0, 0)
                    for c in range(-(-nc // 128)):
                        v = self.vreg()
                        self.emit("mxu.pop", vd=v, x=x, acc=i, chunk=c)
                        if d:
                            # Output lane l is accumulator column c*128 + l + d (d < 128).
                            self.emit("vrot.lane", vd=v, va=v, amount=128 - d)
                            if (c + 1) * 128 < layout.round_up(nc, 128):
                                hi = self.vreg()
                                self.emit("mxu.pop", vd=hi, x=x, acc=i, chunk=c + 1)
                                self.emit("vrot.lane", vd=hi, va=hi, amount=128 - d)
                                self.emit("vsel", vd=v, mk=self.geometry_mask(S(8), S(128 - d)), va=v, vb=hi)
                                self.vfree(hi)
                        self.block_cache = {}
                        sink(v, Blk(S(rb * 8), S(n0 + c * 128), S(min(8, M - rb * 8)),
                                    S(min(128, nc - c * 128))))
                        self.end_block()
        self.release(stride)
        self.release(shape_reg)
        self.release(sc_reg)

    def weight_shifts(self, ref: ir.Ref, N: int, D: int) -> dict[int, int] | None:
        """For the column blocks n0 (0, D, 2D, ... of the view) whose weight tile, read in
        whole 128-column rows, could run past the end of the buffer's last row: how far
        left to shift the load (columns). None when that depends on a run-time column
        start."""
        buf = ref.buffer
        R, C = layout.tile_dims(buf.shape)
        width = layout.round_up(C, 128)
        rows, cols = ref.tile_shape
        col = ref.offsets[-1] if ref.offsets else ir.Const(0, ref.span)
        row = ref.offsets[-2] if len(ref.offsets) >= 2 else ir.Const(0, ref.span)
        last = layout.MX_BLOCK if buf.dtype == "mxfp4" else 1
        # Only the last row of the buffer (the last scale row: mxfp4) has nothing after it.
        if isinstance(row, ir.Const) and row.value + rows <= R - last:
            return {}
        if buf.slots and isinstance(ref.slot, ir.Const) and ref.slot.value < buf.slots - 1:
            return {}
        hi = col.value if isinstance(col, ir.Const) else C - cols
        over = {n0: hi + n0 + layout.round_up(min(D, N - n0), 128) - width for n0 in range(0, N, D)}
        over = {n0: d for n0, d in over.items() if d > 0}
        if over and not isinstance(col, ir.Const):
            return None
        return over

    def mx_weights(self, ref: ir.Ref) -> "MxWeights":
        """Where the parts of an MXFP4 VMEM view are (docs/language.md, "Back end rules")."""
        if self.profile.mxu_dim % layout.MX_BLOCK:
            self.error(f"mxfp4 weights need a matrix unit of a multiple of {layout.MX_BLOCK} rows "
                       f"(profile '{self.profile.name}' has {self.profile.mxu_dim})", ref.span)
        values_reg, values_off = self.ref_address(ref, "values")
        scales_reg, scales_off = self.ref_address(ref, "scales")
        return MxWeights(values_reg, values_off, scales_reg, scales_off,
                         layout.part_strides(ref.buffer, "values")[0],
                         (self.extent(ref.buffer, "values"), self.extent(ref.buffer, "scales")))


@attrs.frozen
class MxWeights:
    """An MXFP4 weight view in VMEM: its values and scales at s[reg] + off (reg None:
    0), value rows `pitch` bytes apart (scale rows twice that)."""

    values_reg: int | None
    values_off: int
    scales_reg: int | None
    scales_off: int
    pitch: int
    extents: tuple


@attrs.frozen
class TempRead:
    """A read of a compiler temporary (a materialized value)."""

    view: View
    dtype: str
    shape: tuple[int, int]
    span: object


def _column_ref(ref: ir.Ref) -> ir.Ref | None:
    """For a view of a 2-D VMEM buffer that indexes its column by a point (`x[:, j]`, a
    [1, R] row of the column's values), the column as an [R, 1] view; else None."""
    if len(ref.buffer.shape) != 2 or ref.buffer.space not in ("vmem", "var"):
        return None
    if ref.sizes[0] is None or ref.sizes[1] is not None:
        return None
    return attrs.evolve(ref, sizes=(ref.sizes[0], 1))


def _children(node):
    if isinstance(node, ir.Elementwise):
        return node.args
    if isinstance(node, (ir.Convert, ir.Reduce, ir.Transpose, ir.TileSlice)):
        return (node.arg,)
    if isinstance(node, ir.Matmul):
        return (node.lhs, node.rhs)
    return ()


def _walk(node):
    yield node
    for c in _children(node):
        yield from _walk(c)


def _key(x):
    """Structural identity of IR values, ignoring source spans."""
    if isinstance(x, ir.Ref):
        return ("ref", id(x.buffer), _key(x.slot), tuple(_key(o) for o in x.offsets), x.sizes)
    if isinstance(x, ir.Const):
        return ("c", x.value)
    if isinstance(x, ir.ScalarRead):
        return ("v", id(x.var))
    if isinstance(x, ir.ScalarOp):
        return ("op", x.op, tuple(_key(a) for a in x.args))
    if x is None:
        return None
    return ("other", id(x))
