// The expert-parallel MoE layer of the megakernel and the super-operators (SCHEME = 1;
// docs/k3_programs.md, "Schemes").
//
// Placement is static: expert e of every layer is owned by core e % NCORES, and only its
// owner reads its weights (with expert homes, shard.mk, only its owner's chip holds them). Batch row b has a home core, b % NCORES, which routes it and
// dispatches it: for each of its TOPK choices the row's latent input goes to the owner of
// the chosen expert, with a tag naming the expert, the slot and the row. An owner learns
// its work only from what arrives (an all-to-all with counts: every home sends every core
// a count, zero included). It runs each distinct expert it received rows for, once, its
// weights streamed through the ring (ffn.mk's units, on the owner alone), and sends every
// result row back to the row's home (the combine). The home computes the shared experts
// for its rows itself, weights the routed parts and adds all parts by psum (the
// contract's order, so the bits equal the tensor-parallel scheme's), applies moe_up to
// its rows, and the rows of f are all-gathered, since the next layer's attention is
// tensor parallel and needs every row everywhere.
//
// Buffers written by other cores' DMAs (d_x, d_tag, d_cnt, the parts g_eo, g_f) exist
// once per slot g and are only read after their semaphore counted every byte.
import "model.mk";
import "tensors.mk";
import "ffn.mk";

const EP_IN = select(EXPERT_PARALLEL, NHOME * EP_CAP, 1);    // an owner's inbox (one row when unused)

struct EpBufs {
    d_x: vmem f32[GROT][EP_IN, LATENT];          // dispatched rows, EP_CAP slots per home
    d_tag: smem i32[GROT, EP_IN];                // their tags
    d_cnt: smem i32[GROT, NHOME];                // how many each home sent
    xin: vmem f32[BATCH, LATENT];                // one expert's rows, packed
    ct: smem i32[NCORES];                        // rows this home sends each owner
    tg: smem i32[EP_CAP];                        // the tags it sends
    dq: smem i32[EP_IN];                         // inbox slot -> its distinct expert
    mt: smem i32[BATCH];                         // an expert's packed rows' tags
    gx: smem i32[1];                             // a unit's row in the stacked expert arrays
    gn: smem i32[1];                             // ... the next unit's
    g_ep: vmem f32[select(EXPERT_PARALLEL, GROT * PPE, 1)][EP_RH, LATENT];   // the parts of a home's rows (row b at b / NCORES)
    r_d: sem[GROT];
    r_cnt: sem[GROT];
    r_ep: sem[GROT];
}

// Home: dispatch each of its rows' TOPK choices (the ids read back by moe_route) to the
// experts' owners (the latent row + a tag), then one count per core, staggered so the homes
// do not all start with the same core.
fn home_dispatch(me: i32, g: i32, f: FfnBufs, c: Coll, e: EpBufs, net: Net) {
    for o in 0..NCORES {
        e.ct[o] = 0;
    }
    for k in 0..EP_RH {
        let b = me + k * NCORES;
        if b < BATCH {
            for j in 0..TOPK {
                let x = f.eid[b * TOPK + j];
                let o = x % NCORES;
                let q = me * EP_CAP + e.ct[o];
                let t = k * TOPK + j;
                e.tg[t] = x * EP_TAGR + j * BATCH + b;
                send(c.g_rl[g][b:b + 1, EPAD:EPAD + LATENT], e.d_x[g][q:q + 1, :], o, me, e.r_d[g], net);
                if o == me {
                    start copy(e.tg[t +: 1], e.d_tag[g, q +: 1], e.r_d[g]);
                } else {
                    start copy(e.tg[t +: 1], e.d_tag[g, q +: 1] @ o, net.ssend, e.r_d[g]);
                    net.sent[0] = net.sent[0] + 4;
                }
                e.ct[o] = e.ct[o] + 1;
            }
        }
    }
    for kk in 0..NCORES {
        let o = (me + kk) % NCORES;
        if o == me {
            start copy(e.ct[o +: 1], e.d_cnt[g, me +: 1], e.r_cnt[g]);
        } else {
            start copy(e.ct[o +: 1], e.d_cnt[g, me +: 1] @ o, net.ssend, e.r_cnt[g]);
            net.sent[0] = net.sent[0] + 4;
        }
    }
}

