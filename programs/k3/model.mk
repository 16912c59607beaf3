// The Kimi-K3 decode maths, shared by the three K3 programs (per-op, super-op, megakernel).
//
// Every fn here is the contract of docs/k3.md written in .mk: one f32 operation per
// rounding point, in the reference's order (programs/k3/reference.py); bf16 only where
// a value enters the matrix unit or the MLA cache. The fns work on VMEM buffers only;
// how the data gets there (prefetch, per-op HBM round trips) and how it is shared
// between cores (programs/k3/shard.mk) is the business of each program.
//
// Batch rows are independent; every tile has BATCH rows unless it is per row. With SPEC = 1
// (speculative decoding's verify step) the BATCH rows are instead the consecutive
// positions pos .. pos + BATCH - 1 of ONE sequence (an anchor and BATCH - 1 drafts),
// causal among themselves: row-wise operators still treat them as independent rows, but
// KDA's conv history and state advance row by row and MLA row r attends positions
// <= pos + r (docs/k3_programs.md, "Speculative decoding").

// ------------------------------------------------------------- model shape (k3-mini)
param DIM = 512;
param NLAYERS = 8;
param NKDA = 6;               // KDA layers (every layer but the MLA ones)
param NMLA = 2;               // gated-MLA layers
param HEADS = 4;              // heads of 128 (KDA and MLA)
param QRANK = 256;
param KVRANK = 256;
param DENSE_INTER = 1024;
param NEXP = 32;
param TOPK = 4;
param NSHARED = 2;
param LATENT = 256;
param EINTER = 256;
param VOCAB = 4096;
param MAXSEQ = 32;
param BATCH = 1;
// 1: the BATCH rows are one sequence's verify rows (set by the driver from --spec-rows).
param SPEC = 0;
// ------------------------------------------------------------------- machine shape
param NCORES = 16;            // cores in the mesh (chips x cores per chip)
param CORES_PER_CHIP = 2;

// ------------------------------------------------------------------- expert storage
// The routed experts' storage dtype (moe_w1, moe_w3, moe_w2), set by the driver from the
// model's `expert_dtype`: bf16, or MXFP4 (4.25 bits a weight, docs/numerics.md; the
// original K3 checkpoint's format), which the matrix unit decodes as it loads a tile
// (mxu.ldw.mx). The shared experts and every other weight stay bf16.
param EXPERT_MX = 0 in {0, 1} "routed experts stored as 0: bf16, 1: MXFP4 (set by the driver from expert_dtype)";
const ET = select(EXPERT_MX == 1, mxfp4, bf16);
const EBYTES32 = select(EXPERT_MX == 1, 17, 64);     // bytes of 32 routed-expert weights
assert EXPERT_MX == 0 || LATENT % 32 == 0 && EINTER % 32 == 0,
    "MXFP4 experts need LATENT and EINTER multiples of 32 (a scale block runs along K)";

const HD = 128;               // head dim = one KDA state tile = one column block
const W = HEADS * HD;         // attention width
const CONVK = 4;              // short-conv kernel
const NMOE = NLAYERS - 1;     // every layer but layer 0 is MoE
const NDENSE = 1;             // the dense FFN layer (layer 0)
const EPAD = (NEXP + 127) / 128 * 128;   // router logits, padded to whole blocks
const NROWS_EO = (TOPK + NSHARED) * BATCH;
const SPECR = SPEC == 1;
const NSEQ = select(SPECR, 1, BATCH);   // sequences (MLA caches): one when the rows are verify rows

assert DIM % 128 == 0 && QRANK % 128 == 0 && KVRANK % 128 == 0, "dims must be whole 128-column blocks";
assert DENSE_INTER % 128 == 0 && LATENT % 128 == 0 && EINTER % 128 == 0 && VOCAB % 128 == 0,
    "dims must be whole 128-column blocks";
