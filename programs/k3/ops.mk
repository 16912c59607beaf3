// The per-op program's kernels (programs/k3_per_op.mk): each reads its operands from HBM,
// computes one operator with the maths of model.mk, and writes its result back to HBM
// (the HBM of the chip it runs on). Weights stream through VMEM tile by tile (a
// pipeline per kernel, its output tiles written back as the next ones arrive), so every
// kernel fits k3-full's VMEM.
//
// Work split: column block j of a projection on core j % NCORES (so a head's columns,
// block h, are on the core that owns head h and per-head operators need no gather);
// row-wise operators (norms, routing, combine, residual adds) are computed by core 0 of
// every chip for its chip's HBM. A gather kernel then copies each core's blocks into
// the same HBM array of every other chip (remote DMA, HBM to HBM), so the next kernel
// finds the whole activation in its own chip's HBM. Launch boundaries order everything.
import "model.mk";
import "tensors.mk";
import "vmem.mk";

// ---------------------------------------------------------------- projections

// y[:, this core's blocks] = x @ w (N a multiple of 128), the weight's column blocks
// streamed, each block of y written back while the next ones are on their way; a
// projection narrower than a block (the router of a small model) on core 0 whole.
fn op_proj<K, N>(x: hbm f32[BATCH, K], w: hbm bf16[K, N], y: hbm f32[BATCH, N]) {
    vmem xv: f32[BATCH, K];
    vmem xb: bf16[BATCH, K];
    sem s;
    let me = global_core(chip_id(), core_id());
    if N % 128 == 0 {
        if me < N / 128 {
            start copy(x, xv, s);
            wait copy(x, xv, s);
            xb = bf16(xv);
            pipeline j in me..N / 128 step NCORES {
                input wt = w[:, j * 128 +: 128];
                output yt = y[:, j * 128 +: 128];
                yt = matmul(xb, wt);
            }
        }
    } else if me == 0 {
        vmem wv: bf16[K, N];
        vmem yv: f32[BATCH, N];
        start copy(x, xv, s);
        start copy(w, wv, s);
        wait copy(x, xv, s);
        wait copy(w, wv, s);
        yv = matmul(bf16(xv), wv);
        start copy(yv, y, s);
        wait copy(yv, y, s);
    }
}

kernel proj<K, N>(x: hbm f32[BATCH, K], w: hbm bf16[K, N], y: hbm f32[BATCH, N]) {
    op_proj(x, w, y);
}
kernel router_proj<K, N>(x: hbm f32[BATCH, K], w: hbm bf16[K, N], y: hbm f32[BATCH, N]) {
    region "router" { op_proj(x, w, y); }
}
kernel lm_proj<K, N>(x: hbm f32[BATCH, K], w: hbm bf16[K, N], y: hbm f32[BATCH, N]) {
    region "lm_head" { op_proj(x, w, y); }
}

// A KDA per-head projection from this chip's shard (shard.mk, KSH: w holds the KSL head
// blocks of the chip's cores): y's block h, on core h % NCORES, from w's block
// h / NCORES * CORES_PER_CHIP + h % CORES_PER_CHIP.
kernel head_proj<K, NS>(x: hbm f32[BATCH, K], w: hbm bf16[K, NS], y: hbm f32[BATCH, W]) {
    vmem xv: f32[BATCH, K];
    vmem xb: bf16[BATCH, K];
    sem s;
    let me = global_core(chip_id(), core_id());
    if me < HEADS {
        start copy(x, xv, s);
        wait copy(x, xv, s);
        xb = bf16(xv);
        pipeline h in me..HEADS step NCORES {
            input wt = w[:, (h / NCORES * CORES_PER_CHIP + h % CORES_PER_CHIP) * HD +: HD];
            output yt = y[:, h * HD +: HD];
            yt = matmul(xb, wt);
        }
    }
}

// ---------------------------------------------------------------------- gathers

// Blocks of nb owned by the cores of chip `chip` (block j on core j % NCORES).
fn chip_blocks(nb: i32, chip: i32, out: smem i32[1]) {
    out[0] = 0;
    for c in chip * CORES_PER_CHIP..(chip + 1) * CORES_PER_CHIP {
        out[0] = out[0] + (max(nb - c, 0) + NCORES - 1) / NCORES;
    }
}

