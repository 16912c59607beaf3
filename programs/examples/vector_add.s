.buffer a f32 8x128 input
.buffer b f32 8x128 input
.buffer out f32 8x128 output
.reference vector_add_ref.py:reference
.kernel main
    .smem 0 4096 1 0 0 1 0 0     ; descriptor: 4096 contiguous bytes
    li s1, @a
    li s2, 0          ; vmem a
    li s3, 0          ; desc
    li s4, 0          ; sem 0
    dma.start vmem[s2], hbm[s1], s3, s4
    li s1, @b
    li s2, 4096
    dma.start vmem[s2], hbm[s1], s3, s4
    li s5, 8192
    sem.wait s4, s5
    li s6, 512        ; row stride
    vld.w v0, 0(s0), s6, m0
    vld.w v1, 4096(s0), s6, m0
    vadd.f32 v2, v0, v1
    vst.w v2, 8192(s0), s6, m0
    li s1, @out
    li s2, 8192
    li s4, 1
    dma.start hbm[s1], vmem[s2], s3, s4
    li s5, 4096
    sem.wait s4, s5
    halt
