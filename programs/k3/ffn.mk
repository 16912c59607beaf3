// The FFN of one layer (the dense FFN of layer 0, the latent MoE of the others) and the
// LM head, as the megakernel and the super-operators run them, every weight streamed
// through the rings (programs/k3/stream.mk) in fns that take `part` (prefetch / primed,
// as in attention.mk).
//
// MoE, tensor parallel: [router | moe_down] on every core (replicated, or split and
// gathered) -> routing on every core (identical bits) -> the units: the shared experts,
// then the distinct routed experts in order of first use; unit u runs on group u % NGROUPS
// (shard.mk: one core, or a chip's cores when experts are big), split by columns over the
// group's cores: each core makes its hidden blocks (w1 | w3), the group's cores exchange
// them, each core makes its output blocks (w2) and pushes them, weighted by the router
// weight of every row that chose the expert, toward the sum of the parts (reduce.mk) ->
// psum -> moe_up.
import "model.mk";
import "tensors.mk";
import "coll.mk";

const RNARROW = NEXP < 128;          // the router is narrower than a block: fetched whole
const A13C = 2 * max(NXB, ND13C) * 128;

// A kernel's FFN working set.
struct FfnBufs {
    mbias: vmem bf16[2][1, NEXP];                // router bias (slot set: MoE index % 2)
    mrn: vmem bf16[2][select(RNARROW, DIM, 1), EW];    // the router, when narrow
    fin: vmem bf16[1, DIM];                      // the final norm
    rl_src: vmem f32[BATCH, NRL * 128];          // this core's [router | down] blocks (split form)
    topi: vmem i32[BATCH, TOPK];
    topw: vmem f32[BATCH, TOPK];
    xlb: vmem bf16[BATCH, LATENT];
    zb: vmem bf16[BATCH, LATENT];
    a13: vmem f32[BATCH, A13C];                  // [w1 | w3] products, block by block
    um: vmem f32[BATCH, EINTER];                 // this core's hidden blocks of a unit (pushed)
    ug: vmem f32[2][BATCH, EINTER];              // a unit's hidden, gathered over the chip (unit parity)
    ub: vmem bf16[BATCH, max(EINTER, DENSE_INTER)];
    ey: vmem f32[NUNITS][BATCH, LATENT];         // each unit's output blocks (sources of its pushes)
    src: vmem f32[BATCH, max(max(NDB, ND2C), max(NIL, NVL)) * 128];    // this core's blocks (split forms), EP's f rows
    eid: smem i32[BATCH * TOPK];                 // the top-k ids, row-major (the routing readback)
    dl: smem i32[BATCH * TOPK];                  // distinct routed experts in order of first use
    dp: smem i32[BATCH * TOPK];                  // (row, slot) -> its distinct expert
    seen: smem i32[NEXP];
    nd: smem i32[1];                             // how many distinct routed experts
    dr: vmem bf16[NDR][DENSE_INTER, 128];        // the dense FFN's w2 blocks (their ring)
    drs: sem[NDR];
    r_u: sem[2];                                 // unit hidden blocks arriving, by unit parity
    wf: sem[2];                                  // side fetches of the MoE layer, by slot set
}

// ----------------------------------------------------------------- router and down

// This core's [router | down] tiles (all of them on the routing cores when replicated,
// else blocks me, me + NCORES, ...; a narrow router is fetched whole by `moe_side`): the
// products go to their columns of the gathered site (replicated) or of f.rl_src (split).
fn rd_stream(part: i32, w: K3Weights, fi: i32, me: i32, xb: vmem bf16[BATCH, DIM], f: FfnBufs, r: Rings, c: Coll,
             g: i32) {
    let j0 = select(REP_RD, i32(RNARROW), me + select(RNARROW && me == 0, NCORES, 0));
    let js = select(REP_RD, 1, NCORES);
    let nj = select(REP_RD, select(me < NT_RD, NRB - j0, 0), (max(NRB - j0, 0) + NCORES - 1) / NCORES);
    pipeline k in 0..nj part part {
        input wt = select(RNARROW, w.moe_down[fi, :, (j0 + k * js - NEB) * HD +: HD],
                          select(j0 + k * js < NEB, w.moe_router[fi, :, (j0 + k * js) * 128 +: EW],
                                                    w.moe_down[fi, :, (j0 + k * js - NEB) * HD +: HD])) via r.w1, r.s1;
        let j = j0 + k * js;
        select(REP_RD, c.g_rl[g], f.rl_src)[:, select(REP_RD, j, (j - me) / NCORES) * 128 +: 128] = matmul(xb, wt);
    }
}

