// Sharding helpers of the K3 programs: column-block ownership and the in-kernel
// all-gather (a K3-specific collective; written here because programs/lib/ had no
// usable all-gather when these programs were written).
//
// Ownership: the nb column blocks of a matrix are dealt round-robin over the cores:
// block j lives on core j % NCORES (me = global core id), so a core's blocks are
// j = me, me + NCORES, ...; its t-th block sits at columns t*128 of its weight buffer,
// and one matmul gives all of its blocks at once (columns t*128 of `src`).
//
// Replication: a projection whose weight (per layer) is at most REPL_BYTES is instead
// computed whole by every core that needs its output (same inputs, same k order: the
// same bits), which saves an all-gather (a collective phase costs ~2-3 us, streaming
// REPL_BYTES at 3 TB/s ~0.7 us, hidden by the prefetch).
//
// All-gather protocol (bit-exact by construction: it only moves bytes):
// - every owner DMAs each of its blocks from `src` into the same columns of `site` on
//   every core, itself included (a local DMA), so `site` is written by DMAs only and
//   is read only after the wait below (no vector access overlaps a DMA in flight);
// - all copies into `site` count on `rsem`; a core waits for the whole site:
//   BATCH * ncols * 4 bytes; sends count on `ssend` (the bytes that left this core).
// - a site (and its rsem) is reused only after a barrier separates the two uses (the
//   megakernel rotates sites by layer parity and puts a barrier every second layer).
// Sites consumed by only some cores go to cores 0..nt-1 only (nt = 1: a gather to core 0).
import "model.mk";

param REPL_BYTES = 2097152;

// Column blocks of each sharded matrix (128 columns each, the router's last block narrower).
const NDB = DIM / 128;                 // DIM-wide outputs: wo, moe_up, dense_w2
const NQB = QRANK / 128;
const NLATB = (QRANK + KVRANK) / 128;  // MLA [wdq | wdkv], one gather
const NEB = EPAD / 128;                // router blocks
const EW = min(NEXP, 128);             // width of a router block
const NRB = NEB + LATENT / 128;        // MoE [router | moe_down], one gather
const NIB = DENSE_INTER / 128;
const NVB = VOCAB / 128;
// Most blocks a core owns (ceil(n / NCORES)).
const NHL = (HEADS + NCORES - 1) / NCORES;
const NDL = (NDB + NCORES - 1) / NCORES;
const NLATL = (NLATB + NCORES - 1) / NCORES;
const NRL = (NRB + NCORES - 1) / NCORES;
const NIL = (NIB + NCORES - 1) / NCORES;
const NVL = (NVB + NCORES - 1) / NCORES;
const NSL = (NSHARED + NCORES - 1) / NCORES;
const NEL = (min(BATCH * TOPK, NEXP) + NCORES - 1) / NCORES;   // distinct routed experts
// Which projections are replicated (1) or column-split (0), and the blocks a core holds.
const REP_WO = W * DIM * 2 <= REPL_BYTES;
const REP_LAT = DIM * (QRANK + KVRANK) * 2 <= REPL_BYTES;
const REP_RD = DIM * (EPAD + LATENT) * 2 <= REPL_BYTES;
const REP_UP = LATENT * DIM * 2 <= REPL_BYTES;
const REP_D13 = DIM * DENSE_INTER * 2 <= REPL_BYTES;
const REP_D2 = DENSE_INTER * DIM * 2 <= REPL_BYTES;
const NWOC = REP_WO * NDB + (1 - REP_WO) * NDL;
const NLATC = REP_LAT * NLATB + (1 - REP_LAT) * NLATL;
const NRDC = REP_RD * NRB + (1 - REP_RD) * NRL;
const NUPC = REP_UP * NDB + (1 - REP_UP) * NDL;
const ND13C = REP_D13 * NIB + (1 - REP_D13) * NIL;
const ND2C = REP_D2 * NDB + (1 - REP_D2) * NDL;
// Consumers of a gathered value: cores 0..n-1.
const NHEADC = min(HEADS, NCORES);     // head owners (the MLA latent)
const NDBC = min(NDB, NCORES);         // owners of DIM-wide blocks
const NT_O = REP_WO * NCORES + (1 - REP_WO) * NDBC;     // attention heads' output
const NT_EO = REP_UP * NCORES + (1 - REP_UP) * NDBC;    // expert outputs (combine + moe_up)
const NT_U = REP_D2 * NCORES + (1 - REP_D2) * NDBC;     // dense hidden (w2)
// Shared expert s lives on core (SOFF + s) % NCORES: the last cores, away from the heads.
const SOFF = (NCORES - NSHARED % NCORES) % NCORES;

