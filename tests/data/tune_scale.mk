// y = 2 x, tile by tile: the program of the tuner's tests (tests/test_tune.py and
// tests/test_sweep.py). TN is a real knob: every value that divides N gives the same
// bits at its own speed. SYNC plants the bugs a tuner must never pick, whatever their
// speed: each makes the run fault or its bits wrong.
param N = 2048;
param TN = 512 in {256, 512, 768, 1024} "tile width (768 does not divide N: a compile error)";
param SYNC = 0 in {0, 1, 2, 3} "0 correct; 1 scales before the wait (a race); 2 waits twice (a deadlock); 3 scales by 3 (wrong bits)";
reference "tune_scale_ref.py:reference";
assert N % TN == 0, "TN must divide N";

kernel scale(x: hbm f32[8, N], y: hbm f32[8, N]) {
    vmem xv: f32[8, TN];
    sem s;
    for k in 0..N / TN {
        start copy(x[:, k * TN +: TN], xv, s);
        if SYNC == 1 {
            xv = xv * 2.0;                                  // while the DMA still writes xv
            wait copy(x[:, k * TN +: TN], xv, s);
        } else {
            wait copy(x[:, k * TN +: TN], xv, s);
            if SYNC == 2 {
                wait copy(x[:, k * TN +: TN], xv, s);       // nothing more ever arrives
            }
            if SYNC == 3 {
                xv = xv * 3.0;
            } else {
                xv = xv * 2.0;
            }
        }
        start copy(xv, y[:, k * TN +: TN], s);
        wait copy(xv, y[:, k * TN +: TN], s);
    }
}
