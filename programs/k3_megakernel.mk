// Kimi-K3 decode as ONE kernel per step (the megakernel), on every core of the mesh.
//
// One launch runs the whole step: embedding, every layer in a loop (the attention kind
// KDA/MLA and the FFN kind dense/MoE read from `layer_plan` at run time), final norm
// and LM head. While layer l computes, layer l+1's weights (and its KDA state / MLA
// cache) stream into the other half of double-buffered VMEM slots; the router's top-k
// is read into scalars to fetch exactly the chosen experts; all collectives are in the
// kernel. Maths: programs/k3/model.mk (the contract of docs/k3.md); sharding:
// programs/k3/shard.mk; the all-gather: programs/k3/gather.mk; the layout of
// everything: docs/k3_programs.md.
import "k3/model.mk";
import "k3/shard.mk";
import "k3/allreduce.mk";
import "k3/moe_ep.mk";

reference "mkemu.programs.k3.driver:drive";

// The gather sites rotate over 2 slots by layer parity; a barrier every GROT layers
// keeps a fast core from writing a slot a slow core still reads (docs/k3_programs.md).
const GROT = 2;
// Routed-expert fetches in flight per core (es[li % ES]).
param ES = 2 in {1, 2, 3, 4} "routed-expert weight fetches in flight per core";
// Routed-expert weight and output slots: distinct experts a core may run in one layer.
const NEW = max(NEL, SCHEME * EP_NDE);
// Receive semaphores of the gathers that are split (not replicated) in this build, two
// per site (layer parity), packed into one array r_sp; a replicated site uses none.
const SPF = max(1 - REP_UP, 1 - REP_D2);
const OFF_L = 0;
const OFF_R = OFF_L + 2 * (1 - REP_LAT);
const OFF_F = OFF_R + 2 * (1 - REP_RD);
const OFF_U = OFF_F + 2 * SPF;
const OFF_M = OFF_U + (1 - REP_D13);
const NSP = max(1, OFF_M + (1 - LM_ROOT));

// ------------------------------------------------------------------ DMA helpers
// mode 0 starts the copy, mode 1 waits for it: a fetch fn is written once and called
// twice (start when prefetching, wait before use) so the two always match.

fn cpb(mode: i32, src: hbm bf16[r, c], dst: vmem bf16[r, c], r: i32, c: i32, s: sem) {
    if mode == 0 { start copy(src, dst, s); } else { wait copy(src, dst, s); }
}

fn cpb1(mode: i32, src: hbm bf16[c], dst: vmem bf16[1, c], c: i32, s: sem) {
    if mode == 0 { start copy(src, dst, s); } else { wait copy(src, dst, s); }
}

fn cpf(mode: i32, src: hbm f32[r, c], dst: vmem f32[r, c], r: i32, c: i32, s: sem) {
    if mode == 0 { start copy(src, dst, s); } else { wait copy(src, dst, s); }
}

// ------------------------------------------------------------- weight streaming

// Columns of a KDA task holder's fused x-projection: per local task t (head h) the
// blocks q, k, v, g, og of head h at (5t + n)*128, then the beta block (all heads).
const KWC = (5 * NTL + 1) * HD;
// ... of an MLA layer: this core's [wdq | wdkv] blocks (all of them if replicated), then
// per local head its wgate block.
const MXC = (NLATC + NHL) * HD;
// Slots of the heads' output buffer (MLA: NHL heads; KDA: NTL tasks).
const NOL = max(NHL, NTL);

// KDA layer `ai` into slot set `sl` (0/1): for this core's tasks t (task = me + t*NCORES:
// head h, row group g) head h's q/k/v/g/og column blocks, conv taps and decay params,
// and the state and conv history of its rows; the beta block and onorm (task holders);
// wo (this core's blocks, or all of it if replicated).
fn kda_fetch(mode: i32, ai: i32, sl: i32, me: i32,
             kda_wq: hbm bf16[NKDA, DIM, W], kda_wk: hbm bf16[NKDA, DIM, W], kda_wv: hbm bf16[NKDA, DIM, W],
             kda_conv_q: hbm bf16[NKDA, CONVK, W], kda_conv_k: hbm bf16[NKDA, CONVK, W],
             kda_conv_v: hbm bf16[NKDA, CONVK, W], kda_wg: hbm bf16[NKDA, DIM, W],
             kda_a_log: hbm bf16[NKDA, W], kda_dt_bias: hbm bf16[NKDA, W], kda_wb: hbm bf16[NKDA, DIM, 128],
             kda_onorm: hbm bf16[NKDA, HD], kda_wog: hbm bf16[NKDA, DIM, W], kda_wo: hbm bf16[NKDA, W, DIM],
             kda_state: hbm f32[NKDA * BATCH * HEADS, HD, HD], conv_state: hbm f32[NKDA, 9 * BATCH, W],
             kw: vmem bf16[2][DIM, KWC], kcw: vmem bf16[2 * NTL][3 * CONVK, HD], kad: vmem bf16[2 * NTL][2, HD],
             kon: vmem bf16[2][1, HD], kwo: vmem bf16[2 * NTL][HD, DIM], kS: vmem f32[2 * NTL * RB][HD, HD],
             kC: vmem f32[2 * NTL][9 * RB, HD], s: sem) {
    if me < NKT {
        cpb(mode, kda_wb[ai, :, 0:HD], kw[sl][:, 5 * NTL * HD +: HD], DIM, HD, s);
        cpb1(mode, kda_onorm[ai], kon[sl], HD, s);
    }
    for t in 0..NTL {
        let task = me + t * NCORES;
        if task < NKT {
            let h = task % HEADS;
            let g = task / HEADS;
            let k = sl * NTL + t;
            let c = 5 * t * HD;
            cpb(mode, kda_wq[ai, :, h * HD +: HD], kw[sl][:, c +: HD], DIM, HD, s);
            cpb(mode, kda_wk[ai, :, h * HD +: HD], kw[sl][:, c + HD +: HD], DIM, HD, s);
            cpb(mode, kda_wv[ai, :, h * HD +: HD], kw[sl][:, c + 2 * HD +: HD], DIM, HD, s);
            cpb(mode, kda_wg[ai, :, h * HD +: HD], kw[sl][:, c + 3 * HD +: HD], DIM, HD, s);
            cpb(mode, kda_wog[ai, :, h * HD +: HD], kw[sl][:, c + 4 * HD +: HD], DIM, HD, s);
            cpb(mode, kda_conv_q[ai, :, h * HD +: HD], kcw[k][0:CONVK, :], CONVK, HD, s);
            cpb(mode, kda_conv_k[ai, :, h * HD +: HD], kcw[k][CONVK:2 * CONVK, :], CONVK, HD, s);
            cpb(mode, kda_conv_v[ai, :, h * HD +: HD], kcw[k][2 * CONVK:3 * CONVK, :], CONVK, HD, s);
            cpb1(mode, kda_a_log[ai, h * HD +: HD], kad[k][0:1, :], HD, s);
            cpb1(mode, kda_dt_bias[ai, h * HD +: HD], kad[k][1:2, :], HD, s);
            cpb(mode, kda_wo[ai, h * HD +: HD, :], kwo[k], HD, DIM, s);
            cpf(mode, conv_state[ai, g * 9 * RB +: 9 * RB, h * HD +: HD], kC[k], 9 * RB, HD, s);
            for bl in 0..RB {
                cpf(mode, kda_state[(ai * BATCH + g * RB + bl) * HEADS + h], kS[k * RB + bl], HD, HD, s);
            }
        }
    }
}

