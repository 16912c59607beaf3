// Counted waits: `wait n * copy(...)` takes n times the copy's bytes off its semaphore,
// so no byte count is worked out by hand. y = 2 * x[idx[r]] for the first `count`
// rows r (a run-time count), then every chip's rows pushed into slot `chip` of
// `all` on every chip, the receives counted in one wait.
param N = 512;
param R = 8;
param CHIPS = 2;

kernel gather_rows(x: hbm f32[64, N], idx: hbm i32[R + 1], y: hbm f32[CHIPS * R, N]) {
    smem ix: i32[R + 1];
    vmem rows: f32[R, N];
    vmem all: f32[CHIPS][R, N];
    sem s;
    sem sent;
    sem got;
    let me = chip_id();
    start copy(idx, ix, s);
    wait copy(idx, ix, s);
    let count = ix[R];
    rows = 0.0;
    for r in 0..count {
        start copy(x[ix[r]], rows[r:r + 1, :], s);
    }
    wait count * copy(x[0], rows[0:1, :], s);       // `count` rows of N floats
    rows = rows * 2.0;
    all[me] = rows;
    for c in 1..CHIPS {
        start copy(rows, all[me] @ global_core((me + c) % CHIPS, core_id()), sent, got);
    }
    wait (CHIPS - 1) * copy(rows, all[me] @ 0, sent, got);        // our sends left
    wait recv (CHIPS - 1) * copy(rows, all[me] @ 0, sent, got);   // the others' arrived
    for c in 0..CHIPS {
        start copy(all[c], y[c * R +: R, :], s);
    }
    wait(s, CHIPS * bytes(all[0]));                             // bytes(view): what a DMA of it counts
}
