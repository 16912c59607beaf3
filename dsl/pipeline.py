"""The pipeline statement: a multi-buffered stream of tiles, declared, not hand-written.

In the spirit of Pallas's BlockSpec / `emit_pipeline` (a body written for one block;
the index map says which block of each operand it sees; the pipeline double-buffers
the copies), a kernel author writes the tile body and the view of tile t of each
operand; this module generates the slots, the semaphores and the slot arithmetic:

    pipeline t in A..B [step S] [depth D] [part P] {
        input x = VIEW_X(t) [via BUF, SEMS];    // copied into a slot before the body
        output y = VIEW_Y(t);                   // copied out of a slot after it
        ... body: x and y are this tile's VMEM slots ...
    }

For the n = ceil((B - A) / S) tiles t = A + k*S, k = 0..n-1, with D slots per stream:

- before the loop, the input copies of tiles 0 .. D-2 start (the prologue);
- iteration k starts the input copies of tile k + D - 1 into the slot that tile k - 1
  used (its body is done), waits for tile k's inputs, waits until the output copy of
  tile k - D has left the slot that tile k will write, runs the body, and starts tile
  k's output copies;
- after the loop, the last min(n, D) output copies are waited for.

So the next tiles' loads, the current tile's compute and the previous tiles'
write-backs are in flight together. Each slot has its own semaphore and every wait
takes exactly one tile's bytes, so nothing is worked out by hand.

`via BUF, SEMS` uses an existing buffer array (D = its slot count; a slot may be
larger than the tile, which then takes its leading rows and columns) and semaphore
array instead of fresh ones, so several pipelines can share one ring of VMEM. Then a
pipeline can be split: `part prefetch` only starts the prologue (the first D - 1
tiles, e.g. a layer ahead; the body is not run), and a later `part primed` run of the
same pipeline over the same slots does the rest. P is a compile-time integer
(`whole` = 0, the default; `prefetch` = 1; `primed` = 2), so one fn holding the
pipeline serves both: called once with `prefetch` and later with `primed`.
"""

from __future__ import annotations

from mkemu.dsl import ast, ir
from mkemu.dsl.expressions import view_leaves
from mkemu.dsl.generics import Generics
from mkemu.dsl.values import POISON, ConstVal, DmaChoice, Scope, ViewChoice, describe
from mkemu.isa.hardware import MAX_SEMAPHORES


class Pipelines(Generics):
    """`pipeline` statements."""

    def s_PipeStream(self, s: ast.PipeStream, scope, out) -> None:
        self.error(s.span, f"'{s.kind} {s.name} = ...' declares a stream of a pipeline: it goes at the top of a "
                           "pipeline's block")

    def s_Pipeline(self, s: ast.Pipeline, scope, out) -> None:
        start = self.as_scalar(self.expr(s.start, scope), s.start.span, "an integer pipeline bound")
        stop = self.as_scalar(self.expr(s.stop, scope), s.stop.span, "an integer pipeline bound")
        step = 1 if s.step is None else self.const_int(s.step, scope, "the pipeline step")
        if step is not None and step <= 0:
            self.error(s.step.span, f"the pipeline step must be positive, got {step}")
            step = None
        depth = None if s.depth is None else self.const_int(s.depth, scope, "the pipeline depth")
        if depth is not None and depth <= 0:
            self.error(s.depth.span, f"the pipeline depth must be positive, got {depth}")
            depth = None
        elif depth is not None and depth > MAX_SEMAPHORES:   # (a slot each; its prefetch is unrolled)
            self.error(s.depth.span, f"the pipeline depth must be at most {MAX_SEMAPHORES:,} (a semaphore per slot), "
                                     f"got {depth:,}")
            depth = None
        part = 0 if s.part is None else self.const_int(s.part, scope, "the part of a pipeline")
        if part is not None and part not in (0, 1, 2):
            self.error(s.part.span, f"the part of a pipeline is whole (0), prefetch (1) or primed (2), got {part}")
            part = None
        streams, body = [], list(s.body.stmts)
        while body and isinstance(body[0], ast.PipeStream):
            streams.append(body.pop(0))
        misplaced = [st for st in body if isinstance(st, ast.PipeStream)]
        for st in misplaced:
            self.error(st.span, "a pipeline's streams (input/output) come first, before its body")
        if not streams and not misplaced:
            self.error(s.span, "a pipeline needs at least one stream: `input x = VIEW;` or `output y = VIEW;` at "
                               "the top of its block")
        if POISON in (start, stop) or None in (step, part) or (s.depth is not None and depth is None) \
                or not streams or misplaced:   # (misplaced streams: the body is not checked)
            return
        Pipe(self, s, scope, start, stop, step, depth, ("whole", "prefetch", "primed")[part], streams,
             body).emit(out)


