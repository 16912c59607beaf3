// Weight streaming of the megakernel and the super-operators: bounded VMEM rings that
// every weight tile goes through, and the compile-time VMEM map that sizes them.
//
// No layer's weights are held whole: every projection streams this core's column blocks
// [K, 128] (the whole K, so each output column is one dot product in increasing k and the
// bits are the unsplit product's) through the weight ring (`Rings`), a pipeline per weight
// stream (programs/k3/attention.mk, ffn.mk). A stream is run in two parts: its first
// tiles are prefetched (`part prefetch`) as soon as the ring is free, e.g. the next
// layer's attention tiles while this layer's MoE finishes, and the rest streams where
// the tiles are used (`part primed`). The published Muse Spark megakernel keeps a 12 x 2
// MiB dense-weight ring and issues its expert slots right after routing; this ring has
// up to 12 slots of [RK, 128] bf16 (k3-full: 1.75 MiB each), as many as the VMEM budget
// leaves room for.
//
// Other tiles have their own small rings, in the attention's and the FFN's working sets:
// a head's 128 rows of wo [128, DIM] (`hr`), one sequence's MLA cache [MAXSEQ, KVRANK]
// (`cr`), a column block of the dense FFN's w2, whose K is the dense hidden size (`dr`,
// layer 0 only).
import "model.mk";
import "shard.mk";

// The weight ring's slots: up to WR_MAX of [RK, 128] bf16, as many as the VMEM map
// (programs/k3/vmem.mk) leaves room for, in two halves that the streams use in turn
// (an attention's x-projection, an expert's w1|w3 and the LM head in w0; the FFN's first
// stream, an expert's w2, moe_up, MLA's wuq in w1): a stream in one half can start while
// the one before it, in the other half, still runs.
param WR_MAX = 12 in {4, 6, 8, 12} "most slots of the weight ring (the published ring: 12)";
const RK = max(max(DIM, QRANK), max(LATENT, EINTER));     // rows of a weight-ring slot: the largest K
const SLOT_WR = RK * 256;                                  // bytes of one slot
// Bytes of one MXFP4 expert slot [RKX, 128] (none with bf16 experts): RKX value rows of 64
// bytes, RKX / 32 scale rows of 128, rounded up to 512.
const SLOT_X = select(EXPERT_MX == 1, (max(LATENT, EINTER) * 68 + 511) / 512 * 512, 0);
const NDR = select(DENSE_INTER * 256 <= 4194304, 2, 1);   // dense w2 slots (k3-full: one of 8.25 MiB)

// A kernel's weight ring (`let r = Rings();`): the slots of each half and a semaphore per slot.
const NW1 = NWR / 2;
const NW0 = NWR - NW1;
//
// MXFP4 routed experts (EXPERT_MX = 1) have their own slots, x0 (w1|w3) and x1 (w2), as
// many as the bf16 ring has, of [RKX, 128] MXFP4 (the VMEM layout of an MXFP4 tile differs
// from bf16's: value rows, then scale rows); the shared experts keep using w0 and w1. With
// bf16 experts x0 and x1 have no slots: absent, so the bf16 layout is the same as without
// them.
const RKX = max(LATENT, EINTER);                           // rows of an expert slot: the largest K
const NXR = select(EXPERT_MX == 1, NWR, 0);
const NX1 = NXR / 2;
const NX0 = NXR - NX1;
struct Rings {
    w0: vmem bf16[NW0][RK, 128];
    s0: sem[NW0];
    w1: vmem bf16[NW1][RK, 128];
    s1: sem[NW1];
    x0: vmem mxfp4[NX0][RKX, 128];
    sx0: sem[NX0];
    x1: vmem mxfp4[NX1][RKX, 128];
    sx1: sem[NX1];
}

// Start (mode prefetch) or wait for (mode primed) a copy of any dtype and shape: a fetch
// written once serves its start and its wait, which therefore always match.
fn cp<T, R, C>(mode: i32, src: hbm T[R, C], dst: vmem T[R, C], s: sem) {
    if mode == prefetch { start copy(src, dst, s); } else { wait copy(src, dst, s); }
}

fn cp1<T, C>(mode: i32, src: hbm T[C], dst: vmem T[1, C], s: sem) {
    if mode == prefetch { start copy(src, dst, s); } else { wait copy(src, dst, s); }
}
