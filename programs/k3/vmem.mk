// The VMEM map of the megakernel and the super-operators, computed at compile time: the
// working sets (their structs, measured with vmem_bytes, laid out as the back end lays
// them out), the megakernel's own buffers, and the weight ring sized to what is left of
// VMEM_BUDGET. The published Muse Spark megakernel keeps its explicit VMEM under 53 of
// 64 MiB (a 12 x 2 MiB dense-weight ring); the rest of a core's VMEM is left to fn locals
// and the compiler's temporaries, and the back end checks the whole against the profile.
import "attention.mk";
import "ffn.mk";
import "moe_ep.mk";

param VMEM_BUDGET = 55574528 "bytes of explicit VMEM per core (the published megakernel: under 53 of 64 MiB)";

// The megakernel's own: h, x, xb, the embedding rows, the attention and FFN norms.
const ROWB = select(BATCH > 1, (BATCH + 7) / 8 * 8, 1) * DIM;
const MAP_KERNEL = ROWB * (4 + 4 + 2 + 2) + 2 * (NLAYERS + 7) / 8 * 8 * DIM * 2;
const MAP_FIXED = vmem_bytes(AttnBufs) + vmem_bytes(FfnBufs) + vmem_bytes(Coll) + vmem_bytes(EpBufs) + MAP_KERNEL;
// The weight ring takes what is left: WR_MAX slots at most, 4 at least (2 per half, to overlap).
// (MXFP4 experts: each slot comes with an expert slot, SLOT_X, stream.mk.)
const NWR = max(4, min(WR_MAX, (VMEM_BUDGET - MAP_FIXED) / (SLOT_WR + SLOT_X)));
assert MAP_FIXED + NWR * (SLOT_WR + SLOT_X) <= VMEM_BUDGET,
    "the K3 VMEM map does not fit VMEM_BUDGET even with a 4-slot weight ring (mkemu asm --stats lists the buffers)";