class Pipe:
    """One pipeline statement being elaborated."""

    def __init__(self, c: Pipelines, s: ast.Pipeline, scope: Scope, start, stop, step: int, depth: int | None,
                 part: str, streams: list[ast.PipeStream], body: list):
        self.c, self.s, self.scope, self.part = c, s, scope, part
        self.start, self.stop, self.step = start, stop, step
        self.depth_given, self.streams, self.body = depth, streams, body
        self.inputs = [st for st in streams if st.kind == "input"]
        self.outputs = [st for st in streams if st.kind == "output"]
        self.span = s.span

    # -- scalars
    def const(self, v: int):
        return ir.Const(v, self.span)

    def op(self, o: str, a, b):
        """a o b, folding the identities a generated expression would otherwise pay for."""
        if isinstance(b, ir.Const) and ((o in ("+", "-") and b.value == 0) or (o in ("*", "/") and b.value == 1)):
            return a
        if isinstance(a, ir.Const) and ((o == "+" and a.value == 0) or (o == "*" and a.value == 1)):
            return b
        return self.c.scalar_binary(o, a, b, self.span)

    def mod(self, x, depth: int):
        """x mod depth for x >= 0: a mask when depth is a power of two."""
        if depth & (depth - 1) == 0:
            return self.op("&", x, self.const(depth - 1))
        return self.op("%", x, self.const(depth))

    def let(self, name: str, value, out: list):
        """value in a fresh variable (evaluated once), or value itself if it is a constant or a variable."""
        if isinstance(value, (ir.Const, ir.ScalarRead)):
            return value
        var = ir.ScalarVar(self.c.unique(name), "let", self.span)
        self.c.let_range(var, value)
        out.append(ir.LetScalar(var, value, self.span))
        return ir.ScalarRead(var, self.span)

    def tile_count(self, out: list):
        """n = max(0, ceil((stop - start) / step)): a Const, or a scalar evaluated once."""
        span = self.span
        if isinstance(self.start, ir.Const) and isinstance(self.stop, ir.Const):
            return self.const(max(0, -(-(self.stop.value - self.start.value) // self.step)))
        n = self.op("/", self.op("+", self.op("-", self.stop, self.start), self.const(self.step - 1)),
                    self.const(self.step))
        var = ir.ScalarVar(self.c.unique(f"{self.s.var}#tiles"), "let", span)
        out.append(ir.LetScalar(var, self.op("max", self.const(0), n), span))
        return ir.ScalarRead(var, span)

    def bind_t(self, k, scope: Scope, out: list) -> Scope:
        """A scope where the pipeline variable is tile k's t = start + k * step."""
        t = self.op("+", self.start, self.op("*", k, self.const(self.step)))
        if isinstance(t, ir.Const):
            entity = ConstVal(t.value)
        elif isinstance(t, ir.ScalarRead):   # t is the tile index itself: no instruction
            entity = t.var
        else:
            entity = ir.ScalarVar(self.c.unique(self.s.var), "let", self.s.var_span)
            self.c.let_range(entity, t)
            out.append(ir.LetScalar(entity, t, self.span))
        inner = Scope(scope)
        self.c.define(inner, self.s.var, entity, self.s.var_span, "pipeline variable")
        return inner

    # -- streams
    def view(self, st: ast.PipeStream, scope: Scope):
        v = self.c.expr(st.view, scope)
        if v is POISON:
            return None
        if isinstance(v, (ViewChoice, ir.Ref)) and not v.shape:   # (its slots would be buffers of no dimension)
            self.c.error(st.view.span, "a pipeline tile has at least 1 dimension, got a single element (keep one "
                                       "as a slice: x[i, j +: 1])")
            return None
        if isinstance(v, ViewChoice):   # a tile from one of several arrays: checked by select
            return v if all(self.c.mx_view(leaf, st.view.span) for leaf in view_leaves(v)) else None
        if not isinstance(v, ir.Ref) or (v.buffer.slots is not None and v.slot is None):
            self.c.error(st.view.span, f"a pipeline stream is a view of a buffer (tile t of an array), got "
                                       f"{self.c.kind_name(v)}")
            return None
        if v.buffer.space == "var":
            self.c.error(st.view.span, f"'{v.buffer.name}' is a var; a pipeline stream copies to or from a "
                                       "vmem, smem or hbm buffer")
            return None
        if len(v.shape) > 2:
            self.c.error(st.view.span, f"a pipeline tile has at most 2 dimensions, got {describe(v.shape)} "
                                       "(index the leading ones)")
            return None
        return v if self.c.mx_view(v, st.view.span) else None

    def slots_for(self, st: ast.PipeStream, tile: ir.Ref, depth: int | None):
        """(buffer array, semaphore array) of a stream: its `via`, or fresh ones (`depth`
        of them, 2 when None)."""
        c = self.c
        if st.via is None:
            depth = depth or 2
            space = (tile.first if isinstance(tile, ViewChoice) else tile).buffer.space
            made = c.error_context(f"the slots of pipeline stream '{st.name}'")
            buf = ir.Buffer(c.unique(st.name), "vmem" if space == "hbm" else space,
                            tile.dtype, tile.shape, depth, st.span, "local", made)
            if buf.space == "smem" and buf.dtype != "i32":
                buf = ir.Buffer(buf.name, "vmem", buf.dtype, buf.shape, depth, st.span, "local", made)
            sems = ir.Semaphore(c.unique(f"{st.name}.sem"), depth, st.span,
                                c.error_context(f"the semaphores of pipeline stream '{st.name}'"))
            c.ctx.buffers.append(buf)
            c.ctx.sems.append(sems)
            return buf, sems
        b, sr = c.expr(st.via[0], self.scope), c.expr(st.via[1], self.scope)
        if b is POISON or sr is POISON:
            return None
        if not isinstance(sr, ir.SemRef) or sr.sem.count is None or sr.index is not None:
            c.error(st.via[1].span, f"the semaphores of a stream are a whole semaphore array (sem[D]), got "
                                    f"{c.kind_name(sr)}")
            return None
        sv = sr.sem
        if not isinstance(b, ir.Ref) or b.buffer.slots is None or b.slot is not None:
            c.error(st.via[0].span, f"the slots of a stream are a whole buffer array (vmem T[D][...]), got "
                                    f"{c.kind_name(b)}")
            return None
        buf = b.buffer
        if buf.dtype != tile.dtype or len(buf.shape) != len(tile.shape) or any(
                bs < ts for bs, ts in zip(buf.shape, tile.shape)):
            c.error(st.via[0].span, f"slots {buf.dtype}{describe(buf.shape)} of '{buf.name}' cannot hold the "
                                    f"tile {tile.dtype}{describe(tile.shape)}")
            return None
        if sv.count != buf.slots:
            c.error(st.via[1].span, f"'{buf.name}' has {buf.slots} slots but '{sv.name}' {sv.count} semaphores: "
                                    "one per slot")
            return None
        if self.depth_given is not None and self.depth_given != buf.slots:
            c.error(self.s.depth.span, f"depth {self.depth_given}, but the slots of '{buf.name}' are "
                                       f"{buf.slots}")
            return None
        return buf, sv

    def slot_ref(self, buf: ir.Buffer, index, tile: ir.Ref) -> ir.Ref:
        return ir.Ref(buf, index, tuple(self.const(0) for _ in buf.shape), tile.shape, self.span)

    # -- DMAs (with the semaphore bookkeeping of start/wait statements)
    def start_copy(self, src, dst, sems: ir.Semaphore, index, out: list) -> None:
        self.c.post(sems, self.span, "pipeline copy started")
        out.append(self.c.start_of(self.copy_of(src, dst, ir.SemRef(sems, index, self.span)), self.span))

    def copy_of(self, src, dst, sref):
        """The copy of a tile (a choice of copies when the view is a run-time choice)."""
        for v, pick in ((src, lambda x: (x, dst)), (dst, lambda x: (src, x))):
            if isinstance(v, ViewChoice):
                return DmaChoice(v.cond, self.copy_of(*pick(v.a), sref), self.copy_of(*pick(v.b), sref))
        return ir.Dma(src, dst, sref, None, None, src.size_bytes, self.span)

    def wait_copy(self, sems: ir.Semaphore, index, size_bytes: int, out: list) -> None:
        self.c.ctx.waited.add(sems)
        self.c.ctx.waits.append((sems, self.span, self.c.error_context()))
        out.append(ir.SemWait(ir.SemRef(sems, index, self.span), self.const(size_bytes), self.span))

    # -- the whole statement
    def emit(self, out: list) -> None:
        c, part = self.c, self.part
        if part != "whole":
            if not self.inputs:
                # (its prefetch would start nothing; the depths of no slots were then compared)
                c.error(self.span, f"a pipeline run in parts ({part}) streams inputs: the prefetch starts their "
                                   "first tiles and the primed part the rest; this one has none")
                return
            unshared = [st for st in self.inputs if st.via is None]
            if unshared:
                c.error(unshared[0].span, f"the inputs of a pipeline run in parts ({part}) give their slots with "
                                          "`via BUF, SEMS` (the prefetch and the primed run share them)")
                return
        n = self.tile_count(out)
        # Probe each stream at its first tile: dtype, shape, slots (and static bounds at t = start).
        if isinstance(self.start, ir.Const) and not (isinstance(n, ir.Const) and n.value > 0):
            # No tile, or a count known at run time only: tile 0 may not exist, so the probe's
            # t is a variable of unknown range (the views are checked where they are issued).
            probe = Scope(self.scope)
            c.define(probe, self.s.var, ir.ScalarVar(c.unique(self.s.var), "let", self.s.var_span),
                     self.s.var_span, "pipeline variable")
        else:
            probe = self.bind_t(self.const(0), self.scope, out)
        got_slots, default_depth = {}, self.depth_given
        # A prefetch starts input tiles only: the outputs and the body belong to the primed run.
        streams = self.inputs if part == "prefetch" else self.streams
        # (a prefetch issues only the first tiles: their range is the primed run's to check)
        out_of_range = self.check_all_tiles(streams, n) if part != "prefetch" else set()
        for st in (st for st in streams if st.name in out_of_range and st.via is not None):
            # A stream in error issues and waits nothing here: what the prefetch part
            # started on its semaphores is not also a copy never waited for.
            sems = self.c.expr(st.via[1], self.scope)
            if isinstance(sems, ir.SemRef):
                self.c.ctx.signalled.add(sems.sem)
                self.c.ctx.waited.add(sems.sem)
        # Streams `via` existing slots first: without a `depth`, theirs is the pipeline's, so
        # the fresh slots of the other streams take it (else 2).
        for st in sorted(streams, key=lambda st: st.via is None):
            if st.name in out_of_range:     # (reported over every tile, not again at one)
                continue
            tile = self.view(st, probe)
            got = self.slots_for(st, tile, default_depth) if tile is not None else None
            if got is None:     # (reported; the other streams and the body are still checked)
                continue
            got_slots[st.name] = (tile, *got)
            if st.via is not None and default_depth is None:
                default_depth = got[0].slots
        if len(got_slots) < len(streams):
            self.check_body(got_slots, probe)
            return
        slots = {st.name: got_slots[st.name] for st in streams}
        owners: dict = {}   # two streams of one pipeline in one ring would overwrite each other's tiles
        for st in (st for st in streams if st.via is not None):
            other = owners.setdefault(slots[st.name][1], st)
            if other is not st:
                c.error(st.via[0].span, f"streams '{other.name}' and '{st.name}' of one pipeline both use the slots "
                                        f"of '{slots[st.name][1].name}': each stream needs slots of its own")
                return
        depths = {buf.slots for _, buf, _ in slots.values()}
        if len(depths) != 1:
            c.error(self.span, f"the streams of a pipeline share one depth; their slots have {sorted(depths)}")
            return
        depth = depths.pop()
        if part != "primed":
            for j in range(depth - 1):
                cond = self.op("<", self.const(j), n)
                if isinstance(cond, ir.Const) and not cond.value:
                    break
                block: list = []
                if isinstance(cond, ir.Const):
                    self.issue(self.const(j), depth, slots, self.scope, block)
                    out.extend(block)
                    continue
                # Whether tile j exists is known at run time only: its views are not
                # bounds-checked statically (a tile index of unknown range).
                var = ir.ScalarVar(c.unique(f"{self.s.var}#first"), "let", self.span)
                block.append(ir.LetScalar(var, self.const(j), self.span))
                self.issue(ir.ScalarRead(var, self.span), depth, slots, self.scope, block)
                out.append(ir.If(cond, tuple(block), (), self.span))
        if part == "prefetch":
            return
        self.loop(n, depth, slots, out)
        for st in self.outputs:   # the last min(n, depth) write-backs
            tile, _, sems = slots[st.name]
            e = ir.ScalarVar(c.unique(f"{st.name}#drain"), "loop", self.span)
            waits: list = []
            self.wait_copy(sems, self.mod(ir.ScalarRead(e, self.span), depth), tile.size_bytes, waits)
            first = self.op("max", self.const(0), self.op("-", n, self.const(depth)))
            out.append(ir.For(e, first, n, 1, tuple(waits), self.span))

    def check_all_tiles(self, streams, n) -> set[str]:
        """The streams whose views leave their buffers at some tile, checked once over all
        `n` tiles (a known count of two or more): each error then gives the range of every
        tile, not of the tiles one copy of the lowering issues (the loop's prefetched
        tiles 1..n-1, say). Their names; the lowering leaves them out."""
        if not (isinstance(n, ir.Const) and n.value > 1):
            return set()
        c = self.c
        k = ir.ScalarVar(c.unique(f"{self.s.var}#any"), "loop", self.span)
        c.ctx.ranges[k] = (0, n.value - 1, frozenset([k]))
        every = self.bind_t(ir.ScalarRead(k, self.span), self.scope, [])
        return {st.name for st in streams if self.view(st, every) is None}

    def check_body(self, slots: dict, probe: Scope) -> None:
        """A stream in error (reported): the body is checked for errors of its own all the
        same, its code dropped; a stream in error stands for nothing there (it is not an
        error of the body's)."""
        c, views = self.c, Scope(probe)
        for st in self.streams:
            got = slots.get(st.name)
            c.define(views, st.name, self.slot_ref(got[1], self.const(0), got[0]) if got else POISON,
                     st.name_span, "pipeline stream")
        c.block(ast.Block(tuple(self.body), self.s.body.span), views)

    def issue(self, k, depth: int, slots: dict, scope: Scope, out: list) -> None:
        """Start the input copies of tile k into slot k % depth."""
        inner = self.bind_t(k, scope, out)
        for st in self.inputs:
            tile, buf, sems = slots[st.name]
            view = self.view(st, inner)
            if view is None:   # in error (reported): its waits are not errors of their own
                self.c.ctx.signalled.add(sems)
                continue
            index = self.let(f"{self.s.var}#next", self.mod(k, depth), out)
            self.start_copy(view, self.slot_ref(buf, index, tile), sems, index, out)

    def loop(self, n, depth: int, slots: dict, out: list) -> None:
        c, s = self.c, self.s
        k = ir.ScalarVar(c.unique(f"{s.var}#tile"), "loop", s.var_span)
        kr = ir.ScalarRead(k, self.span)
        if isinstance(n, ir.Const) and n.value > 0:
            c.ctx.ranges[k] = (0, n.value - 1, frozenset([k]))
        body: list = []
        slot = self.let(f"{s.var}#slot", self.mod(kr, depth), body)
        if depth > 1:   # tile k + depth - 1 into the slot tile k - 1 has finished with
            ahead = self.op("+", kr, self.const(depth - 1))
            cond = self.op("<", ahead, n)
            saved = dict(c.ctx.ranges)
            c.narrow(cond)
            block: list = []
            self.issue(ahead, depth, slots, self.scope, block)
            c.ctx.ranges = saved
            body.append(ir.If(cond, tuple(block), (), self.span))
        else:
            self.issue(kr, depth, slots, self.scope, body)
        inner = self.bind_t(kr, self.scope, body)
        for st in self.inputs:
            tile, _, sems = slots[st.name]
            self.wait_copy(sems, slot, tile.size_bytes, body)
        for st in self.outputs:   # the slot's previous write-back (tile k - depth) has left
            tile, _, sems = slots[st.name]
            block = []
            self.wait_copy(sems, slot, tile.size_bytes, block)
            body.append(ir.If(self.op(">=", kr, self.const(depth)), tuple(block), (), self.span))
        views = Scope(inner)
        for st in self.streams:
            tile, buf, _ = slots[st.name]
            c.define(views, st.name, self.slot_ref(buf, slot, tile), st.name_span, "pipeline stream")
        body.extend(c.block(ast.Block(tuple(self.body), s.body.span), views))
        for st in self.outputs:
            tile, buf, sems = slots[st.name]
            view = self.view(st, inner)
            if view is not None:
                self.start_copy(self.slot_ref(buf, slot, tile), view, sems, slot, body)
            else:   # in error (reported): its waits are not errors of their own
                c.ctx.signalled.add(sems)
        out.append(ir.For(k, self.const(0), n, 1, tuple(body), self.span))

