// The attention of one layer, as the megakernel and the super-operators run it: KDA or
// gated MLA with its weights streamed through the rings (programs/k3/stream.mk), its
// state and small tensors fetched ahead, and the all-reduce of the heads' parts.
//
// Every stream is a fn taking `part`: called with `prefetch` it starts the stream's first
// tiles (the megakernel a layer ahead, a super-operator at its start), with `primed` it
// runs the rest where the tiles are used. The small per-layer tensors and the state go
// into slot set sl (the layer's index within its kind, modulo 2) through `kda_side` /
// `mla_side`, the same fn to start (prefetch) and to wait (primed).
//
// Heads: head h lives on core h % NCORES (shard.mk); a KDA task (head h, rows of group g)
// on core (g*HEADS + h) % NCORES. Each head's part of the output projection, mm(o_h,
// wo[h]) with its 128 rows of wo, goes into slot h of the all-reduce (reduce.mk).
import "model.mk";
import "tensors.mk";
import "coll.mk";

const KWC = (5 * NTL + 1) * HD;      // KDA x-projection columns: 5 blocks per task, then beta
const MXC = (NLATC + NHL) * HD;      // MLA x-projection columns: the latent blocks, then the gates
const NOL = max(NHL, NTL);           // heads or tasks a core holds
param HR_SLOTS = 2 in {1, 2, 3, 4} "slots of the head-row ring (megakernel, super-operators): the depth of the attention output projection's pipeline, a tile one head's 128 rows of wo";
param CR_SLOTS = 2 in {1, 2, 3, 4} "slots of the MLA cache ring (megakernel, super-operators): the depth of the absorbed attention's pipeline, a tile one sequence's cache";
struct AttnBufs {                                // a kernel's attention working set
    kcw: vmem bf16[2 * NTL][3 * CONVK, HD];      // conv taps of q, k, v, per task (slot set sl)
    kad: vmem bf16[2 * NTL][2, HD];              // A_log, dt_bias
    kon: vmem bf16[2][1, HD];                    // the output norm
    kS: vmem f32[2 * NTL * RB][HD, HD];          // the state of each task's rows
    kC: vmem f32[2 * NTL][9 * RB, HD];           // the conv history
    mqn: vmem bf16[2][1, QRANK];
    mkvn: vmem bf16[2][1, KVRANK];
    mwuk: vmem bf16[2 * NHL][HD, KVRANK];
    mwuv: vmem bf16[2 * NHL][KVRANK, HD];
    pr: vmem f32[BATCH, max(KWC, MXC)];          // the x-projection
    oh: vmem f32[NOL][BATCH, HD];                // each head's (task's) output, before wo
    a_src: vmem f32[NOL][BATCH, DIM];            // each head's part (the pushes' sources)
    qt: vmem bf16[NHL][BATCH, KVRANK];           // MLA: each head's absorbed query
    ctx: vmem f32[NHL][BATCH, KVRANK];           // MLA: each head's context
    ckv: vmem bf16[BATCH, KVRANK];               // MLA: the new latent (the cache row)
    cqb: vmem bf16[BATCH, QRANK];                // MLA: the normalised query latent
    hr: vmem bf16[HR_SLOTS][HD, DIM];            // a head's rows of wo (its ring)
    cr: vmem bf16[CR_SLOTS][MAXSEQ, KVRANK];     // one sequence's MLA cache (its ring)
    hrs: sem[HR_SLOTS];
    crs: sem[CR_SLOTS];
    wa: sem[max(2, GROT)];                       // side fetches, by the layer rotation's slot g (coll.mk)
    stw: sem;                                    // state and cache write-backs
    sb: smem i32[1];                             // SPEC: spec_base (K3Io), loaded by the kernel first
}

// ------------------------------------------------------------------------------ KDA

