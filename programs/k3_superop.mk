// Kimi-K3 decode as super-operators (Inspur SD200 style): each layer is two fused
// kernels, the attention block and the FFN block (the MoE's router, dispatch, experts,
// combine and moe_up, or the dense FFN), each with its collectives inside; plus the
// embedding and the LM head: 2 * NLAYERS + 2 launches per step.
//
// Inside a super-operator everything is a tile pipeline: its weights stream through the
// VMEM rings (the next tiles' DMAs in flight while the current tile computes), its
// cross-core communication goes out tile by tile as the pieces are made (each head's
// part of the output projection, each expert's rows, the gathered blocks), and its
// intermediates stay in VMEM; only the residual stream h (and the decode state, the
// debug outputs) goes to HBM, at the super-operator's boundary. What a super-operator
// cannot do is what the megakernel does: start the next layer's weights while this one
// computes (a launch starts with an empty VMEM), which is the difference the three-way
// comparison shows. The layers are the library's (programs/k3/attention.mk, ffn.mk,
// moe_ep.mk), the same code as the megakernel's.
import "k3/tensors.mk";
import "k3/vmem.mk";
import "k3/embed.mk";

reference "mkemu.programs.k3.driver:drive";

// One layer per launch: one set of collective buffers (launch boundaries order the uses).
const GROT = 1;

// The residual stream from this chip's HBM; this core's plan row of layer l and the position.
fn block_start(l: i32, io: K3Io, hs: hbm f32[BATCH, DIM], h: vmem f32[BATCH, DIM], pl: smem i32[1, 4],
               posv: smem i32[1], s: sem) {
    start copy(io.layer_plan[l], pl, s);
    start copy(io.pos, posv, s);
    start copy(hs, h, s);
    wait copy(io.layer_plan[l], pl, s);
    wait copy(io.pos, posv, s);
    wait copy(hs, h, s);
}

// h += y; h to this chip's HBM (core 0: every core holds the same h) and y to the debug
// output of layer l (global core 0).
fn block_end(me: i32, h: vmem f32[BATCH, DIM], y: vmem f32[BATCH, DIM], dbg: hbm f32[BATCH, DIM],
             hs: hbm f32[BATCH, DIM], s: sem) {
    h = h + y;
    if me == 0 {
        start copy(y, dbg, s);
        wait copy(y, dbg, s);
    }
    if core_id() == 0 {
        start copy(h, hs, s);
        wait copy(h, hs, s);
    }
}

// Layer l's attention block: norm, the attention (KDA or MLA by the plan), the all-reduce
// of the heads' parts, the residual add.
kernel attn_block(w: K3Weights, io: K3Io, st: K3State, o: K3Out, hs: hbm f32[BATCH, DIM], l: i32) {
    vmem h: f32[BATCH, DIM];
    vmem x: f32[BATCH, DIM];
    vmem xb: bf16[BATCH, DIM];
    vmem nw: bf16[1, DIM];
    smem pl: i32[1, 4];
    smem posv: i32[1];
    let r = Rings();
    let a = AttnBufs();
    let c = Coll();
    let net = Net();
    sem s;
    let me = global_core(chip_id(), core_id());
    net.sent[0] = 0;
    start copy(w.attn_norm[l], nw[0, :], s);
    block_start(l, io, hs, h, pl, posv, s);
    attn_prefetch(w, st, pl[0, 0], pl[0, 1], me, xb, a, r, c, 0, net, a.wa[0]);
    wait copy(w.attn_norm[l], nw[0, :], s);
    region "norm" {
        rmsnorm(h, nw, x, DIM);
        xb = bf16(x);
    }
    attn_front(w, st, pl[0, 0], pl[0, 1], me, posv[0], xb, a, r, c, 0, net, a.wa[0]);
    attn_back(w, st, pl[0, 0], pl[0, 1], me, posv[0], a, r, c, 0, net);
    attn_sum(c, 0, net, me);
    block_end(me, h, select(RS_A, c.g_att[0], c.g_a[0]), o.dbg_attn[l], hs, s);
    attn_written(pl[0, 0], me, a);
    drain(net);
}

// Layer l's FFN block: norm, the MoE (router, routing, dispatch, experts, combine, moe_up)
// or the dense FFN, the residual add.
kernel ffn_block(w: K3Weights, io: K3Io, o: K3Out, hs: hbm f32[BATCH, DIM], l: i32) {
    vmem h: f32[BATCH, DIM];
    vmem x: f32[BATCH, DIM];
    vmem xb: bf16[BATCH, DIM];
    vmem nw: bf16[1, DIM];
    smem pl: i32[1, 4];
    smem posv: i32[1];
    let r = Rings();
    let f = FfnBufs();
    let c = Coll();
    let ep = EpBufs();
    let net = Net();
    sem s;
    let me = global_core(chip_id(), core_id());
    net.sent[0] = 0;
    start copy(w.ffn_norm[l], nw[0, :], s);
    block_start(l, io, hs, h, pl, posv, s);
    let fk = pl[0, 2];
    let fi = pl[0, 3];
    ffn_prefetch(w, fk, fi, me, xb, f, r, c, 0, f.wf[fi % 2]);
    wait copy(w.ffn_norm[l], nw[0, :], s);
    region "norm" {
        rmsnorm(h, nw, x, DIM);
        xb = bf16(x);
    }
    if fk == 1 {
        region "moe" {
            if EXPERT_PARALLEL {
                moe_front_ep(w, fi, me, 0, xb, f, r, c, ep, net, f.wf[fi % 2]);
                moe_back_ep(w, fi, me, 0, f, r, c, ep, net);
            } else {
                moe_front(w, fi, me, xb, f, r, c, 0, net, f.wf[fi % 2]);
                moe_back(w, fi, me, f, r, c, 0, net);
            }
        }
    } else {
        region "dense" {
            dense_layer(w, me, xb, f, r, c, 0, net);
        }
    }
    block_end(me, h, c.g_f[0], o.dbg_ffn[l], hs, s);
    drain(net);
}

kernel lm_block(w: K3Weights, o: K3Out, hs: hbm f32[BATCH, DIM]) {
    vmem h: f32[BATCH, DIM];
    vmem x: f32[BATCH, DIM];
    vmem xb: bf16[BATCH, DIM];
    let r = Rings();
    let f = FfnBufs();
    let c = Coll();
    let net = Net();
    sem s;
    let me = global_core(chip_id(), core_id());
    net.sent[0] = 0;
    region "lm_head" {
        lm_stream(prefetch, w, me, xb, f, r, c);
        start copy(w.final_norm, f.fin[0, :], s);
        start copy(hs, h, s);
        wait copy(w.final_norm, f.fin[0, :], s);
        wait copy(hs, h, s);
        region "norm" {
            rmsnorm(h, f.fin, x, DIM);
            xb = bf16(x);
        }
        lm_stream(primed, w, me, xb, f, r, c);
        logits_out(o, me, f, c, s, net);
    }
}

host {
    input w: K3Weights;
    input io: K3Io;
    hbm st: K3State;
    output o: K3Out;
    hbm hs: f32[BATCH, DIM];        // the residual stream between super-operators (every chip's copy)
    launch embed_tokens(w, io, hs);
    for l in 0..NLAYERS {
        launch attn_block(w, io, st, o, hs, l);
        launch ffn_block(w, io, o, hs, l);
    }
    launch lm_block(w, o, hs);
}
