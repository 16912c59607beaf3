// Sharding of the K3 programs: which core computes which column blocks of each
// projection, and whether a projection is split or replicated.
//
// Ownership: the nb column blocks of a matrix are dealt round-robin over the cores:
// block j lives on core j % NCORES (me = global core id), so a core's blocks are
// j = me, me + NCORES, ...; its t-th block sits at columns t*128 of its weight buffer,
// and one matmul gives all of its blocks at once (columns t*128 of `src`). Head h's
// columns of every per-head projection are block h, so they all live on core h % NCORES.
//
// Replication: a projection whose weight (per layer) is at most REPL_BYTES is instead
// computed whole by every core that needs its output (same inputs, same k order: the
// same bits), which saves an all-gather (a collective phase costs ~2-3 us, streaming
// REPL_BYTES at 3 TB/s ~0.7 us, hidden by the prefetch). REPL_BYTES=0 splits everything.
import "model.mk";
import "gather.mk";

// How the MoE is spread over the cores (docs/k3_programs.md, "Schemes"):
//   0  tensor parallel, the published scheme: routing on every core, each chosen expert
//      computed where it is cheapest, the MoE all-reduce of the parts (allreduce.mk);
//   1  expert parallel: expert e lives on core e % NCORES; each batch row's home core
//      routes it, dispatches it to its experts' owners and combines what comes back
//      (all-to-all dispatch and combine), then the rows are all-gathered.
// The attention is tensor parallel (heads over cores, the all-reduce) in both. Both give
// the same bits (the parts and their order are the contract's).
param SCHEME = 0 in {0, 1} "how the MoE is spread: 0 tensor parallel (all-reduces), 1 expert parallel (all-to-all)";

// Projections whose weight is at most REPL_BYTES are replicated (see the top of this file).
param REPL_BYTES = 2097152 in {0, 131072, 262144, 524288, 1048576, 2097152, 4194304, 8388608} "bytes up to which a projection is computed whole by every core instead of split + gathered";
// The LM head is computed whole on core 0 (the only core that needs the logits: it
// writes them) when it is at most this big, else split over all cores and gathered.
param LM_ROOT_BYTES = 8388608 in {0, 1048576, 8388608, 67108864} "bytes up to which the LM head is computed whole on core 0 instead of split + gathered";

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
const LM_ROOT = i32(DIM * VOCAB * 2 <= LM_ROOT_BYTES);
// KDA tasks (megakernel): the BATCH rows of a head are split into RG groups of RB rows
// when there are idle cores (RG = the largest divisor of BATCH that is at most
// NCORES / HEADS; KDA_ROW_SPLIT = 0 keeps RG = 1). Task (g, h), number g*HEADS + h,
// runs head h for rows g*RB .. g*RB + RB - 1 on core (g*HEADS + h) % NCORES: every
// operator after the projections is row-wise, so the rows are independent.
param KDA_ROW_SPLIT = 1 in {0, 1} "1: split a KDA head's batch rows over idle cores, 0: keep them together";
const RGCAP = KDA_ROW_SPLIT * max(1, NCORES / HEADS) + (1 - KDA_ROW_SPLIT);
const RG = max(max(max(1, 2 * i32(BATCH % 2 == 0 && 2 <= RGCAP)),
                   max(3 * i32(BATCH % 3 == 0 && 3 <= RGCAP), 4 * i32(BATCH % 4 == 0 && 4 <= RGCAP))),
               max(max(5 * i32(BATCH % 5 == 0 && 5 <= RGCAP), 6 * i32(BATCH % 6 == 0 && 6 <= RGCAP)),
                   max(7 * i32(BATCH % 7 == 0 && 7 <= RGCAP), 8 * i32(BATCH % 8 == 0 && 8 <= RGCAP))));
const RB = BATCH / RG;
const NKT = HEADS * RG;
const NTL = (NKT + NCORES - 1) / NCORES;
const NVC = LM_ROOT * NVB + (1 - LM_ROOT) * NVL;
// Shared experts a core holds: tensor parallel, shared expert s on core (SOFF + s) % NCORES;
// expert parallel, every home (cores 0 .. NHOME-1, one per batch row up to NCORES) all of them.
const NHOME = min(BATCH, NCORES);
const NSL = SCHEME * NSHARED + (1 - SCHEME) * ((NSHARED + NCORES - 1) / NCORES);
// Expert-parallel capacities (both programs). A home's TOPK experts of one row are
// distinct but may share an owner, so in the worst case every slot of every row of a home
// goes to one owner: EP_CAP slots per (home, owner) pair never overflow, and every count
// lies in 0 .. EP_CAP.
const EP_RH = (BATCH + NCORES - 1) / NCORES;    // rows a home has, at most
const EP_CAP = EP_RH * TOPK;                    // rows one home can send one owner
const EP_NDE = min((NEXP + NCORES - 1) / NCORES, BATCH * TOPK);   // distinct experts per owner
const EP_TAGR = TOPK * BATCH;                   // tag = expert * EP_TAGR + slot * BATCH + row
const EP_ROW = LATENT * 4;                      // bytes of one dispatched or returned row
const NEL = (min(BATCH * TOPK, NEXP) + NCORES - 1) / NCORES;   // distinct routed experts
// Which projections are replicated (1) or column-split (0), and the blocks a core holds.
const REP_LAT = i32(DIM * (QRANK + KVRANK) * 2 <= REPL_BYTES);
const REP_RD = i32(DIM * (EPAD + LATENT) * 2 <= REPL_BYTES);
const REP_UP = i32(LATENT * DIM * 2 <= REPL_BYTES);
const REP_D13 = i32(DIM * DENSE_INTER * 2 <= REPL_BYTES);
const REP_D2 = i32(DENSE_INTER * DIM * 2 <= REPL_BYTES);
const NLATC = REP_LAT * NLATB + (1 - REP_LAT) * NLATL;
const NRDC = REP_RD * NRB + (1 - REP_RD) * NRL;
const NUPC = REP_UP * NDB + (1 - REP_UP) * NDL;
const ND13C = REP_D13 * NIB + (1 - REP_D13) * NIL;
const ND2C = REP_D2 * NDB + (1 - REP_D2) * NDL;
// Consumers of a gathered value: cores 0..n-1.
const NHEADC = min(HEADS, NCORES);     // head owners (the MLA latent)
const NDBC = min(NDB, NCORES);         // owners of DIM-wide blocks
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
