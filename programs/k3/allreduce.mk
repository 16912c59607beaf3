// The sums of parts made on different cores, in the contract's order (docs/k3.md, psum).
// The attention output is a sum over the heads of each head's K = 128 product with its
// rows of wo; the MoE's latent output a sum over the weighted routed experts and the
// shared experts. A part is numbered by the model (head h; routed slot j, then shared
// expert TOPK + s), not by the core that made it, and no core adds parts on the way,
// so the bits are the same on every mesh.
import "model.mk";

// Parts of the two sums, padded to powers of two (PP*) with log2 (LG*).
const NPE = TOPK + NSHARED;
const LGH = i32(HEADS > 1) + i32(HEADS > 2) + i32(HEADS > 4) + i32(HEADS > 8) + i32(HEADS > 16) + i32(HEADS > 32)
            + i32(HEADS > 64);
const LGE = i32(NPE > 1) + i32(NPE > 2) + i32(NPE > 4) + i32(NPE > 8) + i32(NPE > 16) + i32(NPE > 32)
            + i32(NPE > 64);
const PPH = 1 << LGH;
const PPE = 1 << LGE;
assert HEADS <= 128 && NPE <= 128, "at most 128 parts per all-reduce";

// parts[base] = psum(parts[base .. base + 2^lg - 1]), in place: slot base + i += slot
// base + i + half for half = 2^lg/2, ..., 1. Slots past the real parts must hold +0.0
// (they are never written: only slots below half < the number of parts are).
fn psum<S, R, C>(parts: vmem f32[S][R, C], base: i32, lg: i32) {
    for lv in 0..lg {
        let half = (1 << lg) >> (lv + 1);
        for i in 0..half {
            parts[base + i] = parts[base + i] + parts[base + i + half];
        }
    }
}
