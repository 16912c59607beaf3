// Kernel bodies of the per-op program's expert-parallel MoE (SCHEME = 1; programs/k3/shard.mk):
// the all-to-all dispatch, the owners' expert compute with the combine's return trip, the
// homes' weighted psum, moe_up on the homes' rows, and the all-gather of those rows.
//
// Placement is static: expert e of every layer is owned by core e % NCORES, and only its
// owner reads its weights. Batch row b has a home, core b % NCORES (cores 0 .. NHOME-1),
// which dispatches the row to the owners of its TOPK experts and combines what comes back.
// An owner learns its work only from what was dispatched to it.
//
// Everything goes through HBM between kernels, so a message lands in the HBM of the
// target core's chip, in a region of its own: the owner with core index c on its chip has
// rows c*EP_INBOX .. c*EP_INBOX + EP_INBOX - 1 of ep_x and ep_tag and entries
// c*NHOME .. c*NHOME + NHOME - 1 of ep_cnt; inside it, home hm writes EP_CAP slots from
// hm*EP_CAP on and its count at entry hm. Results come back as part j, row b of the
// all-reduce layout of e_out (row j*BATCH + b) in the home's chip HBM, so the shared
// experts and the psum use the tensor-parallel scheme's rows.
//
// Nothing races: every buffer a remote DMA writes is read only after a wait on the
// semaphore that counted all of its bytes (in a later kernel for the rows, tags and
// results), each slot is written once per layer, and kernel boundaries order the layers.
// Nothing deadlocks: in each kernel every core issues all its sends before its first wait
// on another core.
import "ops.mk";

// An owner's inbox has EP_CAP slots per home (shard.mk), a fixed region per home, so the
// homes fill it without agreeing on offsets.
const EP_INBOX = NHOME * EP_CAP;                // an owner's inbox
const EP_OWN = (NEXP + NCORES - 1) / NCORES;    // experts a core owns (e = me + i*NCORES)

// Start (mode prefetch) or wait for (mode primed) the copies between this home's rows
// b = me + k*NCORES of x and rows k of v: x to v (store 0) or v to x (store 1).
fn ep_home_rows<N>(mode: i32, store: i32, x: hbm f32[BATCH, N], v: vmem f32[EP_RH, N], me: i32, s: sem) {
    for k in 0..EP_RH {
        let b = me + k * NCORES;
        if b < BATCH {
            if store == 0 {
                if mode == prefetch {
                    start copy(x[b +: 1, :], v[k:k + 1, :], s);
                } else {
                    wait copy(x[b +: 1, :], v[k:k + 1, :], s);
                }
            } else if mode == prefetch {
                start copy(v[k:k + 1, :], x[b +: 1, :], s);
            } else {
                wait copy(v[k:k + 1, :], x[b +: 1, :], s);
            }
        }
    }
}

// Dispatch (every core: the homes send, everyone receives). For each of its rows b and
// slot j the home sends xl[b] and its tag to the owner o of expert e = topi[b, j], into
// the next free slot of its region of o's inbox; then every core a count, zero included,
// staggered from the home itself so the homes start on different owners. Every core waits
// for the NHOME counts, then for the rows and tags they announce.
fn op_ep_dispatch(topi: hbm i32[BATCH * TOPK], xl: hbm f32[BATCH, LATENT],
                  ep_x: hbm f32[CORES_PER_CHIP * EP_INBOX, LATENT], ep_tag: hbm i32[CORES_PER_CHIP * EP_INBOX],
                  ep_cnt: hbm i32[CORES_PER_CHIP * NHOME]) {
    smem ti: i32[EP_RH, TOPK];
    smem tg: i32[EP_CAP];
    smem ct: i32[NCORES];
    smem rc: i32[NHOME];
    sem s;
    sem ssend;
    sem r_row;
    sem r_cnt;
    var sent: i32 = 0;         // bytes this core pushed to other cores
    var nin: i32 = 0;          // rows announced to this core
    let me = global_core(chip_id(), core_id());
    if me < NHOME {
        region "dispatch" {
            for k in 0..EP_RH {
                let b = me + k * NCORES;
                if b < BATCH { start copy(topi[b * TOPK +: TOPK], ti[k], s); }
            }
            wait (BATCH - me + NCORES - 1) / NCORES * copy(topi[0:TOPK], ti[0], s);
            for o in 0..NCORES {
                ct[o] = 0;
            }
            for k in 0..EP_RH {
                let b = me + k * NCORES;
                if b < BATCH {
                    for j in 0..TOPK {
                        let e = ti[k, j];
                        let o = e % NCORES;
                        let q = o % CORES_PER_CHIP * EP_INBOX + me * EP_CAP + ct[o];
                        let t = k * TOPK + j;
                        tg[t] = e * EP_TAGR + j * BATCH + b;
                        if o == me {
                            start copy(xl[b +: 1, :], ep_x[q +: 1, :], r_row);
                            start copy(tg[t +: 1], ep_tag[q +: 1], r_row);
                        } else {
                            start copy(xl[b +: 1, :], ep_x[q +: 1, :] @ o, ssend, r_row);
                            start copy(tg[t +: 1], ep_tag[q +: 1] @ o, ssend, r_row);
                            sent += EP_ROW + 4;
                        }
                        ct[o] = ct[o] + 1;
                    }
                }
            }
            for kk in 0..NCORES {
                let o = (me + kk) % NCORES;
                let q = o % CORES_PER_CHIP * NHOME + me;
                if o == me {
                    start copy(ct[o +: 1], ep_cnt[q +: 1], r_cnt);
                } else {
                    start copy(ct[o +: 1], ep_cnt[q +: 1] @ o, ssend, r_cnt);
                    sent += 4;
                }
            }
        }
    }
    let c = core_id();
    region "alltoall" {
        wait(r_cnt, NHOME * 4);
        start copy(ep_cnt[c * NHOME +: NHOME], rc, s);
        wait copy(ep_cnt[c * NHOME +: NHOME], rc, s);
        for hm in 0..NHOME {
            nin += rc[hm];
        }
        wait(r_row, nin * (EP_ROW + 4));
        wait(ssend, sent);
    }
}