assert NEXP <= 128 || NEXP % 128 == 0, "NEXP must be at most 128 or a multiple of 128";
assert HEADS <= 128, "the beta projection is one 128-column block: at most 128 heads";
assert NKDA + NMLA == NLAYERS, "every layer is KDA or MLA";
assert BATCH >= 1 && BATCH <= 8, "BATCH is 1..8 (one vreg of rows)";
assert SPEC == 0 || SPEC == 1, "SPEC is 0 (independent rows) or 1 (verify rows of one sequence)";
assert NSHARED >= 1, "the programs assume at least one shared expert";
assert NCORES >= 1 && NCORES % CORES_PER_CHIP == 0, "NCORES = chips x CORES_PER_CHIP";

// ------------------------------------------------------------------------ norms

// y = (x * rsqrt(tsum(x*x) / n + eps)) * w over each of r rows of length n (docs/k3.md RMSNorm).
fn rmsnorm_rows(x: vmem f32[r, n], w: vmem bf16[1, n], y: vmem f32[r, n], n: i32, r: i32) {
    let ss = sum(x * x, axis=1);
    y = (x * rsqrt(ss / n + 1e-5)) * f32(w);
}

fn rmsnorm(x: vmem f32[BATCH, n], w: vmem bf16[1, n], y: vmem f32[BATCH, n], n: i32) {
    rmsnorm_rows(x, w, y, n, BATCH);
}

// --------------------------------------------------------------------------- KDA

// The KDA fns below work on r rows (sequences) of one head at a time.

// Short causal conv (kernel 4) of one head's 128 channels: ((w0*s0 + w1*s1) + w2*s2) + w3*u.
// hist rows s*r + b hold s0, s1, s2 (oldest first); they become (s1, s2, u).
fn conv4(u: vmem f32[r, 128], hist: vmem f32[3 * r, 128], cw: vmem bf16[4, 128],
         y: vmem f32[r, 128], r: i32) {
    y = f32(cw[0:1, :]) * hist[0:r, :];
    y = y + f32(cw[1:2, :]) * hist[r:2 * r, :];
    y = y + f32(cw[2:3, :]) * hist[2 * r:3 * r, :];
    y = y + f32(cw[3:4, :]) * u;
    hist[0:r, :] = hist[r:2 * r, :];
    hist[r:2 * r, :] = hist[2 * r:3 * r, :];
    hist[2 * r:3 * r, :] = u;
}

// The conv of r consecutive positions of one sequence (verify rows): ext rows 0..2 hold
// the history s0, s1, s2 (oldest first), rows 3.. the r inputs, so row i's taps are
// ext[i .. i+3] and its output ((w0*ext[i] + w1*ext[i+1]) + w2*ext[i+2]) + w3*ext[i+3]:
// conv4's operations, with row i's history made of the rows before it. The history
// after row i is ext[i+1 .. i+3].
fn conv4_seq(ext: vmem f32[3 + r, 128], cw: vmem bf16[4, 128], y: vmem f32[r, 128], r: i32) {
    y = f32(cw[0:1, :]) * ext[0:r, :];
    y = y + f32(cw[1:2, :]) * ext[1:r + 1, :];
    y = y + f32(cw[2:3, :]) * ext[2:r + 2, :];
    y = y + f32(cw[3:4, :]) * ext[3:r + 3, :];
}

// After the conv, in place: q = l2norm(silu(q)) * 128^-0.5, k = l2norm(silu(k)), v = silu(v).
fn kda_qkv_act(q: vmem f32[r, 128], k: vmem f32[r, 128], v: vmem f32[r, 128], r: i32) {
    q = silu(q);
    q = (q * rsqrt(sum(q * q, axis=1) + 1e-6)) * 0.08838834764831845;
    k = silu(k);
    k = k * rsqrt(sum(k * k, axis=1) + 1e-6);
    v = silu(v);
}

// Decay logits of one head: g = -5 * sigmoid(exp(A_log) * (graw + dt_bias)). ad rows: A_log, dt_bias.
fn kda_decay(g: vmem f32[r, 128], ad: vmem bf16[2, 128], r: i32) {
    let t = g + f32(ad[1:2, :]);
    g = -5.0 * sigmoid(exp(f32(ad[0:1, :])) * t);
}

