// The megakernel's expert-parallel MoE layer (SCHEME = 1; docs/k3_programs.md, "Schemes").
//
// Placement is static: expert e of every layer is owned by core e % NCORES, and only its
// owner reads its weights. Batch row b has a home core, b % NCORES, which routes it and
// dispatches it: for each of its TOPK choices the row's latent input goes to the owner of
// the chosen expert, with a tag naming the expert, the slot and the row. An owner learns
// its work only from what arrives (an all-to-all with counts: every home sends every core
// a count, zero included). It runs each distinct expert it received rows for, once, and
// sends every result row back to the row's home (the combine). The home computes the
// shared experts for its rows itself, weights the routed parts and adds all parts by psum
// (the contract's order, so the bits equal the tensor-parallel scheme's), applies moe_up
// to its rows, and the rows of f are all-gathered, since the next layer's attention is
// tensor parallel and needs every row everywhere.
//
// Three collective phases per layer (dispatch, combine, the all-gather of f) where the
// tensor-parallel scheme has one: at decode batch sizes a phase is latency, so this
// scheme is the slower one here; it is what expert placement needs once the experts no
// longer fit next to every core (k3-full: 896 experts).
//
// Buffers written by other cores' DMAs (d_x, d_tag, d_cnt, the parts g_eo, g_f) exist
// once per layer parity and are only read after their semaphore counted every byte; the
// megakernel's barrier every second layer keeps a fast core from reaching a buffer that
// a slow core still reads (the argument of the all-gathers, docs/k3_programs.md).
import "model.mk";
import "shard.mk";
import "allreduce.mk";
import "gather.mk";

assert SCHEME == 0 || REP_UP == 1,
    "SCHEME=1 applies moe_up at the rows' homes: REPL_BYTES must be at least moe_up's size";

// Home: dispatch each of its rows' TOPK choices to the experts' owners (xl row + tag, then
// one count per core); returns the bytes this core sent to other cores in `sent`.
fn ep_dispatch(me: i32, topi: vmem i32[BATCH, TOPK], xl: vmem f32[BATCH, LATENT],
               d_x: vmem f32[NHOME * EP_CAP, LATENT], d_tag: smem i32[GROT, NHOME * EP_CAP],
               d_cnt: smem i32[GROT, NHOME], p: i32, ct: smem i32[NCORES], tg: smem i32[EP_CAP],
               sent: smem i32[1], ssend: sem, r_d: sem, r_cnt: sem) {
    for o in 0..NCORES {
        ct[o] = 0;
    }
    for k in 0..EP_RH {
        let b = me + k * NCORES;
        if b < BATCH {
            for j in 0..TOPK {
                let e = scalar(topi[b:b + 1, j:j + 1]);
                let o = e % NCORES;
                let q = me * EP_CAP + ct[o];
                let t = k * TOPK + j;
                tg[t] = e * EP_TAGR + j * BATCH + b;
                if o == me {
                    start copy(xl[b:b + 1, :], d_x[q:q + 1, :], r_d);
                    start copy(tg[t +: 1], d_tag[p, q +: 1], r_d);
                } else {
                    start copy(xl[b:b + 1, :], d_x[q:q + 1, :] @ o, ssend, r_d);
                    start copy(tg[t +: 1], d_tag[p, q +: 1] @ o, ssend, r_d);
                    sent[0] = sent[0] + EP_ROW + 4;
                }
                ct[o] = ct[o] + 1;
            }
        }
    }
    // Counts last, staggered so the homes do not all start with the same core.
    for kk in 0..NCORES {
        let o = (me + kk) % NCORES;
        if o == me {
            start copy(ct[o +: 1], d_cnt[p, me +: 1], r_cnt);
        } else {
            start copy(ct[o +: 1], d_cnt[p, me +: 1] @ o, ssend, r_cnt);
            sent[0] = sent[0] + 4;
        }
    }
}