// Fetch (mode 0) or wait for (mode 1) this core's column blocks of src [k, n] into dst
// (its t-th block at columns t*128), or all of src when rep == 1.
fn fetch_cols(mode: i32, src: hbm bf16[k, n], dst: vmem bf16[k, nl * 128], k: i32, n: i32, nl: i32,
              me: i32, rep: i32, s: sem) {
    if rep == 1 {
        if mode == 0 { start copy(src, dst[:, 0:n], s); } else { wait copy(src, dst[:, 0:n], s); }
    } else {
        for j in me..n / 128 step NCORES {
            let c = (j - me) / NCORES * 128;
            if mode == 0 {
                start copy(src[:, j * 128 +: 128], dst[:, c +: 128], s);
            } else {
                wait copy(src[:, j * 128 +: 128], dst[:, c +: 128], s);
            }
        }
    }
}

// NCORES rounded up to a power of two: c = me ^ k for k in 0..PCORES is a permutation of
// 0..PCORES-1, so it visits every core once (those >= nt are skipped).
const PCORES = 1 << ((NCORES > 1) + (NCORES > 2) + (NCORES > 4) + (NCORES > 8) + (NCORES > 16)
                     + (NCORES > 32) + (NCORES > 64) + (NCORES > 128) + (NCORES > 256));

// Copy src into dst on cores 0..nt-1 (dst on this core by a local DMA, counted on rsem
// like the remote ones). Targets in the order me ^ (PCORES-1), ..., me ^ 0: on a
// power-of-two mesh the farthest chips first (their copies take longest) and this core
// last.
fn push_all(src: vmem f32[r, c], dst: vmem f32[r, c], r: i32, c: i32, me: i32, nt: i32, ssend: sem, rsem: sem) {
    for kk in 0..PCORES {
        let tc = me ^ (PCORES - 1 - kk);
        if tc < nt {
            if tc == me {
                start copy(src, dst, rsem);
            } else {
                start copy(src, dst @ tc, ssend, rsem);
            }
        }
    }
}

// Push this core's blocks of `src` into `site` on cores 0..nt-1.
fn ag_push(src: vmem f32[BATCH, nl * 128], site: vmem f32[BATCH, nb * 128], nl: i32, nb: i32,
           first: i32, me: i32, nt: i32, ssend: sem, rsem: sem) {
    for j in first..nb step NCORES {
        push_all(src[:, (j - first) / NCORES * 128 +: 128], site[:, j * 128 +: 128], BATCH, 128, me, nt,
                 ssend, rsem);
    }
}

// Wait until this core's sends have left and (if it is a consumer) the whole site arrived.
fn ag_finish(nb: i32, first: i32, me: i32, nt: i32, ssend: sem, rsem: sem) {
    let mine = (max(nb - first, 0) + NCORES - 1) / NCORES;
    wait(ssend, mine * (nt - (me < nt)) * BATCH * 512);
    if me < nt {
        wait(rsem, nb * BATCH * 512);
    }
}

// site = x @ w on cores 0..nt-1: replicated (each computes all of it), or split (each
// core its blocks, then an all-gather).
fn proj(x: vmem bf16[BATCH, k], w: vmem bf16[k, nl * 128], src: vmem f32[BATCH, nl * 128],
        site: vmem f32[BATCH, nb * 128], k: i32, nl: i32, nb: i32, me: i32, nt: i32, rep: i32,
        ssend: sem, rsem: sem) {
    if rep == 1 {
        if me < nt {
            site = matmul(x, w);
        }
    } else {
        if me < nb {
            src = matmul(x, w);
        }
        region "allgather" {
            ag_push(src, site, nl, nb, me, me, nt, ssend, rsem);
            ag_finish(nb, me, me, nt, ssend, rsem);
        }
    }
}
