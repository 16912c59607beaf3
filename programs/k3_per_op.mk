// Kimi-K3 decode, one kernel per operator (the per-op baseline).
//
// The host launches, for every layer in order: norm, each projection, each all-gather,
// the KDA conv, gating, state update and output norm (or MLA latent norms + cache row,
// absorbed attention), each head's part of the output projection, the attention
// all-reduce, residual add, norm, then the dense FFN or the MoE, residual add; then the
// final norm, LM head and its gather. The MoE is picked at compile time by SCHEME
// (programs/k3/shard.mk): tensor parallel (0: router, top-k, each routed-expert slot,
// each shared expert, the MoE all-reduce of their outputs, moe_up, its gather) or expert
// parallel (1: router, top-k, the all-to-all dispatch, the owners' experts with the
// combine's return, each shared expert at the rows' homes, the homes' psum, moe_up on
// the homes' rows, their gather). Every intermediate goes to HBM and comes back in the
// next kernel; every launch pays the profile's launch overhead. Same maths
// (programs/k3/model.mk) and the same bits as the megakernel; the kernel bodies are in
// programs/k3/ops.mk, programs/k3/ep_ops.mk (expert parallel) and below.
//
// The launch sequence is fixed at compile time, so the layer layout is the K3 one:
// dense FFN at layer 0, gated MLA at layers l % 4 == 3 and the last layer, KDA elsewhere.
import "k3/model.mk";
import "k3/shard.mk";
import "k3/ops.mk";
import "k3/ep_ops.mk";

reference "mkemu.programs.k3.driver:drive";

assert NMLA == NLAYERS / 4 + i32(NLAYERS % 4 != 0),
    "k3_per_op.mk unrolls the K3 layer layout (MLA at l % 4 == 3 and at the last layer)";

// ------------------------------------------------------------------ projections
// One kernel per weight shape (kernels are not generic); the body is op_proj.

kernel proj_dim_w(x: hbm f32[BATCH, DIM], w: hbm bf16[DIM, W], y: hbm f32[BATCH, W]) {
    op_proj(x, w, y, DIM, W);
}
kernel proj_dim_beta(x: hbm f32[BATCH, DIM], w: hbm bf16[DIM, 128], y: hbm f32[BATCH, 128]) {
    op_proj(x, w, y, DIM, 128);
}
kernel proj_dim_q(x: hbm f32[BATCH, DIM], w: hbm bf16[DIM, QRANK], y: hbm f32[BATCH, QRANK]) {
    op_proj(x, w, y, DIM, QRANK);
}
kernel proj_dim_kv(x: hbm f32[BATCH, DIM], w: hbm bf16[DIM, KVRANK], y: hbm f32[BATCH, KVRANK]) {
    op_proj(x, w, y, DIM, KVRANK);
}
kernel proj_q_w(x: hbm f32[BATCH, QRANK], w: hbm bf16[QRANK, W], y: hbm f32[BATCH, W]) {
    op_proj(x, w, y, QRANK, W);
}
kernel proj_dim_inter(x: hbm f32[BATCH, DIM], w: hbm bf16[DIM, DENSE_INTER], y: hbm f32[BATCH, DENSE_INTER]) {
    op_proj(x, w, y, DIM, DENSE_INTER);
}
kernel proj_inter_dim(x: hbm f32[BATCH, DENSE_INTER], w: hbm bf16[DENSE_INTER, DIM], y: hbm f32[BATCH, DIM]) {
    op_proj(x, w, y, DENSE_INTER, DIM);
}
kernel proj_router(x: hbm f32[BATCH, DIM], w: hbm bf16[DIM, NEXP], y: hbm f32[BATCH, NEXP]) {
    region "router" {
        if NEXP < 128 {
            op_proj_narrow(x, w, y, DIM, NEXP);
        } else {
            op_proj(x, w, y, DIM, NEXP);
        }
    }
}
kernel proj_dim_lat(x: hbm f32[BATCH, DIM], w: hbm bf16[DIM, LATENT], y: hbm f32[BATCH, LATENT]) {
    op_proj(x, w, y, DIM, LATENT);
}
kernel proj_lat_dim(x: hbm f32[BATCH, LATENT], w: hbm bf16[LATENT, DIM], y: hbm f32[BATCH, DIM]) {
    op_proj(x, w, y, LATENT, DIM);
}
kernel proj_lm_head(x: hbm f32[BATCH, DIM], w: hbm bf16[DIM, VOCAB], y: hbm f32[BATCH, VOCAB]) {
    region "lm_head" {
        op_proj(x, w, y, DIM, VOCAB);
    }
}

// ---------------------------------------------------------------------- gathers

