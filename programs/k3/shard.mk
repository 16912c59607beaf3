// Sharding of the K3 programs: which core computes which column blocks of each
// projection, whether a projection is split or replicated, how the experts and the
// attention heads are spread, and which all-reduce form each sum takes.
//
// Ownership: the nb column blocks of a matrix are dealt round-robin over the cores:
// block j lives on core j % NCORES (me = global core id), so a core's blocks are
// j = me, me + NCORES, ...; its t-th block sits at columns t*128 of its buffers. Head
// h's columns of every per-head projection are block h, so they all live on core
// h % NCORES.
//
// Replication: a projection whose weight (per layer) is at most REPL_BYTES is instead
// computed whole by every core that needs its output (same inputs, same k order: the
// same bits), which saves an all-gather (a collective phase costs ~2-3 us, streaming
// REPL_BYTES at 3 TB/s ~0.7 us, hidden by the prefetch). REPL_BYTES=0 splits everything.
import "model.mk";
import "gather.mk";

// How the MoE is spread over the cores (docs/k3_programs.md, "Schemes"):
//   0  tensor parallel, the published scheme: routing on every core, each chosen expert
//      computed by one chip's cores (split by columns), the MoE all-reduce of the parts;
//   1  expert parallel: expert e lives on core e % NCORES; each batch row's home core
//      routes it, dispatches it to its experts' owners and combines what comes back
//      (all-to-all dispatch and combine), then the rows are all-gathered.
// The attention is tensor parallel (heads over cores, the all-reduce) in both. Both give
// the same bits (the parts and their order are the contract's).
param SCHEME = 0 in {0, 1} "how the MoE is spread: 0 tensor parallel (all-reduces), 1 expert parallel (all-to-all)";
const EXPERT_PARALLEL = SCHEME == 1;

// Projections whose weight is at most REPL_BYTES are replicated (see the top of this file).
param REPL_BYTES = 2097152 in {0, 131072, 262144, 524288, 1048576, 2097152, 4194304, 8388608} "bytes up to which a projection is computed whole by every core instead of split + gathered";
// The LM head is computed whole on core 0 (the only core that needs the logits: it
// writes them) when it is at most this big, else split over all cores and gathered.
param LM_ROOT_BYTES = 8388608 in {0, 1048576, 8388608, 67108864} "bytes up to which the LM head is computed whole on core 0 instead of split + gathered";

const NCHIPS = NCORES / CORES_PER_CHIP;

// Column blocks of each sharded matrix (128 columns each, the router's last block narrower).
const NDB = DIM / 128;                 // DIM-wide outputs: wo, moe_up, dense_w2
const NQB = QRANK / 128;
const NLATB = (QRANK + KVRANK) / 128;  // MLA [wdq | wdkv], one gather
const NEB = EPAD / 128;                // router blocks
const EW = min(NEXP, 128);             // width of a router block
const NRB = NEB + LATENT / 128;        // MoE [router | moe_down], one gather
const NIB = DENSE_INTER / 128;
const NVB = VOCAB / 128;
const NLB = LATENT / 128;
const NXB = EINTER / 128;              // an expert's hidden blocks
// Most blocks a core owns (ceil(n / NCORES)).
const NHL = (HEADS + NCORES - 1) / NCORES;
const NDL = (NDB + NCORES - 1) / NCORES;
const NLATL = (NLATB + NCORES - 1) / NCORES;
const NRL = (NRB + NCORES - 1) / NCORES;
const NIL = (NIB + NCORES - 1) / NCORES;
const NVL = (NVB + NCORES - 1) / NCORES;
const NLL = (NLB + NCORES - 1) / NCORES;
const LM_ROOT = DIM * VOCAB * 2 <= LM_ROOT_BYTES;
// KDA tasks: the BATCH rows of a head are split into RG groups of RB rows when there
// are idle cores (RG = the largest divisor of BATCH that is at most NCORES / HEADS;
// KDA_ROW_SPLIT = 0 keeps RG = 1). Task (g, h), number g*HEADS + h, runs head h for rows
// g*RB .. g*RB + RB - 1 on core (g*HEADS + h) % NCORES: every operator after the
// projections is row-wise, so the rows are independent.
// (Not when the KDA projections are sharded per chip, below: a chip holds its heads' columns.)
param KDA_ROW_SPLIT = 1 in {0, 1} "1: split a KDA head's batch rows over idle cores, 0: keep them together";
// Verify rows (SPEC) go through one head's recurrence in order: never split.
const RGCAP = select(KDA_ROW_SPLIT == 1 && !KSH && !SPECR, max(1, NCORES / HEADS), 1);
const RG = max(max(max(1, select(BATCH % 2 == 0 && 2 <= RGCAP, 2, 1)),
                   max(select(BATCH % 3 == 0 && 3 <= RGCAP, 3, 1), select(BATCH % 4 == 0 && 4 <= RGCAP, 4, 1))),
               max(max(select(BATCH % 5 == 0 && 5 <= RGCAP, 5, 1), select(BATCH % 6 == 0 && 6 <= RGCAP, 6, 1)),
                   max(select(BATCH % 7 == 0 && 7 <= RGCAP, 7, 1), select(BATCH % 8 == 0 && 8 <= RGCAP, 8, 1))));
