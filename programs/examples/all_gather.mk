// All-gather: every core of every chip brings x[core] (a [ROWS, COLS] f32 array) and
// ends with the arrays of all participants, participant p = core * num_chips() + chip
// at rows [p*ROWS, (p+1)*ROWS), composed from rings over the mesh axes X, Y, Z and then
// the chip's cores (lib/collectives.mk). The output has room for MAX_PARTS
// participants; rows past the last one stay zero.
//
//   mkemu run programs/examples/all_gather.mk --mesh 2x2x2
//   mkemu run programs/examples/all_gather.mk --mesh 4x2x2 --set DIRS=1
import "../lib/collectives.mk";
reference "all_gather_ref.py:reference";

param CORES = 2;          // cores per chip of the hardware profile
param ROWS = 16;          // rows per participant
param COLS = 256;
param BLOCK = 8 in {8, 16} "rows per DMA";
param DIRS = 2 in {1, 2} "1: rings, 2: bidirectional rings";
const MAX_PARTS = 32;     // all_gather_ref.py sizes the output the same way
assert ROWS % BLOCK == 0, "ROWS must be a multiple of BLOCK";

kernel all_gather_example(x: hbm f32[CORES, ROWS, COLS], out: hbm f32[CORES, MAX_PARTS * ROWS, COLS]) {
    vmem buf: f32[MAX_PARTS * ROWS, COLS];
    sem s;
    expect_mesh(CORES, MAX_PARTS);
    let parts = num_chips() * num_cores();
    let p = core_id() * num_chips() + chip_id();
    start copy(x[core_id()], buf[p * ROWS +: ROWS, :], s);
    wait copy(x[core_id()], buf[p * ROWS +: ROWS, :], s);
    all_gather(buf, MAX_PARTS * ROWS, COLS, BLOCK, DIRS, parts * (ROWS / BLOCK));
    start copy(buf, out[core_id()], s);
    wait copy(buf, out[core_id()], s);
}

host {
    input x: f32[CORES, ROWS, COLS];
    output out: f32[CORES, MAX_PARTS * ROWS, COLS];
    launch all_gather_example(x, out);
}