// All-gather of y [BATCH, N] across chips: every core copies its column blocks (block j
// on core j % NCORES; a y narrower than a block: all of it, from core 0) from its chip's
// HBM into the same columns on every other chip.
kernel gather<N>(y: hbm f32[BATCH, N]) {
    smem cnt: i32[1];
    sem ssend;
    sem rrecv;
    let me = global_core(chip_id(), core_id());
    let chip = chip_id();
    let bw = min(N, 128);
    let nb = N / bw;
    region "allgather" {
        for j in me..nb step NCORES {
            for c in 1..NCHIPS {
                start copy(y[:, j * bw +: bw], y[:, j * bw +: bw] @ ((chip + c) % NCHIPS * CORES_PER_CHIP), ssend,
                           rrecv);
            }
        }
        wait ((max(nb - me, 0) + NCORES - 1) / NCORES * (NCHIPS - 1)) * copy(y[:, 0:bw], y[:, 0:bw] @ 0, ssend,
                                                                             rrecv);
        if core_id() == 0 {
            chip_blocks(nb, chip, cnt);
            wait recv (nb - cnt[0]) * copy(y[:, 0:bw], y[:, 0:bw] @ 0, ssend, rrecv);
        }
    }
}

// All-reduce of np parts of y [BATCH, n] (programs/k3/allreduce.mk): parts holds part p
// at rows p*BATCH .. p*BATCH + BATCH - 1, written to its chip's HBM by the previous
// kernel; rows come in units of ru rows, unit u made by core u % NCORES (ru = BATCH: a
// part per core; ru = 1: a row per core). Every core pushes its units into the same rows
// on every other chip; core 0 of each chip waits for the rest, adds the parts up by the
// padded halving tree (psum) and writes y.
fn op_allreduce<NR, N>(parts: hbm f32[NR, N], y: hbm f32[BATCH, N], np: i32, lg: i32, ru: i32) {
    vmem pv: f32[1 << lg][BATCH, N];
    smem cnt: i32[1];
    sem s;
    sem ssend;
    sem rrecv;
    let me = global_core(chip_id(), core_id());
    let chip = chip_id();
    let nu = np * BATCH / ru;
    region "allreduce" {
        for u in me..nu step NCORES {
            for c in 1..NCHIPS {
                start copy(parts[u * ru +: ru, :], parts[u * ru +: ru, :] @ ((chip + c) % NCHIPS * CORES_PER_CHIP),
                           ssend, rrecv);
            }
        }
        wait ((max(nu - me, 0) + NCORES - 1) / NCORES * (NCHIPS - 1)) * copy(parts[0:ru, :], parts[0:ru, :] @ 0,
                                                                             ssend, rrecv);
        if core_id() == 0 {
            chip_blocks(nu, chip, cnt);
            wait recv (nu - cnt[0]) * copy(parts[0:ru, :], parts[0:ru, :] @ 0, ssend, rrecv);
        }
    }
    if core_id() == 0 {
        region "combine" {
            for q in 0..np {
                start copy(parts[q * BATCH +: BATCH, :], pv[q], s);
            }
            wait np * copy(parts[0:BATCH, :], pv[0], s);
            psum(pv, 0, lg);
            start copy(pv[0], y, s);
            wait copy(pv[0], y, s);
        }
    }
}

// The attention output: part h (head h's rows of wo) made by the head's owner.
kernel allreduce_attn(parts: hbm f32[HEADS * BATCH, DIM], y: hbm f32[BATCH, DIM]) {
    op_allreduce(parts, y, HEADS, LGH, BATCH);
}
// The MoE's latent output: routed slot j's row b (weighted) at row j*BATCH + b, shared
// expert s at (TOPK + s)*BATCH + b, row r made by core r % NCORES.
kernel allreduce_moe(parts: hbm f32[NPE * BATCH, LATENT], y: hbm f32[BATCH, LATENT]) {
    op_allreduce(parts, y, NPE, LGE, 1);
}

// --------------------------------------------------------------------- row-wise

// y = rmsnorm(x, wn) over rows of length N (core 0 of each chip).
kernel norm<N>(x: hbm f32[BATCH, N], wn: hbm bf16[N], y: hbm f32[BATCH, N]) {
    vmem xv: f32[BATCH, N];
    vmem wv: bf16[1, N];
    sem s;
    region "norm" {
        if core_id() == 0 {
            start copy(x, xv, s);
            start copy(wn, wv, s);
            wait copy(x, xv, s);
            wait copy(wn, wv, s);
            rmsnorm(xv, wv, xv, N);
            start copy(xv, y, s);
            wait copy(xv, y, s);
        }
    }
}