// This core's x-projection tiles: tile 0 the beta block (all heads), tile 1 + 5t + n block
// n (q, k, v, g, og) of task t's head (its block in this chip's arrays: shard.mk, KSH). pr
// gets block n of task t at (5t + n)*128, beta at 5*NTL*128.
fn kda_x(part: i32, w: K3Weights, ai: i32, me: i32, xb: vmem bf16[BATCH, DIM], a: AttnBufs, r: Rings) {
    let nt = (max(NKT - me, 0) + NCORES - 1) / NCORES;
    pipeline c in 0..select(me < NKT, 5 * nt + 1, 0) part part {
        input wt = select(c == 0, w.kda_wb[ai, :, 0:HD],
                   select((c - 1) % 5 == 0, w.kda_wq[ai, :, select(KSH, (c - 1) / 5 * CORES_PER_CHIP + me % CORES_PER_CHIP,
                                                                        (me + (c - 1) / 5 * NCORES) % HEADS) * HD +: HD],
                   select((c - 1) % 5 == 1, w.kda_wk[ai, :, select(KSH, (c - 1) / 5 * CORES_PER_CHIP + me % CORES_PER_CHIP,
                                                                        (me + (c - 1) / 5 * NCORES) % HEADS) * HD +: HD],
                   select((c - 1) % 5 == 2, w.kda_wv[ai, :, select(KSH, (c - 1) / 5 * CORES_PER_CHIP + me % CORES_PER_CHIP,
                                                                        (me + (c - 1) / 5 * NCORES) % HEADS) * HD +: HD],
                   select((c - 1) % 5 == 3, w.kda_wg[ai, :, select(KSH, (c - 1) / 5 * CORES_PER_CHIP + me % CORES_PER_CHIP,
                                                                        (me + (c - 1) / 5 * NCORES) % HEADS) * HD +: HD],
                                            w.kda_wog[ai, :, select(KSH, (c - 1) / 5 * CORES_PER_CHIP + me % CORES_PER_CHIP,
                                                                         (me + (c - 1) / 5 * NCORES) % HEADS) * HD +: HD])))))
                   via r.w0, r.s0;
        a.pr[:, select(c == 0, 5 * NTL, c - 1) * HD +: HD] = matmul(xb, wt);
    }
}

// Each task's 128 rows of wo, through the head-row ring; the body makes the task's part
// and pushes it (its rows) toward the sum.
fn kda_wo(part: i32, w: K3Weights, ai: i32, me: i32, a: AttnBufs, r: Rings, c: Coll, g: i32, net: Net) {
    let nt = (max(NKT - me, 0) + NCORES - 1) / NCORES;
    pipeline t in 0..nt part part {
        input wo = w.kda_wo[ai, select(KSH, t * CORES_PER_CHIP + me % CORES_PER_CHIP, (me + t * NCORES) % HEADS) * HD +: HD, :]
                   via a.hr, a.hrs;
        let task = me + t * NCORES;
        a.a_src[t][0:RB, :] = matmul(bf16(a.oh[t][0:RB, :]), wo);
        if !LOCAL_A {
            ar_send(a.a_src[t][0:RB, :], c.g_a, g * PPH + task % HEADS, task / HEADS * RB, 0, NDB, RS_A, me,
                    NCORES, c.r_o[g], net);
        }
    }
    if LOCAL_A && part != prefetch {
        attn_send_local(nt, me, a, c, g, net);
    }
}

// LOCAL_A (reduce.mk): once the pipeline made every part of this core (RG = 1 there, so a
// task is a head and has all rows), their sum goes out as one part.
fn attn_send_local(nh: i32, me: i32, a: AttnBufs, c: Coll, g: i32, net: Net) {
    psum_local(a.a_src, nh, LGT);
    ar_send(a.a_src[0], c.g_a, g * NPA + me, 0, 0, NDB, RS_A, me, NCORES, c.r_o[g], net);
}

// The small tensors and the state of this core's tasks of KDA layer ai, into slot set sl:
// conv taps, decay parameters, the output norm; each task's rows' state and conv history.
fn kda_side(mode: i32, w: K3Weights, st: K3State, ai: i32, sl: i32, me: i32, a: AttnBufs, s: sem) {
    if me < NKT {
        cp1(mode, w.kda_onorm[ai], a.kon[sl], s);
    }
    for t in 0..NTL {
        let task = me + t * NCORES;
        if task < NKT {
            let h = task % HEADS;
            let g = task / HEADS;
            let k = sl * NTL + t;
            cp(mode, w.kda_conv_q[ai, :, h * HD +: HD], a.kcw[k][0:CONVK, :], s);
            cp(mode, w.kda_conv_k[ai, :, h * HD +: HD], a.kcw[k][CONVK:2 * CONVK, :], s);
            cp(mode, w.kda_conv_v[ai, :, h * HD +: HD], a.kcw[k][2 * CONVK:3 * CONVK, :], s);
            cp1(mode, w.kda_a_log[ai, h * HD +: HD], a.kad[k][0:1, :], s);
            cp1(mode, w.kda_dt_bias[ai, h * HD +: HD], a.kad[k][1:2, :], s);
            cp(mode, st.conv_state[ai, g * 9 * RB +: 9 * RB, h * HD +: HD], a.kC[k], s);
            // Verify rows start from one state: the last accepted row's of the previous step.
            for bl in 0..select(SPECR, 1, RB) {
                cp(mode, st.kda_state[(ai * BATCH + select(SPECR, a.sb[0], g * RB + bl)) * HEADS + h],
                   a.kS[k * RB + bl], s);
            }
        }
    }
}