// The MoE layer's small tensors, into slot set sl: the router bias (routing cores) and the
// narrow router (its block's owners).
fn moe_side(mode: i32, w: K3Weights, fi: i32, sl: i32, me: i32, f: FfnBufs, s: sem) {
    if me < NT_RD {
        cp1(mode, w.moe_bias[fi], f.mbias[sl], s);
    }
    if RNARROW {
        if select(REP_RD, me < NT_RD, me == 0) {
            cp(mode, w.moe_router[fi], f.mrn[sl], s);
        }
    }
}

// The router (its narrow block, when narrow) and the gather of [router | down] (when
// split), then routing on every routing core: top-k and weights, the ids read back into
// scalars in the fixed order every program keeps (row-major, docs/k3_programs.md: the
// contract with the timing-only mode), and the latent input of the experts.
fn moe_route(w: K3Weights, fi: i32, sl: i32, me: i32, xb: vmem bf16[BATCH, DIM], f: FfnBufs, c: Coll, g: i32,
             net: Net) {
    region "router" {
        if RNARROW {
            if select(REP_RD, me < NT_RD, me == 0) {
                select(REP_RD, c.g_rl[g], f.rl_src)[:, 0:EW] = matmul(xb, f.mrn[sl]);
            }
        }
        if !REP_RD {
            all_gather(f.rl_src, c.g_rl[g], NRB, me, NT_RD, c.r_rl[g], c.q[QS_RL], net);
        }
        if me < NT_RD {
            route(c.g_rl[g][:, 0:NEXP], f.mbias[sl], f.topi, f.topw);
            for b in 0..BATCH {
                for j in 0..TOPK {
                    f.eid[b * TOPK + j] = scalar(f.topi[b:b + 1, j:j + 1]);
                }
            }
            f.xlb = bf16(c.g_rl[g][:, EPAD:EPAD + LATENT]);
        }
    }
}

// The distinct routed experts in order of first use (row-major over rows and slots):
// dl[i] = expert, dp[q] = the distinct index of (row, slot) q = b*TOPK + j.
fn distinct(f: FfnBufs) {
    for q in 0..BATCH * TOPK {
        f.seen[f.eid[q]] = -1;      // only the chosen entries are read below
    }
    f.nd[0] = 0;
    for q in 0..BATCH * TOPK {
        let e = f.eid[q];
        if f.seen[e] < 0 {
            f.seen[e] = f.nd[0];
            f.dl[f.nd[0]] = e;
            f.nd[0] = f.nd[0] + 1;
        }
        f.dp[q] = f.seen[e];
    }
}

// ---------------------------------------------------------------------- expert units