kernel gather_beta(y: hbm f32[BATCH, 128]) { op_gather(y, 128); }
kernel gather_dim(y: hbm f32[BATCH, DIM]) { op_gather(y, DIM); }
kernel gather_q(y: hbm f32[BATCH, QRANK]) { op_gather(y, QRANK); }
kernel gather_kv(y: hbm f32[BATCH, KVRANK]) { op_gather(y, KVRANK); }
kernel gather_inter(y: hbm f32[BATCH, DENSE_INTER]) { op_gather(y, DENSE_INTER); }
kernel gather_lat(y: hbm f32[BATCH, LATENT]) { op_gather(y, LATENT); }
kernel gather_vocab(y: hbm f32[BATCH, VOCAB]) { op_gather(y, VOCAB); }
kernel gather_router(y: hbm f32[BATCH, NEXP]) {
    if NEXP < 128 {
        op_gather_narrow(y, NEXP);
    } else {
        op_gather(y, NEXP);
    }
}

// -------------------------------------------------------------------- all-reduces

// The attention output: part h (head h's rows of wo) made by the head's owner.
kernel allreduce_attn(parts: hbm f32[HEADS * BATCH, DIM], y: hbm f32[BATCH, DIM]) {
    op_allreduce(parts, y, HEADS, PPH, LGH, BATCH, DIM);
}
// The MoE's latent output: routed slot j's row b (weighted) at row j*BATCH + b, shared
// expert s at (TOPK + s)*BATCH + b, row r made by core r % NCORES.
kernel allreduce_moe(parts: hbm f32[NPE * BATCH, LATENT], y: hbm f32[BATCH, LATENT]) {
    op_allreduce(parts, y, NPE, PPE, LGE, 1, LATENT);
}

// --------------------------------------------------------------------- row-wise

kernel embed_tokens(tokens: hbm i32[BATCH], embed: hbm bf16[VOCAB, DIM], h: hbm f32[BATCH, DIM]) {
    op_embed(tokens, embed, h);
}
kernel norm_dim(x: hbm f32[BATCH, DIM], w: hbm bf16[DIM], y: hbm f32[BATCH, DIM]) {
    op_norm(x, w, y, DIM);
}
kernel residual(h: hbm f32[BATCH, DIM], a: hbm f32[BATCH, DIM], dbg: hbm f32[BATCH, DIM]) {
    op_residual(h, a, dbg);
}

// -------------------------------------------------------------------------- KDA
// Per-head operators run on the head's owner (core h % NCORES), which holds the head's
// projection columns in its chip's HBM.

// Short conv + silu (+ L2 norm of q, k) of this core's heads; updates the conv history.
kernel kda_conv(q: hbm f32[BATCH, W], k: hbm f32[BATCH, W], v: hbm f32[BATCH, W],
                cwq: hbm bf16[CONVK, W], cwk: hbm bf16[CONVK, W], cwv: hbm bf16[CONVK, W],
                hist: hbm f32[9 * BATCH, W],
                qn: hbm f32[BATCH, W], kn: hbm f32[BATCH, W], vn: hbm f32[BATCH, W]) {
    vmem u: f32[3][BATCH, HD];
    vmem y: f32[3][BATCH, HD];
    vmem cw: bf16[3 * CONVK, HD];
    vmem hv: f32[9 * BATCH, HD];
    sem s;
    let me = global_core(chip_id(), core_id());
    region "kda" {
        for t in 0..NHL {
            let h = me + t * NCORES;
            if h < HEADS {
                let c = h * HD;
                start copy(q[:, c +: HD], u[0], s);
                start copy(k[:, c +: HD], u[1], s);
                start copy(v[:, c +: HD], u[2], s);
                start copy(cwq[:, c +: HD], cw[0:CONVK, :], s);
                start copy(cwk[:, c +: HD], cw[CONVK:2 * CONVK, :], s);
                start copy(cwv[:, c +: HD], cw[2 * CONVK:3 * CONVK, :], s);
                start copy(hist[:, c +: HD], hv, s);
                wait copy(q[:, c +: HD], u[0], s);
                wait copy(k[:, c +: HD], u[1], s);
                wait copy(v[:, c +: HD], u[2], s);
                wait copy(cwq[:, c +: HD], cw[0:CONVK, :], s);
                wait copy(cwk[:, c +: HD], cw[CONVK:2 * CONVK, :], s);
                wait copy(cwv[:, c +: HD], cw[2 * CONVK:3 * CONVK, :], s);
                wait copy(hist[:, c +: HD], hv, s);
                conv4(u[0], hv[0:3 * BATCH, :], cw[0:CONVK, :], y[0], BATCH);
                conv4(u[1], hv[3 * BATCH:6 * BATCH, :], cw[CONVK:2 * CONVK, :], y[1], BATCH);
                conv4(u[2], hv[6 * BATCH:9 * BATCH, :], cw[2 * CONVK:3 * CONVK, :], y[2], BATCH);
                kda_qkv_act(y[0], y[1], y[2], BATCH);
                start copy(y[0], qn[:, c +: HD], s);
                start copy(y[1], kn[:, c +: HD], s);
                start copy(y[2], vn[:, c +: HD], s);
                start copy(hv, hist[:, c +: HD], s);
                wait copy(y[0], qn[:, c +: HD], s);
                wait copy(y[1], kn[:, c +: HD], s);
                wait copy(y[2], vn[:, c +: HD], s);
                wait copy(hv, hist[:, c +: HD], s);
            }
        }
    }
}

