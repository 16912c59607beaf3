// All-to-all with per-destination sizes known only at run time, as in MoE dispatch
// and combine (lib/collectives.mk). Participant p = core * num_chips() + chip holds
// rows for every participant d at rows [d*CAP, (d+1)*CAP) of x[core] and a count
// table: it sends the first cnt[d] of them to d (dispatch), d scales what it got by
// d + 1 (the "expert"), and sends the rows back (combine). Buffers have room for
// MAX_PARTS participants.
//
//   mkemu run programs/examples/all_to_all.mk --mesh 2x2x2
//   mkemu run programs/examples/all_to_all.mk --mesh 4x2x2 --set CAP=16
import "../lib/collectives.mk";
reference "all_to_all_ref.py:reference";

param CORES = 2;          // cores per chip of the hardware profile
param CAP = 8;            // rows per (source, destination) pair: the expert capacity
param COLS = 128;
const MAX_PARTS = 32;     // all_to_all_ref.py reads it from the shapes

kernel moe_all_to_all(x: hbm f32[CORES, MAX_PARTS * CAP, COLS], counts: hbm i32[CORES, MAX_PARTS],
                      y: hbm f32[CORES, MAX_PARTS * CAP, COLS], rcounts: hbm i32[CORES, MAX_PARTS],
                      back: hbm f32[CORES, MAX_PARTS * CAP, COLS]) {
    vmem xv: f32[MAX_PARTS * CAP, COLS];
    vmem yv: f32[MAX_PARTS * CAP, COLS];
    vmem bv: f32[MAX_PARTS * CAP, COLS];
    smem raw: i32[MAX_PARTS];
    smem cnt: i32[MAX_PARTS];       // rows we send to each participant
    smem rcnt: i32[MAX_PARTS];      // rows each participant sent us
    smem bcnt: i32[MAX_PARTS];      // rows each participant sent back (= cnt)
    sem s;
    expect_mesh(CORES, MAX_PARTS);
    let parts = num_chips() * num_cores();
    let me = core_id() * num_chips() + chip_id();
    start copy(x[core_id()], xv, s);
    start copy(counts[core_id()], raw, s);
    wait copy(x[core_id()], xv, s);
    wait copy(counts[core_id()], raw, s);
    // Any i32 becomes a count in 0..CAP: raw mod (CAP + 1), rounded toward -inf.
    for d in 0..MAX_PARTS {
        cnt[d] = 0;
        rcnt[d] = 0;
        if d < parts {
            cnt[d] = (raw[d] % (CAP + 1) + CAP + 1) % (CAP + 1);
        }
    }
    all_to_all(xv, yv, cnt, rcnt, MAX_PARTS, CAP, COLS);        // dispatch
    start copy(yv, y[core_id()], s);
    start copy(rcnt, rcounts[core_id()], s);
    wait copy(yv, y[core_id()], s);
    wait copy(rcnt, rcounts[core_id()], s);
    yv = yv * f32(me + 1);                                      // the expert
    all_to_all(yv, bv, rcnt, bcnt, MAX_PARTS, CAP, COLS);       // combine
    start copy(bv, back[core_id()], s);
    wait copy(bv, back[core_id()], s);
}

host {
    input x: f32[CORES, MAX_PARTS * CAP, COLS];
    input counts: i32[CORES, MAX_PARTS];
    output y: f32[CORES, MAX_PARTS * CAP, COLS];
    output rcounts: i32[CORES, MAX_PARTS];
    output back: f32[CORES, MAX_PARTS * CAP, COLS];
    launch moe_all_to_all(x, counts, y, rcounts, back);
}