// h <- h + a; dbg <- a (core 0 of each chip).
kernel residual(h: hbm f32[BATCH, DIM], a: hbm f32[BATCH, DIM], dbg: hbm f32[BATCH, DIM]) {
    vmem hv: f32[BATCH, DIM];
    vmem av: f32[BATCH, DIM];
    sem s;
    if core_id() == 0 {
        start copy(h, hv, s);
        start copy(a, av, s);
        wait copy(h, hv, s);
        wait copy(a, av, s);
        start copy(av, dbg, s);
        hv = hv + av;
        start copy(hv, h, s);
        wait copy(av, dbg, s);
        wait copy(hv, h, s);
    }
}

// -------------------------------------------------------------------------- KDA
// Per-head operators run on the head's owner (core h % NCORES), which holds the head's
// projection columns in its chip's HBM, for every row group of the state layout.

// Short conv + silu (+ L2 norm of q, k) of this core's heads; updates the conv history.
kernel kda_conv(q: hbm f32[BATCH, W], k: hbm f32[BATCH, W], v: hbm f32[BATCH, W], w: K3Weights, st: K3State,
                ai: i32, qn: hbm f32[BATCH, W], kn: hbm f32[BATCH, W], vn: hbm f32[BATCH, W]) {
    vmem u: f32[3][BATCH, HD];
    vmem y: f32[3][BATCH, HD];
    vmem cw: bf16[3 * CONVK, HD];
    vmem hv: f32[9 * BATCH, HD];
    sem s;
    let me = global_core(chip_id(), core_id());
    region "kda" {
        for h in me..HEADS step NCORES {
            let c = h * HD;
            start copy(q[:, c +: HD], u[0], s);
            start copy(k[:, c +: HD], u[1], s);
            start copy(v[:, c +: HD], u[2], s);
            start copy(w.kda_conv_q[ai, :, c +: HD], cw[0:CONVK, :], s);
            start copy(w.kda_conv_k[ai, :, c +: HD], cw[CONVK:2 * CONVK, :], s);
            start copy(w.kda_conv_v[ai, :, c +: HD], cw[2 * CONVK:3 * CONVK, :], s);
            start copy(st.conv_state[ai, :, c +: HD], hv, s);
            wait 3 * copy(q[:, c +: HD], u[0], s);
            wait 3 * copy(w.kda_conv_q[ai, :, c +: HD], cw[0:CONVK, :], s);
            wait copy(st.conv_state[ai, :, c +: HD], hv, s);
            for g in 0..RG {       // the history's row groups (shard.mk)
                let r0 = g * RB;
                let hg = g * 9 * RB;
                conv4(u[0][r0 +: RB, :], hv[hg +: 3 * RB, :], cw[0:CONVK, :], y[0][r0 +: RB, :], RB);
                conv4(u[1][r0 +: RB, :], hv[hg + 3 * RB +: 3 * RB, :], cw[CONVK:2 * CONVK, :], y[1][r0 +: RB, :],
                      RB);
                conv4(u[2][r0 +: RB, :], hv[hg + 6 * RB +: 3 * RB, :], cw[2 * CONVK:3 * CONVK, :],
                      y[2][r0 +: RB, :], RB);
            }
            kda_qkv_act(y[0], y[1], y[2], BATCH);
            start copy(y[0], qn[:, c +: HD], s);
            start copy(y[1], kn[:, c +: HD], s);
            start copy(y[2], vn[:, c +: HD], s);
            start copy(hv, st.conv_state[ai, :, c +: HD], s);
            wait 3 * copy(y[0], qn[:, c +: HD], s);
            wait copy(hv, st.conv_state[ai, :, c +: HD], s);
        }
    }
}

