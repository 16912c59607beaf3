// Kimi-K3 decode as ONE kernel per step (the megakernel), on every core of the mesh.
//
// One launch runs the whole step: embedding, every layer in a loop (the attention kind
// KDA/MLA and the FFN kind dense/MoE read from the layer plan at run time), final norm
// and LM head. Every weight streams tile by tile through bounded VMEM rings that stay
// busy across layer boundaries: the FFN's first tiles start as soon as the attention's
// last weight stream is done, the next layer's attention tiles (and its state and small
// tensors) as soon as the FFN's are; the router's top-k, read into scalars, picks the
// expert tiles. All collectives are in the kernel. The layers are the library's
// (programs/k3/attention.mk, ffn.mk, moe_ep.mk), shared with the super-operators; the
// maths is programs/k3/model.mk; the layout of everything: docs/k3_programs.md.
import "k3/tensors.mk";
import "k3/vmem.mk";

reference "mkemu.programs.k3.driver:drive";

// The collective buffers rotate over GROT slots by layer with a barrier every GROT layers, so a
// fast core never writes a slot a slow core still reads (docs/k3_programs.md: why not 1 or 4).
param GROT = 2 in {2, 3} "slots the collective buffers rotate over by layer (slot l % GROT), a barrier every GROT layers";

// The next layer's attention (or, after the last layer, the LM head) starts streaming:
// its tiles in the weight ring's first half, free once this layer's experts are done.
fn next_prefetch(l: i32, w: K3Weights, st: K3State, plan: smem i32[NLAYERS, 4], me: i32, xb: vmem bf16[BATCH, DIM],
                 a: AttnBufs, f: FfnBufs, r: Rings, c: Coll, net: Net, wx: sem) {
    if l + 1 < NLAYERS {
        attn_prefetch(w, st, plan[l + 1, 0], plan[l + 1, 1], me, xb, a, r, c, (l + 1) % GROT, net,
                      a.wa[(l + 1) % GROT]);
    } else {
        lm_stream(prefetch, w, me, xb, f, r, c);
        start copy(w.final_norm, f.fin[0, :], wx);
    }
}

kernel k3_step(w: K3Weights, io: K3Io, st: K3State, o: K3Out) {
    vmem h: f32[BATCH, DIM];        // the residual stream, on every core
    vmem x: f32[BATCH, DIM];
    vmem xb: bf16[BATCH, DIM];
    vmem ebuf: bf16[BATCH, DIM];
    vmem anorm: bf16[NLAYERS, DIM];
    vmem fnorm: bf16[NLAYERS, DIM];
    smem plan: i32[NLAYERS, 4];
    smem tok: i32[BATCH];
    smem posv: i32[1];
    let r = Rings();
    let a = AttnBufs();
    let f = FfnBufs();
    let c = Coll();
    let net = Net();
    let ep = EpBufs();
    sem dbg;                        // prologue loads, debug outputs, the logits copy
    sem wx;                         // the final norm
    sem nw;                         // the norm weights' prologue loads: their bytes must not count for the others

    let me = global_core(chip_id(), core_id());
    net.sent[0] = 0;

    // ---------------------------------------------------------------- prologue
    start copy(io.layer_plan, plan, dbg);
    start copy(io.tokens, tok, dbg);
    start copy(io.pos, posv, dbg);
    start copy(w.attn_norm, anorm, nw);
    start copy(w.ffn_norm, fnorm, nw);
    wait copy(io.layer_plan, plan, dbg);
    wait copy(io.tokens, tok, dbg);
    wait copy(io.pos, posv, dbg);
    let p0 = posv[0];
    if SPECR {
        sem sbw;
        start copy(io.spec_base, a.sb, sbw);
        wait copy(io.spec_base, a.sb, sbw);
    }
    for b in 0..BATCH {
        start copy(w.embed[tok[b]], ebuf[b:b + 1, :], dbg);
    }
    attn_prefetch(w, st, plan[0, 0], plan[0, 1], me, xb, a, r, c, 0, net, a.wa[0]);
    wait BATCH * copy(w.embed[0], ebuf[0:1, :], dbg);
    wait copy(w.attn_norm, anorm, nw);
    wait copy(w.ffn_norm, fnorm, nw);
    h = f32(ebuf);

    // ------------------------------------------------------------------ layers
    for l in 0..NLAYERS {
        region "layer" (l) {
            let ak = plan[l, 0];
            let ai = plan[l, 1];
            let fk = plan[l, 2];
            let fi = plan[l, 3];
            let p = l % GROT;
            if l > 0 && p == 0 {
                barrier();
            }
            // ---- attention
            region "norm" {
                rmsnorm(h, anorm[l:l + 1, :], x, DIM);
                xb = bf16(x);
            }
            attn_front(w, st, ak, ai, me, p0, xb, a, r, c, p, net, a.wa[p]);
            ffn_prefetch(w, fk, fi, me, xb, f, r, c, p, f.wf[fi % 2]);
            attn_back(w, st, ak, ai, me, p0, a, r, c, p, net);
            attn_sum(c, p, net, me);
            // Debug copies of layer l-1 have landed long ago; wait before their slot is reused.
            if me == 0 && l > 0 {
                wait 2 * copy(h, o.dbg_attn[0], dbg);
            }
            if me == 0 {
                start copy(select(RS_A, c.g_att[p], c.g_a[p * NPA]), o.dbg_attn[l], dbg);
            }
            h = h + select(RS_A, c.g_att[p], c.g_a[p * NPA]);
            // ---- FFN
            region "norm" {
                rmsnorm(h, fnorm[l:l + 1, :], x, DIM);
                xb = bf16(x);
            }
            if fk == 1 {
                region "moe" {
                    if EXPERT_PARALLEL {
                        moe_front_ep(w, fi, me, p, xb, f, r, c, ep, net, f.wf[fi % 2]);
                        next_prefetch(l, w, st, plan, me, xb, a, f, r, c, net, wx);
                        moe_back_ep(w, fi, me, p, f, r, c, ep, net);
                    } else {
                        moe_front(w, fi, me, xb, f, r, c, p, net, f.wf[fi % 2]);
                        next_prefetch(l, w, st, plan, me, xb, a, f, r, c, net, wx);
                        moe_back(w, fi, me, f, r, c, p, net);
                    }
                }
            } else {
                region "dense" {
                    next_prefetch(l, w, st, plan, me, xb, a, f, r, c, net, wx);
                    dense_layer(w, me, xb, f, r, c, p, net);
                }
            }
            if me == 0 {
                start copy(c.g_f[p], o.dbg_ffn[l], dbg);
            }
            h = h + c.g_f[p];
            attn_written(ak, me, a);
        }
    }
    // ------------------------------------------------------------- LM head
    region "lm_head" {
        wait copy(w.final_norm, f.fin[0, :], wx);
        region "norm" {
            rmsnorm(h, f.fin, x, DIM);
            xb = bf16(x);
        }
        lm_stream(primed, w, me, xb, f, r, c);
        logits_out(o, me, f, c, dbg, net);
        if me == 0 {
            wait 2 * copy(h, o.dbg_attn[0], dbg);
        }
        drain(net);
    }
}

host {
    input w: K3Weights;
    input io: K3Io;
    hbm st: K3State;
    output o: K3Out;
    launch k3_step(w, io, st, o);
}