// One row of one head: S <- S * exp(g)[:, None]; kS = tsum_K(k * S); S <- S + k (beta (v - kS));
// o = tsum_K(q * S). S is [K, V] float32; beta = brow[hh] (brow already sigmoided). The state
// before the row is read from S0 and the state after it left in S: the same buffer to update
// in place; verify rows keep every row's state, so they pass the row before's state as S0
// (docs/k3_programs.md, "Speculative decoding"). Three passes over the state: S0 * exp(g) is
// formed twice, with the same bits both times.
fn kda_update(S0: vmem f32[128, 128], S: vmem f32[128, 128], q: vmem f32[1, 128], k: vmem f32[1, 128],
              v: vmem f32[1, 128], g: vmem f32[1, 128], brow: vmem f32[1, 128], hh: i32, o: vmem f32[1, 128]) {
    vmem kc: f32[128, 1];
    vmem eg: f32[128, 1];
    vmem d: f32[1, 128];
    let beta = max(where(iota(1, 128) == hh, brow, -inf), axis=1);
    kc = transpose(k);
    eg = transpose(exp(g));
    d = beta * (v - sum(kc * (S0 * eg), axis=0));
    S = S0 * eg + kc * d;
    o = sum(transpose(q) * S, axis=0);
}

// Output of one head: rmsnorm(o, onorm) * sigmoid(ograw), into out.
fn kda_out(o: vmem f32[r, 128], onorm: vmem bf16[1, 128], ograw: vmem f32[r, 128],
           out: vmem f32[r, 128], r: i32) {
    rmsnorm_rows(o, onorm, o, 128, r);
    out = o * sigmoid(ograw);
}

// --------------------------------------------------------------------------- MLA

// Attention probabilities of one sequence (absorbed, NoPE), for the n heads in the rows of
// qt: softmax over positions 0..pos of (qt . cache^T) * 128^-0.5, the sequence's cache
// [MAXSEQ, KVRANK] (rows are heads and independent, as in the reference's per-sequence
// matmul). Positions after pos are set to -inf after the scaling, so they get exactly +0.
// Verify rows (SPEC): row i of qt is head i / BATCH at position pos + i % BATCH, which sees
// positions up to its own.
fn mla_probs<n>(qt: vmem bf16[n, KVRANK], cache: vmem bf16[MAXSEQ, KVRANK], pos: i32, p: vmem f32[n, MAXSEQ]) {
    p = matmul(qt, transpose(cache)) * 0.08838834764831845;
    if SPECR {
        for t in 0..n / BATCH {
            p[t * BATCH +: BATCH, :] = where(iota(1, MAXSEQ) > iota(0, BATCH) + pos, -inf, p[t * BATCH +: BATCH, :]);
        }
    } else {
        p = where(iota(1, MAXSEQ) > pos, -inf, p);
    }
    p = exp(p - max(p, axis=1));
    p = p / sum(p, axis=1);
}

// --------------------------------------------------------------------------- MoE

// Sigmoid router: top-k of sigmoid(logits) + bias by repeated argmax (lowest index on
// ties), weights = the chosen sigmoids over their sequential sum.
fn route(logits: vmem f32[BATCH, NEXP], bias: vmem bf16[1, NEXP], topi: vmem i32[BATCH, TOPK],
         topw: vmem f32[BATCH, TOPK]) {
    vmem s: f32[BATCH, NEXP];
    vmem sel: f32[BATCH, NEXP];
    vmem ch: f32[BATCH, TOPK];
    vmem den: f32[BATCH, 1];
    s = sigmoid(logits);
    sel = s + f32(bias);
    for j in 0..TOPK {
        let m = argmax(sel, axis=1);
        topi[:, j:j + 1] = m;
        ch[:, j:j + 1] = max(where(iota(1, NEXP) == m, s, -inf), axis=1);
        sel = where(iota(1, NEXP) == m, -inf, sel);
    }
    den = ch[:, 0:1];
    for j in 1..TOPK {
        den = den + ch[:, j:j + 1];
    }
    topw = ch / den;
}
