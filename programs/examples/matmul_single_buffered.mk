// y = x @ W: x bf16[8, 2048], W bf16[2048, 2048], float32 result.
// W streams through VMEM in TK x TN tiles. For each column block j, acc sums the
// tile products over k in increasing order: each matmul is one matrix-unit pass
// (bf16 products accumulated in f32 over its TK rows), then `acc += ...` adds it
// in f32. Every tile is waited for before it is used, so the DMA latency and the
// matrix unit take turns.
param M = 8;
param K = 2048;
param N = 2048;
param TK = 256 in {128, 256, 512} "K tile; the reference adds 256-row partial products, so only 256 keeps the bits"; // 256 x 256: 128 KiB per tile
param TN = 256 in {128, 256, 512, 1024} "N tile: columns of W per DMA and per accumulator";
reference "refs.py:matmul_k256";
assert K % TK == 0 && N % TN == 0, "K and N must be multiples of the tile size";

kernel matmul_sb(x: hbm bf16[M, K], w: hbm bf16[K, N], y: hbm f32[M, N]) {
    vmem xv: bf16[M, K];
    vmem wv: bf16[TK, TN];
    vmem yv: f32[M, N];
    var acc: f32[M, TN];
    sem s;

    start copy(x, xv, s);
    wait copy(x, xv, s);
    for j in 0..N / TN {
        acc = 0.0;
        for k in 0..K / TK {
            start copy(w[k * TK +: TK, j * TN +: TN], wv, s);
            wait copy(w[k * TK +: TK, j * TN +: TN], wv, s);    // the matrix unit idles here
            acc += matmul(xv[:, k * TK +: TK], wv);
        }
        yv[:, j * TN +: TN] = acc;
    }
    start copy(yv, y, s);
    wait copy(yv, y, s);
}

host {
    input x: bf16[M, K];
    input w: bf16[K, N];
    output y: f32[M, N];
    launch matmul_sb(x, w, y);
}
