// y = softmax(x) along each row: exp(x - max) / sum(exp(x - max)), in float32.
param N = 1024;
reference "refs.py:softmax";

kernel softmax(x: hbm f32[8, N], y: hbm f32[8, N]) {
    vmem xv: f32[8, N];
    vmem yv: f32[8, N];
    sem s;

    start copy(x, xv, s);
    wait copy(x, xv, s);
    let m = max(xv, axis=1);                         // [8, 1]: subtracting it keeps exp finite
    let e = exp(xv - m);
    yv = e / sum(e, axis=1);
    start copy(yv, y, s);
    wait copy(yv, y, s);
}

host {
    input x: f32[8, N];
    output y: f32[8, N];
    launch softmax(x, y);
}
