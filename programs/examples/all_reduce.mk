// All-reduce: every core of every chip brings x[core] (its own [ROWS, COLS] f32 array)
// and ends with the sum over all cores of all chips, composed from rings over the
// chip's cores and the mesh axes, each ring bidirectional (lib/collectives.mk).
//
//   mkemu run programs/examples/all_reduce.mk --mesh 2x2x2
//   mkemu run programs/examples/all_reduce.mk --mesh 4x2x2 --set ROWS=256
//
// The sum is bit-exact against all_reduce_ref.py, which repeats the rings' order.
import "../lib/collectives.mk";
reference "all_reduce_ref.py:reference";

param CORES = 2;          // cores per chip of the hardware profile
param ROWS = 128;         // rows per core
param COLS = 256;
const BLOCK = 8;          // rows per DMA: the unit the rings move
const DIRS = 2;           // bidirectional rings (all_reduce_ref.py assumes these two)

kernel all_reduce_example(x: hbm f32[CORES, ROWS, COLS], out: hbm f32[CORES, ROWS, COLS]) {
    vmem buf: f32[ROWS, COLS];
    sem s;
    expect_mesh(CORES, 0);
    start copy(x[core_id()], buf, s);
    wait copy(x[core_id()], buf, s);
    all_reduce(buf, ROWS, COLS, BLOCK, DIRS, ROWS / BLOCK);
    start copy(buf, out[core_id()], s);
    wait copy(buf, out[core_id()], s);
}

host {
    input x: f32[CORES, ROWS, COLS];
    output out: f32[CORES, ROWS, COLS];
    launch all_reduce_example(x, out);
}
