// The pipeline statement: y = x @ W, W streamed in column tiles through 3 slots while
// the previous tiles of y go back to HBM, the tile body written once. Then y2 = 2 x W
// through slots shared with other pipelines (`via`), run in two parts: the first
// tiles prefetched before x has even arrived, the rest after.
param M = 8;
param K = 256;
param N = 1024;
const TN = 128;

// One definition serves both parts: called with `prefetch`, then with `primed`.
fn doubled(part: i32, xv: vmem bf16[M, K], w: hbm bf16[K, N], y: hbm f32[M, N], ring: vmem bf16[2][K, TN],
           rs: sem[2]) {
    pipeline j in 0..N / TN part part {
        input wt = w[:, j * TN +: TN] via ring, rs;
        output yt = y[:, j * TN +: TN];
        yt = matmul(xv, wt) * 2.0;
    }
}

kernel matmul_pipelined(x: hbm bf16[M, K], w: hbm bf16[K, N], y: hbm f32[M, N], y2: hbm f32[M, N]) {
    vmem xv: bf16[M, K];
    vmem ring: bf16[2][K, TN];
    sem rs[2];
    sem xs;
    doubled(prefetch, xv, w, y2, ring, rs);
    start copy(x, xv, xs);
    wait copy(x, xv, xs);
    pipeline j in 0..N / TN depth 3 {
        input wt = w[:, j * TN +: TN];
        output yt = y[:, j * TN +: TN];
        yt = matmul(xv, wt);
    }
    doubled(primed, xv, w, y2, ring, rs);
}