// Gating of this core's heads: decay logits g and sigmoid(beta) (each head's block of
// bsig holds the sigmoid of the whole beta block; the head reads its own lane).
kernel kda_gate(graw: hbm f32[BATCH, W], beta: hbm f32[BATCH, 128], a_log: hbm bf16[W],
                dt_bias: hbm bf16[W], g: hbm f32[BATCH, W], bsig: hbm f32[BATCH, W]) {
    vmem gv: f32[BATCH, HD];
    vmem bv: f32[BATCH, HD];
    vmem ad: bf16[2, HD];
    sem s;
    let me = global_core(chip_id(), core_id());
    region "kda" {
        for t in 0..NHL {
            let h = me + t * NCORES;
            if h < HEADS {
                let c = h * HD;
                start copy(graw[:, c +: HD], gv, s);
                start copy(beta, bv, s);
                start copy(a_log[c +: HD], ad[0:1, :], s);
                start copy(dt_bias[c +: HD], ad[1:2, :], s);
                wait copy(graw[:, c +: HD], gv, s);
                wait copy(beta, bv, s);
                wait copy(a_log[c +: HD], ad[0:1, :], s);
                wait copy(dt_bias[c +: HD], ad[1:2, :], s);
                kda_decay(gv, ad, BATCH);
                bv = sigmoid(bv);
                start copy(gv, g[:, c +: HD], s);
                start copy(bv, bsig[:, c +: HD], s);
                wait copy(gv, g[:, c +: HD], s);
                wait copy(bv, bsig[:, c +: HD], s);
            }
        }
    }
}

// The recurrent state update of this core's heads; writes q^T S (before the norm).
kernel kda_update_state(qn: hbm f32[BATCH, W], kn: hbm f32[BATCH, W], vn: hbm f32[BATCH, W],
                        g: hbm f32[BATCH, W], bsig: hbm f32[BATCH, W], state: hbm f32[BATCH * HEADS * HD, HD],
                        ocore: hbm f32[BATCH, W]) {
    vmem a: f32[5][BATCH, HD];
    vmem sv: f32[BATCH][HD, HD];
    vmem ov: f32[BATCH, HD];
    sem s;
    let me = global_core(chip_id(), core_id());
    region "kda" {
        for t in 0..NHL {
            let h = me + t * NCORES;
            if h < HEADS {
                let c = h * HD;
                start copy(qn[:, c +: HD], a[0], s);
                start copy(kn[:, c +: HD], a[1], s);
                start copy(vn[:, c +: HD], a[2], s);
                start copy(g[:, c +: HD], a[3], s);
                start copy(bsig[:, c +: HD], a[4], s);
                for b in 0..BATCH {
                    start copy(state[(b * HEADS + h) * HD +: HD, :], sv[b], s);
                }
                wait copy(qn[:, c +: HD], a[0], s);
                wait copy(kn[:, c +: HD], a[1], s);
                wait copy(vn[:, c +: HD], a[2], s);
                wait copy(g[:, c +: HD], a[3], s);
                wait copy(bsig[:, c +: HD], a[4], s);
                for b in 0..BATCH {
                    wait copy(state[(b * HEADS + h) * HD +: HD, :], sv[b], s);
                }
                for b in 0..BATCH {
                    kda_update(sv[b], a[0][b:b + 1, :], a[1][b:b + 1, :], a[2][b:b + 1, :], a[3][b:b + 1, :],
                               a[4][b:b + 1, :], h, ov[b:b + 1, :]);
                    start copy(sv[b], state[(b * HEADS + h) * HD +: HD, :], s);
                }
                start copy(ov, ocore[:, c +: HD], s);
                for b in 0..BATCH {
                    wait copy(sv[b], state[(b * HEADS + h) * HD +: HD, :], s);
                }
                wait copy(ov, ocore[:, c +: HD], s);
            }
        }
    }
}

