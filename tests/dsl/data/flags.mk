// Booleans and select: a compile-time flag picks values and code, a runtime flag picks
// scalars. out[:, block j] = a[:, block j] * f, f = 2 (3 for the last block), negated
// for odd blocks when the launch says so.
param N = 1024;
param SPLIT = 1 in {0, 1} "1: stream the rows in two blocks";
const HALVES = SPLIT == 1;                  // a bool const
const TN = select(HALVES, N / 2, N);        // picked at compile time

fn scale(x: vmem f32[8, TN], neg: bool, k: i32) {
    let f = select(neg, 0 - k, k);          // picked at run time, no branch
    x = x * f32(f);
}

kernel flags(a: hbm f32[8, N], out: hbm f32[8, N], negate_odd: bool) {
    vmem xa: f32[8, TN];
    sem s;
    var last: bool = false;
    for j in 0..N / TN {
        last = j == N / TN - 1;
        start copy(a[:, j * TN +: TN], xa, s);
        wait copy(a[:, j * TN +: TN], xa, s);
        scale(xa, negate_odd && j % 2 == 1, select(last, 3, 2));
        start copy(xa, out[:, j * TN +: TN], s);
        wait copy(xa, out[:, j * TN +: TN], s);
    }
    assert !HALVES || TN * 2 == N, "two halves make N";
}

host {
    input a: f32[8, N];
    output out: f32[8, N];
    launch flags(a, out, true);
}
