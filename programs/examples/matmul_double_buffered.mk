// y = x @ W as in matmul_single_buffered.mk (same tiles, same order, same bits),
// double-buffered: while one tile is multiplied, the next is already on its way into
// the other slot of wbuf, each slot with its own semaphore. The wait for a tile
// re-describes the copy started one iteration earlier. The DMA start latency (~0.5 us
// on tpu-v7-like, longer than one tile's transfer and matmul together) then overlaps
// with the previous tile's work instead of adding to it.
param M = 8;
param K = 2048;
param N = 2048;
param TK = 256 in {128, 256, 512} "K tile; the reference adds 256-row partial products, so only 256 keeps the bits"; // 256 x 256: 128 KiB per slot
param TN = 256 in {128, 256, 512, 1024} "N tile: columns of W per DMA and per accumulator";
const KT = K / TK;
const NJ = N / TN;
reference "refs.py:matmul_k256";
assert K % TK == 0 && N % TN == 0, "K and N must be multiples of the tile size";

kernel matmul_db(x: hbm bf16[M, K], w: hbm bf16[K, N], y: hbm f32[M, N]) {
    vmem xv: bf16[M, K];
    vmem wbuf: bf16[2][TK, TN];
    vmem yv: f32[M, N];
    var acc: f32[M, TN];
    var slot: i32 = 0;                // the slot that holds (or receives) tile (j, k)
    sem xs;
    sem ws[2];

    start copy(x, xv, xs);
    start copy(w[0 +: TK, 0 +: TN], wbuf[0], ws[0]);            // prologue: tile (0, 0)
    wait copy(x, xv, xs);
    for j in 0..NJ {
        acc = 0.0;
        for k in 0..KT {
            // Prefetch the next tile in streaming order into the other slot.
            if k + 1 < KT {
                start copy(w[(k + 1) * TK +: TK, j * TN +: TN], wbuf[1 - slot], ws[1 - slot]);
            } else if j + 1 < NJ {
                start copy(w[0 +: TK, (j + 1) * TN +: TN], wbuf[1 - slot], ws[1 - slot]);
            }
            wait copy(w[k * TK +: TK, j * TN +: TN], wbuf[slot], ws[slot]);
            acc += matmul(xv[:, k * TK +: TK], wbuf[slot]);
            slot = 1 - slot;
        }
        yv[:, j * TN +: TN] = acc;
    }
    start copy(yv, y, xs);
    wait copy(yv, y, xs);
}

host {
    input x: bf16[M, K];
    input w: bf16[K, N];
    output y: f32[M, N];
    launch matmul_db(x, w, y);
}