const RB = BATCH / RG;
const NKT = HEADS * RG;
const NTL = (NKT + NCORES - 1) / NCORES;
// Expert-parallel capacities (both programs). A home's TOPK experts of one row are
// distinct but may share an owner, so in the worst case every slot of every row of a home
// goes to one owner: EP_CAP slots per (home, owner) pair never overflow, and every count
// lies in 0 .. EP_CAP.
const NHOME = min(BATCH, NCORES);
const EP_RH = (BATCH + NCORES - 1) / NCORES;    // rows a home has, at most
const EP_CAP = EP_RH * TOPK;                    // rows one home can send one owner
const EP_NDE = min((NEXP + NCORES - 1) / NCORES, BATCH * TOPK);   // distinct experts per owner
const EP_TAGR = TOPK * BATCH;                   // tag = expert * EP_TAGR + slot * BATCH + row
const EP_ROW = LATENT * 4;                      // bytes of one dispatched or returned row
// Which projections are replicated (true) or column-split, and the blocks a core holds.
const REP_LAT = DIM * (QRANK + KVRANK) * 2 <= REPL_BYTES;
const REP_RD = DIM * (EPAD + LATENT) * 2 <= REPL_BYTES;
const REP_UP = LATENT * DIM * 2 <= REPL_BYTES;
const REP_D13 = DIM * DENSE_INTER * 2 <= REPL_BYTES;
const REP_D2 = DENSE_INTER * DIM * 2 <= REPL_BYTES;
const NLATC = select(REP_LAT, NLATB, NLATL);
const ND13C = select(REP_D13, NIB, NIL);
const ND2C = select(REP_D2, NDB, NDL);
// Consumers of a gathered value: cores 0..n-1.
const NHEADC = min(HEADS, NCORES);     // head owners (the MLA latent)
const NDBC = min(NDB, NCORES);         // owners of DIM-wide blocks
const NT_EO = select(REP_UP, NCORES, NDBC);     // expert outputs (combine + moe_up)
const NT_U = select(REP_D2, NCORES, NDBC);      // dense hidden (w2)
const NT_RD = select(EXPERT_PARALLEL, NHOME, NCORES);   // the cores that route

// Experts, tensor parallel: the units of a layer are its shared experts, then its
// distinct routed experts in order of first use; unit u runs on group u % NGROUPS (or,
// with expert homes, a routed expert on its home group: HOMED below) of
// ESPLIT cores (a chip's cores when an expert is bigger than ESPLIT_BYTES, else one
// core), split by columns: core c of the group makes the hidden blocks [c*NXS, ..) and
// the output blocks [c*NOS, ..), contiguous so that each piece moves in one copy, and
// the group's cores exchange their hidden blocks (a copy to the sibling core costs
// ~2.2 us, worth it only when it halves a big expert's streaming). Expert parallel:
// unit = an owner's expert, on the owner alone.
param ESPLIT_BYTES = 8388608 in {0, 1048576, 8388608, 67108864} "bytes of an expert's weights above which it is split by columns over the cores of a chip";
const ESPLIT = select(3 * LATENT * EINTER * 2 > ESPLIT_BYTES, CORES_PER_CHIP, 1);
const NGROUPS = NCORES / ESPLIT;
// (At least one block each, so that a split the assert below refuses is reported by it alone.)
const NXS = max(1, NXB / ESPLIT);
const NOS = max(1, NLB / ESPLIT);
assert NXB % ESPLIT == 0 && NLB % ESPLIT == 0,
    "an expert split over a chip's cores needs EINTER and LATENT blocks that divide evenly (raise ESPLIT_BYTES)";