// MLA layer `mi` into slot set `sl`: the [wdq | wdkv] blocks (this core's, or all of it
// on the head owners if replicated); for head owners the norms, this core's copy of the
// latent cache and per head wuq/wuk/wuv/wgate; wo.
fn mla_fetch(mode: i32, mi: i32, sl: i32, me: i32,
             mla_wdq: hbm bf16[NMLA, DIM, QRANK], mla_qnorm: hbm bf16[NMLA, QRANK],
             mla_wuq: hbm bf16[NMLA, QRANK, W], mla_wdkv: hbm bf16[NMLA, DIM, KVRANK],
             mla_kvnorm: hbm bf16[NMLA, KVRANK], mla_wuk: hbm bf16[NMLA * HEADS, HD, KVRANK],
             mla_wuv: hbm bf16[NMLA * HEADS, KVRANK, HD], mla_wgate: hbm bf16[NMLA, DIM, W],
             mla_wo: hbm bf16[NMLA, W, DIM], mla_cache: hbm bf16[NMLA * CORES_PER_CHIP * BATCH, MAXSEQ, KVRANK],
             mx: vmem bf16[2][DIM, MXC], mqn: vmem bf16[2][1, QRANK], mkvn: vmem bf16[2][1, KVRANK],
             mwuq: vmem bf16[2][QRANK, NHL * HD], mwuk: vmem bf16[2 * NHL][HD, KVRANK],
             mwuv: vmem bf16[2 * NHL][KVRANK, HD], mwo: vmem bf16[2 * NHL][HD, DIM],
             mcache: vmem bf16[2][BATCH * MAXSEQ, KVRANK], s: sem) {
    if REP_LAT == 1 {
        if me < HEADS {
            cpb(mode, mla_wdq[mi], mx[sl][:, 0:QRANK], DIM, QRANK, s);
            cpb(mode, mla_wdkv[mi], mx[sl][:, QRANK:QRANK + KVRANK], DIM, KVRANK, s);
        }
    } else {
        for j in me..NLATB step NCORES {
            let c = (j - me) / NCORES * HD;
            if j < NQB {
                cpb(mode, mla_wdq[mi, :, j * HD +: HD], mx[sl][:, c +: HD], DIM, HD, s);
            } else {
                cpb(mode, mla_wdkv[mi, :, (j - NQB) * HD +: HD], mx[sl][:, c +: HD], DIM, HD, s);
            }
        }
    }
    if me < HEADS {
        cpb1(mode, mla_qnorm[mi], mqn[sl], QRANK, s);
        cpb1(mode, mla_kvnorm[mi], mkvn[sl], KVRANK, s);
        for b in 0..BATCH {
            cpb(mode, mla_cache[(mi * CORES_PER_CHIP + core_id()) * BATCH + b],
                mcache[sl][b * MAXSEQ +: MAXSEQ, :], MAXSEQ, KVRANK, s);
        }
    }
    for t in 0..NHL {
        let h = me + t * NCORES;
        if h < HEADS {
            let k = sl * NHL + t;
            cpb(mode, mla_wuq[mi, :, h * HD +: HD], mwuq[sl][:, t * HD +: HD], QRANK, HD, s);
            cpb(mode, mla_wuk[mi * HEADS + h], mwuk[k], HD, KVRANK, s);
            cpb(mode, mla_wuv[mi * HEADS + h], mwuv[k], KVRANK, HD, s);
            cpb(mode, mla_wgate[mi, :, h * HD +: HD], mx[sl][:, (NLATC + t) * HD +: HD], DIM, HD, s);
            cpb(mode, mla_wo[mi, h * HD +: HD, :], mwo[k], HD, DIM, s);
        }
    }
}

// Shared expert e of MoE layer fi into slot k.
fn shared_fetch(mode: i32, fi: i32, e: i32, k: i32, moe_shared_w1: hbm bf16[NMOE * NSHARED, LATENT, EINTER],
                moe_shared_w3: hbm bf16[NMOE * NSHARED, LATENT, EINTER],
                moe_shared_w2: hbm bf16[NMOE * NSHARED, EINTER, LATENT],
                msw13: vmem bf16[2 * NSL][LATENT, 2 * EINTER], msw2: vmem bf16[2 * NSL][EINTER, LATENT], s: sem) {
    cpb(mode, moe_shared_w1[fi * NSHARED + e], msw13[k][:, 0:EINTER], LATENT, EINTER, s);
    cpb(mode, moe_shared_w3[fi * NSHARED + e], msw13[k][:, EINTER:2 * EINTER], LATENT, EINTER, s);
    cpb(mode, moe_shared_w2[fi * NSHARED + e], msw2[k], EINTER, LATENT, s);
}