// Stage A of a unit (shared expert or routed, its row gx of the stacked arrays), split
// over G cores (this one is cc): the w1 and w3 blocks of this core's hidden blocks
// [cc*NXB/G, (cc+1)*NXB/G) in turn, their products with the latent input into f.a13.
// MXFP4 routed experts (EXPERT_MX) stream through their own slots (r.x0), the shared
// experts through r.w0 as with bf16 experts.
fn unit_a(part: i32, w: K3Weights, shared: bool, gx: i32, G: i32, cc: i32, f: FfnBufs, r: Rings) {
    let jb0 = cc * (NXB / G);
    let nb = NXB / G;
    if EXPERT_MX == 1 {
        if shared {
            pipeline k in 0..2 * nb part part {
                input wt = select(k % 2 == 0, w.moe_shared_w1[gx, :, (jb0 + k / 2) * HD +: HD],
                                              w.moe_shared_w3[gx, :, (jb0 + k / 2) * HD +: HD]) via r.w0, r.s0;
                f.a13[:, k * HD +: HD] = matmul(f.xlb, wt);
            }
        } else {
            pipeline k in 0..2 * nb part part {
                input wt = select(k % 2 == 0, w.moe_w1[gx, :, (jb0 + k / 2) * HD +: HD],
                                              w.moe_w3[gx, :, (jb0 + k / 2) * HD +: HD]) via r.x0, r.sx0;
                f.a13[:, k * HD +: HD] = matmul(f.xlb, wt);
            }
        }
    } else {
        pipeline k in 0..2 * nb part part {
            input wt = select(k % 2 == 0,
                              select(shared, w.moe_shared_w1[gx, :, (jb0 + k / 2) * HD +: HD],
                                             w.moe_w1[gx, :, (jb0 + k / 2) * HD +: HD]),
                              select(shared, w.moe_shared_w3[gx, :, (jb0 + k / 2) * HD +: HD],
                                             w.moe_w3[gx, :, (jb0 + k / 2) * HD +: HD])) via r.w0, r.s0;
            f.a13[:, k * HD +: HD] = matmul(f.xlb, wt);
        }
    }
}

// The unit's hidden u = silu(x w1) * (x w3), rounded to bf16 (as the matrix unit takes
// it): this core's blocks, pushed to the G cores of the split (cores c0 .. c0+G-1, into
// ug[k % 2] for the unit's ordinal k), then all of it once every block arrived. (Two
// slots suffice: a core pushes unit k+1's blocks only after it received all of unit k's,
// so its siblings are done with slot (k+1) % 2 = (k-1) % 2.) Unsplit (G = 1), all of it
// at once.
fn unit_hidden(G: i32, cc: i32, c0: i32, k: i32, me: i32, f: FfnBufs, net: Net) {
    if G == 1 {
        for i in 0..NXB {
            f.ub[:, i * HD +: HD] = bf16(silu(f.a13[:, 2 * i * HD +: HD]) * f.a13[:, (2 * i + 1) * HD +: HD]);
        }
    } else {
        unit_exchange(G, cc, c0, k, me, f, net);
    }
}

fn unit_exchange(G: i32, cc: i32, c0: i32, k: i32, me: i32, f: FfnBufs, net: Net) {
    let jb0 = cc * (NXB / G);
    let nb = NXB / G;
    for i in 0..nb {
        f.um[:, i * HD +: HD] = f32(bf16(silu(f.a13[:, 2 * i * HD +: HD]) * f.a13[:, (2 * i + 1) * HD +: HD]));
    }
    for i in 0..nb {      // (after all the stores: a copy's source spans the rows of its columns)
        for t in 0..G {
            send(f.um[:, i * HD +: HD], f.ug[k % 2][:, (jb0 + i) * HD +: HD], c0 + t, me, f.r_u[k % 2], net);
        }
    }
    region "allgather" {    // the hidden blocks of the group's cores
        wait(f.r_u[k % 2], NXB * bytes(f.ug[0][:, 0:HD]));
        drain(net);       // f.um is free for the next unit
    }
    f.ub[:, 0:EINTER] = bf16(f.ug[k % 2]);
}