// Experts (every core as owner, then as home). The owner reads its counts and tags,
// numbers the distinct experts in order of arrival (home, then slot) and gathers each
// one's rows into its own buffer; it streams each distinct expert's weights once through
// the ring (ffn.mk's units, whole on the owner), runs the gated FFN on that expert's rows
// and sends every result row to part j, row b of e_out at the row's home. The home then waits for its TOPK results
// per row (the combine's all-to-all: it knows how many to expect).
fn op_ep_experts(ep_x: hbm f32[CORES_PER_CHIP * EP_INBOX, LATENT], ep_tag: hbm i32[CORES_PER_CHIP * EP_INBOX],
                 ep_cnt: hbm i32[CORES_PER_CHIP * NHOME], w: K3Weights, eo: hbm f32[NROWS_EO, LATENT], fi: i32) {
    vmem xr: f32[EP_NDE][BATCH, LATENT];         // distinct expert i's rows, in arrival order
    let r = Rings();
    let f = FfnBufs();                           // f.ey[i]: expert i's results (sources of the return DMAs)
    let net = Net();
    smem rc: i32[NHOME];
    smem tags: i32[EP_INBOX];
    smem seen: i32[EP_OWN];        // owned expert e / NCORES -> 1 + its distinct index; 0: none yet
    smem de: i32[EP_NDE];          // distinct index -> expert
    smem nr: i32[EP_NDE];          // rows of each distinct expert
    smem rt: i32[EP_NDE, BATCH];   // slot * BATCH + row of each of them
    sem s;
    sem r_in;
    sem ssend;
    sem r_res;
    var nd: i32 = 0;
    var nin: i32 = 0;
    var sent: i32 = 0;
    let me = global_core(chip_id(), core_id());
    let c = core_id();
    region "experts" {
        start copy(ep_cnt[c * NHOME +: NHOME], rc, s);
        start copy(ep_tag[c * EP_INBOX +: EP_INBOX], tags, s);
        wait copy(ep_cnt[c * NHOME +: NHOME], rc, s);
        wait copy(ep_tag[c * EP_INBOX +: EP_INBOX], tags, s);
        for i in 0..EP_OWN {
            seen[i] = 0;
        }
        for hm in 0..NHOME {
            for k in 0..rc[hm] {
                let q = hm * EP_CAP + k;
                let e = tags[q] / EP_TAGR;
                if seen[e / NCORES] == 0 {
                    de[nd] = e;
                    nr[nd] = 0;
                    nd += 1;
                    seen[e / NCORES] = nd;
                }
                let i = seen[e / NCORES] - 1;
                let m = nr[i];
                rt[i, m] = tags[q] % EP_TAGR;
                start copy(ep_x[c * EP_INBOX + q +: 1, :], xr[i][m:m + 1, :], r_in);
                nr[i] = m + 1;
                nin += 1;
            }
        }
        wait(r_in, nin * EP_ROW);
        for i in 0..nd {
            f.xlb = bf16(xr[i]);
            unit_a(whole, w, false, fi * NEL + select(HOMED, de[i] / NCORES * CORES_PER_CHIP + de[i] % CORES_PER_CHIP, de[i]), 1, 0, f, r);
            unit_hidden(1, 0, me, i, me, f, net);
            unit_b(whole, w, false, fi * NEL + select(HOMED, de[i] / NCORES * CORES_PER_CHIP + de[i] % CORES_PER_CHIP, de[i]), 1, 0, i, f, r);
            for m in 0..nr[i] {
                let rr = rt[i, m];
                let home = rr % BATCH % NCORES;
                if home == me {
                    start copy(f.ey[i][m:m + 1, :], eo[rr +: 1, :], r_res);
                } else {
                    start copy(f.ey[i][m:m + 1, :], eo[rr +: 1, :] @ home, ssend, r_res);
                    sent += EP_ROW;
                }
            }
        }
    }
    region "alltoall" {
        if me < NHOME {
            wait(r_res, (BATCH - me + NCORES - 1) / NCORES * TOPK * EP_ROW);
        }
        wait(ssend, sent);
    }
}