// The tasks' work after the projections (pr): per task (head h, rows of group g) conv and
// activations, decay, the state update of each row, gated output norm -> a.oh[t]; the new
// conv history and state go back to HBM as soon as they are final.
fn kda_tasks(st: K3State, ai: i32, sl: i32, me: i32, a: AttnBufs) {
    vmem qa: f32[RB, HD];
    vmem ka: f32[RB, HD];
    vmem va: f32[RB, HD];
    vmem bl: f32[BATCH, HD];
    if me < NKT {
        bl = sigmoid(a.pr[:, 5 * NTL * HD +: HD]);
    }
    for t in 0..NTL {
        let task = me + t * NCORES;
        if task < NKT {
            let h = task % HEADS;
            let r0 = task / HEADS * RB;
            let k = sl * NTL + t;
            let c = 5 * t * HD;
            conv4(a.pr[r0 +: RB, c +: HD], a.kC[k][0:3 * RB, :], a.kcw[k][0:CONVK, :], qa, RB);
            conv4(a.pr[r0 +: RB, c + HD +: HD], a.kC[k][3 * RB:6 * RB, :], a.kcw[k][CONVK:2 * CONVK, :], ka, RB);
            conv4(a.pr[r0 +: RB, c + 2 * HD +: HD], a.kC[k][6 * RB:9 * RB, :], a.kcw[k][2 * CONVK:3 * CONVK, :], va,
                  RB);
            start copy(a.kC[k], st.conv_state[ai, r0 * 9 +: 9 * RB, h * HD +: HD], a.stw);
            kda_qkv_act(qa, ka, va, RB);
            kda_decay(a.pr[r0 +: RB, c + 3 * HD +: HD], a.kad[k], RB);
            for b in 0..RB {
                kda_update(a.kS[k * RB + b], a.kS[k * RB + b], qa[b:b + 1, :], ka[b:b + 1, :], va[b:b + 1, :],
                           a.pr[r0 + b +: 1, c + 3 * HD +: HD], bl[r0 + b +: 1, :], h, a.oh[t][b:b + 1, :]);
                start copy(a.kS[k * RB + b], st.kda_state[(ai * BATCH + r0 + b) * HEADS + h], a.stw);
            }
            kda_out(a.oh[t][0:RB, :], a.kon[sl], a.pr[r0 +: RB, c + 4 * HD +: HD], a.oh[t][0:RB, :], RB);
        }
    }
}