// Stage B: the w2 blocks of this core's output blocks [cc*NLB/G, (cc+1)*NLB/G) into f.ey[k]
// (k: the unit's ordinal in the layer on this core).
fn unit_b(part: i32, w: K3Weights, shared: bool, gx: i32, G: i32, cc: i32, k: i32, f: FfnBufs, r: Rings) {
    let jo0 = cc * (NLB / G);
    let no = NLB / G;
    if EXPERT_MX == 1 {
        if shared {
            pipeline t in 0..no part part {
                input wt = w.moe_shared_w2[gx, :, (jo0 + t) * HD +: HD] via r.w1, r.s1;
                f.ey[k][:, (jo0 + t) * HD +: HD] = matmul(f.ub[:, 0:EINTER], wt);
            }
        } else {
            pipeline t in 0..no part part {
                input wt = w.moe_w2[gx, :, (jo0 + t) * HD +: HD] via r.x1, r.sx1;
                f.ey[k][:, (jo0 + t) * HD +: HD] = matmul(f.ub[:, 0:EINTER], wt);
            }
        }
    } else {
        pipeline t in 0..no part part {
            input wt = select(shared, w.moe_shared_w2[gx, :, (jo0 + t) * HD +: HD], w.moe_w2[gx, :, (jo0 + t) * HD +: HD])
                       via r.w1, r.s1;
            f.ey[k][:, (jo0 + t) * HD +: HD] = matmul(f.ub[:, 0:EINTER], wt);
        }
    }
}

// The unit's parts, tensor parallel: shared expert s is part TOPK + s (every row); routed
// distinct expert i is part j of every row b that chose it in slot j, weighted by w_j.
fn unit_parts(shared: bool, u: i32, i: i32, k: i32, me: i32, f: FfnBufs, c: Coll, g: i32, net: Net) {
    let jo0 = me % ESPLIT * NOS;
    if shared {
        ar_send(f.ey[k], c.g_eo, g * PPE + TOPK + u, 0, jo0, NOS, RS_E, me, NT_EO, c.r_eo[g], net);
    } else {
        for q in 0..BATCH * TOPK {
            if f.dp[q] == i {
                let b = q / TOPK;
                let j = q % TOPK;
                f.ey[k][b:b + 1, :] = f.topw[b:b + 1, j:j + 1] * f.ey[k][b:b + 1, :];
                ar_send(f.ey[k][b:b + 1, :], c.g_eo, g * PPE + j, b, jo0, NOS, RS_E, me, NT_EO, c.r_eo[g], net);
            }
        }
    }
}

// Unit u's row in the stacked expert arrays: shared expert u, or routed expert dl[u - NSHARED].
// (A routed expert's row is its local index on its home chip when the experts are homed.)
fn unit_row(fi: i32, u: i32, f: FfnBufs, out: smem i32[1]) {
    out[0] = select(u < NSHARED, fi * NSHARED + u,
                    fi * NEL + select(HOMED, f.dl[max(u - NSHARED, 0)] / NCORES * CORES_PER_CHIP
                                             + f.dl[max(u - NSHARED, 0)] % CORES_PER_CHIP,
                                      f.dl[max(u - NSHARED, 0)]));
}

// This group's units of MoE layer fi, one after the other, each split over the group's
// cores. A unit's w1|w3 tiles stream through the ring's first half, its w2 tiles through
// the second: the w2 tiles start with the unit, the next unit's w1|w3 tiles as soon as
// this unit's are done. The first unit's w1|w3 tiles were started before routing when it
// is a shared expert (its weights do not depend on the routing).
fn moe_units(w: K3Weights, fi: i32, me: i32, f: FfnBufs, r: Rings, c: Coll, g: i32, net: Net) {
    smem gx: i32[1];
    smem gn: i32[1];
    let grp = me / ESPLIT;
    let cc = me % ESPLIT;
    let nu = NSHARED + f.nd[0];
    var k: i32 = 0;
    if grp >= NSHARED && grp < nu {
        unit_row(fi, grp, f, gx);
        unit_a(prefetch, w, false, gx[0], ESPLIT, cc, f, r);
    }
    for u in grp..nu step NGROUPS {
        let shared = u < NSHARED;
        unit_row(fi, u, f, gx);
        unit_b(prefetch, w, shared, gx[0], ESPLIT, cc, k, f, r);
        region "experts" {
            unit_a(primed, w, shared, gx[0], ESPLIT, cc, f, r);
        }
        if u + NGROUPS < nu {
            unit_row(fi, u + NGROUPS, f, gn);
            unit_a(prefetch, w, u + NGROUPS < NSHARED, gn[0], ESPLIT, cc, f, r);
        }
        unit_hidden(ESPLIT, cc, grp * ESPLIT, k, me, f, net);
        region "experts" {
            unit_b(primed, w, shared, gx[0], ESPLIT, cc, k, f, r);
            unit_parts(shared, u, u - NSHARED, k, me, f, c, g, net);
        }
        k += 1;
    }
}

