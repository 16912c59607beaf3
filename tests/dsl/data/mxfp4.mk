// MXFP4 weights: y = x @ W[e] with the experts' weights W kept in 4 bits (plus a
// scale per 32 rows) in HBM and in VMEM. The expert e is read at run time; W[e]
// streams through a 2-slot pipeline in column tiles (each tile is two DMAs, its
// values and its scales, on the tile's semaphore) and the matrix unit decodes a
// tile as it loads it (mxu.ldw.mx). Then the last expert's first TN columns come in
// blocks of 32 rows, waited as one count, go back to HBM, and a window of them
// moves VMEM to VMEM and is multiplied once more.
param E = 4;
param M = 8;
param K = 256;
param N = 512;
param TN = 128;
const RB = 32;                                  // rows per block: one scale each

kernel expert(sel: hbm i32[8], x: hbm bf16[M, K], w: hbm mxfp4[E, K, N],
              y: hbm f32[M, N], wlast: hbm mxfp4[K, TN], y2: hbm f32[M, TN]) {
    smem si: i32[8];
    vmem xv: bf16[M, K];
    vmem yv: f32[M, N];
    vmem keep: mxfp4[K, TN];
    vmem pair: mxfp4[2][K / 2, TN];
    vmem y2v: f32[M, TN];
    sem s;
    start copy(sel, si, s);
    start copy(x, xv, s);
    wait copy(sel, si, s);
    wait copy(x, xv, s);
    let e = si[0];
    pipeline j in 0..N / TN depth 2 {
        input wt = w[e, :, j * TN +: TN];
        yv[:, j * TN +: TN] = matmul(xv, wt);
    }
    start copy(yv, y, s);
    for b in 0..K / RB {
        start copy(w[E - 1, b * RB +: RB, 0 +: TN], keep[b * RB +: RB, :], s);
    }
    wait copy(yv, y, s);
    wait (K / RB) * copy(w[0, 0 +: RB, 0 +: TN], keep[0 +: RB, :], s);
    assert bytes(keep) == K * TN / 2 + K / RB * TN, "values, then a scale per 32 rows";
    start copy(keep, wlast, s);                              // VMEM -> HBM
    start copy(keep[K / 4 +: K / 2, :], pair[1], s);         // VMEM -> VMEM
    wait(s, bytes(keep) + bytes(pair[1]));
    y2v = matmul(xv[:, K / 4 +: K / 2], pair[1]);
    start copy(y2v, y2, s);
    wait copy(y2v, y2, s);
}

host {
    input sel: i32[8];
    input x: bf16[M, K];
    input w: mxfp4[E, K, N];
    output y: f32[M, N];
    output wlast: mxfp4[K, TN];
    output y2: f32[M, TN];
    launch expert(sel, x, w, y, wlast, y2);
}