// MoE layer `fi` into slot set `sl`: [router | down] (this core's blocks, or all of it),
// the router bias, this core's shared experts, moe_up. Routed experts come after routing.
fn moe_fetch(mode: i32, fi: i32, sl: i32, me: i32,
             moe_router: hbm bf16[NMOE, DIM, NEXP], moe_bias: hbm bf16[NMOE, NEXP],
             moe_down: hbm bf16[NMOE, DIM, LATENT],
             moe_shared_w1: hbm bf16[NMOE * NSHARED, LATENT, EINTER],
             moe_shared_w3: hbm bf16[NMOE * NSHARED, LATENT, EINTER],
             moe_shared_w2: hbm bf16[NMOE * NSHARED, EINTER, LATENT], moe_up: hbm bf16[NMOE, LATENT, DIM],
             mrd: vmem bf16[2][DIM, NRDC * HD], mbias: vmem bf16[2][1, NEXP],
             msw13: vmem bf16[2 * NSL][LATENT, 2 * EINTER],
             msw2: vmem bf16[2 * NSL][EINTER, LATENT], mup: vmem bf16[2][LATENT, NUPC * HD], s: sem) {
    // Tensor parallel: every core routes; expert parallel: only the rows' homes do, and
    // they run all the shared experts.
    let routes = SCHEME == 0 || me < NHOME;
    if REP_RD == 1 {
        if routes {
            cpb(mode, moe_router[fi], mrd[sl][:, 0:NEXP], DIM, NEXP, s);
            cpb(mode, moe_down[fi], mrd[sl][:, EPAD:EPAD + LATENT], DIM, LATENT, s);
        }
    } else {
        for j in me..NRB step NCORES {
            let c = (j - me) / NCORES * HD;
            if j < NEB {
                cpb(mode, moe_router[fi, :, j * 128 +: EW], mrd[sl][:, c +: EW], DIM, EW, s);
            } else {
                cpb(mode, moe_down[fi, :, (j - NEB) * HD +: HD], mrd[sl][:, c +: HD], DIM, HD, s);
            }
        }
    }
    if routes {
        cpb1(mode, moe_bias[fi], mbias[sl], NEXP, s);
        fetch_cols(mode, moe_up[fi], mup[sl], LATENT, DIM, NUPC, me, REP_UP, s);
    }
    if SCHEME == 1 {
        if me < NHOME {
            for e in 0..NSHARED {
                shared_fetch(mode, fi, e, sl * NSL + e, moe_shared_w1, moe_shared_w3, moe_shared_w2, msw13, msw2, s);
            }
        }
    } else {
        let sfirst = (me + NCORES - SOFF) % NCORES;
        for e in sfirst..NSHARED step NCORES {
            shared_fetch(mode, fi, e, sl * NSL + (e - sfirst) / NCORES, moe_shared_w1, moe_shared_w3, moe_shared_w2,
                         msw13, msw2, s);
        }
    }
}

// The dense FFN (layer 0, fetched once).
fn dense_fetch(mode: i32, me: i32, dense_w1: hbm bf16[NDENSE, DIM, DENSE_INTER],
               dense_w3: hbm bf16[NDENSE, DIM, DENSE_INTER], dense_w2: hbm bf16[NDENSE, DENSE_INTER, DIM],
               dw13: vmem bf16[DIM, 2 * ND13C * HD], dw2: vmem bf16[DENSE_INTER, ND2C * HD], s: sem) {
    if REP_D13 == 0 || me < NT_U {
        fetch_cols(mode, dense_w1[0], dw13[:, 0:ND13C * HD], DIM, DENSE_INTER, ND13C, me, REP_D13, s);
        fetch_cols(mode, dense_w3[0], dw13[:, ND13C * HD:2 * ND13C * HD], DIM, DENSE_INTER, ND13C, me, REP_D13, s);
    }
    fetch_cols(mode, dense_w2[0], dw2, DENSE_INTER, DIM, ND2C, me, REP_D2, s);
}

// The LM head: all of it on core 0 (LM_ROOT), or this core's column blocks.
fn lm_fetch(mode: i32, me: i32, lm_head: hbm bf16[DIM, VOCAB], final_norm: hbm bf16[DIM],
            lmw: vmem bf16[DIM, NVC * HD], fin: vmem bf16[1, DIM], s: sem) {
    if LM_ROOT == 0 || me == 0 {
        cpb1(mode, final_norm, fin, DIM, s);
        fetch_cols(mode, lm_head, lmw, DIM, VOCAB, NVC, me, LM_ROOT, s);
    }
}

// ------------------------------------------------------------------------ layers

// KDA: one matmul gives this core's tasks' q/k/v/g/og and beta (all rows) -> per task
// (head h, rows of group g) conv, decay, state update, gated norm, the head's part of
// the output projection -> push its rows into slot h of every core's parts buffer
// (attn_finish waits and sums).
fn kda_layer(ai: i32, sl: i32, me: i32, xb: vmem bf16[BATCH, DIM],
             kw: vmem bf16[2][DIM, KWC], kcw: vmem bf16[2 * NTL][3 * CONVK, HD], kad: vmem bf16[2 * NTL][2, HD],
             kon: vmem bf16[2][1, HD], kS: vmem f32[2 * NTL * RB][HD, HD], kC: vmem f32[2 * NTL][9 * RB, HD],
             kda_state: hbm f32[NKDA * BATCH * HEADS, HD, HD], conv_state: hbm f32[NKDA, 9 * BATCH, W],
             kwo: vmem bf16[2 * NTL][HD, DIM], a_src: vmem f32[NOL][BATCH, DIM],
             g_a: vmem f32[GROT * PPH][BATCH, DIM], pbase: i32, stw: sem, ssend: sem, r_o: sem) {
    vmem pr: f32[BATCH, KWC];
    vmem qa: f32[RB, HD];
    vmem ka: f32[RB, HD];
    vmem va: f32[RB, HD];
    vmem oh: f32[RB, HD];
    vmem bl: f32[BATCH, HD];
    if me < NKT {
        pr = matmul(xb, kw[sl]);
        bl = sigmoid(pr[:, 5 * NTL * HD +: HD]);
        for t in 0..NTL {
            let task = me + t * NCORES;
            if task < NKT {
                let h = task % HEADS;
                let r0 = task / HEADS * RB;
                let k = sl * NTL + t;
                let c = 5 * t * HD;
                conv4(pr[r0 +: RB, c +: HD], kC[k][0:3 * RB, :], kcw[k][0:CONVK, :], qa, RB);
                conv4(pr[r0 +: RB, c + HD +: HD], kC[k][3 * RB:6 * RB, :], kcw[k][CONVK:2 * CONVK, :], ka, RB);
                conv4(pr[r0 +: RB, c + 2 * HD +: HD], kC[k][6 * RB:9 * RB, :], kcw[k][2 * CONVK:3 * CONVK, :], va, RB);
                start copy(kC[k], conv_state[ai, r0 * 9 +: 9 * RB, h * HD +: HD], stw);
                kda_qkv_act(qa, ka, va, RB);
                kda_decay(pr[r0 +: RB, c + 3 * HD +: HD], kad[k], RB);
                for b in 0..RB {
                    kda_update(kS[k * RB + b], qa[b:b + 1, :], ka[b:b + 1, :], va[b:b + 1, :],
                               pr[r0 + b +: 1, c + 3 * HD +: HD], bl[r0 + b +: 1, :], h, oh[b:b + 1, :]);
                    start copy(kS[k * RB + b], kda_state[(ai * BATCH + r0 + b) * HEADS + h], stw);
                }
                kda_out(oh, kon[sl], pr[r0 +: RB, c + 4 * HD +: HD], oh, RB);
                a_src[t][0:RB, :] = matmul(bf16(oh), kwo[k]);
                push_all(a_src[t][0:RB, :], g_a[pbase + h][r0 +: RB, :], RB, DIM, me, NCORES, ssend, r_o);
            }
        }
    }
}