// Owner: wait for every home's count and the rows they announce, run each distinct expert
// once on its rows, send each result row to slot j, row b of its home's parts g_eo.
fn ep_experts(fi: i32, me: i32, d_x: vmem f32[NHOME * EP_CAP, LATENT], d_tag: smem i32[GROT, NHOME * EP_CAP],
              d_cnt: smem i32[GROT, NHOME], p: i32, g_eo: vmem f32[GROT * PPE][BATCH, LATENT], pbase: i32,
              moe_w1: hbm bf16[NMOE * NEXP, LATENT, EINTER], moe_w3: hbm bf16[NMOE * NEXP, LATENT, EINTER],
              moe_w2: hbm bf16[NMOE * NEXP, EINTER, LATENT],
              ew13: vmem bf16[ne][LATENT, 2 * EINTER], ew2: vmem bf16[ne][EINTER, LATENT],
              e_out: vmem f32[ne][BATCH, LATENT], ne: i32, seen: smem i32[NEXP], dl: smem i32[BATCH * TOPK],
              sent: smem i32[1], es: sem[ES], ssend: sem, r_d: sem, r_cnt: sem, r_eo: sem) {
    vmem xin: f32[BATCH, LATENT];
    vmem xlb: bf16[BATCH, LATENT];
    vmem ub: bf16[BATCH, EINTER];
    smem dq: i32[NHOME * EP_CAP];
    smem mt: i32[BATCH];
    var nin: i32 = 0;
    var nd: i32 = 0;
    region "alltoall" {
        wait(r_cnt, NHOME * 4);
        for hm in 0..NHOME {
            nin += d_cnt[p, hm];
        }
        wait(r_d, nin * (EP_ROW + 4));
    }
    region "experts" {
        // Distinct experts in order of arrival (home, then position): dl[i]; dq[q] = i.
        for hm in 0..NHOME {
            for k in 0..d_cnt[p, hm] {
                seen[d_tag[p, hm * EP_CAP + k] / EP_TAGR] = -1;
            }
        }
        for hm in 0..NHOME {
            for k in 0..d_cnt[p, hm] {
                let q = hm * EP_CAP + k;
                let e = d_tag[p, q] / EP_TAGR;
                if seen[e] < 0 {
                    seen[e] = nd;
                    dl[nd] = e;
                    nd += 1;
                }
                dq[q] = seen[e];
            }
        }
        for i in 0..min(nd, ES) {
            let g = fi * NEXP + dl[i];
            start copy(moe_w1[g], ew13[i][:, 0:EINTER], es[i % ES]);
            start copy(moe_w3[g], ew13[i][:, EINTER:2 * EINTER], es[i % ES]);
            start copy(moe_w2[g], ew2[i], es[i % ES]);
        }
        for i in 0..nd {
            let g = fi * NEXP + dl[i];
            // Its rows, packed; their tags (slot and row) in mt.
            var m: i32 = 0;
            for hm in 0..NHOME {
                for k in 0..d_cnt[p, hm] {
                    let q = hm * EP_CAP + k;
                    if dq[q] == i {
                        xin[m:m + 1, :] = d_x[q:q + 1, :];
                        mt[m] = d_tag[p, q] % EP_TAGR;
                        m += 1;
                    }
                }
            }
            xlb = bf16(xin);
            wait copy(moe_w1[g], ew13[i][:, 0:EINTER], es[i % ES]);
            wait copy(moe_w3[g], ew13[i][:, EINTER:2 * EINTER], es[i % ES]);
            wait copy(moe_w2[g], ew2[i], es[i % ES]);
            if i + ES < nd {
                let g2 = fi * NEXP + dl[i + ES];
                start copy(moe_w1[g2], ew13[i + ES][:, 0:EINTER], es[i % ES]);
                start copy(moe_w3[g2], ew13[i + ES][:, EINTER:2 * EINTER], es[i % ES]);
                start copy(moe_w2[g2], ew2[i + ES], es[i % ES]);
            }
            gated_ffn(xlb, ew13[i], ew2[i], ub, e_out[i], LATENT, EINTER, LATENT);
            for r in 0..m {
                let j = mt[r] / BATCH;
                let b = mt[r] % BATCH;
                let home = b % NCORES;
                if home == me {
                    start copy(e_out[i][r:r + 1, :], g_eo[pbase + j][b:b + 1, :], r_eo);
                } else {
                    start copy(e_out[i][r:r + 1, :], g_eo[pbase + j][b:b + 1, :] @ home, ssend, r_eo);
                    sent[0] = sent[0] + EP_ROW;
                }
            }
        }
    }
}

