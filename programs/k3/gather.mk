// Pushing data to other cores, and the all-gather of the K3 programs (a K3-specific
// collective, kept apart from the model code).
//
// programs/lib/collectives.mk's all_gather is a ring per mesh level over equal
// per-participant chunks: four sequential ring levels (each with a credit round trip)
// on a 2x2x2 mesh of 2-core chips. The K3 activations are a few blocks of BATCH x 128
// f32 owned by cores j % NCORES, so one direct phase is what they need: every owner
// pushes its blocks straight to every consumer (latency: one DMA start plus the
// farthest path, ~2.2-2.6 us on 2x2x2), and the receivers count bytes.
//
// Protocol (bit-exact by construction: it only moves bytes):
// - a push DMAs a piece from a private source into the same place of the destination
//   buffer on a target core (on this core by a local DMA), so a destination is written
//   by DMAs only and read only after its receive semaphore counted every byte;
// - remote pushes count on the sender's `Net.ssend`, and `Net.sent` keeps how many bytes
//   left, so `drain` waits for exactly those (every semaphore ends at 0);
// - consumers of a gather are cores 0..nt-1 (nt = NCORES: everyone; nt = 1: core 0);
// - a destination (and its receive semaphore) may be reused only when something orders
//   the two uses on every core: the megakernel rotates its buffers over GROT slots by
//   layer and puts a barrier every GROT layers; the other programs have kernel
//   boundaries.
import "model.mk";

// NCORES rounded up to a power of two, PCORES = 2^LGC: c = me ^ k for k in 0..PCORES is a
// permutation of 0..PCORES-1, so it visits every core once (those >= nt are skipped).
const LGC = i32(NCORES > 1) + i32(NCORES > 2) + i32(NCORES > 4) + i32(NCORES > 8) + i32(NCORES > 16)
            + i32(NCORES > 32) + i32(NCORES > 64) + i32(NCORES > 128) + i32(NCORES > 256);
const PCORES = 1 << LGC;

// A core's sending side: the semaphore its remote pushes count on, and their bytes.
struct Net {
    ssend: sem;
    sent: smem i32[1];
}

// Push src into dst on core t (this core `me`: a local copy); the bytes arrive on rsem
// there. src must stay as it is until they arrived (a local copy is not counted by
// `drain`: its receiver, this core, counts it).
fn send<R, C>(src: vmem f32[R, C], dst: vmem f32[R, C], t: i32, me: i32, rsem: sem, net: Net) {
    if t == me {
        start copy(src, dst, rsem);
    } else {
        start copy(src, dst @ t, net.ssend, rsem);
        net.sent[0] = net.sent[0] + bytes(src);
    }
}

// Wait until every byte this core pushed has left (its sources may be reused).
fn drain(net: Net) {
    wait(net.ssend, net.sent[0]);
    net.sent[0] = 0;
}

// Copy src into dst on cores 0..nt-1. Targets in the order me ^ (PCORES-1), ..., me ^ 0:
// on a power-of-two mesh the farthest chips first (their copies take longest) and this
// core last.
fn push_all<R, C>(src: vmem f32[R, C], dst: vmem f32[R, C], me: i32, nt: i32, rsem: sem, net: Net) {
    for kk in 0..PCORES {
        let tc = me ^ (PCORES - 1 - kk);
        if tc < nt {
            send(src, dst, tc, me, rsem, net);
        }
    }
}

// Push this core's blocks of `src` (its t-th block at columns t*128) into `site` on cores
// 0..nt-1 (block j at columns j*128), for its blocks j = first, first + NCORES, ... < nb.
fn ag_push<NL, NS>(src: vmem f32[BATCH, NL], site: vmem f32[BATCH, NS], nb: i32, first: i32, me: i32, nt: i32,
                   rsem: sem, net: Net) {
    for j in first..nb step NCORES {
        push_all(src[:, (j - first) / NCORES * 128 +: 128], site[:, j * 128 +: 128], me, nt, rsem, net);
    }
}

