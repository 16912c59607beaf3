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
param GROT = 1 in {1} "slots of the collective buffers: one, as a super-operator is one layer (launch boundaries order the uses)";

// What every layer's super-operator starts with: the residual stream h (from this chip's
// HBM), this layer's plan row and norm weight, the position, and the normed input.
struct Block {
    h: vmem f32[BATCH, DIM];
    x: vmem f32[BATCH, DIM];
    xb: vmem bf16[BATCH, DIM];
    nw: vmem bf16[1, DIM];
    pl: smem i32[1, 4];
    posv: smem i32[1];
    s: sem;
    ns: sem;                     // the norm weight's fetch alone: its bytes must not count for the others
}

// Start layer l's block: the norm weight's fetch, and h, the plan row and the position
// loaded (the caller can start its first weight tiles from the plan before block_norm).
fn block_start(l: i32, io: K3Io, norm: hbm bf16[NLAYERS, DIM], hs: hbm f32[BATCH, DIM], k: Block) {
    start copy(norm[l], k.nw[0, :], k.ns);
    start copy(io.layer_plan[l], k.pl, k.s);
    start copy(io.pos, k.posv, k.s);
    start copy(hs, k.h, k.s);
    wait copy(io.layer_plan[l], k.pl, k.s);
    wait copy(io.pos, k.posv, k.s);
    wait copy(hs, k.h, k.s);
}

// xb = bf16(rmsnorm(h)) once the norm weight is in.
fn block_norm(l: i32, norm: hbm bf16[NLAYERS, DIM], k: Block) {
    wait copy(norm[l], k.nw[0, :], k.ns);
    region "norm" {
        rmsnorm(k.h, k.nw, k.x, DIM);
        k.xb = bf16(k.x);
    }
}

// h += y; h to this chip's HBM (core 0: every core holds the same h) and y to the debug
// output of layer l (global core 0).
fn block_end(me: i32, k: Block, y: vmem f32[BATCH, DIM], dbg: hbm f32[BATCH, DIM], hs: hbm f32[BATCH, DIM]) {
    k.h = k.h + y;
    if me == 0 {
        start copy(y, dbg, k.s);
        wait copy(y, dbg, k.s);
    }
    if core_id() == 0 {
        start copy(k.h, hs, k.s);
        wait copy(k.h, hs, k.s);
    }
}

// Layer l's attention block: norm, the attention (KDA or MLA by the plan), the all-reduce
// of the heads' parts, the residual add.
kernel attn_block(w: K3Weights, io: K3Io, st: K3State, o: K3Out, hs: hbm f32[BATCH, DIM], l: i32) {
    let k = Block();
    let r = Rings();
    let a = AttnBufs();
    let c = Coll();
    let net = Net();
    let me = global_core(chip_id(), core_id());
    net.sent[0] = 0;
    block_start(l, io, w.attn_norm, hs, k);
    if SPECR {
        sem sbw;
        start copy(io.spec_base, a.sb, sbw);
        wait copy(io.spec_base, a.sb, sbw);
    }
    let ak = k.pl[0, 0];
    let ai = k.pl[0, 1];
    attn_prefetch(w, st, ak, ai, me, k.xb, a, r, c, 0, net, a.wa[0]);
    block_norm(l, w.attn_norm, k);
    attn_front(w, st, ak, ai, me, k.posv[0], k.xb, a, r, c, 0, net, a.wa[0]);
    attn_back(w, st, ak, ai, me, k.posv[0], a, r, c, 0, net);
    attn_sum(c, 0, net, me);
    block_end(me, k, select(RS_A, c.g_att[0], c.g_a[0]), o.dbg_attn[l], hs);
    attn_written(ak, me, a);
    drain(net);
}

// Layer l's FFN block: norm, the MoE (router, routing, dispatch, experts, combine, moe_up)
// or the dense FFN, the residual add.
kernel ffn_block(w: K3Weights, io: K3Io, o: K3Out, hs: hbm f32[BATCH, DIM], l: i32) {
    let k = Block();
    let r = Rings();
    let f = FfnBufs();
    let c = Coll();
    let ep = EpBufs();
    let net = Net();
    let me = global_core(chip_id(), core_id());
    net.sent[0] = 0;
    block_start(l, io, w.ffn_norm, hs, k);
    let fk = k.pl[0, 2];
    let fi = k.pl[0, 3];
    ffn_prefetch(w, fk, fi, me, k.xb, f, r, c, 0, f.wf[fi % 2]);
    block_norm(l, w.ffn_norm, k);
    if fk == 1 {
        region "moe" {
            if EXPERT_PARALLEL {
                moe_front_ep(w, fi, me, 0, k.xb, f, r, c, ep, net, f.wf[fi % 2]);
                moe_back_ep(w, fi, me, 0, f, r, c, ep, net);
            } else {
                moe_front(w, fi, me, k.xb, f, r, c, 0, net, f.wf[fi % 2]);
                moe_back(w, fi, me, f, r, c, 0, net);
            }
        }
    } else {
        region "dense" {
            dense_layer(w, me, k.xb, f, r, c, 0, net);
        }
    }
    block_end(me, k, c.g_f[0], o.dbg_ffn[l], hs);
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