// The whole layer on every core: route and dispatch (homes), experts (owners), shared
// experts + combine + moe_up (homes), the all-gather of f (every core waits for it in g_f).
fn moe_layer_ep(fi: i32, sl: i32, me: i32, p: i32, xb: vmem bf16[BATCH, DIM],
                mrd: vmem bf16[2][DIM, NRDC * HD], mbias: vmem bf16[2][1, NEXP],
                msw13: vmem bf16[2 * NSL][LATENT, 2 * EINTER], msw2: vmem bf16[2 * NSL][EINTER, LATENT],
                mup: vmem bf16[2][LATENT, NUPC * HD],
                ew13: vmem bf16[ne][LATENT, 2 * EINTER], ew2: vmem bf16[ne][EINTER, LATENT],
                e_out: vmem f32[ne][BATCH, LATENT], ne: i32,
                moe_w1: hbm bf16[NMOE * NEXP, LATENT, EINTER], moe_w3: hbm bf16[NMOE * NEXP, LATENT, EINTER],
                moe_w2: hbm bf16[NMOE * NEXP, EINTER, LATENT],
                rl_src: vmem f32[BATCH, NRDC * HD], g_rl: vmem f32[BATCH, EPAD + LATENT],
                d_x: vmem f32[NHOME * EP_CAP, LATENT], d_tag: smem i32[GROT, NHOME * EP_CAP],
                d_cnt: smem i32[GROT, NHOME], g_eo: vmem f32[GROT * PPE][BATCH, LATENT], pbase: i32,
                f_src: vmem f32[BATCH, DIM], g_f: vmem f32[BATCH, DIM],
                seen: smem i32[NEXP], dl: smem i32[BATCH * TOPK], es: sem[ES], ssend: sem, r_rl: sem,
                r_d: sem, r_cnt: sem, r_eo: sem, r_f: sem) {
    vmem topi: i32[BATCH, TOPK];
    vmem topw: f32[BATCH, TOPK];
    vmem xl: f32[BATCH, LATENT];
    vmem xlb: bf16[BATCH, LATENT];
    vmem ub: bf16[BATCH, EINTER];
    vmem zb: bf16[BATCH, LATENT];
    smem ct: i32[NCORES];
    smem tg: i32[EP_CAP];
    smem sent: i32[1];
    sent[0] = 0;
    region "router" {
        proj(xb, mrd[sl], rl_src, g_rl, DIM, NRDC, NRB, me, NHOME, REP_RD, ssend, r_rl);
        if me < NHOME {
            route(g_rl[:, 0:NEXP], mbias[sl], topi, topw);
            xl = g_rl[:, EPAD:EPAD + LATENT];
        }
    }
    if me < NHOME {
        region "dispatch" {
            ep_dispatch(me, topi, xl, d_x, d_tag, d_cnt, p, ct, tg, sent, ssend, r_d, r_cnt);
        }
    }
    ep_experts(fi, me, d_x, d_tag, d_cnt, p, g_eo, pbase, moe_w1, moe_w3, moe_w2, ew13, ew2, e_out, ne,
               seen, dl, sent, es, ssend, r_d, r_cnt, r_eo);
    if me < NHOME {
        region "experts" {
            xlb = bf16(xl);
            for s in 0..NSHARED {
                gated_ffn(xlb, msw13[sl * NSL + s], msw2[sl * NSL + s], ub, g_eo[pbase + TOPK + s],
                          LATENT, EINTER, LATENT);
            }
        }
        let mine = (BATCH - me + NCORES - 1) / NCORES;
        region "alltoall" {
            wait(r_eo, mine * TOPK * EP_ROW);
        }
        region "combine" {
            for k in 0..EP_RH {
                let b = me + k * NCORES;
                if b < BATCH {
                    for j in 0..TOPK {
                        g_eo[pbase + j][b:b + 1, :] = topw[b:b + 1, j:j + 1] * g_eo[pbase + j][b:b + 1, :];
                    }
                }
            }
            psum(g_eo, pbase, PPE, LGE, GROT * PPE, BATCH, LATENT);
            zb = bf16(g_eo[pbase]);
        }
        f_src = matmul(zb, mup[sl][:, 0:DIM]);
        for k in 0..EP_RH {
            let b = me + k * NCORES;
            if b < BATCH {
                push_all(f_src[b:b + 1, :], g_f[b:b + 1, :], 1, DIM, me, NCORES, ssend, r_f);
                sent[0] = sent[0] + (NCORES - 1) * DIM * 4;
            }
        }
    }
    region "allgather" {
        wait(r_f, BATCH * DIM * 4);
        wait(ssend, sent[0]);
    }
}