// The end of an attention layer (either kind): wait until this core's parts have left
// (`sent` bytes) and every head's part has arrived, then add them up: the attention
// output is in g_a[pbase].
fn attn_finish(sent: i32, g_a: vmem f32[GROT * PPH][BATCH, DIM], pbase: i32, ssend: sem, r_o: sem) {
    region "allreduce" {
        wait(ssend, sent);
        wait(r_o, HEADS * BATCH * DIM * 4);
    }
    region "combine" {
        psum(g_a, pbase, PPH, LGH, GROT * PPH, BATCH, DIM);
    }
}

// The head owners' part of gated MLA, given the latent lat = [x wdq | x wdkv] and the
// gate logits in pr: norms, the new cache row, per head absorbed attention -> o blocks.
fn mla_heads(mi: i32, sl: i32, me: i32, pos: i32, lat: vmem f32[BATCH, QRANK + KVRANK],
             pr: vmem f32[BATCH, MXC], mqn: vmem bf16[2][1, QRANK], mkvn: vmem bf16[2][1, KVRANK],
             mwuq: vmem bf16[2][QRANK, NHL * HD], mwuk: vmem bf16[2 * NHL][HD, KVRANK],
             mwuv: vmem bf16[2 * NHL][KVRANK, HD], mcache: vmem bf16[2][BATCH * MAXSEQ, KVRANK],
             mla_cache: hbm bf16[NMLA * CORES_PER_CHIP * BATCH, MAXSEQ, KVRANK],
             mwo: vmem bf16[2 * NHL][HD, DIM], a_src: vmem f32[NOL][BATCH, DIM], stw: sem) {
    vmem cq: f32[BATCH, QRANK];
    vmem cqb: bf16[BATCH, QRANK];
    vmem ckf: f32[BATCH, KVRANK];
    vmem ckv: bf16[BATCH, KVRANK];
    vmem qh: f32[BATCH, NHL * HD];
    vmem qt: bf16[BATCH, KVRANK];
    vmem pb: f32[BATCH, BATCH * MAXSEQ];
    vmem oh: f32[BATCH, HD];
    rmsnorm(lat[:, 0:QRANK], mqn[sl], cq, QRANK);
    cqb = bf16(cq);
    rmsnorm(lat[:, QRANK:QRANK + KVRANK], mkvn[sl], ckf, KVRANK);
    ckv = bf16(ckf);
    for b in 0..BATCH {
        mcache[sl][b * MAXSEQ + pos +: 1, :] = ckv[b:b + 1, :];
    }
    start copy(ckv, mla_cache[(mi * CORES_PER_CHIP + core_id()) * BATCH +: BATCH, pos, :], stw);
    qh = matmul(cqb, mwuq[sl]);
    for t in 0..NHL {
        let h = me + t * NCORES;
        if h < HEADS {
            let k = sl * NHL + t;
            qt = bf16(matmul(bf16(qh[:, t * HD +: HD]), mwuk[k]));
            mla_probs(qt, mcache[sl], pos, pb);
            oh = matmul(bf16(matmul(bf16(pb), mcache[sl])), mwuv[k]) * sigmoid(pr[:, (NLATC + t) * HD +: HD]);
            a_src[t] = matmul(bf16(oh), mwo[k]);
        }
    }
}

// Gated MLA: one matmul gives this core's latent blocks and its heads' gate logits ->
// (gather the latent to the head owners) -> heads, each with its part of the output
// projection -> push the parts (attn_finish waits and sums).
fn mla_layer(mi: i32, sl: i32, me: i32, pos: i32, xb: vmem bf16[BATCH, DIM],
             mx: vmem bf16[2][DIM, MXC], mqn: vmem bf16[2][1, QRANK], mkvn: vmem bf16[2][1, KVRANK],
             mwuq: vmem bf16[2][QRANK, NHL * HD], mwuk: vmem bf16[2 * NHL][HD, KVRANK],
             mwuv: vmem bf16[2 * NHL][KVRANK, HD], mcache: vmem bf16[2][BATCH * MAXSEQ, KVRANK],
             mla_cache: hbm bf16[NMLA * CORES_PER_CHIP * BATCH, MAXSEQ, KVRANK],
             g_lat: vmem f32[BATCH, QRANK + KVRANK],
             mwo: vmem bf16[2 * NHL][HD, DIM], a_src: vmem f32[NOL][BATCH, DIM],
             g_a: vmem f32[GROT * PPH][BATCH, DIM], pbase: i32,
             stw: sem, ssend: sem, r_lat: sem, r_o: sem) {
    vmem pr: f32[BATCH, MXC];
    if REP_LAT == 1 {
        if me < HEADS {
            pr = matmul(xb, mx[sl]);
            mla_heads(mi, sl, me, pos, pr[:, 0:QRANK + KVRANK], pr, mqn, mkvn, mwuq, mwuk, mwuv, mcache,
                      mla_cache, mwo, a_src, stw);
        }
    } else {
        if me < max(HEADS, NLATB) {
            pr = matmul(xb, mx[sl]);
        }
        region "allgather" {
            ag_push(pr[:, 0:NLATL * HD], g_lat, NLATL, NLATB, me, me, NHEADC, ssend, r_lat);
            ag_finish(NLATB, me, me, NHEADC, ssend, r_lat);
        }
        if me < HEADS {
            mla_heads(mi, sl, me, pos, g_lat, pr, mqn, mkvn, mwuq, mwuk, mwuv, mcache, mla_cache, mwo, a_src, stw);
        }
    }
    for t in 0..NHL {
        let h = me + t * NCORES;
        if h < HEADS {
            push_all(a_src[t], g_a[pbase + h], BATCH, DIM, me, NCORES, ssend, r_o);
        }
    }
}

