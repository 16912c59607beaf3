// Weight streaming of the megakernel and the super-operators: bounded VMEM rings that
// every weight tile goes through, and the compile-time VMEM map that sizes them.
//
// No layer's weights are held whole: every projection streams this core's column blocks
// [K, 128] (the whole K, so each output column is one dot product in increasing k and the
// bits are the unsplit product's) through the weight ring `wr`, a pipeline per weight
// stream (programs/k3/attention.mk, ffn.mk). A stream is run in two parts: its first
// tiles are prefetched (`part prefetch`) as soon as the ring is free, e.g. the next
// layer's attention tiles while this layer's MoE finishes, and the rest streams where
// the tiles are used (`part primed`). The published Muse Spark megakernel keeps a 12 x 2
// MiB dense-weight ring and issues its expert slots right after routing; this ring has
// up to 12 slots of [RK, 128] bf16 (k3-full: 1.75 MiB each), as many as the VMEM budget
// leaves room for.
//
// Other tiles have their own small rings: a head's 128 rows of wo [128, DIM] (`hr`), one
// sequence's MLA cache [MAXSEQ, KVRANK] (`cr`), a column block of the dense FFN's w2,
// whose K is the dense hidden size (`dr`, layer 0 only).
import "model.mk";
import "shard.mk";

// The explicit VMEM a K3 program may take per core. The published megakernel keeps its
// explicit VMEM under 53 of 64 MiB, the rest for the compiler's temporaries.
param VMEM_BUDGET = 55574528 "bytes of VMEM per core the K3 programs' buffers may take (the published megakernel: under 53 of 64 MiB)";
param WR_MAX = 12 in {2, 3, 4, 6, 8, 12} "most slots of the weight ring (the published ring: 12)";

const RK = max(max(DIM, QRANK), max(LATENT, EINTER));     // rows of a weight-ring slot: the largest K
// Bytes of a VMEM slot of R rows x C columns of E-byte elements (the back end's layout:
// rows rounded up to 8 when R > 1, columns to 128, the slot to 512 bytes).
const SLOT_WR = RK * 256;
const SLOT_HR = 128 * DIM * 2;
const SLOT_CR = (MAXSEQ + 7) / 8 * 8 * KVRANK * 2;
const SLOT_DR = DENSE_INTER * 256;
const ROWS = select(BATCH > 1, 8, 1);                     // an activation's rows, laid out
// The rest of the explicit VMEM map, per core (the largest buffers; docs/k3_programs.md):
// the two KDA state and conv-history slot sets of the local tasks, the MLA heads'
// absorbed weights, the all-reduce parts, the gathered activations and the logits.
const MAP_STATE = 2 * NTL * (RB * HD * HD * 4 + (9 * RB + 7) / 8 * 8 * HD * 4);
const MAP_MLA = 2 * NHL * 2 * HD * KVRANK * 2;
const MAP_ACT = ROWS * 4 * (8 * DIM + 2 * (QRANK + KVRANK) + 2 * (EPAD + LATENT) + DENSE_INTER + VOCAB
                            + 4 * NHL * HD + 8 * LATENT);
const MAP_FIXED = 2 * SLOT_HR + 2 * SLOT_CR + SLOT_DR + MAP_STATE + MAP_MLA + MAP_ACT;
// The weight ring takes what is left, WR_MAX slots at most (and at least 2, to overlap).
const NWR = max(2, min(WR_MAX, (VMEM_BUDGET - MAP_FIXED) / SLOT_WR));
const MAP_TOTAL = MAP_FIXED + NWR * SLOT_WR;
assert MAP_TOTAL <= VMEM_BUDGET,
    "the K3 VMEM map does not fit VMEM_BUDGET even with a 2-slot weight ring (see MAP_* in programs/k3/stream.mk)";

// The rings of one kernel (`let r = Rings();`): slots and a semaphore per slot.
struct Rings {
    wr: vmem bf16[NWR][RK, 128];
    wrs: sem[NWR];
    hr: vmem bf16[2][HD, DIM];
    hrs: sem[2];
    cr: vmem bf16[2][MAXSEQ, KVRANK];
    crs: sem[2];
    dr: vmem bf16[1][DENSE_INTER, 128];
    drs: sem[1];
}

// Start (mode prefetch) or wait for (mode primed) a copy of any dtype and shape: a fetch
// written once serves its start and its wait, which therefore always match.
fn cp<T, R, C>(mode: i32, src: hbm T[R, C], dst: vmem T[R, C], s: sem) {
    if mode == prefetch { start copy(src, dst, s); } else { wait copy(src, dst, s); }
}

fn cp1<T, C>(mode: i32, src: hbm T[C], dst: vmem T[1, C], s: sem) {
    if mode == prefetch { start copy(src, dst, s); } else { wait copy(src, dst, s); }
}