// Output of this core's heads: rmsnorm(q^T S, onorm) * sigmoid(output gate logits).
kernel kda_output(ocore: hbm f32[BATCH, W], og: hbm f32[BATCH, W], onorm: hbm bf16[HD], o: hbm f32[BATCH, W]) {
    vmem ov: f32[BATCH, HD];
    vmem gv: f32[BATCH, HD];
    vmem on: bf16[1, HD];
    vmem y: f32[BATCH, HD];
    sem s;
    let me = global_core(chip_id(), core_id());
    region "kda" {
        for t in 0..NHL {
            let h = me + t * NCORES;
            if h < HEADS {
                let c = h * HD;
                start copy(ocore[:, c +: HD], ov, s);
                start copy(og[:, c +: HD], gv, s);
                start copy(onorm, on, s);
                wait copy(ocore[:, c +: HD], ov, s);
                wait copy(og[:, c +: HD], gv, s);
                wait copy(onorm, on, s);
                kda_out(ov, on, gv, y, BATCH);
                start copy(y, o[:, c +: HD], s);
                wait copy(y, o[:, c +: HD], s);
            }
        }
    }
}

// Head h's part of the attention output projection (both kinds): o's head h columns
// times wo's head h rows, on the head's owner, into rows h*BATCH.. of parts.
kernel attn_part(o: hbm f32[BATCH, W], wo: hbm bf16[W, DIM], parts: hbm f32[HEADS * BATCH, DIM]) {
    vmem ov: f32[BATCH, HD];
    vmem wv: bf16[HD, DIM];
    vmem y: f32[BATCH, DIM];
    sem s;
    let me = global_core(chip_id(), core_id());
    for t in 0..NHL {
        let h = me + t * NCORES;
        if h < HEADS {
            start copy(o[:, h * HD +: HD], ov, s);
            start copy(wo[h * HD +: HD, :], wv, s);
            wait copy(o[:, h * HD +: HD], ov, s);
            wait copy(wo[h * HD +: HD, :], wv, s);
            y = matmul(bf16(ov), wv);
            start copy(y, parts[h * BATCH +: BATCH, :], s);
            wait copy(y, parts[h * BATCH +: BATCH, :], s);
        }
    }
}

// -------------------------------------------------------------------------- MLA

// cq = rmsnorm(x wdq, qnorm); the new latent bf16(rmsnorm(x wdkv, kvnorm)) goes to row
// pos of every sequence's cache (core 0 of each chip, for its chip's cache copy).
kernel mla_latent(lq: hbm f32[BATCH, QRANK], lkv: hbm f32[BATCH, KVRANK], qnorm: hbm bf16[QRANK],
                  kvnorm: hbm bf16[KVRANK], pos: hbm i32[1], cq: hbm f32[BATCH, QRANK],
                  cache: hbm bf16[BATCH * MAXSEQ, KVRANK]) {
    vmem qv: f32[BATCH, QRANK];
    vmem kv: f32[BATCH, KVRANK];
    vmem qw: bf16[1, QRANK];
    vmem kw: bf16[1, KVRANK];
    vmem ckv: bf16[BATCH, KVRANK];
    smem pv: i32[1];
    sem s;
    region "mla" {
        if core_id() == 0 {
            start copy(pos, pv, s);
            start copy(lq, qv, s);
            start copy(lkv, kv, s);
            start copy(qnorm, qw, s);
            start copy(kvnorm, kw, s);
            wait copy(pos, pv, s);
            wait copy(lq, qv, s);
            wait copy(lkv, kv, s);
            wait copy(qnorm, qw, s);
            wait copy(kvnorm, kw, s);
            rmsnorm(qv, qw, qv, QRANK);
            rmsnorm(kv, kw, kv, KVRANK);
            ckv = bf16(kv);
            let p = pv[0];
            start copy(qv, cq, s);
            for b in 0..BATCH {
                start copy(ckv[b:b + 1, :], cache[b * MAXSEQ + p +: 1, :], s);
            }
            wait copy(qv, cq, s);
            for b in 0..BATCH {
                wait copy(ckv[b:b + 1, :], cache[b * MAXSEQ + p +: 1, :], s);
            }
        }
    }
}

// Absorbed attention of this core's heads over the cache, with the output gate.
kernel mla_attention(q: hbm f32[BATCH, W], gate: hbm f32[BATCH, W], wuk: hbm bf16[NMLA * HEADS, HD, KVRANK],
                     wuv: hbm bf16[NMLA * HEADS, KVRANK, HD], cache: hbm bf16[BATCH * MAXSEQ, KVRANK],
                     pos: hbm i32[1], o: hbm f32[BATCH, W], mi: i32) {
    vmem qv: f32[BATCH, HD];
    vmem gv: f32[BATCH, HD];
    vmem uk: bf16[HD, KVRANK];
    vmem uv: bf16[KVRANK, HD];
    vmem cv: bf16[BATCH * MAXSEQ, KVRANK];
    vmem qt: bf16[BATCH, KVRANK];
    vmem p: f32[BATCH, BATCH * MAXSEQ];
    vmem y: f32[BATCH, HD];
    smem pv: i32[1];
    sem s;
    let me = global_core(chip_id(), core_id());
    region "mla" {
        if me < HEADS {
            start copy(pos, pv, s);
            start copy(cache, cv, s);
            wait copy(pos, pv, s);
            wait copy(cache, cv, s);
        }
        for t in 0..NHL {
            let h = me + t * NCORES;
            if h < HEADS {
                let c = h * HD;
                start copy(q[:, c +: HD], qv, s);
                start copy(gate[:, c +: HD], gv, s);
                start copy(wuk[mi * HEADS + h], uk, s);
                start copy(wuv[mi * HEADS + h], uv, s);
                wait copy(q[:, c +: HD], qv, s);
                wait copy(gate[:, c +: HD], gv, s);
                wait copy(wuk[mi * HEADS + h], uk, s);
                wait copy(wuv[mi * HEADS + h], uv, s);
                qt = bf16(matmul(bf16(qv), uk));
                mla_probs(qt, cv, pv[0], p);
                y = matmul(bf16(matmul(bf16(p), cv)), uv) * sigmoid(gv);
                start copy(y, o[:, c +: HD], s);
                wait copy(y, o[:, c +: HD], s);
            }
        }
    }
}