// Latent MoE: [router | down] -> routing on every core (identical bits) -> fetch exactly
// the chosen experts -> shared and routed experts where they live; each routed output
// row weighted by its router weight -> the parts to every combining core (the MoE
// all-reduce) -> psum -> moe_up.
fn moe_layer(fi: i32, sl: i32, me: i32, xb: vmem bf16[BATCH, DIM],
             mrd: vmem bf16[2][DIM, NRDC * HD], mbias: vmem bf16[2][1, NEXP],
             msw13: vmem bf16[2 * NSL][LATENT, 2 * EINTER],
             msw2: vmem bf16[2 * NSL][EINTER, LATENT], mup: vmem bf16[2][LATENT, NUPC * HD],
             ew13: vmem bf16[NEW][LATENT, 2 * EINTER],
             ew2: vmem bf16[NEW][EINTER, LATENT],
             moe_w1: hbm bf16[NMOE * NEXP, LATENT, EINTER], moe_w3: hbm bf16[NMOE * NEXP, LATENT, EINTER],
             moe_w2: hbm bf16[NMOE * NEXP, EINTER, LATENT],
             rl_src: vmem f32[BATCH, NRDC * HD], g_rl: vmem f32[BATCH, EPAD + LATENT],
             e_out: vmem f32[NEW][BATCH, LATENT], s_out: vmem f32[NSL][BATCH, LATENT],
             g_eo: vmem f32[GROT * PPE][BATCH, LATENT], pbase: i32, f_src: vmem f32[BATCH, NUPC * HD], g_f: vmem f32[BATCH, DIM],
             eid: smem i32[BATCH * TOPK], dl: smem i32[BATCH * TOPK], dp: smem i32[BATCH * TOPK],
             seen: smem i32[NEXP], es: sem[ES], ssend: sem, r_rl: sem, r_eo: sem, r_f: sem) {
    vmem topi: i32[BATCH, TOPK];
    vmem topw: f32[BATCH, TOPK];
    vmem xlb: bf16[BATCH, LATENT];
    vmem ub: bf16[BATCH, EINTER];
    vmem zb: bf16[BATCH, LATENT];
    var nd: i32 = 0;
    var sent: i32 = 0;
    region "router" {
        proj(xb, mrd[sl], rl_src, g_rl, DIM, NRDC, NRB, me, NCORES, REP_RD, ssend, r_rl);
        route(g_rl[:, 0:NEXP], mbias[sl], topi, topw);
        // top-k into scalars; distinct experts in order of first use: dl[i] = expert,
        // dp[q] = distinct index of (row, slot) q = b*TOPK + j.
        for b in 0..BATCH {
            for j in 0..TOPK {
                eid[b * TOPK + j] = scalar(topi[b:b + 1, j:j + 1]);
            }
        }
        for q in 0..BATCH * TOPK {
            seen[eid[q]] = -1;      // only the chosen entries are read below
        }
        for q in 0..BATCH * TOPK {
            let e = eid[q];
            if seen[e] < 0 {
                seen[e] = nd;
                dl[nd] = e;
                nd += 1;
            }
            dp[q] = seen[e];
        }
    }
    region "experts" {
        // Distinct expert i lives on core i % NCORES; up to 4 fetches in flight (es[li % ES]).
        for i in me..nd step NCORES {
            let li = (i - me) / NCORES;
            if li < ES {
                let g = fi * NEXP + dl[i];
                start copy(moe_w1[g], ew13[li][:, 0:EINTER], es[li % ES]);
                start copy(moe_w3[g], ew13[li][:, EINTER:2 * EINTER], es[li % ES]);
                start copy(moe_w2[g], ew2[li], es[li % ES]);
            }
        }
        xlb = bf16(g_rl[:, EPAD:EPAD + LATENT]);
        let sfirst = (me + NCORES - SOFF) % NCORES;
        for e in sfirst..NSHARED step NCORES {
            let t = (e - sfirst) / NCORES;
            gated_ffn(xlb, msw13[sl * NSL + t], msw2[sl * NSL + t], ub, s_out[t], LATENT, EINTER, LATENT);
            push_all(s_out[t], g_eo[pbase + TOPK + e], BATCH, LATENT, me, NT_EO, ssend, r_eo);
            sent += (NT_EO - i32(me < NT_EO)) * BATCH * LATENT * 4;
        }
        for i in me..nd step NCORES {
            let li = (i - me) / NCORES;
            let g = fi * NEXP + dl[i];
            wait copy(moe_w1[g], ew13[li][:, 0:EINTER], es[li % ES]);
            wait copy(moe_w3[g], ew13[li][:, EINTER:2 * EINTER], es[li % ES]);
            wait copy(moe_w2[g], ew2[li], es[li % ES]);
            if i + ES * NCORES < nd {
                let g2 = fi * NEXP + dl[i + ES * NCORES];
                start copy(moe_w1[g2], ew13[li + ES][:, 0:EINTER], es[li % ES]);
                start copy(moe_w3[g2], ew13[li + ES][:, EINTER:2 * EINTER], es[li % ES]);
                start copy(moe_w2[g2], ew2[li + ES], es[li % ES]);
            }
            gated_ffn(xlb, ew13[li], ew2[li], ub, e_out[li], LATENT, EINTER, LATENT);
            // Row b chose this expert in at most one slot j: weight that row in place.
            for q in 0..BATCH * TOPK {
                if dp[q] == i {
                    let b = q / TOPK;
                    let j = q % TOPK;
                    e_out[li][b:b + 1, :] = topw[b:b + 1, j:j + 1] * e_out[li][b:b + 1, :];
                    push_all(e_out[li][b:b + 1, :], g_eo[pbase + j][b:b + 1, :], 1, LATENT, me, NT_EO, ssend, r_eo);
                    sent += (NT_EO - i32(me < NT_EO)) * LATENT * 4;
                }
            }
        }
        region "allreduce" {
            wait(ssend, sent);
            if me < NT_EO {
                wait(r_eo, NROWS_EO * LATENT * 4);
            }
        }
    }
    if me < NT_EO {
        region "combine" {
            psum(g_eo, pbase, PPE, LGE, GROT * PPE, BATCH, LATENT);
            zb = bf16(g_eo[pbase]);
        }
    }
    proj(zb, mup[sl], f_src, g_f, LATENT, NUPC, NDB, me, NCORES, REP_UP, ssend, r_f);
}