// Owner: wait for every home's count and the rows they announce, run each distinct expert
// once on its rows (in order of arrival: home, then position), send each result row to
// slot j, row b of its home's parts.
fn owner_experts(w: K3Weights, fi: i32, me: i32, g: i32, f: FfnBufs, r: Rings, c: Coll, e: EpBufs, net: Net) {
    var nin: i32 = 0;
    region "alltoall" {
        wait(e.r_cnt[g], NHOME * bytes(e.d_cnt[0, 0:1]));
        for hm in 0..NHOME {
            nin += e.d_cnt[g, hm];
        }
        wait(e.r_d[g], nin * (bytes(e.d_x[0][0:1, :]) + 4));
    }
    region "experts" {
        for hm in 0..NHOME {
            for k in 0..e.d_cnt[g, hm] {
                f.seen[e.d_tag[g, hm * EP_CAP + k] / EP_TAGR] = -1;
            }
        }
        f.nd[0] = 0;
        for hm in 0..NHOME {
            for k in 0..e.d_cnt[g, hm] {
                let q = hm * EP_CAP + k;
                let x = e.d_tag[g, q] / EP_TAGR;
                if f.seen[x] < 0 {
                    f.seen[x] = f.nd[0];
                    f.dl[f.nd[0]] = x;
                    f.nd[0] = f.nd[0] + 1;
                }
                e.dq[q] = f.seen[x];
            }
        }
    }
    // Its units: each distinct routed expert, then (a home) each shared expert on its rows;
    // w1|w3 tiles in the ring's first half, w2 tiles in the second, as in moe_units.
    let nd = f.nd[0];
    let nk = nd + select(me < NHOME, NSHARED, 0);
    if nk > 0 {
        ep_unit_row(fi, 0, nd, f, e.gx);
        unit_a(prefetch, w, nd == 0, e.gx[0], 1, 0, f, r);
    }
    for k in 0..nk {
        let shared = k >= nd;
        var m: i32 = 0;
        ep_unit_row(fi, k, nd, f, e.gx);
        unit_b(prefetch, w, shared, e.gx[0], 1, 0, k, f, r);
        region "experts" {
            if shared {
                f.xlb = bf16(c.g_rl[g][:, EPAD:EPAD + LATENT]);      // the home's rows (all computed)
            } else {
                // The expert's rows, packed; their tags (slot and row) in mt.
                for hm in 0..NHOME {
                    for q0 in 0..e.d_cnt[g, hm] {
                        let q = hm * EP_CAP + q0;
                        if e.dq[q] == k {
                            e.xin[m:m + 1, :] = e.d_x[g][q:q + 1, :];
                            e.mt[m] = e.d_tag[g, q] % EP_TAGR;
                            m += 1;
                        }
                    }
                }
                f.xlb = bf16(e.xin);
            }
            unit_a(primed, w, shared, e.gx[0], 1, 0, f, r);
        }
        if k + 1 < nk {
            ep_unit_row(fi, k + 1, nd, f, e.gn);
            unit_a(prefetch, w, k + 1 >= nd, e.gn[0], 1, 0, f, r);
        }
        unit_hidden(1, 0, me, k, me, f, net);
        region "experts" {
            unit_b(primed, w, shared, e.gx[0], 1, 0, k, f, r);
            if shared {
                for kk in 0..EP_RH {
                    if me + kk * NCORES < BATCH {
                        e.g_ep[g * PPE + TOPK + k - nd][kk:kk + 1, :] = f.ey[k][me + kk * NCORES:me + kk * NCORES + 1, :];
                    }
                }
            } else {
                for rr in 0..m {
                    let j = e.mt[rr] / BATCH;
                    let b = e.mt[rr] % BATCH;
                    send(f.ey[k][rr:rr + 1, :], e.g_ep[g * PPE + j][b / NCORES:b / NCORES + 1, :], b % NCORES, me,
                         e.r_ep[g], net);
                }
            }
        }
    }
}

// Unit k's row in the stacked expert arrays: distinct routed expert k (k < nd; its local
// index on this chip when the experts are homed, shard.mk), else shared expert k - nd.
fn ep_unit_row(fi: i32, k: i32, nd: i32, f: FfnBufs, out: smem i32[1]) {
    out[0] = select(k < nd, fi * NEL + select(HOMED, f.dl[min(k, BATCH * TOPK - 1)] / NCORES * CORES_PER_CHIP
                                                     + f.dl[min(k, BATCH * TOPK - 1)] % CORES_PER_CHIP,
                                              f.dl[min(k, BATCH * TOPK - 1)]),
                    fi * NSHARED + k - nd);
}

// The layer up to its experts, on every core: route and dispatch (homes), the experts
// (owners, then the shared ones at the homes); after them the ring's first half is free.
fn moe_front_ep(w: K3Weights, fi: i32, me: i32, g: i32, xb: vmem bf16[BATCH, DIM], f: FfnBufs, r: Rings, c: Coll,
                e: EpBufs, net: Net, s: sem) {
    region "router" {
        moe_side(primed, w, fi, fi % 2, me, f, s);
        rd_stream(primed, w, fi, me, xb, f, r, c, g);
    }
    moe_route(w, fi, fi % 2, me, xb, f, c, g, net);
    if me < NHOME {
        region "dispatch" {
            home_dispatch(me, g, f, c, e, net);
        }
    }
    owner_experts(w, fi, me, g, f, r, c, e, net);
}

// The rest: combine and moe_up at the homes, the all-gather of f (every core waits for it
// in c.g_f[g]).
fn moe_back_ep(w: K3Weights, fi: i32, me: i32, g: i32, f: FfnBufs, r: Rings, c: Coll, e: EpBufs, net: Net) {
    up_stream(prefetch, w, fi, me, f, r, c, g);
    if me < NHOME {
        region "alltoall" {
            wait(e.r_ep[g], (BATCH - me + NCORES - 1) / NCORES * TOPK * bytes(e.g_ep[0][0:1, :]));
        }
        region "combine" {
            for k in 0..EP_RH {
                let b = me + k * NCORES;
                if b < BATCH {
                    for j in 0..TOPK {
                        e.g_ep[g * PPE + j][k:k + 1, :] = f.topw[b:b + 1, j:j + 1] * e.g_ep[g * PPE + j][k:k + 1, :];
                    }
                }
            }
            psum(e.g_ep, g * PPE, LGE);
            for k in 0..EP_RH {
                let b = me + k * NCORES;
                if b < BATCH {
                    f.zb[b:b + 1, :] = bf16(e.g_ep[g * PPE][k:k + 1, :]);
                }
            }
        }
    }
    up_stream(primed, w, fi, me, f, r, c, g);
    if me < NHOME {
        for k in 0..EP_RH {
            let b = me + k * NCORES;
            if b < BATCH {
                push_all(f.src[b:b + 1, 0:DIM], c.g_f[g][b:b + 1, :], me, NCORES, c.r_f[g], net);
            }
        }
    }
    region "allgather" {
        wait(c.r_f[g], BATCH * bytes(c.g_f[0][0:1, :]));
        drain(net);
    }
}