// Combine (each home, its rows): weight routed part j by the row's router weight j, then
// psum over the routed parts in selection order and the shared experts (the contract's
// order, so the bits are the tensor-parallel scheme's), into z.
fn op_ep_combine(eo: hbm f32[NROWS_EO, LATENT], topw: hbm f32[BATCH, TOPK], z: hbm f32[BATCH, LATENT]) {
    vmem pv: f32[PPE][EP_RH, LATENT];       // slots NPE .. PPE-1 stay +0.0 (fresh VMEM)
    vmem wv: f32[EP_RH, TOPK];
    sem s;
    let me = global_core(chip_id(), core_id());
    if me < NHOME {
        region "combine" {
            ep_home_rows(prefetch, 0, topw, wv, me, s);
            for q in 0..NPE {
                ep_home_rows(prefetch, 0, eo[q * BATCH +: BATCH, :], pv[q], me, s);
            }
            ep_home_rows(primed, 0, topw, wv, me, s);
            for q in 0..NPE {
                ep_home_rows(primed, 0, eo[q * BATCH +: BATCH, :], pv[q], me, s);
            }
            for j in 0..TOPK {
                pv[j] = wv[:, j:j + 1] * pv[j];
            }
            psum(pv, 0, LGE);
            ep_home_rows(prefetch, 1, z, pv[0], me, s);
            ep_home_rows(primed, 1, z, pv[0], me, s);
        }
    }
}

// y[b] = x[b] @ w for this home's rows b, all of w's column blocks streamed (moe_up at
// the rows' homes).
fn op_proj_rows<K, N>(x: hbm f32[BATCH, K], w: hbm bf16[K, N], y: hbm f32[BATCH, N]) {
    vmem xv: f32[EP_RH, K];
    vmem xb: bf16[EP_RH, K];
    vmem yv: f32[EP_RH, N];
    sem s;
    let me = global_core(chip_id(), core_id());
    if me < NHOME {
        ep_home_rows(prefetch, 0, x, xv, me, s);
        ep_home_rows(primed, 0, x, xv, me, s);
        xb = bf16(xv);
        pipeline j in 0..N / 128 {
            input wt = w[:, j * 128 +: 128];
            yv[:, j * 128 +: 128] = matmul(xb, wt);
        }
        ep_home_rows(prefetch, 1, y, yv, me, s);
        ep_home_rows(primed, 1, y, yv, me, s);
    }
}

// All-gather of the rows of y [BATCH, n] across chips: each home pushes its rows from its
// chip's HBM into the same rows on every other chip (its sibling cores share the HBM);
// core 0 of each chip waits for the rows homed on other chips.
fn op_gather_rows<N>(y: hbm f32[BATCH, N]) {
    sem ssend;
    sem rrecv;
    var mine: i32 = 0;
    var away: i32 = 0;
    let me = global_core(chip_id(), core_id());
    let chip = chip_id();
    region "allgather" {
        for k in 0..EP_RH {
            let b = me + k * NCORES;
            if b < BATCH {
                for cc in 1..NCHIPS {
                    start copy(y[b +: 1, :], y[b +: 1, :] @ ((chip + cc) % NCHIPS * CORES_PER_CHIP), ssend, rrecv);
                }
                mine += 1;
            }
        }
        wait (mine * (NCHIPS - 1)) * copy(y[0:1, :], y[0:1, :] @ 0, ssend, rrecv);
        if core_id() == 0 {
            for b in 0..BATCH {
                if b % NCORES / CORES_PER_CHIP != chip {
                    away += 1;
                }
            }
            wait recv away * copy(y[0:1, :], y[0:1, :] @ 0, ssend, rrecv);
        }
    }
}
