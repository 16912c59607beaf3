// Generic fns and kernels: the names in <...> are inferred from the arguments' shapes
// and dtypes. One projection kernel serves every weight shape (an instance per shape,
// named proj<K,N>); one copy helper serves every dtype and shape. y = (x w1) w2.
param M = 8;

// Start (mode 0) or wait for (mode 1) a copy of any dtype and shape.
fn cp<T, R, C>(mode: i32, src: hbm T[R, C], dst: vmem T[R, C], s: sem) {
    if mode == 0 { start copy(src, dst, s); } else { wait copy(src, dst, s); }
}

kernel proj<K, N>(x: hbm f32[M, K], w: hbm bf16[K, N], y: hbm f32[M, N]) {
    vmem xv: f32[M, K];
    vmem wv: bf16[K, N];
    vmem yv: f32[M, N];
    sem s;
    cp(0, x, xv, s);
    cp(0, w, wv, s);
    cp(1, x, xv, s);
    cp(1, w, wv, s);
    yv = matmul(bf16(xv), wv);
    start copy(yv, y, s);
    wait copy(yv, y, s);
}

host {
    input x: f32[M, 256];
    input w1: bf16[256, 512];
    input w2: bf16[512, 128];
    hbm h: f32[M, 512];
    output y: f32[M, 128];
    launch proj(x, w1, h);      // proj<256,512>
    launch proj(h, w2, y);      // proj<512,128>
}