// ------------------------------------------------------------------ dense FFN

// u = silu(a) * b on this core's column blocks.
kernel swiglu(a: hbm f32[BATCH, DENSE_INTER], b3: hbm f32[BATCH, DENSE_INTER], u: hbm f32[BATCH, DENSE_INTER]) {
    vmem av: f32[BATCH, HD];
    vmem bv: f32[BATCH, HD];
    sem s;
    let me = global_core(chip_id(), core_id());
    region "dense" {
        for j in me..NIB step NCORES {
            start copy(a[:, j * HD +: HD], av, s);
            start copy(b3[:, j * HD +: HD], bv, s);
            wait copy(a[:, j * HD +: HD], av, s);
            wait copy(b3[:, j * HD +: HD], bv, s);
            av = silu(av) * bv;
            start copy(av, u[:, j * HD +: HD], s);
            wait copy(av, u[:, j * HD +: HD], s);
        }
    }
}

// -------------------------------------------------------------------------- MoE

// Routing (core 0 of each chip): top-k expert ids and renormalised weights.
kernel topk(rl: hbm f32[BATCH, NEXP], bias: hbm bf16[NEXP], topi: hbm i32[BATCH, TOPK],
            topw: hbm f32[BATCH, TOPK]) {
    vmem lv: f32[BATCH, NEXP];
    vmem bv: bf16[1, NEXP];
    vmem iv: i32[BATCH, TOPK];
    vmem wv: f32[BATCH, TOPK];
    sem s;
    region "router" {
        if core_id() == 0 {
            start copy(rl, lv, s);
            start copy(bias, bv, s);
            wait copy(rl, lv, s);
            wait copy(bias, bv, s);
            route(lv, bv, iv, wv);
            start copy(iv, topi, s);
            start copy(wv, topw, s);
            wait copy(iv, topi, s);
            wait copy(wv, topw, s);
        }
    }
}

// Routed-expert slot j: row b's chosen expert on row b, times its router weight (the
// MoE all-reduce's part j, row b at r = j*BATCH + b, computed on core r % NCORES).
kernel expert(xl: hbm f32[BATCH, LATENT], topi: hbm i32[BATCH, TOPK], topw: hbm f32[BATCH, TOPK],
              w1: hbm bf16[NMOE * NEXP, LATENT, EINTER], w3: hbm bf16[NMOE * NEXP, LATENT, EINTER],
              w2: hbm bf16[NMOE * NEXP, EINTER, LATENT], eo: hbm f32[NROWS_EO, LATENT], fi: i32, j: i32) {
    vmem xv: f32[BATCH, LATENT];
    vmem xb: bf16[BATCH, LATENT];
    vmem v13: bf16[LATENT, 2 * EINTER];
    vmem v2: bf16[EINTER, LATENT];
    vmem ub: bf16[BATCH, EINTER];
    vmem y: f32[BATCH, LATENT];
    vmem wv: f32[BATCH, TOPK];
    smem ti: i32[BATCH, TOPK];
    sem s;
    let me = global_core(chip_id(), core_id());
    region "experts" {
        for r in j * BATCH..(j + 1) * BATCH {
            if r % NCORES == me {
                let b = r - j * BATCH;
                start copy(topi, ti, s);
                start copy(xl, xv, s);
                start copy(topw, wv, s);
                wait copy(topi, ti, s);
                let e = fi * NEXP + ti[b, j];
                ffn_weights(0, w1, w3, w2, NMOE * NEXP, e, v13, v2, s);
                wait copy(xl, xv, s);
                wait copy(topw, wv, s);
                ffn_weights(1, w1, w3, w2, NMOE * NEXP, e, v13, v2, s);
                xb = bf16(xv);
                gated_ffn(xb, v13, v2, ub, y, LATENT, EINTER, LATENT);
                y[b:b + 1, :] = wv[b:b + 1, j:j + 1] * y[b:b + 1, :];
                start copy(y[b:b + 1, :], eo[r +: 1, :], s);
                wait copy(y[b:b + 1, :], eo[r +: 1, :], s);
            }
        }
    }
}

