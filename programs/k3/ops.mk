// Per-operator building blocks of programs/k3_per_op.mk: each fn is the body of one
// kernel that reads its operands from HBM, computes one operator with the maths of
// model.mk, and writes its result back to HBM (the HBM of the chip it runs on).
//
// Work split: column block j of a projection on core j % NCORES (so a head's columns,
// block h, are on the core that owns head h and per-head operators need no gather);
// row-wise operators (norms, routing, combine, residual adds) are computed by core 0 of
// every chip for its chip's HBM. A gather kernel then copies each core's blocks into
// the same HBM array of every other chip (remote DMA, HBM to HBM), so the next kernel
// finds the whole activation in its own chip's HBM. Launch boundaries order everything.
import "model.mk";
import "shard.mk";
import "allreduce.mk";

const NCHIPS = NCORES / CORES_PER_CHIP;

// ---------------------------------------------------------------- projections

// y[:, this core's blocks] = x @ w[:, block] (n a multiple of 128).
fn op_proj(x: hbm f32[BATCH, k], w: hbm bf16[k, n], y: hbm f32[BATCH, n], k: i32, n: i32) {
    vmem xv: f32[BATCH, k];
    vmem xb: bf16[BATCH, k];
    vmem wv: bf16[k, (n / 128 + NCORES - 1) / NCORES * 128];
    vmem yv: f32[BATCH, (n / 128 + NCORES - 1) / NCORES * 128];
    sem s;
    let me = global_core(chip_id(), core_id());
    if me < n / 128 {
        start copy(x, xv, s);
        for j in me..n / 128 step NCORES {
            start copy(w[:, j * 128 +: 128], wv[:, (j - me) / NCORES * 128 +: 128], s);
        }
        wait copy(x, xv, s);
        for j in me..n / 128 step NCORES {
            wait copy(w[:, j * 128 +: 128], wv[:, (j - me) / NCORES * 128 +: 128], s);
        }
        xb = bf16(xv);
        yv = matmul(xb, wv);
        for j in me..n / 128 step NCORES {
            start copy(yv[:, (j - me) / NCORES * 128 +: 128], y[:, j * 128 +: 128], s);
        }
        for j in me..n / 128 step NCORES {
            wait copy(yv[:, (j - me) / NCORES * 128 +: 128], y[:, j * 128 +: 128], s);
        }
    }
}

// y = x @ w for a matrix narrower than one block (the router when NEXP < 128): core 0.
fn op_proj_narrow(x: hbm f32[BATCH, k], w: hbm bf16[k, n], y: hbm f32[BATCH, n], k: i32, n: i32) {
    vmem xv: f32[BATCH, k];
    vmem xb: bf16[BATCH, k];
    vmem wv: bf16[k, n];
    vmem yv: f32[BATCH, n];
    sem s;
    if global_core(chip_id(), core_id()) == 0 {
        start copy(x, xv, s);
        start copy(w, wv, s);
        wait copy(x, xv, s);
        wait copy(w, wv, s);
        xb = bf16(xv);
        yv = matmul(xb, wv);
        start copy(yv, y, s);
        wait copy(yv, y, s);
    }
}

// --------------------------------------------------------------------- gathers

// Blocks of n/128 columns owned by the cores of chip `chip`.
fn chip_blocks(nb: i32, chip: i32, out: smem i32[1]) {
    out[0] = 0;
    for c in chip * CORES_PER_CHIP..(chip + 1) * CORES_PER_CHIP {
        out[0] = out[0] + (max(nb - c, 0) + NCORES - 1) / NCORES;
    }
}

// All-gather of y [BATCH, n] across chips: every core copies its column blocks (block j
// on core j % NCORES) from its chip's HBM into the same columns on every other chip.
fn op_gather(y: hbm f32[BATCH, n], n: i32) {
    smem cnt: i32[1];
    sem ssend;
    sem rrecv;
    let me = global_core(chip_id(), core_id());
    let chip = chip_id();
    region "allgather" {
        for j in me..n / 128 step NCORES {
            for c in 1..NCHIPS {
                start copy(y[:, j * 128 +: 128], y[:, j * 128 +: 128] @ ((chip + c) % NCHIPS * CORES_PER_CHIP),
                           ssend, rrecv);
            }
        }
        let mine = (max(n / 128 - me, 0) + NCORES - 1) / NCORES;
        wait(ssend, mine * (NCHIPS - 1) * BATCH * 512);
        if core_id() == 0 {
            chip_blocks(n / 128, chip, cnt);
            wait(rrecv, (n / 128 - cnt[0]) * BATCH * 512);
        }
    }
}