// Units a group runs in one layer, at most: tensor parallel, the shared experts and the
// distinct routed ones dealt over the groups; expert parallel, an owner's distinct
// experts and, at a home, the shared ones.
// Homed (below), a group runs its shared experts and the distinct experts it is home to.
const NUNITS = select(EXPERT_PARALLEL, EP_NDE + NSHARED,
                      select(HOMED, (NSHARED + NGROUPS - 1) / NGROUPS + min(BATCH * TOPK, EPG),
                             (NSHARED + min(BATCH * TOPK, NEXP) + NGROUPS - 1) / NGROUPS));


// ------------------------------------------------------------------ per-chip HBM homes
//
// Every chip's HBM holds the same arrays, but an array may hold only what that chip's
// cores read (the driver writes each chip its own shard). Two kinds of weight are too big
// to replicate at k3-full (docs/k3_programs.md, "The HBM map"); both use the same local
// numbering: thing x (an expert, a head) lives on core x % NCORES, so on chip
// (x % NCORES) / CORES_PER_CHIP, at the chip's local index
//     x / NCORES * CORES_PER_CHIP + x % CORES_PER_CHIP
// (x's round over the mesh, then its core on the chip).
//
// Expert homes: when the routed experts of all MoE layers are bigger than HOME_BYTES,
// routed expert e lives only on its home chip, the chip of core e % NCORES: moe_w1/w3/w2
// hold EPC experts per layer (row fi*EPC + local index; slots past NEXP are padding).
// Expert parallel, core e % NCORES owns it anyway; tensor parallel, the group of core
// e % NCORES runs it (group (e % NCORES) / ESPLIT, inside the chip). The shared experts
// stay on every chip.
param HOME_BYTES = 17179869184 in {0, 17179869184} "bytes of the routed experts (all layers) above which each lives only on its home chip";
const EXPERT_BYTES = NMOE * NEXP * 3 * LATENT * EINTER / 32 * EBYTES32;
const EPC = (NEXP + NCORES - 1) / NCORES * CORES_PER_CHIP;   // experts a chip is home to, per layer
const HOMED = EXPERT_BYTES > HOME_BYTES && EPC < NEXP;
const NEL = select(HOMED, EPC, NEXP);                        // expert rows per layer in a chip's arrays
// Experts a tensor-parallel group is home to, per layer.
const EPG = (NEXP + NCORES - 1) / NCORES * ESPLIT;

// KDA head shards: when the KDA per-head projections (q, k, v, g, og and wo, all layers)
// are bigger than KDA_SHARD_BYTES, each chip holds only its heads' columns of
// kda_wq/wk/wv/wg/wog and rows of kda_wo: head h at local block h / NCORES * CORES_PER_CHIP
// + h % CORES_PER_CHIP, KSL blocks per layer. A KDA task is then a whole head (RG = 1), so
// task t of core me is head me + t*NCORES at local block t*CORES_PER_CHIP + me % CORES_PER_CHIP.
param KDA_SHARD_BYTES = 17179869184 in {0, 17179869184} "bytes of the KDA heads' projections (all layers) above which each chip holds only its heads' columns";
const KSL = (HEADS + NCORES - 1) / NCORES * CORES_PER_CHIP;
const KSH = NKDA * 6 * DIM * W * 2 > KDA_SHARD_BYTES && KSL < HEADS;
const KWL = select(KSH, KSL, HEADS) * HD;                    // columns of a chip's kda_wq.. (rows of kda_wo)