// Shared expert s: row b of part TOPK + s (row r0 + b of eo, r0 = (TOPK + s)*BATCH) on
// core (rb + b) % NCORES, rb = r0 for the tensor-parallel all-reduce (core r % NCORES makes
// row r) and rb = 0 for expert parallelism (the row's home makes it, next to its routed
// parts). Each of those cores computes the whole batch and writes its rows.
kernel shared_expert(xl: hbm f32[BATCH, LATENT], w1: hbm bf16[NMOE * NSHARED, LATENT, EINTER],
                     w3: hbm bf16[NMOE * NSHARED, LATENT, EINTER], w2: hbm bf16[NMOE * NSHARED, EINTER, LATENT],
                     eo: hbm f32[NROWS_EO, LATENT], fi: i32, sx: i32) {
    vmem xv: f32[BATCH, LATENT];
    vmem xb: bf16[BATCH, LATENT];
    vmem v13: bf16[LATENT, 2 * EINTER];
    vmem v2: bf16[EINTER, LATENT];
    vmem ub: bf16[BATCH, EINTER];
    vmem y: f32[BATCH, LATENT];
    sem s;
    let me = global_core(chip_id(), core_id());
    let r0 = (TOPK + sx) * BATCH;
    let rb = (1 - SCHEME) * r0;
    let e = fi * NSHARED + sx;
    region "experts" {
        if (me + NCORES - rb % NCORES) % NCORES < BATCH {
            start copy(xl, xv, s);
            ffn_weights(0, w1, w3, w2, NMOE * NSHARED, e, v13, v2, s);
            wait copy(xl, xv, s);
            ffn_weights(1, w1, w3, w2, NMOE * NSHARED, e, v13, v2, s);
            xb = bf16(xv);
            gated_ffn(xb, v13, v2, ub, y, LATENT, EINTER, LATENT);
            for b in 0..BATCH {
                if (rb + b) % NCORES == me {
                    start copy(y[b +: 1, :], eo[r0 + b +: 1, :], s);
                    wait copy(y[b +: 1, :], eo[r0 + b +: 1, :], s);
                }
            }
        }
    }
}

// ------------------------------------------------------- MoE, expert parallel (SCHEME = 1)
// The bodies and the buffer layouts are in programs/k3/ep_ops.mk.

// The homes send their rows' latent inputs to the experts' owners (the all-to-all with counts).
kernel ep_dispatch(topi: hbm i32[BATCH, TOPK], xl: hbm f32[BATCH, LATENT],
                   ep_x: hbm f32[CORES_PER_CHIP * EP_INBOX, LATENT], ep_tag: hbm i32[CORES_PER_CHIP * EP_INBOX],
                   ep_cnt: hbm i32[CORES_PER_CHIP * NHOME]) {
    op_ep_dispatch(topi, xl, ep_x, ep_tag, ep_cnt);
}
// The owners run the experts they received rows for and send the results to the rows' homes.
kernel ep_experts(ep_x: hbm f32[CORES_PER_CHIP * EP_INBOX, LATENT], ep_tag: hbm i32[CORES_PER_CHIP * EP_INBOX],
                  ep_cnt: hbm i32[CORES_PER_CHIP * NHOME], w1: hbm bf16[NMOE * NEXP, LATENT, EINTER],
                  w3: hbm bf16[NMOE * NEXP, LATENT, EINTER], w2: hbm bf16[NMOE * NEXP, EINTER, LATENT],
                  eo: hbm f32[NROWS_EO, LATENT], fi: i32) {
    op_ep_experts(ep_x, ep_tag, ep_cnt, w1, w3, w2, eo, fi);
}
// The homes weight the routed parts and psum them with the shared experts' into z.
kernel ep_combine(eo: hbm f32[NROWS_EO, LATENT], topw: hbm f32[BATCH, TOPK], z: hbm f32[BATCH, LATENT]) {
    op_ep_combine(eo, topw, z);
}
// moe_up on the rows' homes, then the rows all-gathered.
kernel proj_rows_lat_dim(x: hbm f32[BATCH, LATENT], w: hbm bf16[LATENT, DIM], y: hbm f32[BATCH, DIM]) {
    op_proj_rows(x, w, y, LATENT, DIM);
}
kernel gather_rows_dim(y: hbm f32[BATCH, DIM]) { op_gather_rows(y, DIM); }

// ------------------------------------------------------------------------- host