// kda_tasks for verify rows (SPEC; one task per head, RB = BATCH): the rows go through the
// head's recurrence in order. The conv runs over [the history of the last accepted row |
// the rows' inputs] (conv4_seq); the history after every row and the state after every
// row are kept, in row r's slot of conv_state and kda_state, so that the next step can
// start from its last accepted row (spec_base) and a rejected row leaves nothing that is
// read again (docs/k3_programs.md, "Speculative decoding").
fn kda_tasks_spec(st: K3State, ai: i32, sl: i32, me: i32, a: AttnBufs) {
    if SPECR {       // (compiled only for verify rows: the slices below assume RB = BATCH)
        vmem ext: f32[3][3 + BATCH, HD];
        vmem qa: f32[BATCH, HD];
        vmem ka: f32[BATCH, HD];
        vmem va: f32[BATCH, HD];
        vmem bl: f32[BATCH, HD];
        let base = a.sb[0];
        if me < NKT {
            bl = sigmoid(a.pr[:, 5 * NTL * HD +: HD]);
        }
        for t in 0..NTL {
            let task = me + t * NCORES;
            if task < NKT {
                let h = task % HEADS;
                let k = sl * NTL + t;
                let c = 5 * t * HD;
                for n in 0..3 {
                    for j in 0..3 {
                        ext[n][j:j + 1, :] = a.kC[k][(n * 3 + j) * BATCH + base +: 1, :];
                    }
                    ext[n][3:3 + BATCH, :] = a.pr[:, c + n * HD +: HD];
                }
                conv4_seq(ext[0], a.kcw[k][0:CONVK, :], qa, BATCH);
                conv4_seq(ext[1], a.kcw[k][CONVK:2 * CONVK, :], ka, BATCH);
                conv4_seq(ext[2], a.kcw[k][2 * CONVK:3 * CONVK, :], va, BATCH);
                for n in 0..3 {
                    for j in 0..3 {
                        a.kC[k][(n * 3 + j) * BATCH +: BATCH, :] = ext[n][j + 1 +: BATCH, :];
                    }
                }
                start copy(a.kC[k], st.conv_state[ai, 0:9 * BATCH, h * HD +: HD], a.stw);
                kda_qkv_act(qa, ka, va, BATCH);
                kda_decay(a.pr[:, c + 3 * HD +: HD], a.kad[k], BATCH);
                for b in 0..BATCH {
                    kda_update(a.kS[k * BATCH + max(b - 1, 0)], a.kS[k * BATCH + b], qa[b:b + 1, :], ka[b:b + 1, :],
                               va[b:b + 1, :], a.pr[b +: 1, c + 3 * HD +: HD], bl[b +: 1, :], h, a.oh[t][b:b + 1, :]);
                    start copy(a.kS[k * BATCH + b], st.kda_state[(ai * BATCH + b) * HEADS + h], a.stw);
                }
                kda_out(a.oh[t], a.kon[sl], a.pr[:, c + 4 * HD +: HD], a.oh[t], BATCH);
            }
        }
    }
}

// The write-backs of this core's tasks (after the layer): state and conv history.
fn kda_written(me: i32, a: AttnBufs) {
    let nt = (max(NKT - me, 0) + NCORES - 1) / NCORES;
    wait(a.stw, nt * (RB * bytes(a.kS[0]) + bytes(a.kC[0])));
}

// ------------------------------------------------------------------------------ MLA

// This core's MLA x-projection tiles: its latent blocks ([wdq | wdkv]: all of them on the
// head owners when replicated, else blocks me, me + NCORES, ...), then its heads' gate
// blocks. pr gets the latent blocks from column 0, the gates from NLATC*128.
fn mla_x(part: i32, w: K3Weights, mi: i32, me: i32, xb: vmem bf16[BATCH, DIM], a: AttnBufs, r: Rings) {
    let lat0 = select(REP_LAT, 0, me);
    let latn = select(REP_LAT, select(me < HEADS, NLATB, 0), (max(NLATB - me, 0) + NCORES - 1) / NCORES);
    let lstep = select(REP_LAT, 1, NCORES);
    let nh = (max(HEADS - me, 0) + NCORES - 1) / NCORES;
    pipeline c in 0..latn + nh part part {
        input wt = select(c < latn,
                   select(lat0 + c * lstep < NQB, w.mla_wdq[mi, :, (lat0 + c * lstep) * HD +: HD],
                                                  w.mla_wdkv[mi, :, (lat0 + c * lstep - NQB) * HD +: HD]),
                   w.mla_wgate[mi, :, (me + (c - latn) * NCORES) * HD +: HD]) via r.w0, r.s0;
        a.pr[:, select(c < latn, c, NLATC + c - latn) * HD +: HD] = matmul(xb, wt);
    }
}

// The heads' query up-projection: wuq's block of each local head, q_h = cq wuq_h, then the
// absorbed query qt_h = bf16(q_h wuk[h]) (the rounding mm applies to it anyway).
fn mla_uq(part: i32, w: K3Weights, mi: i32, sl: i32, me: i32, a: AttnBufs, r: Rings) {
    vmem qh: f32[BATCH, HD];
    let nh = (max(HEADS - me, 0) + NCORES - 1) / NCORES;
    pipeline t in 0..nh part part {
        input wt = w.mla_wuq[mi, :, (me + t * NCORES) * HD +: HD] via r.w1, r.s1;
        qh = matmul(a.cqb, wt);
        a.qt[t] = bf16(matmul(bf16(qh), a.mwuk[sl * NHL + t]));
    }
}