// Expert homes (shard.mk, HOMED): a routed expert runs on its home group, the group of core
// e % NCORES, the only one whose chip holds its weights. This group's units are its shared
// experts (grp, grp + NGROUPS, ...), then the distinct routed experts it is home to, in
// order of first use: ul[0 .. un[0]) as unit numbers (NSHARED + distinct index). The
// parts and their sum are those of the dealt units: only who computes a unit moves.
fn home_units(grp: i32, f: FfnBufs, ul: smem i32[NUNITS], un: smem i32[1]) {
    un[0] = 0;
    for u in grp..NSHARED step NGROUPS {
        ul[un[0]] = u;
        un[0] = un[0] + 1;
    }
    for i in 0..f.nd[0] {
        if f.dl[i] % NCORES / ESPLIT == grp {
            ul[un[0]] = NSHARED + i;
            un[0] = un[0] + 1;
        }
    }
}

fn moe_units_homed(w: K3Weights, fi: i32, me: i32, f: FfnBufs, r: Rings, c: Coll, g: i32, net: Net) {
    smem gx: i32[1];
    smem gn: i32[1];
    smem ul: i32[NUNITS];
    smem un: i32[1];
    let grp = me / ESPLIT;
    let cc = me % ESPLIT;
    home_units(grp, f, ul, un);
    let nu = un[0];
    if nu > 0 {
        if ul[0] >= NSHARED {      // (a shared first unit was started before routing)
            unit_row(fi, ul[0], f, gx);
            unit_a(prefetch, w, false, gx[0], ESPLIT, cc, f, r);
        }
    }
    for k in 0..nu {
        let u = ul[k];
        let shared = u < NSHARED;
        unit_row(fi, u, f, gx);
        unit_b(prefetch, w, shared, gx[0], ESPLIT, cc, k, f, r);
        region "experts" {
            unit_a(primed, w, shared, gx[0], ESPLIT, cc, f, r);
        }
        if k + 1 < nu {
            unit_row(fi, ul[k + 1], f, gn);
            unit_a(prefetch, w, ul[k + 1] < NSHARED, gn[0], ESPLIT, cc, f, r);
        }
        unit_hidden(ESPLIT, cc, grp * ESPLIT, k, me, f, net);
        region "experts" {
            unit_b(primed, w, shared, gx[0], ESPLIT, cc, k, f, r);
            unit_parts(shared, u, u - NSHARED, k, me, f, c, g, net);
        }
    }
}

// moe_up's blocks: all of them on the sum's consumers when replicated (into the FFN
// output), else this core's (into f.src, then gathered); expert parallel, all of them on
// the homes (into f.src: each home's rows).
fn up_stream(part: i32, w: K3Weights, fi: i32, me: i32, f: FfnBufs, r: Rings, c: Coll, g: i32) {
    let whole = EXPERT_PARALLEL || REP_UP;
    let nt = select(EXPERT_PARALLEL, NHOME, NT_EO);
    let nj = select(whole, select(me < nt, NDB, 0), (max(NDB - me, 0) + NCORES - 1) / NCORES);
    pipeline k in 0..nj part part {
        input wt = w.moe_up[fi, :, select(whole, k, me + k * NCORES) * HD +: HD] via r.w1, r.s1;
        select(EXPERT_PARALLEL || !REP_UP, f.src, c.g_f[g])[:, k * HD +: HD] = matmul(f.zb, wt);
    }
}

// ------------------------------------------------------------------------ dense FFN

