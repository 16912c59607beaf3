// y = x * rsqrt(mean(x^2) + eps) * w over each row of x, in float32;
// the weight is stored in bf16 and widened exactly.
param D = 1024;
reference "refs.py:rmsnorm";

kernel rmsnorm(x: hbm f32[8, D], w: hbm bf16[1, D], y: hbm f32[8, D]) {
    vmem xv: f32[8, D];
    vmem wv: bf16[1, D];
    vmem yv: f32[8, D];
    sem s;

    start copy(x, xv, s);
    start copy(w, wv, s);
    wait copy(x, xv, s);
    wait copy(w, wv, s);
    let ss = sum(xv * xv, axis=1);                   // [8, 1]
    yv = xv * rsqrt(ss / D + 1e-5) * f32(wv);        // [8, D] * [8, 1] * [1, D]
    start copy(yv, y, s);
    wait copy(yv, y, s);
}

host {
    input x: f32[8, D];
    input w: bf16[1, D];
    output y: f32[8, D];
    launch rmsnorm(x, w, y);
}