// Dense FFN: u = silu(x w1) * (x w3) (on the w2 consumers, or split + gather) -> w2.
fn dense_layer(me: i32, xb: vmem bf16[BATCH, DIM], dw13: vmem bf16[DIM, 2 * ND13C * HD],
               dw2: vmem bf16[DENSE_INTER, ND2C * HD],
               u_src: vmem f32[BATCH, ND13C * HD], g_u: vmem f32[BATCH, DENSE_INTER],
               f_src: vmem f32[BATCH, ND2C * HD], g_f: vmem f32[BATCH, DIM],
               ssend: sem, r_u: sem, r_f: sem) {
    vmem ub: bf16[BATCH, DENSE_INTER];
    vmem a: f32[BATCH, 2 * ND13C * HD];
    if REP_D13 == 1 {
        if me < NT_U {
            a = matmul(xb, dw13);
            g_u = silu(a[:, 0:DENSE_INTER]) * a[:, DENSE_INTER:2 * DENSE_INTER];
        }
    } else {
        if me < NIB {
            a = matmul(xb, dw13);
            u_src = silu(a[:, 0:ND13C * HD]) * a[:, ND13C * HD:2 * ND13C * HD];
        }
        region "allgather" {
            ag_push(u_src, g_u, ND13C, NIB, me, me, NT_U, ssend, r_u);
            ag_finish(NIB, me, me, NT_U, ssend, r_u);
        }
    }
    if me < NT_U {
        ub = bf16(g_u);
    }
    proj(ub, dw2, f_src, g_f, DENSE_INTER, ND2C, NDB, me, NCORES, REP_D2, ssend, r_f);
}

// ------------------------------------------------------------------------ kernel