// The sequences' caches, one at a time through the cache ring: write the new latent at
// pos, then for this core's heads (rows of one matmul) the probabilities over positions
// 0..pos and the context p . cache. Verify rows (SPEC): one sequence; its BATCH new rows
// go in at pos .. pos + BATCH - 1 and the matmul's rows are (head, row) pairs, row r
// seeing positions up to pos + r (mla_probs).
fn mla_cache_rows(part: i32, st: K3State, mi: i32, me: i32, pos: i32, a: AttnBufs, r: Rings) {
    vmem qs: bf16[NHL * (BATCH / NSEQ), KVRANK];
    vmem p: f32[NHL * (BATCH / NSEQ), MAXSEQ];
    vmem cx: f32[NHL * (BATCH / NSEQ), KVRANK];
    let copy0 = (mi * CORES_PER_CHIP + core_id()) * NSEQ;
    pipeline b in 0..select(me < HEADS, NSEQ, 0) part part {
        input cb = st.mla_cache[copy0 + b] via a.cr, a.crs;
        if SPECR {
            cb[pos +: BATCH, :] = a.ckv;
            for t in 0..NHL {
                qs[t * BATCH +: BATCH, :] = a.qt[t];
            }
        } else {
            cb[pos +: 1, :] = a.ckv[b:b + 1, :];
            for t in 0..NHL {
                qs[t:t + 1, :] = a.qt[t][b:b + 1, :];
            }
        }
        mla_probs(qs, cb, pos, p);
        cx = matmul(bf16(p), cb);
        if SPECR {
            for t in 0..NHL {
                a.ctx[t] = cx[t * BATCH +: BATCH, :];
            }
        } else {
            for t in 0..NHL {
                a.ctx[t][b:b + 1, :] = cx[t:t + 1, :];
            }
        }
    }
}

// Each head's 128 rows of wo; the body makes the head's output (wuv, the gate) and its
// part, and pushes the part toward the sum.
fn mla_wo(part: i32, w: K3Weights, mi: i32, sl: i32, me: i32, a: AttnBufs, r: Rings, c: Coll, g: i32, net: Net) {
    let nh = (max(HEADS - me, 0) + NCORES - 1) / NCORES;
    pipeline t in 0..nh part part {
        input wo = w.mla_wo[mi, (me + t * NCORES) * HD +: HD, :] via a.hr, a.hrs;
        a.oh[t] = matmul(bf16(a.ctx[t]), a.mwuv[sl * NHL + t]) * sigmoid(a.pr[:, (NLATC + t) * HD +: HD]);
        a.a_src[t] = matmul(bf16(a.oh[t]), wo);
        if !LOCAL_A {
            ar_send(a.a_src[t], c.g_a, g * PPH + me + t * NCORES, 0, 0, NDB, RS_A, me, NCORES, c.r_o[g], net);
        }
    }
    if LOCAL_A && part != prefetch {
        attn_send_local(nh, me, a, c, g, net);
    }
}

// The norms and the heads' absorbed wuk/wuv of MLA layer mi, into slot set sl.
fn mla_side(mode: i32, w: K3Weights, mi: i32, sl: i32, me: i32, a: AttnBufs, s: sem) {
    if me < HEADS {
        cp1(mode, w.mla_qnorm[mi], a.mqn[sl], s);
        cp1(mode, w.mla_kvnorm[mi], a.mkvn[sl], s);
    }
    for t in 0..NHL {
        let h = me + t * NCORES;
        if h < HEADS {
            cp(mode, w.mla_wuk[mi * HEADS + h], a.mwuk[sl * NHL + t], s);
            cp(mode, w.mla_wuv[mi * HEADS + h], a.mwuv[sl * NHL + t], s);
        }
    }
}

// The head owners' latent work: the norms, the new cache row (into the cache tiles as they
// stream; to HBM once they have all landed), the normalised query latent.
fn mla_norms(sl: i32, me: i32, lat: vmem f32[BATCH, QRANK + KVRANK], a: AttnBufs) {
    vmem cq: f32[BATCH, QRANK];
    vmem ckf: f32[BATCH, KVRANK];
    if me < HEADS {
        rmsnorm(lat[:, 0:QRANK], a.mqn[sl], cq, QRANK);
        a.cqb = bf16(cq);
        rmsnorm(lat[:, QRANK:QRANK + KVRANK], a.mkvn[sl], ckf, KVRANK);
        a.ckv = bf16(ckf);
    }
}

