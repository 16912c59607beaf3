// The embedding as its own kernel (the per-op program and the super-operators): the rows
// of the step's tokens into this chip's copy of the residual stream h (core 0 of each
// chip; the other cores have nothing to do).
import "tensors.mk";

kernel embed_tokens(w: K3Weights, io: K3Io, hs: hbm f32[BATCH, DIM]) {
    smem tok: i32[BATCH];
    vmem e: bf16[BATCH, DIM];
    vmem hv: f32[BATCH, DIM];
    sem s;
    if core_id() == 0 {
        start copy(io.tokens, tok, s);
        wait copy(io.tokens, tok, s);
        for b in 0..BATCH {
            start copy(w.embed[tok[b]], e[b:b + 1, :], s);
        }
        wait BATCH * copy(w.embed[0], e[0:1, :], s);
        hv = f32(e);
        start copy(hv, hs, s);
        wait copy(hv, hs, s);
    }
}
