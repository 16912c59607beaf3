// The pipeline statement: y = x @ W, W streamed in column tiles through 3 slots while
// the previous tiles of y go back to HBM, the tile body written once. The same tiles
// again through shared slots (`via`), prefetched before x has even arrived.
param M = 8;
param K = 256;
param N = 1024;
const TN = 128;

kernel matmul_pipelined(x: hbm bf16[M, K], w: hbm bf16[K, N], y: hbm f32[M, N], y2: hbm f32[M, N]) {
    vmem xv: bf16[M, K];
    vmem ring: bf16[2][K, TN];      // slots shared by the prefetch and the primed run
    sem rs[2];
    sem xs;
    pipeline j in 0..N / TN prefetch {
        input wt = w[:, j * TN +: TN] via ring, rs;
    }
    start copy(x, xv, xs);
    wait copy(x, xv, xs);
    pipeline j in 0..N / TN depth 3 {
        input wt = w[:, j * TN +: TN];
        output yt = y[:, j * TN +: TN];
        yt = matmul(xv, wt);
    }
    pipeline j in 0..N / TN primed {
        input wt = w[:, j * TN +: TN] via ring, rs;
        output yt = y2[:, j * TN +: TN];
        yt = matmul(xv, wt) * 2.0;
    }
}