// kda_conv for verify rows (SPEC, RG = 1): the BATCH rows are consecutive positions of one
// sequence, so each row's taps are the rows before it (conv4_seq over [the history of
// spec_base | the rows' inputs]); the history after every row is kept in row r's slot of
// conv_state, for the next step to start from its last accepted row.
kernel kda_conv_spec(q: hbm f32[BATCH, W], k: hbm f32[BATCH, W], v: hbm f32[BATCH, W], w: K3Weights, st: K3State,
                     io: K3Io, ai: i32, qn: hbm f32[BATCH, W], kn: hbm f32[BATCH, W], vn: hbm f32[BATCH, W]) {
    vmem ext: f32[3][3 + BATCH, HD];
    vmem y: f32[3][BATCH, HD];
    vmem cw: bf16[3 * CONVK, HD];
    vmem hv: f32[9 * BATCH, HD];
    smem sb: i32[1];
    sem s;
    let me = global_core(chip_id(), core_id());
    region "kda" {
        start copy(io.spec_base, sb, s);
        wait copy(io.spec_base, sb, s);
        let base = sb[0];
        for h in me..HEADS step NCORES {
            let c = h * HD;
            start copy(q[:, c +: HD], ext[0][3:3 + BATCH, :], s);
            start copy(k[:, c +: HD], ext[1][3:3 + BATCH, :], s);
            start copy(v[:, c +: HD], ext[2][3:3 + BATCH, :], s);
            start copy(w.kda_conv_q[ai, :, c +: HD], cw[0:CONVK, :], s);
            start copy(w.kda_conv_k[ai, :, c +: HD], cw[CONVK:2 * CONVK, :], s);
            start copy(w.kda_conv_v[ai, :, c +: HD], cw[2 * CONVK:3 * CONVK, :], s);
            start copy(st.conv_state[ai, :, c +: HD], hv, s);
            wait 3 * copy(q[:, c +: HD], ext[0][3:3 + BATCH, :], s);
            wait 3 * copy(w.kda_conv_q[ai, :, c +: HD], cw[0:CONVK, :], s);
            wait copy(st.conv_state[ai, :, c +: HD], hv, s);
            for n in 0..3 {
                for j in 0..3 {
                    ext[n][j:j + 1, :] = hv[(n * 3 + j) * BATCH + base +: 1, :];
                }
                conv4_seq(ext[n], cw[n * CONVK +: CONVK, :], y[n], BATCH);
                for j in 0..3 {
                    hv[(n * 3 + j) * BATCH +: BATCH, :] = ext[n][j + 1 +: BATCH, :];
                }
            }
            kda_qkv_act(y[0], y[1], y[2], BATCH);
            start copy(y[0], qn[:, c +: HD], s);
            start copy(y[1], kn[:, c +: HD], s);
            start copy(y[2], vn[:, c +: HD], s);
            start copy(hv, st.conv_state[ai, :, c +: HD], s);
            wait 3 * copy(y[0], qn[:, c +: HD], s);
            wait copy(hv, st.conv_state[ai, :, c +: HD], s);
        }
    }
}

// Gating of this core's heads: decay logits g and sigmoid(beta) (each head's block of
// bsig holds the sigmoid of the whole beta block; the head reads its own lane).
kernel kda_gate(graw: hbm f32[BATCH, W], beta: hbm f32[BATCH, 128], w: K3Weights, ai: i32, g: hbm f32[BATCH, W],
                bsig: hbm f32[BATCH, W]) {
    vmem gv: f32[BATCH, HD];
    vmem bv: f32[BATCH, HD];
    vmem ad: bf16[2, HD];
    sem s;
    let me = global_core(chip_id(), core_id());
    region "kda" {
        for h in me..HEADS step NCORES {
            let c = h * HD;
            start copy(graw[:, c +: HD], gv, s);
            start copy(beta, bv, s);
            start copy(w.kda_a_log[ai, c +: HD], ad[0, :], s);
            start copy(w.kda_dt_bias[ai, c +: HD], ad[1, :], s);
            wait 2 * copy(graw[:, c +: HD], gv, s);
            wait 2 * copy(w.kda_a_log[ai, c +: HD], ad[0, :], s);
            kda_decay(gv, ad, BATCH);
            bv = sigmoid(bv);
            start copy(gv, g[:, c +: HD], s);
            start copy(bv, bsig[:, c +: HD], s);
            wait 2 * copy(gv, g[:, c +: HD], s);
        }
    }
}

// The recurrent state update of this core's heads; writes q^T S (before the norm).
kernel kda_update_state(qn: hbm f32[BATCH, W], kn: hbm f32[BATCH, W], vn: hbm f32[BATCH, W],
                        g: hbm f32[BATCH, W], bsig: hbm f32[BATCH, W], st: K3State, ai: i32,
                        ocore: hbm f32[BATCH, W]) {
    vmem a: f32[5][BATCH, HD];
    vmem sv: f32[BATCH][HD, HD];
    vmem ov: f32[BATCH, HD];
    sem s;
    let me = global_core(chip_id(), core_id());
    region "kda" {
        for h in me..HEADS step NCORES {
            let c = h * HD;
            start copy(qn[:, c +: HD], a[0], s);
            start copy(kn[:, c +: HD], a[1], s);
            start copy(vn[:, c +: HD], a[2], s);
            start copy(g[:, c +: HD], a[3], s);
            start copy(bsig[:, c +: HD], a[4], s);
            for b in 0..BATCH {
                start copy(st.kda_state[(ai * BATCH + b) * HEADS + h], sv[b], s);
            }
            wait 5 * copy(qn[:, c +: HD], a[0], s);
            wait BATCH * copy(st.kda_state[0], sv[0], s);
            for b in 0..BATCH {
                kda_update(sv[b], sv[b], a[0][b:b + 1, :], a[1][b:b + 1, :], a[2][b:b + 1, :], a[3][b:b + 1, :],
                           a[4][b:b + 1, :], h, ov[b:b + 1, :]);
                start copy(sv[b], st.kda_state[(ai * BATCH + b) * HEADS + h], s);
            }
            start copy(ov, ocore[:, c +: HD], s);
            wait BATCH * copy(sv[0], st.kda_state[0], s);
            wait copy(ov, ocore[:, c +: HD], s);
        }
    }
}

