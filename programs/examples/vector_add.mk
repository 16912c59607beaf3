// out = a + b, elementwise in float32, on every core of every chip.
// The same computation as vector_add.s, written in .mk.
param N = 1024;
reference "vector_add_ref.py:reference";

kernel vector_add(a: hbm f32[8, N], b: hbm f32[8, N], out: hbm f32[8, N]) {
    vmem xa: f32[8, N];
    vmem xb: f32[8, N];
    sem s;

    start copy(a, xa, s);        // both loads in flight at once
    start copy(b, xb, s);
    wait copy(a, xa, s);
    wait copy(b, xb, s);
    xa = xa + xb;
    start copy(xa, out, s);
    wait copy(xa, out, s);
}

host {
    input a: f32[8, N];
    input b: f32[8, N];
    output out: f32[8, N];
    launch vector_add(a, b, out);
}
