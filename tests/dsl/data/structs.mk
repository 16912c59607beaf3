// Structs: a group of buffers and semaphores declared once and passed whole. The MLP's
// weights are one struct (a host instance: one input array per member), its VMEM
// working set another (made in the kernel). y = relu(x w1) w2.
param D = 256;

struct Mlp {
    w1: hbm bf16[D, D];
    w2: hbm bf16[D, D];
}

struct Slots {                      // the kernel's VMEM working set
    wv: vmem bf16[2][D, D];
    xv: vmem f32[8, D];
    ws: sem[2];
}

fn fetch(m: Mlp, b: Slots) {
    start copy(m.w1, b.wv[0], b.ws[0]);
    start copy(m.w2, b.wv[1], b.ws[1]);
}

fn mlp(m: Mlp, b: Slots) {
    fetch(m, b);
    wait copy(m.w1, b.wv[0], b.ws[0]);
    b.xv = max(matmul(bf16(b.xv), b.wv[0]), 0.0);
    wait copy(m.w2, b.wv[1], b.ws[1]);
    b.xv = matmul(bf16(b.xv), b.wv[1]);
}

kernel run(m: Mlp, x: hbm f32[8, D], y: hbm f32[8, D]) {
    let b = Slots();
    sem io;
    start copy(x, b.xv, io);
    wait copy(x, b.xv, io);
    mlp(m, b);
    start copy(b.xv, y, io);
    wait copy(b.xv, y, io);
}

host {
    input m: Mlp;
    input x: f32[8, D];
    output y: f32[8, D];
    launch run(m, x, y);
}
