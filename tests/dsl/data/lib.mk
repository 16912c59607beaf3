// A small library imported by full.mk.
param D = 256;
const ROWS = 8;

fn rmsnorm(x: vmem f32[ROWS, D], w: vmem bf16[1, D], out: vmem f32[ROWS, D]) {
    let ss = sum(x * x, axis=1);
    out = x * rsqrt(ss / D + 1e-5) * f32(w);
}

// Generic over the width: a scalar parameter bound to a constant sizes the others.
fn scale(x: vmem f32[ROWS, n], n: i32, factor: i32) {
    x = x * f32(factor);
}