// The dense FFN's w1 and w3 blocks in turn (all on the w2 consumers when replicated, else
// this core's blocks), their products with x into f.a13.
fn d13_stream(part: i32, w: K3Weights, me: i32, xb: vmem bf16[BATCH, DIM], f: FfnBufs, r: Rings) {
    let nj = select(REP_D13, select(me < NT_U, NIB, 0), (max(NIB - me, 0) + NCORES - 1) / NCORES);
    pipeline k in 0..2 * nj part part {
        input wt = select(k % 2 == 0, w.dense_w1[0, :, select(REP_D13, k / 2, me + k / 2 * NCORES) * HD +: HD],
                                      w.dense_w3[0, :, select(REP_D13, k / 2, me + k / 2 * NCORES) * HD +: HD])
                   via r.w1, r.s1;
        f.a13[:, k * HD +: HD] = matmul(xb, wt);
    }
}

// The dense hidden u = silu(x w1) * (x w3) of this core's blocks, gathered to the w2
// consumers when split; then bf16 for the matrix unit.
fn dense_hidden(me: i32, f: FfnBufs, c: Coll, net: Net) {
    let nj = select(REP_D13, select(me < NT_U, NIB, 0), (max(NIB - me, 0) + NCORES - 1) / NCORES);
    for i in 0..nj {
        select(REP_D13, c.g_u, f.src)[:, i * HD +: HD] = silu(f.a13[:, 2 * i * HD +: HD]) * f.a13[:, (2 * i + 1) * HD +: HD];
    }
    if !REP_D13 {
        all_gather(f.src, c.g_u, NIB, me, NT_U, c.r_u, c.q[QS_U], net);
    }
    if me < NT_U {
        f.ub[:, 0:DENSE_INTER] = bf16(c.g_u);
    }
}

// The dense FFN's w2 blocks (all of them everywhere when replicated, else this core's),
// through the dense ring: into the FFN output, or f.src and then gathered.
fn d2_stream(part: i32, w: K3Weights, me: i32, f: FfnBufs, r: Rings, c: Coll, g: i32) {
    let nj = select(REP_D2, NDB, (max(NDB - me, 0) + NCORES - 1) / NCORES);
    pipeline k in 0..nj part part {
        input wt = w.dense_w2[0, :, select(REP_D2, k, me + k * NCORES) * HD +: HD] via f.dr, f.drs;
        select(REP_D2, c.g_f[g], f.src)[:, k * HD +: HD] = matmul(f.ub[:, 0:DENSE_INTER], wt);
    }
}

// ------------------------------------------------------------------------- LM head

// The LM head's blocks: all on core 0 (LM_ROOT, into c.g_lm), else this core's (f.src).
fn lm_stream(part: i32, w: K3Weights, me: i32, xb: vmem bf16[BATCH, DIM], f: FfnBufs, r: Rings, c: Coll) {
    let nj = select(LM_ROOT, select(me == 0, NVB, 0), (max(NVB - me, 0) + NCORES - 1) / NCORES);
    pipeline k in 0..nj part part {
        input wt = w.lm_head[:, select(LM_ROOT, k, me + k * NCORES) * HD +: HD] via r.w0, r.s0;
        select(LM_ROOT, c.g_lm, f.src)[:, k * HD +: HD] = matmul(xb, wt);
    }
}

// ---------------------------------------------------------------------- one layer

// Everything of a layer's FFN that can start once the attention's last weight-ring
// stream is done (kind 1 MoE layer fi, kind 0 the dense FFN): its first tiles and its small
// tensors (slot set fi % 2, counted on s); tensor parallel, the first unit's w1|w3 tiles
// when it is a shared expert (in the other half of the ring).
fn ffn_prefetch(w: K3Weights, kind: i32, fi: i32, me: i32, xb: vmem bf16[BATCH, DIM], f: FfnBufs, r: Rings,
                c: Coll, g: i32, s: sem) {
    if kind == 1 {
        rd_stream(prefetch, w, fi, me, xb, f, r, c, g);
        moe_side(prefetch, w, fi, fi % 2, me, f, s);
        if !EXPERT_PARALLEL {
            if me / ESPLIT < NSHARED {
                unit_a(prefetch, w, true, fi * NSHARED + me / ESPLIT, ESPLIT, me % ESPLIT, f, r);
            }
        }
    } else {
        d13_stream(prefetch, w, me, xb, f, r);
        d2_stream(prefetch, w, me, f, r, c, g);
    }
}