// Wait until this core's sends have left and (if it is a consumer) all nb blocks arrived.
fn ag_finish<NS>(site: vmem f32[BATCH, NS], nb: i32, me: i32, nt: i32, rsem: sem, net: Net) {
    drain(net);
    if me < nt {
        wait(rsem, nb * bytes(site[:, 0:128]));
    }
}

// Past AG_DIRECT_MAX cores an owner's pushes to every consumer are the phase's critical
// path (at most max_in_flight DMAs of an engine in flight, each several hops away: 256
// consumers are 16 rounds of latency). The consumers then form groups of AGG cores
// (cores k*AGG ..); block b has one relay in each group, core k*AGG + b % (the group's
// size). The owner pushes the block to the relays (counted on their qsem), each relay
// waits for its blocks and pushes them on to the rest of its group (counted on rsem as
// before): two rounds of about sqrt(nt) pushes instead of one of nt, the same bytes,
// the same bits. A relay's semaphore must not see the next use of its site early: the
// super-operators (GROT = 1) order the uses by kernel boundaries; the megakernel's GROT
// slots would need one per site and slot, which its semaphore budget does not have, so
// it always pushes directly.
param AG_DIRECT_MAX = 64 in {0, 16, 32, 64, 128, 256, 1024} "cores up to which an all-gather of the super-operators pushes every block straight to every consumer, instead of through one relay per group of consumers";
const AG_RELAY = NCORES > AG_DIRECT_MAX && GROT == 1;
const AGG = 1 << ((LGC + 1) / 2);       // a relay group: about sqrt(NCORES) cores

// The owner's side: this core's blocks (those of ag_push) to their relays.
fn ag_push_relay<NL, NS>(src: vmem f32[BATCH, NL], site: vmem f32[BATCH, NS], nb: i32, me: i32, nt: i32,
                         qsem: sem, net: Net) {
    for j in me..nb step NCORES {
        for k in 0..(nt + AGG - 1) / AGG {
            send(src[:, (j - me) / NCORES * 128 +: 128], site[:, j * 128 +: 128], k * AGG + j % min(AGG, nt - k * AGG),
                 me, qsem, net);
        }
    }
}

// The relay's side (every consumer): wait for the blocks it relays, push them to the rest
// of its group, then wait for the other blocks, relayed to it.
fn ag_relay_finish<NS>(site: vmem f32[BATCH, NS], nb: i32, me: i32, nt: i32, rsem: sem, qsem: sem, net: Net) {
    if me < nt {
        let k0 = me / AGG * AGG;
        let gs = min(AGG, nt - k0);
        let i = me - k0;
        let mine = (max(nb - i, 0) + gs - 1) / gs;      // blocks i, i + gs, ... below nb
        wait(qsem, mine * bytes(site[:, 0:128]));
        for t in 0..mine {
            for m in 0..gs {
                if m != i {
                    send(site[:, (i + t * gs) * 128 +: 128], site[:, (i + t * gs) * 128 +: 128], k0 + m, me, rsem, net);
                }
            }
        }
        drain(net);
        wait(rsem, (nb - mine) * bytes(site[:, 0:128]));
    } else {
        drain(net);
    }
}

// The all-gather of this core's blocks of a split projection into site on cores 0..nt-1
// (qsem: the relays' semaphore, used when AG_RELAY).
fn all_gather<NL, NS>(src: vmem f32[BATCH, NL], site: vmem f32[BATCH, NS], nb: i32, me: i32, nt: i32, rsem: sem,
                      qsem: sem, net: Net) {
    region "allgather" {
        if AG_RELAY {
            ag_push_relay(src, site, nb, me, nt, qsem, net);
            ag_relay_finish(site, nb, me, nt, rsem, qsem, net);
        } else {
            ag_push(src, site, nb, me, me, nt, rsem, net);
            ag_finish(site, nb, me, nt, rsem, net);
        }
    }
}