// kda_update_state for verify rows (SPEC): each head's rows go through its recurrence in
// order, from the state of spec_base's slot; the state after row r goes to row r's slot.
kernel kda_update_spec(qn: hbm f32[BATCH, W], kn: hbm f32[BATCH, W], vn: hbm f32[BATCH, W],
                       g: hbm f32[BATCH, W], bsig: hbm f32[BATCH, W], st: K3State, io: K3Io, ai: i32,
                       ocore: hbm f32[BATCH, W]) {
    vmem a: f32[5][BATCH, HD];
    vmem sv: f32[BATCH][HD, HD];
    vmem ov: f32[BATCH, HD];
    smem sb: i32[1];
    sem s;
    let me = global_core(chip_id(), core_id());
    region "kda" {
        start copy(io.spec_base, sb, s);
        wait copy(io.spec_base, sb, s);
        for h in me..HEADS step NCORES {
            let c = h * HD;
            start copy(qn[:, c +: HD], a[0], s);
            start copy(kn[:, c +: HD], a[1], s);
            start copy(vn[:, c +: HD], a[2], s);
            start copy(g[:, c +: HD], a[3], s);
            start copy(bsig[:, c +: HD], a[4], s);
            start copy(st.kda_state[(ai * BATCH + sb[0]) * HEADS + h], sv[0], s);
            wait 5 * copy(qn[:, c +: HD], a[0], s);
            wait copy(st.kda_state[0], sv[0], s);
            for b in 0..BATCH {
                kda_update(sv[max(b - 1, 0)], sv[b], a[0][b:b + 1, :], a[1][b:b + 1, :], a[2][b:b + 1, :],
                           a[3][b:b + 1, :], a[4][b:b + 1, :], h, ov[b:b + 1, :]);
                start copy(sv[b], st.kda_state[(ai * BATCH + b) * HEADS + h], s);
            }
            start copy(ov, ocore[:, c +: HD], s);
            wait BATCH * copy(sv[0], st.kda_state[0], s);
            wait copy(ov, ocore[:, c +: HD], s);
        }
    }
}

// Output of this core's heads: rmsnorm(q^T S, onorm) * sigmoid(output gate logits).
kernel kda_output(ocore: hbm f32[BATCH, W], og: hbm f32[BATCH, W], w: K3Weights, ai: i32, o: hbm f32[BATCH, W]) {
    vmem ov: f32[BATCH, HD];
    vmem gv: f32[BATCH, HD];
    vmem on: bf16[1, HD];
    vmem y: f32[BATCH, HD];
    sem s;
    let me = global_core(chip_id(), core_id());
    region "kda" {
        for h in me..HEADS step NCORES {
            let c = h * HD;
            start copy(ocore[:, c +: HD], ov, s);
            start copy(og[:, c +: HD], gv, s);
            start copy(w.kda_onorm[ai], on[0, :], s);
            wait 2 * copy(ocore[:, c +: HD], ov, s);
            wait copy(w.kda_onorm[ai], on[0, :], s);
            kda_out(ov, on, gv, y, BATCH);
            start copy(y, o[:, c +: HD], s);
            wait copy(y, o[:, c +: HD], s);
        }
    }
}

// Each local head's part of the attention output projection (both kinds): o's head h
// columns times wo's head h rows (streamed), on the head's owner, into rows h*BATCH of parts.
kernel attn_part(o: hbm f32[BATCH, W], wo: hbm bf16[W, DIM], parts: hbm f32[HEADS * BATCH, DIM]) {
    vmem ov: f32[BATCH, HD];
    sem s;
    let me = global_core(chip_id(), core_id());
    pipeline h in me..HEADS step NCORES {
        input wt = wo[h * HD +: HD, :];
        output pt = parts[h * BATCH +: BATCH, :];
        start copy(o[:, h * HD +: HD], ov, s);
        wait copy(o[:, h * HD +: HD], ov, s);
        pt = matmul(bf16(ov), wt);
    }
}