// The same for a y narrower than a block, computed whole on core 0.
fn op_gather_narrow(y: hbm f32[BATCH, n], n: i32) {
    sem ssend;
    sem rrecv;
    region "allgather" {
        if global_core(chip_id(), core_id()) == 0 {
            for c in 1..NCHIPS {
                start copy(y, y @ (c * CORES_PER_CHIP), ssend, rrecv);
            }
            wait(ssend, (NCHIPS - 1) * BATCH * n * 4);
        } else {
            if core_id() == 0 {
                wait(rrecv, BATCH * n * 4);
            }
        }
    }
}

// All-reduce of NP parts of y [BATCH, n] (programs/k3/allreduce.mk): parts holds part
// p at rows p*BATCH .. p*BATCH + BATCH - 1, written to its chip's HBM by the previous
// kernel; rows come in units of ru rows, unit u made by core u % NCORES (ru = BATCH: a
// part per core; ru = 1: a row per core). Every core pushes its units into the same
// rows on every other chip; core 0 of each chip waits for the rest, adds the parts up
// by the padded halving tree (psum) and writes y.
fn op_allreduce(parts: hbm f32[np * BATCH, n], y: hbm f32[BATCH, n], np: i32, pp: i32, lg: i32, ru: i32,
                n: i32) {
    vmem pv: f32[pp][BATCH, n];
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
        let mine = (max(nu - me, 0) + NCORES - 1) / NCORES;
        wait(ssend, mine * (NCHIPS - 1) * ru * n * 4);
        if core_id() == 0 {
            chip_blocks(nu, chip, cnt);
            wait(rrecv, (nu - cnt[0]) * ru * n * 4);
        }
    }
    if core_id() == 0 {
        region "combine" {
            for q in 0..np {
                start copy(parts[q * BATCH +: BATCH, :], pv[q], s);
            }
            for q in 0..np {
                wait copy(parts[q * BATCH +: BATCH, :], pv[q], s);
            }
            psum(pv, 0, pp, lg, pp, BATCH, n);
            start copy(pv[0], y, s);
            wait copy(pv[0], y, s);
        }
    }
}

// ------------------------------------------------------------------- row-wise

// h <- embed[tokens] (core 0 of each chip).
fn op_embed(tokens: hbm i32[BATCH], embed: hbm bf16[VOCAB, DIM], h: hbm f32[BATCH, DIM]) {
    smem tok: i32[BATCH];
    vmem e: bf16[BATCH, DIM];
    vmem hv: f32[BATCH, DIM];
    sem s;
    if core_id() == 0 {
        start copy(tokens, tok, s);
        wait copy(tokens, tok, s);
        for b in 0..BATCH {
            start copy(embed[tok[b]], e[b:b + 1, :], s);
        }
        for b in 0..BATCH {
            wait copy(embed[tok[b]], e[b:b + 1, :], s);
        }
        hv = f32(e);
        start copy(hv, h, s);
        wait copy(hv, h, s);
    }
}

// y = rmsnorm(x, w) over rows of length n (core 0 of each chip).
fn op_norm(x: hbm f32[BATCH, n], w: hbm bf16[n], y: hbm f32[BATCH, n], n: i32) {
    vmem xv: f32[BATCH, n];
    vmem wv: bf16[1, n];
    sem s;
    region "norm" {
        if core_id() == 0 {
            start copy(x, xv, s);
            start copy(w, wv, s);
            wait copy(x, xv, s);
            wait copy(w, wv, s);
            rmsnorm(xv, wv, xv, n);
            start copy(xv, y, s);
            wait copy(xv, y, s);
        }
    }
}

// h <- h + a; dbg <- a (core 0 of each chip).
fn op_residual(h: hbm f32[BATCH, DIM], a: hbm f32[BATCH, DIM], dbg: hbm f32[BATCH, DIM]) {
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

// ------------------------------------------------------------------------ MoE

// Start (mode 0) or wait for (mode 1) the fetch of expert g's weights: w1 | w3 side by side
// into v13, w2 into v2 (gated_ffn's layout). n experts per array.
fn ffn_weights(mode: i32, w1: hbm bf16[n, LATENT, EINTER], w3: hbm bf16[n, LATENT, EINTER],
               w2: hbm bf16[n, EINTER, LATENT], n: i32, g: i32, v13: vmem bf16[LATENT, 2 * EINTER],
               v2: vmem bf16[EINTER, LATENT], s: sem) {
    if mode == 0 {
        start copy(w1[g], v13[:, 0:EINTER], s);
        start copy(w3[g], v13[:, EINTER:2 * EINTER], s);
        start copy(w2[g], v2, s);
    } else {
        wait copy(w1[g], v13[:, 0:EINTER], s);
        wait copy(w3[g], v13[:, EINTER:2 * EINTER], s);
        wait copy(w2[g], v2, s);
    }
}