// The tensor-parallel MoE of layer fi up to its experts: router and down, routing, this
// group's units (after them the ring's first half is free: the caller may start the next
// layer's tiles there).
fn moe_front(w: K3Weights, fi: i32, me: i32, xb: vmem bf16[BATCH, DIM], f: FfnBufs, r: Rings, c: Coll, g: i32,
             net: Net, s: sem) {
    region "router" {
        moe_side(primed, w, fi, fi % 2, me, f, s);
        rd_stream(primed, w, fi, me, xb, f, r, c, g);
    }
    moe_route(w, fi, fi % 2, me, xb, f, c, g, net);
    region "router" {
        distinct(f);
    }
    if HOMED {
        moe_units_homed(w, fi, me, f, r, c, g, net);
    } else {
        moe_units(w, fi, me, f, r, c, g, net);
    }
}

// The rest of the tensor-parallel MoE: the sum of the parts, moe_up; the layer's output
// lands in c.g_f[g] on every core.
fn moe_back(w: K3Weights, fi: i32, me: i32, f: FfnBufs, r: Rings, c: Coll, g: i32, net: Net) {
    up_stream(prefetch, w, fi, me, f, r, c, g);
    ar_sum(c.g_eo, g * PPE, LGE, NROWS_EO, c.g_z[g], NLB, RS_E, me, NT_EO, c.r_eo[g], c.r_z[g], c.q[QS_Z],
           net);
    if me < NT_EO {
        f.zb = bf16(select(RS_E, c.g_z[g], c.g_eo[g * PPE]));
    }
    up_stream(primed, w, fi, me, f, r, c, g);
    if !REP_UP {
        all_gather(f.src, c.g_f[g], NDB, me, NCORES, c.r_f[g], c.q[QS_F], net);
    }
}

// The dense FFN (layer 0): w1|w3, the hidden (gathered when split), w2 through the dense
// ring; the output lands in c.g_f[g] on every core.
fn dense_layer(w: K3Weights, me: i32, xb: vmem bf16[BATCH, DIM], f: FfnBufs, r: Rings, c: Coll, g: i32, net: Net) {
    d13_stream(primed, w, me, xb, f, r);
    dense_hidden(me, f, c, net);
    d2_stream(primed, w, me, f, r, c, g);
    if !REP_D2 {
        all_gather(f.src, c.g_f[g], NDB, me, NCORES, c.r_f[g], c.q[QS_F], net);
    }
}

// The logits into chip 0's HBM: from core 0 (LM_ROOT), or from every core its blocks,
// straight into their columns (no gather buffer: k3-full's logits are 5 MiB at batch 8).
fn logits_out(o: K3Out, me: i32, f: FfnBufs, c: Coll, s: sem, net: Net) {
    if LM_ROOT {
        if me == 0 {
            start copy(c.g_lm, o.logits, s);
            wait copy(c.g_lm, o.logits, s);
        }
    } else {
        region "allgather" {
            for j in me..NVB step NCORES {
                let src = f.src[:, (j - me) / NCORES * HD +: HD];
                if me == 0 {
                    start copy(src, o.logits[:, j * HD +: HD], c.r_lm);
                } else {
                    start copy(src, o.logits[:, j * HD +: HD] @ 0, net.ssend, c.r_lm);
                    net.sent[0] = net.sent[0] + bytes(src);
                }
            }
            drain(net);
            if me == 0 {
                wait(c.r_lm, NVB * bytes(f.src[:, 0:HD]));
            }
        }
    }
}