// attn_part for a sharded KDA wo (shard.mk, KSH): head h's rows at its local block.
kernel head_part<NW>(o: hbm f32[BATCH, W], wo: hbm bf16[NW, DIM], parts: hbm f32[HEADS * BATCH, DIM]) {
    vmem ov: f32[BATCH, HD];
    sem s;
    let me = global_core(chip_id(), core_id());
    pipeline h in me..HEADS step NCORES {
        input wt = wo[(h / NCORES * CORES_PER_CHIP + h % CORES_PER_CHIP) * HD +: HD, :];
        output pt = parts[h * BATCH +: BATCH, :];
        start copy(o[:, h * HD +: HD], ov, s);
        wait copy(o[:, h * HD +: HD], ov, s);
        pt = matmul(bf16(ov), wt);
    }
}

// -------------------------------------------------------------------------- MLA

// On each head owner, for its own copy of the cache (K3State): cq = rmsnorm(x wdq, qnorm);
// the new latent bf16(rmsnorm(x wdkv, kvnorm)) into row pos of every sequence's cache.
kernel mla_latent(lq: hbm f32[BATCH, QRANK], lkv: hbm f32[BATCH, KVRANK], w: K3Weights, st: K3State,
                  io: K3Io, mi: i32, cq: hbm f32[BATCH, QRANK]) {
    vmem qv: f32[BATCH, QRANK];
    vmem kv: f32[BATCH, KVRANK];
    vmem qw: bf16[1, QRANK];
    vmem kw: bf16[1, KVRANK];
    vmem ckv: bf16[BATCH, KVRANK];
    smem pv: i32[1];
    sem s;
    region "mla" {
        if global_core(chip_id(), core_id()) < HEADS {
            start copy(io.pos, pv, s);
            start copy(lq, qv, s);
            start copy(lkv, kv, s);
            start copy(w.mla_qnorm[mi], qw[0, :], s);
            start copy(w.mla_kvnorm[mi], kw[0, :], s);
            wait copy(io.pos, pv, s);
            wait copy(lq, qv, s);
            wait copy(lkv, kv, s);
            wait copy(w.mla_qnorm[mi], qw[0, :], s);
            wait copy(w.mla_kvnorm[mi], kw[0, :], s);
            rmsnorm(qv, qw, qv, QRANK);
            rmsnorm(kv, kw, kv, KVRANK);
            ckv = bf16(kv);
            start copy(ckv, select(SPECR, st.mla_cache[(mi * CORES_PER_CHIP + core_id()) * NSEQ, pv[0] +: BATCH, :],
                                   st.mla_cache[(mi * CORES_PER_CHIP + core_id()) * BATCH +: BATCH, pv[0], :]), s);
            if core_id() == 0 {
                start copy(qv, cq, s);
                wait copy(qv, cq, s);
            }
            wait copy(ckv, select(SPECR, st.mla_cache[0, 0:BATCH, :], st.mla_cache[0:BATCH, 0, :]), s);
        }
    }
}