host {
    input embed: bf16[VOCAB, DIM];
    input attn_norm: bf16[NLAYERS, DIM];
    input ffn_norm: bf16[NLAYERS, DIM];
    input kda_wq: bf16[NKDA, DIM, W];
    input kda_wk: bf16[NKDA, DIM, W];
    input kda_wv: bf16[NKDA, DIM, W];
    input kda_conv_q: bf16[NKDA, CONVK, W];
    input kda_conv_k: bf16[NKDA, CONVK, W];
    input kda_conv_v: bf16[NKDA, CONVK, W];
    input kda_wg: bf16[NKDA, DIM, W];
    input kda_a_log: bf16[NKDA, W];
    input kda_dt_bias: bf16[NKDA, W];
    input kda_wb: bf16[NKDA, DIM, 128];
    input kda_onorm: bf16[NKDA, HD];
    input kda_wog: bf16[NKDA, DIM, W];
    input kda_wo: bf16[NKDA, W, DIM];
    input mla_wdq: bf16[NMLA, DIM, QRANK];
    input mla_qnorm: bf16[NMLA, QRANK];
    input mla_wuq: bf16[NMLA, QRANK, W];
    input mla_wdkv: bf16[NMLA, DIM, KVRANK];
    input mla_kvnorm: bf16[NMLA, KVRANK];
    input mla_wuk: bf16[NMLA * HEADS, HD, KVRANK];
    input mla_wuv: bf16[NMLA * HEADS, KVRANK, HD];
    input mla_wgate: bf16[NMLA, DIM, W];
    input mla_wo: bf16[NMLA, W, DIM];
    input dense_w1: bf16[NDENSE, DIM, DENSE_INTER];
    input dense_w3: bf16[NDENSE, DIM, DENSE_INTER];
    input dense_w2: bf16[NDENSE, DENSE_INTER, DIM];
    input moe_router: bf16[NMOE, DIM, NEXP];
    input moe_bias: bf16[NMOE, NEXP];
    input moe_down: bf16[NMOE, DIM, LATENT];
    input moe_w1: bf16[NMOE * NEXP, LATENT, EINTER];
    input moe_w3: bf16[NMOE * NEXP, LATENT, EINTER];
    input moe_w2: bf16[NMOE * NEXP, EINTER, LATENT];
    input moe_shared_w1: bf16[NMOE * NSHARED, LATENT, EINTER];
    input moe_shared_w3: bf16[NMOE * NSHARED, LATENT, EINTER];
    input moe_shared_w2: bf16[NMOE * NSHARED, EINTER, LATENT];
    input moe_up: bf16[NMOE, LATENT, DIM];
    input final_norm: bf16[DIM];
    input lm_head: bf16[DIM, VOCAB];
    input layer_plan: i32[NLAYERS, 4];
    input tokens: i32[BATCH];
    input pos: i32[1];
    // decode state (persists in HBM between steps)
    hbm kda_state: f32[NKDA, BATCH * HEADS * HD, HD];
    hbm conv_state: f32[NKDA, 9 * BATCH, W];
    hbm mla_cache: bf16[NMLA, BATCH * MAXSEQ, KVRANK];
    // intermediates
    hbm h: f32[BATCH, DIM];
    hbm xn: f32[BATCH, DIM];
    hbm a_q: f32[BATCH, W];
    hbm a_k: f32[BATCH, W];
    hbm a_v: f32[BATCH, W];
    hbm a_g: f32[BATCH, W];
    hbm a_og: f32[BATCH, W];
    hbm a_beta: f32[BATCH, 128];
    hbm a_qn: f32[BATCH, W];
    hbm a_kn: f32[BATCH, W];
    hbm a_vn: f32[BATCH, W];
    hbm a_gd: f32[BATCH, W];
    hbm a_bs: f32[BATCH, W];
    hbm a_core: f32[BATCH, W];
    hbm a_o: f32[BATCH, W];
    hbm a_parts: f32[HEADS * BATCH, DIM];
    hbm a_attn: f32[BATCH, DIM];
    hbm m_lq: f32[BATCH, QRANK];
    hbm m_lkv: f32[BATCH, KVRANK];
    hbm m_cq: f32[BATCH, QRANK];
    hbm m_q: f32[BATCH, W];
    hbm m_gate: f32[BATCH, W];
    hbm d_a: f32[BATCH, DENSE_INTER];
    hbm d_b: f32[BATCH, DENSE_INTER];
    hbm d_u: f32[BATCH, DENSE_INTER];
    hbm e_rl: f32[BATCH, NEXP];
    hbm e_xl: f32[BATCH, LATENT];
    hbm e_topi: i32[BATCH, TOPK];
    hbm e_topw: f32[BATCH, TOPK];
    hbm e_out: f32[NROWS_EO, LATENT];
    // expert-parallel inboxes: rows, tags and counts of each core of the chip (ep_ops.mk)
    hbm ep_x: f32[CORES_PER_CHIP * EP_INBOX, LATENT];
    hbm ep_tag: i32[CORES_PER_CHIP * EP_INBOX];
    hbm ep_cnt: i32[CORES_PER_CHIP * NHOME];
    hbm e_z: f32[BATCH, LATENT];
    hbm f_out: f32[BATCH, DIM];
    output logits: f32[BATCH, VOCAB];
    output dbg_attn: f32[NLAYERS, BATCH, DIM];
    output dbg_ffn: f32[NLAYERS, BATCH, DIM];

    launch embed_tokens(tokens, embed, h);
    for l in 0..NLAYERS {
        // ---- attention
        launch norm_dim(h, attn_norm[l], xn);
        if l % 4 == 3 || l == NLAYERS - 1 {
            let mi = select(l % 4 == 3, l / 4, NMLA - 1);
            launch proj_dim_q(xn, mla_wdq[mi], m_lq);
            launch gather_q(m_lq);
            launch proj_dim_kv(xn, mla_wdkv[mi], m_lkv);
            launch gather_kv(m_lkv);
            launch mla_latent(m_lq, m_lkv, mla_qnorm[mi], mla_kvnorm[mi], pos, m_cq, mla_cache[mi]);
            launch proj_q_w(m_cq, mla_wuq[mi], m_q);
            launch proj_dim_w(xn, mla_wgate[mi], m_gate);
            launch mla_attention(m_q, m_gate, mla_wuk, mla_wuv, mla_cache[mi], pos, a_o, mi);
            launch attn_part(a_o, mla_wo[mi], a_parts);
        } else {
            let ai = l - l / 4;
            launch proj_dim_w(xn, kda_wq[ai], a_q);
            launch proj_dim_w(xn, kda_wk[ai], a_k);
            launch proj_dim_w(xn, kda_wv[ai], a_v);
            launch proj_dim_w(xn, kda_wg[ai], a_g);
            launch proj_dim_beta(xn, kda_wb[ai], a_beta);
            launch proj_dim_w(xn, kda_wog[ai], a_og);
            launch gather_beta(a_beta);
            launch kda_conv(a_q, a_k, a_v, kda_conv_q[ai], kda_conv_k[ai], kda_conv_v[ai], conv_state[ai],
                            a_qn, a_kn, a_vn);
            launch kda_gate(a_g, a_beta, kda_a_log[ai], kda_dt_bias[ai], a_gd, a_bs);
            launch kda_update_state(a_qn, a_kn, a_vn, a_gd, a_bs, kda_state[ai], a_core);
            launch kda_output(a_core, a_og, kda_onorm[ai], a_o);
            launch attn_part(a_o, kda_wo[ai], a_parts);
        }
        launch allreduce_attn(a_parts, a_attn);
        launch residual(h, a_attn, dbg_attn[l]);
        // ---- FFN
        launch norm_dim(h, ffn_norm[l], xn);
        if l == 0 {
            launch proj_dim_inter(xn, dense_w1[0], d_a);
            launch proj_dim_inter(xn, dense_w3[0], d_b);
            launch swiglu(d_a, d_b, d_u);
            launch gather_inter(d_u);
            launch proj_inter_dim(d_u, dense_w2[0], f_out);
            launch gather_dim(f_out);
        } else {
            let fi = l - 1;
            launch proj_router(xn, moe_router[fi], e_rl);
            launch gather_router(e_rl);
            launch proj_dim_lat(xn, moe_down[fi], e_xl);
            launch gather_lat(e_xl);
            launch topk(e_rl, moe_bias[fi], e_topi, e_topw);
            if SCHEME == 1 {
                launch ep_dispatch(e_topi, e_xl, ep_x, ep_tag, ep_cnt);
                launch ep_experts(ep_x, ep_tag, ep_cnt, moe_w1, moe_w3, moe_w2, e_out, fi);
            } else {
                for j in 0..TOPK {
                    launch expert(e_xl, e_topi, e_topw, moe_w1, moe_w3, moe_w2, e_out, fi, j);
                }
            }
            for sx in 0..NSHARED {
                launch shared_expert(e_xl, moe_shared_w1, moe_shared_w3, moe_shared_w2, e_out, fi, sx);
            }
            if SCHEME == 1 {
                launch ep_combine(e_out, e_topw, e_z);
                launch proj_rows_lat_dim(e_z, moe_up[fi], f_out);
                launch gather_rows_dim(f_out);
            } else {
                launch allreduce_moe(e_out, e_z);
                launch proj_lat_dim(e_z, moe_up[fi], f_out);
                launch gather_dim(f_out);
            }
        }
        launch residual(h, f_out, dbg_ffn[l]);
    }
    launch norm_dim(h, final_norm, xn);
    launch proj_lm_head(xn, lm_head, logits);
    launch gather_vocab(logits);
}
