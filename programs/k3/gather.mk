// The all-gather of the K3 programs (a K3-specific collective, kept apart from the
// model code). programs/lib/collectives.mk's all_gather is a ring per mesh level over
// equal per-participant chunks: four sequential ring levels (each with a credit round
// trip) on a 2x2x2 mesh of 2-core chips. The K3 activations are a few blocks of
// BATCH x 128 f32 owned by cores j % NCORES, so one direct phase is what they need:
// every owner pushes its blocks straight to every consumer (latency: one DMA start plus
// the farthest path, ~2.2-2.6 us on 2x2x2), and the receivers count bytes.
//
// Protocol (bit-exact by construction: it only moves bytes):
// - every owner DMAs each of its blocks from its private `src` into the same columns
//   of `site` on every consumer core, itself included (a local DMA), so `site` is
//   written by DMAs only and read only after the wait (no vector access overlaps a DMA
//   in flight);
// - all copies into `site` count on `rsem`: a consumer waits for the whole site,
//   BATCH * ncols * 4 bytes; sends count on `ssend` (the bytes that left this core);
// - consumers are cores 0..nt-1 (nt = NCORES: everyone; nt = 1: a gather to core 0);
// - a site (and its rsem) may be reused only when something orders the two uses on
//   every core: the megakernel rotates its sites over two slots by layer parity and
//   puts a barrier every second layer; the per-op program has kernel boundaries.
import "model.mk";

// NCORES rounded up to a power of two: c = me ^ k for k in 0..PCORES is a permutation of
// 0..PCORES-1, so it visits every core once (those >= nt are skipped).
const PCORES = 1 << (i32(NCORES > 1) + i32(NCORES > 2) + i32(NCORES > 4) + i32(NCORES > 8) + i32(NCORES > 16)
                     + i32(NCORES > 32) + i32(NCORES > 64) + i32(NCORES > 128) + i32(NCORES > 256));

// Copy src into dst on cores 0..nt-1 (dst on this core by a local DMA, counted on rsem
// like the remote ones). Targets in the order me ^ (PCORES-1), ..., me ^ 0: on a
// power-of-two mesh the farthest chips first (their copies take longest) and this core
// last.
fn push_all(src: vmem f32[r, c], dst: vmem f32[r, c], r: i32, c: i32, me: i32, nt: i32, ssend: sem, rsem: sem) {
    for kk in 0..PCORES {
        let tc = me ^ (PCORES - 1 - kk);
        if tc < nt {
            if tc == me {
                start copy(src, dst, rsem);
            } else {
                start copy(src, dst @ tc, ssend, rsem);
            }
        }
    }
}

// Push this core's blocks of `src` into `site` on cores 0..nt-1.
fn ag_push(src: vmem f32[BATCH, nl * 128], site: vmem f32[BATCH, nb * 128], nl: i32, nb: i32,
           first: i32, me: i32, nt: i32, ssend: sem, rsem: sem) {
    for j in first..nb step NCORES {
        push_all(src[:, (j - first) / NCORES * 128 +: 128], site[:, j * 128 +: 128], BATCH, 128, me, nt,
                 ssend, rsem);
    }
}

// Wait until this core's sends have left and (if it is a consumer) the whole site arrived.
fn ag_finish(nb: i32, first: i32, me: i32, nt: i32, ssend: sem, rsem: sem) {
    let mine = (max(nb - first, 0) + NCORES - 1) / NCORES;
    wait(ssend, mine * (nt - i32(me < nt)) * BATCH * 512);
    if me < nt {
        wait(rsem, nb * BATCH * 512);
    }
}