// Absorbed attention of this core's heads, sequence by sequence over its cache (streamed),
// with the output gate. Verify rows (SPEC): one sequence, the matmul's rows are (head, row)
// pairs, row r seeing positions up to pos + r (mla_probs).
kernel mla_attention(q: hbm f32[BATCH, W], gate: hbm f32[BATCH, W], w: K3Weights, st: K3State, io: K3Io,
                     mi: i32, o: hbm f32[BATCH, W]) {
    vmem qv: f32[BATCH, HD];
    vmem gv: f32[BATCH, HD];
    vmem uk: bf16[NHL][HD, KVRANK];
    vmem uv: bf16[NHL][KVRANK, HD];
    vmem qt: bf16[NHL][BATCH, KVRANK];
    vmem ctx: f32[NHL][BATCH, KVRANK];
    vmem qs: bf16[NHL * (BATCH / NSEQ), KVRANK];
    vmem p: f32[NHL * (BATCH / NSEQ), MAXSEQ];
    vmem cx: f32[NHL * (BATCH / NSEQ), KVRANK];
    vmem y: f32[BATCH, HD];
    smem pv: i32[1];
    sem s;
    let me = global_core(chip_id(), core_id());
    region "mla" {
        start copy(io.pos, pv, s);
        wait copy(io.pos, pv, s);
        for t in 0..NHL {
            let h = me + t * NCORES;
            if h < HEADS {
                start copy(q[:, h * HD +: HD], qv, s);
                start copy(w.mla_wuk[mi * HEADS + h], uk[t], s);
                start copy(w.mla_wuv[mi * HEADS + h], uv[t], s);
                wait copy(q[:, h * HD +: HD], qv, s);
                wait 2 * copy(w.mla_wuk[0], uk[t], s);
                qt[t] = bf16(matmul(bf16(qv), uk[t]));
            }
        }
        let copy0 = (mi * CORES_PER_CHIP + core_id()) * NSEQ;
        pipeline b in 0..select(me < HEADS, NSEQ, 0) {
            input cb = st.mla_cache[copy0 + b];
            if SPECR {
                for t in 0..NHL {
                    qs[t * BATCH +: BATCH, :] = qt[t];
                }
            } else {
                for t in 0..NHL {
                    qs[t:t + 1, :] = qt[t][b:b + 1, :];
                }
            }
            mla_probs(qs, cb, pv[0], p);
            cx = matmul(bf16(p), cb);
            if SPECR {
                for t in 0..NHL {
                    ctx[t] = cx[t * BATCH +: BATCH, :];
                }
            } else {
                for t in 0..NHL {
                    ctx[t][b:b + 1, :] = cx[t:t + 1, :];
                }
            }
        }
        for t in 0..NHL {
            let h = me + t * NCORES;
            if h < HEADS {
                start copy(gate[:, h * HD +: HD], gv, s);
                wait copy(gate[:, h * HD +: HD], gv, s);
                y = matmul(bf16(ctx[t]), uv[t]) * sigmoid(gv);
                start copy(y, o[:, h * HD +: HD], s);
                wait copy(y, o[:, h * HD +: HD], s);
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
            wait 2 * copy(a[:, j * HD +: HD], av, s);
            av = silu(av) * bv;
            start copy(av, u[:, j * HD +: HD], s);
            wait copy(av, u[:, j * HD +: HD], s);
        }
    }
}

// -------------------------------------------------------------------------- MoE

// Routing (core 0 of each chip): top-k expert ids and renormalised weights. The ids go to
// HBM through scalars, read back in the fixed order of the timing-only contract
// (row-major; docs/k3_programs.md), so later kernels read them from an i32 HBM array.
kernel topk(rl: hbm f32[BATCH, NEXP], w: K3Weights, fi: i32, topi: hbm i32[BATCH * TOPK],
            topw: hbm f32[BATCH, TOPK]) {
    vmem lv: f32[BATCH, NEXP];
    vmem bv: bf16[1, NEXP];
    vmem iv: i32[BATCH, TOPK];
    vmem wv: f32[BATCH, TOPK];
    smem eid: i32[BATCH * TOPK];
    sem s;
    region "router" {
        if core_id() == 0 {
            start copy(rl, lv, s);
            start copy(w.moe_bias[fi], bv[0, :], s);
            wait copy(rl, lv, s);
            wait copy(w.moe_bias[fi], bv[0, :], s);
            route(lv, bv, iv, wv);
            for b in 0..BATCH {
                for j in 0..TOPK {
                    eid[b * TOPK + j] = scalar(iv[b:b + 1, j:j + 1]);
                }
            }
            start copy(eid, topi, s);
            start copy(wv, topw, s);
            wait copy(eid, topi, s);
            wait copy(wv, topw, s);
        }
    }
}

// Expert (row gx of the stacked arrays, shared or routed) on the rows in f.xlb, its
// weights streamed through the ring (ffn.mk's units, whole on this core), into f.ey[0].
fn op_expert(w: K3Weights, shared: bool, gx: i32, f: FfnBufs, r: Rings, net: Net) {
    unit_a(whole, w, shared, gx, 1, 0, f, r);
    unit_hidden(1, 0, 0, 0, 0, f, net);
    unit_b(whole, w, shared, gx, 1, 0, 0, f, r);
}

// Routed-expert slot j: row b's chosen expert on row b, times its router weight (the
// MoE all-reduce's part j, row b at r = j*BATCH + b, computed on core r % NCORES; with
// expert homes on the expert's home core, below).
kernel expert(xl: hbm f32[BATCH, LATENT], topi: hbm i32[BATCH * TOPK], topw: hbm f32[BATCH, TOPK], w: K3Weights,
              eo: hbm f32[NROWS_EO, LATENT], fi: i32, j: i32) {
    vmem xv: f32[BATCH, LATENT];
    vmem wv: f32[BATCH, TOPK];
    smem ti: i32[BATCH * TOPK];
    let r = Rings();
    let f = FfnBufs();
    let net = Net();
    sem s;
    let me = global_core(chip_id(), core_id());
    if HOMED {
        op_expert_homed(xl, topi, topw, w, eo, fi, j, xv, wv, ti, f, r, net);
    } else {
        region "experts" {
            for rr in j * BATCH..(j + 1) * BATCH {
                if rr % NCORES == me {
                    let b = rr - j * BATCH;
                    start copy(topi, ti, s);
                    start copy(xl, xv, s);
                    start copy(topw, wv, s);
                    wait copy(topi, ti, s);
                    wait copy(xl, xv, s);
                    wait copy(topw, wv, s);
                    f.xlb = bf16(xv);
                    op_expert(w, false, fi * NEXP + ti[b * TOPK + j], f, r, net);
                    f.ey[0][b:b + 1, :] = wv[b:b + 1, j:j + 1] * f.ey[0][b:b + 1, :];
                    start copy(f.ey[0][b:b + 1, :], eo[rr +: 1, :], s);
                    wait copy(f.ey[0][b:b + 1, :], eo[rr +: 1, :], s);
                }
            }
        }
    }
}

// Expert homes (shard.mk, HOMED): row b's expert e runs on its home core, e % NCORES (only
// that core's chip holds its weights), and the weighted row goes to row r = j*BATCH + b of
// eo in the HBM of core r % NCORES's chip, where allreduce_moe takes it from.
fn op_expert_homed(xl: hbm f32[BATCH, LATENT], topi: hbm i32[BATCH * TOPK], topw: hbm f32[BATCH, TOPK],
                   w: K3Weights, eo: hbm f32[NROWS_EO, LATENT], fi: i32, j: i32, xv: vmem f32[BATCH, LATENT],
                   wv: vmem f32[BATCH, TOPK], ti: smem i32[BATCH * TOPK], f: FfnBufs, r: Rings, net: Net) {
    vmem eb: f32[BATCH, LATENT];       // this core's result rows (the sources of their copies)
    sem s;
    sem ssend;
    sem r_res;
    var sent: i32 = 0;
    var nin: i32 = 0;
    var loaded: i32 = 0;
    let me = global_core(chip_id(), core_id());
    region "experts" {
        start copy(topi, ti, s);
        wait copy(topi, ti, s);
        for b in 0..BATCH {
            let e = ti[b * TOPK + j];
            if e % NCORES == me {
                if loaded == 0 {
                    start copy(xl, xv, s);
                    start copy(topw, wv, s);
                    wait copy(xl, xv, s);
                    wait copy(topw, wv, s);
                    f.xlb = bf16(xv);
                    loaded = 1;
                }
                op_expert(w, false, fi * NEL + e / NCORES * CORES_PER_CHIP + e % CORES_PER_CHIP, f, r, net);
                eb[b:b + 1, :] = wv[b:b + 1, j:j + 1] * f.ey[0][b:b + 1, :];
            }
        }
        for b in 0..BATCH {
            let rr = j * BATCH + b;
            let o = rr % NCORES;
            if ti[b * TOPK + j] % NCORES == me {
                if o == me {
                    start copy(eb[b:b + 1, :], eo[rr +: 1, :], r_res);
                } else {
                    start copy(eb[b:b + 1, :], eo[rr +: 1, :] @ o, ssend, r_res);
                    sent += EP_ROW;
                }
            }
            if o == me {
                nin += 1;
            }
        }
    }
    region "alltoall" {
        wait(r_res, nin * EP_ROW);
        wait(ssend, sent);
    }
}

// Shared expert sx: row b of part TOPK + sx (row r0 + b of eo, r0 = (TOPK + sx)*BATCH) on
// core (rb + b) % NCORES, rb = r0 for the tensor-parallel all-reduce (core r % NCORES makes
// row r) and rb = 0 for expert parallelism (the row's home makes it, next to its routed
// parts). Each of those cores computes the whole batch and writes its rows.
kernel shared_expert(xl: hbm f32[BATCH, LATENT], w: K3Weights, eo: hbm f32[NROWS_EO, LATENT], fi: i32, sx: i32) {
    vmem xv: f32[BATCH, LATENT];
    let r = Rings();
    let f = FfnBufs();
    let net = Net();
    sem s;
    let me = global_core(chip_id(), core_id());
    let r0 = (TOPK + sx) * BATCH;
    let rb = select(EXPERT_PARALLEL, 0, r0);
    region "experts" {
        if (me + NCORES - rb % NCORES) % NCORES < BATCH {
            start copy(xl, xv, s);
            wait copy(xl, xv, s);
            f.xlb = bf16(xv);
            op_expert(w, true, fi * NSHARED + sx, f, r, net);
            for b in 0..BATCH {
                if (rb + b) % NCORES == me {
                    start copy(f.ey[0][b +: 1, :], eo[r0 + b +: 1, :], s);
                    wait copy(f.ey[0][b +: 1, :], eo[r0 + b +: 1, :], s);
                }
            }
        }
    }
}