kernel k3_step(
    embed: hbm bf16[VOCAB, DIM], attn_norm: hbm bf16[NLAYERS, DIM], ffn_norm: hbm bf16[NLAYERS, DIM],
    kda_wq: hbm bf16[NKDA, DIM, W], kda_wk: hbm bf16[NKDA, DIM, W], kda_wv: hbm bf16[NKDA, DIM, W],
    kda_conv_q: hbm bf16[NKDA, CONVK, W], kda_conv_k: hbm bf16[NKDA, CONVK, W],
    kda_conv_v: hbm bf16[NKDA, CONVK, W], kda_wg: hbm bf16[NKDA, DIM, W],
    kda_a_log: hbm bf16[NKDA, W], kda_dt_bias: hbm bf16[NKDA, W], kda_wb: hbm bf16[NKDA, DIM, 128],
    kda_onorm: hbm bf16[NKDA, HD], kda_wog: hbm bf16[NKDA, DIM, W], kda_wo: hbm bf16[NKDA, W, DIM],
    mla_wdq: hbm bf16[NMLA, DIM, QRANK], mla_qnorm: hbm bf16[NMLA, QRANK],
    mla_wuq: hbm bf16[NMLA, QRANK, W], mla_wdkv: hbm bf16[NMLA, DIM, KVRANK],
    mla_kvnorm: hbm bf16[NMLA, KVRANK], mla_wuk: hbm bf16[NMLA * HEADS, HD, KVRANK],
    mla_wuv: hbm bf16[NMLA * HEADS, KVRANK, HD], mla_wgate: hbm bf16[NMLA, DIM, W],
    mla_wo: hbm bf16[NMLA, W, DIM],
    dense_w1: hbm bf16[NDENSE, DIM, DENSE_INTER], dense_w3: hbm bf16[NDENSE, DIM, DENSE_INTER],
    dense_w2: hbm bf16[NDENSE, DENSE_INTER, DIM],
    moe_router: hbm bf16[NMOE, DIM, NEXP], moe_bias: hbm bf16[NMOE, NEXP],
    moe_down: hbm bf16[NMOE, DIM, LATENT],
    moe_w1: hbm bf16[NMOE * NEXP, LATENT, EINTER], moe_w3: hbm bf16[NMOE * NEXP, LATENT, EINTER],
    moe_w2: hbm bf16[NMOE * NEXP, EINTER, LATENT],
    moe_shared_w1: hbm bf16[NMOE * NSHARED, LATENT, EINTER],
    moe_shared_w3: hbm bf16[NMOE * NSHARED, LATENT, EINTER],
    moe_shared_w2: hbm bf16[NMOE * NSHARED, EINTER, LATENT], moe_up: hbm bf16[NMOE, LATENT, DIM],
    final_norm: hbm bf16[DIM], lm_head: hbm bf16[DIM, VOCAB],
    layer_plan: hbm i32[NLAYERS, 4], tokens: hbm i32[BATCH], pos: hbm i32[1],
    kda_state: hbm f32[NKDA * BATCH * HEADS, HD, HD], conv_state: hbm f32[NKDA, 9 * BATCH, W],
    mla_cache: hbm bf16[NMLA * CORES_PER_CHIP * BATCH, MAXSEQ, KVRANK],
    logits: hbm f32[BATCH, VOCAB], dbg_attn: hbm f32[NLAYERS, BATCH, DIM], dbg_ffn: hbm f32[NLAYERS, BATCH, DIM]
) {
    // --- per-core state: residual stream, norms, plan
    vmem h: f32[BATCH, DIM];
    vmem x: f32[BATCH, DIM];
    vmem xb: bf16[BATCH, DIM];
    vmem ebuf: bf16[BATCH, DIM];
    vmem anorm: bf16[NLAYERS, DIM];
    vmem fnorm: bf16[NLAYERS, DIM];
    vmem fin: bf16[1, DIM];
    smem plan: i32[NLAYERS, 4];
    smem tok: i32[BATCH];
    smem posv: i32[1];
    smem eid: i32[BATCH * TOPK];
    smem dl: i32[BATCH * TOPK];
    smem dp: i32[BATCH * TOPK];
    smem seen: i32[NEXP];
    // --- collective buffers (slot = layer parity) and the sending side's sources
    vmem g_a: f32[GROT * PPH][BATCH, DIM];
    vmem g_lat: f32[GROT][BATCH, QRANK + KVRANK];
    vmem g_rl: f32[GROT][BATCH, EPAD + LATENT];
    vmem g_eo: f32[GROT * PPE][BATCH, LATENT];
    vmem g_f: f32[GROT][BATCH, DIM];
    vmem g_u: f32[BATCH, DENSE_INTER];
    vmem g_lm: f32[BATCH, VOCAB];
    vmem a_src: f32[NOL][BATCH, DIM];
    vmem rl_src: f32[BATCH, NRDC * HD];
    vmem u_src: f32[BATCH, ND13C * HD];
    vmem f_src: f32[BATCH, max(NUPC, ND2C) * HD];
    vmem lm_src: f32[BATCH, NVC * HD];
    vmem e_out: f32[NEW][BATCH, LATENT];
    vmem s_out: f32[NSL][BATCH, LATENT];
    // --- KDA weights and state, 2 slot sets
    vmem kw: bf16[2][DIM, KWC];
    vmem kcw: bf16[2 * NTL][3 * CONVK, HD];
    vmem kad: bf16[2 * NTL][2, HD];
    vmem kon: bf16[2][1, HD];
    vmem kwo: bf16[2 * NTL][HD, DIM];
    vmem kS: f32[2 * NTL * RB][HD, HD];
    vmem kC: f32[2 * NTL][9 * RB, HD];
    // --- MLA weights and cache, 2 slot sets
    vmem mx: bf16[2][DIM, MXC];
    vmem mqn: bf16[2][1, QRANK];
    vmem mkvn: bf16[2][1, KVRANK];
    vmem mwuq: bf16[2][QRANK, NHL * HD];
    vmem mwuk: bf16[2 * NHL][HD, KVRANK];
    vmem mwuv: bf16[2 * NHL][KVRANK, HD];
    vmem mwo: bf16[2 * NHL][HD, DIM];
    vmem mcache: bf16[2][BATCH * MAXSEQ, KVRANK];
    // --- MoE weights, 2 slot sets; routed experts fetched per layer
    vmem mrd: bf16[2][DIM, NRDC * HD];
    vmem mbias: bf16[2][1, NEXP];
    vmem msw13: bf16[2 * NSL][LATENT, 2 * EINTER];
    vmem msw2: bf16[2 * NSL][EINTER, LATENT];
    vmem mup: bf16[2][LATENT, NUPC * HD];
    vmem ew13: bf16[NEW][LATENT, 2 * EINTER];
    vmem ew2: bf16[NEW][EINTER, LATENT];
    // --- dense FFN and LM head (fetched once)
    vmem dw13: bf16[DIM, 2 * ND13C * HD];
    vmem dw2: bf16[DENSE_INTER, ND2C * HD];
    vmem lmw: bf16[DIM, NVC * HD];
    // --- semaphores
    sem wa[2];              // attention weights + state of layer l (any kind), by layer parity
    sem wf[2];              // MoE slot sets
    sem wx;                 // fetched once: the dense FFN (prologue), the LM head (last layer)
    sem es[ES];             // routed experts in flight
    sem stw;                // state write-back (KDA state, conv history, MLA cache row)
    sem dbg;                // prologue loads, debug outputs, the logits copy
    sem ssend;              // bytes pushed to other cores
    sem r_o[GROT];          // the attention all-reduce's parts
    sem r_eo[GROT];         // the MoE all-reduce's parts
    sem r_sp[NSP];          // split (not replicated) projections' gathers, see OFF_*
    sem r_ep[3 * GROT * SCHEME + 1 - SCHEME];   // expert parallel: dispatch rows, counts, f rows
    // --- expert-parallel dispatch buffers (moe_ep.mk; a single row when SCHEME = 0)
    vmem d_x: f32[GROT][SCHEME * NHOME * EP_CAP + 1 - SCHEME, LATENT];
    smem d_tag: i32[GROT, SCHEME * NHOME * EP_CAP + 1 - SCHEME];
    smem d_cnt: i32[GROT, NHOME];

    let me = global_core(chip_id(), core_id());

    // ---------------------------------------------------------------- prologue
    start copy(layer_plan, plan, dbg);
    start copy(tokens, tok, dbg);
    start copy(pos, posv, dbg);
    start copy(attn_norm, anorm, dbg);
    start copy(ffn_norm, fnorm, dbg);
    wait copy(layer_plan, plan, dbg);
    wait copy(tokens, tok, dbg);
    wait copy(pos, posv, dbg);
    let p0 = posv[0];
    for b in 0..BATCH {
        start copy(embed[tok[b]], ebuf[b:b + 1, :], dbg);
    }
    // Layer 0's weights (its attention kind from the plan; its FFN is the dense one).
    if plan[0, 0] == 1 {
        mla_fetch(0, plan[0, 1], plan[0, 1] % 2, me, mla_wdq, mla_qnorm, mla_wuq, mla_wdkv, mla_kvnorm,
                  mla_wuk, mla_wuv, mla_wgate, mla_wo, mla_cache, mx, mqn, mkvn, mwuq, mwuk, mwuv,
                  mwo, mcache, wa[0]);
    } else {
        kda_fetch(0, plan[0, 1], plan[0, 1] % 2, me, kda_wq, kda_wk, kda_wv, kda_conv_q, kda_conv_k,
                  kda_conv_v, kda_wg, kda_a_log, kda_dt_bias, kda_wb, kda_onorm, kda_wog, kda_wo,
                  kda_state, conv_state, kw, kcw, kad, kon, kwo, kS, kC,
                  wa[0]);
    }
    dense_fetch(0, me, dense_w1, dense_w3, dense_w2, dw13, dw2, wx);
    for b in 0..BATCH {
        wait copy(embed[tok[b]], ebuf[b:b + 1, :], dbg);
    }
    wait copy(attn_norm, anorm, dbg);
    wait copy(ffn_norm, fnorm, dbg);
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
            if ak == 1 {
                region "mla" {
                    mla_fetch(1, ai, ai % 2, me, mla_wdq, mla_qnorm, mla_wuq, mla_wdkv, mla_kvnorm,
                              mla_wuk, mla_wuv, mla_wgate, mla_wo, mla_cache, mx, mqn, mkvn, mwuq, mwuk,
                              mwuv, mwo, mcache, wa[p]);
                    mla_layer(ai, ai % 2, me, p0, xb, mx, mqn, mkvn, mwuq, mwuk, mwuv, mcache, mla_cache,
                              g_lat[p], mwo, a_src, g_a, p * PPH, stw, ssend,
                              r_sp[(OFF_L + p) * (1 - REP_LAT)], r_o[p]);
                }
            } else {
                region "kda" {
                    kda_fetch(1, ai, ai % 2, me, kda_wq, kda_wk, kda_wv, kda_conv_q, kda_conv_k,
                              kda_conv_v, kda_wg, kda_a_log, kda_dt_bias, kda_wb, kda_onorm, kda_wog, kda_wo,
                              kda_state, conv_state, kw, kcw, kad, kon, kwo, kS, kC, wa[p]);
                    kda_layer(ai, ai % 2, me, xb, kw, kcw, kad, kon, kS, kC, kda_state, conv_state,
                              kwo, a_src, g_a, p * PPH, stw, ssend, r_o[p]);
                }
            }
            // Prefetch layer l+1 (or the LM head) while this layer computes: issued after
            // the heads' parts were pushed (which must not queue behind it).
            if l + 1 < NLAYERS {
                let ai1 = plan[l + 1, 1];
                if plan[l + 1, 0] == 1 {
                    mla_fetch(0, ai1, ai1 % 2, me, mla_wdq, mla_qnorm, mla_wuq, mla_wdkv, mla_kvnorm,
                              mla_wuk, mla_wuv, mla_wgate, mla_wo, mla_cache, mx, mqn, mkvn, mwuq, mwuk,
                              mwuv, mwo, mcache, wa[1 - p]);
                } else {
                    kda_fetch(0, ai1, ai1 % 2, me, kda_wq, kda_wk, kda_wv, kda_conv_q, kda_conv_k,
                              kda_conv_v, kda_wg, kda_a_log, kda_dt_bias, kda_wb, kda_onorm, kda_wog, kda_wo,
                              kda_state, conv_state, kw, kcw, kad, kon, kwo, kS, kC, wa[1 - p]);
                }
                if plan[l + 1, 2] == 1 {
                    let fi1 = plan[l + 1, 3];
                    moe_fetch(0, fi1, fi1 % 2, me, moe_router, moe_bias, moe_down, moe_shared_w1,
                              moe_shared_w3, moe_shared_w2, moe_up, mrd, mbias, msw13, msw2, mup, wf[fi1 % 2]);
                }
            } else {
                lm_fetch(0, me, lm_head, final_norm, lmw, fin, wx);
            }
            // This core pushed one part row-block per local head (MLA) or task (KDA).
            if ak == 1 {
                attn_finish((max(HEADS - me, 0) + NCORES - 1) / NCORES * (NCORES - 1) * BATCH * DIM * 4,
                            g_a, p * PPH, ssend, r_o[p]);
            } else {
                attn_finish((max(NKT - me, 0) + NCORES - 1) / NCORES * (NCORES - 1) * RB * DIM * 4,
                            g_a, p * PPH, ssend, r_o[p]);
            }
            // Debug copies of layer l-1 have landed long ago; wait before their slot is reused.
            if me == 0 && l > 0 {
                wait(dbg, 2 * BATCH * DIM * 4);
            }
            if me == 0 {
                start copy(g_a[p * PPH], dbg_attn[l], dbg);
            }
            h = h + g_a[p * PPH];
            // ---- FFN
            region "norm" {
                rmsnorm(h, fnorm[l:l + 1, :], x, DIM);
                xb = bf16(x);
            }
            if fk == 1 {
                region "moe" {
                    moe_fetch(1, fi, fi % 2, me, moe_router, moe_bias, moe_down, moe_shared_w1,
                              moe_shared_w3, moe_shared_w2, moe_up, mrd, mbias, msw13, msw2, mup,
                              wf[fi % 2]);
                    if SCHEME == 1 {
                        moe_layer_ep(fi, fi % 2, me, p, xb, mrd, mbias, msw13, msw2, mup, ew13, ew2, e_out, NEW,
                                     moe_w1, moe_w3, moe_w2, rl_src, g_rl[p], d_x[p], d_tag, d_cnt, g_eo, p * PPE,
                                     f_src[:, 0:DIM], g_f[p], seen, dl, es, ssend, r_sp[(OFF_R + p) * (1 - REP_RD)],
                                     r_ep[3 * p], r_ep[3 * p + 1], r_eo[p], r_ep[3 * p + 2]);
                    } else {
                        moe_layer(fi, fi % 2, me, xb, mrd, mbias, msw13, msw2, mup, ew13, ew2,
                                  moe_w1, moe_w3, moe_w2, rl_src, g_rl[p], e_out, s_out, g_eo, p * PPE,
                                  f_src[:, 0:NUPC * HD], g_f[p], eid, dl, dp, seen, es, ssend,
                                  r_sp[(OFF_R + p) * (1 - REP_RD)], r_eo[p], r_sp[(OFF_F + p) * SPF]);
                    }
                }
            } else {
                region "dense" {
                    dense_fetch(1, me, dense_w1, dense_w3, dense_w2, dw13, dw2, wx);
                    dense_layer(me, xb, dw13, dw2, u_src, g_u, f_src[:, 0:ND2C * HD], g_f[p], ssend,
                                r_sp[OFF_U * (1 - REP_D13)], r_sp[(OFF_F + p) * SPF]);
                }
            }
            if me == 0 {
                start copy(g_f[p], dbg_ffn[l], dbg);
            }
            h = h + g_f[p];
            // This layer's state write-backs (KDA state + conv history, or the cache row).
            if ak == 1 {
                if me < HEADS {
                    wait(stw, BATCH * KVRANK * 2);
                }
            } else {
                let nt = (max(NKT - me, 0) + NCORES - 1) / NCORES;
                wait(stw, nt * RB * (HD * HD * 4 + 9 * HD * 4));
            }
        }
    }
    // ------------------------------------------------------------- LM head
    region "lm_head" {
        lm_fetch(1, me, lm_head, final_norm, lmw, fin, wx);
        if LM_ROOT == 1 {
            if me == 0 {
                region "norm" {
                    rmsnorm(h, fin, x, DIM);
                    xb = bf16(x);
                }
                g_lm = matmul(xb, lmw);
            }
        } else {
            region "norm" {
                rmsnorm(h, fin, x, DIM);
                xb = bf16(x);
            }
            if me < NVB {
                lm_src = matmul(xb, lmw);
            }
            region "allgather" {
                ag_push(lm_src, g_lm, NVL, NVB, me, me, 1, ssend, r_sp[OFF_M]);
                ag_finish(NVB, me, me, 1, ssend, r_sp[OFF_M]);
            }
        }
        if me == 0 {
            start copy(g_lm, logits, dbg);
            wait copy(g_lm, logits, dbg);
            wait(dbg, 2 * BATCH * DIM * 4);
        }
    }
}

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
    hbm kda_state: f32[NKDA * BATCH * HEADS, HD, HD];
    hbm conv_state: f32[NKDA, 9 * BATCH, W];
    hbm mla_cache: bf16[NMLA * CORES_PER_CHIP * BATCH, MAXSEQ, KVRANK];
    output logits: f32[BATCH, VOCAB];
    output dbg_attn: f32[NLAYERS, BATCH, DIM];
    output dbg_ffn: f32[NLAYERS, BATCH, DIM];
    launch k3_step(embed, attn_norm, ffn_norm, kda_wq, kda_wk, kda_wv, kda_conv_q, kda_conv_k, kda_conv_v,
                   kda_wg, kda_a_log, kda_dt_bias, kda_wb, kda_onorm, kda_wog, kda_wo,
                   mla_wdq, mla_qnorm, mla_wuq, mla_wdkv, mla_kvnorm, mla_wuk, mla_wuv, mla_wgate, mla_wo,
                   dense_w1, dense_w3, dense_w2, moe_router, moe_bias, moe_down, moe_w1, moe_w3, moe_w2,
                   moe_shared_w1, moe_shared_w3, moe_shared_w2, moe_up, final_norm, lm_head,
                   layer_plan, tokens, pos, kda_state, conv_state, mla_cache, logits, dbg_attn, dbg_ffn);
}