// ------------------------------------------------------------------------- one layer

// Everything of a layer's attention that can start before it runs (kind 1 MLA layer ki,
// kind 0 KDA layer ki): the first tiles of its streams, its small tensors and state.
fn attn_prefetch(w: K3Weights, st: K3State, kind: i32, ki: i32, me: i32, xb: vmem bf16[BATCH, DIM], a: AttnBufs,
                 r: Rings, c: Coll, g: i32, net: Net, s: sem) {
    if kind == 1 {
        mla_x(prefetch, w, ki, me, xb, a, r);
        mla_cache_rows(prefetch, st, ki, me, 0, a, r);
        mla_wo(prefetch, w, ki, ki % 2, me, a, r, c, g, net);
        mla_side(prefetch, w, ki, ki % 2, me, a, s);
    } else {
        kda_x(prefetch, w, ki, me, xb, a, r);
        kda_wo(prefetch, w, ki, me, a, r, c, g, net);
        kda_side(prefetch, w, st, ki, ki % 2, me, a, s);
    }
}

// A layer's attention up to its last weight-ring stream (the caller then starts the FFN's
// first tiles: the ring is free): its small tensors, the x-projection, and for MLA the
// latent (gathered when split), its norms and the heads' absorbed queries.
fn attn_front(w: K3Weights, st: K3State, kind: i32, ki: i32, me: i32, pos: i32, xb: vmem bf16[BATCH, DIM],
              a: AttnBufs, r: Rings, c: Coll, g: i32, net: Net, s: sem) {
    if kind == 1 {
        region "mla" {
            mla_side(primed, w, ki, ki % 2, me, a, s);
            mla_x(primed, w, ki, me, xb, a, r);
            mla_uq(prefetch, w, ki, ki % 2, me, a, r);
            if !REP_LAT {
                all_gather(a.pr[:, 0:NLATL * HD], c.g_lat[g], NLATB, me, NHEADC, c.r_lat[g], c.q[QS_LAT],
                           net);
            }
            mla_norms(ki % 2, me, select(REP_LAT, a.pr[:, 0:QRANK + KVRANK], c.g_lat[g]), a);
            mla_uq(primed, w, ki, ki % 2, me, a, r);
        }
    } else {
        region "kda" {
            kda_side(primed, w, st, ki, ki % 2, me, a, s);
            kda_x(primed, w, ki, me, xb, a, r);
        }
    }
}

// The rest of the layer's attention: the heads' work and their parts, pushed toward the
// sum (attn_sum waits for them and adds them up).
fn attn_back(w: K3Weights, st: K3State, kind: i32, ki: i32, me: i32, pos: i32, a: AttnBufs, r: Rings, c: Coll,
             g: i32, net: Net) {
    if kind == 1 {
        region "mla" {
            mla_cache_rows(primed, st, ki, me, pos, a, r);
            // The new row goes to HBM only now: the cache tiles read row pos (and overwrite
            // it in VMEM), so an earlier write would race with their reads.
            if me < HEADS {
                start copy(a.ckv, select(SPECR, st.mla_cache[(ki * CORES_PER_CHIP + core_id()) * NSEQ, pos +: BATCH, :],
                                         st.mla_cache[(ki * CORES_PER_CHIP + core_id()) * BATCH +: BATCH, pos, :]),
                           a.stw);
            }
            mla_wo(primed, w, ki, ki % 2, me, a, r, c, g, net);
        }
    } else {
        region "kda" {
            if SPECR {
                kda_tasks_spec(st, ki, ki % 2, me, a);
            } else {
                kda_tasks(st, ki, ki % 2, me, a);
            }
            kda_wo(primed, w, ki, me, a, r, c, g, net);
        }
    }
}

// Wait for the layer's state write-backs (KDA state and conv history, or the cache row).
fn attn_written(kind: i32, me: i32, a: AttnBufs) {
    if kind == 1 {
        if me < HEADS {
            wait(a.stw, bytes(a.ckv));
        }
    } else {
        kda_written(me, a);
    }
}
