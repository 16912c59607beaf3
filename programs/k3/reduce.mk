// The all-reduce of the megakernel and the super-operators, in VMEM, in one of two forms
// chosen at compile time by the size of one all-reduce's parts (AR_BYTES):
//
// - one-shot (small models): every part is pushed into its slot of a parts buffer
//   [PP][BATCH, n] on every core that needs the sum, which waits for all parts' bytes and
//   adds them in place by the padded halving tree (psum). One phase: at decode batch
//   sizes a phase is latency, so this is the fast form while the buffer is small
//   (k3-mini: 4 heads x BATCH x 2 KB).
// - reduce-scatter + all-gather (k3-full: 32 parts x BATCH x 28 KB to every core cost more
//   than two phases, docs/k3_programs.md): column
//   block j of every part goes to its owner, core j % NCORES, which adds all the parts of
//   its blocks by the same tree, then the sums are all-gathered. Two phases, and each
//   core receives only its blocks.
//
// Either way every output element is psum over all parts in the contract's order, so
// the bits are the same. The parts buffers rotate over GROT slots (a param of the
// program: the megakernel 2 or 3, by layer; the super-operators 1).
import "allreduce.mk";
import "gather.mk";
import "shard.mk";

// The attention's parts are added on their own core first when that is the contract's
// order: with NCORES a power of two below PPH, core me holds heads me, me + NCORES, ...
// (shard.mk), and the first LGT = LGH - LGC levels of the tree pair only those slots
// (slot i with i + half, half a multiple of NCORES). Each core then sends one part, its
// heads' sum in slot me, and the sum adds NPA = NCORES parts by the remaining levels.
const LOCAL_A = NCORES == PCORES && NCORES < PPH;
const LGT = select(LOCAL_A, LGH - LGC, 0);
const NPA = PPH >> LGT;

param AR_BYTES = 524288 in {0, 262144, 524288, 1048576, 2097152, 8388608, 67108864} "bytes of one all-reduce's parts (one slot set) up to which it is one-shot (every part to every core) instead of reduce-scatter + all-gather";
const RS_A = NPA * BATCH * DIM * 4 > AR_BYTES;         // the attention sum
const RS_E = PPE * BATCH * LATENT * 4 > AR_BYTES;      // the MoE sum (tensor parallel)
// Columns of one parts slot on this core: all of them, or this core's blocks.
const ACOLS = select(RS_A, NDL * 128, DIM);
const ECOLS = select(RS_E, NLL * 128, LATENT);

// Push column blocks b0 .. b0 + nb - 1 of part q's rows r0 .. r0 + R - 1 (in src, at their
// own columns) toward the sum: one-shot, in one copy into parts[q] on each of cores
// 0..nt-1; reduce-scatter, each block into its owner's parts[q] at the owner's local
// columns.
fn ar_send<R, N, S, PC>(src: vmem f32[R, N], parts: vmem f32[S][BATCH, PC], q: i32, r0: i32, b0: i32, nb: i32,
                        rs: bool, me: i32, nt: i32, rsem: sem, net: Net) {
    if rs {
        for jb in b0..b0 + nb {
            send(src[:, jb * 128 +: 128], parts[q][r0 +: R, jb / NCORES * 128 +: 128], jb % NCORES, me, rsem, net);
        }
    } else {
        push_all(src[:, b0 * 128 +: nb * 128], parts[q][r0 +: R, b0 * 128 +: nb * 128], me, nt, rsem, net);
    }
}

// The first lg levels of psum over one core's parts (LOCAL_A): src[t] holds global part
// me + t*NCORES for t < n, and the parts past them are +0.0 in the contract's tree, so
// adding one is adding +0.0. The core's sum ends in src[0].
fn psum_local<S, R, C>(src: vmem f32[S][R, C], n: i32, lg: i32) {
    for lv in 0..lg {
        let half = (1 << lg) >> (lv + 1);
        for i in 0..min(half, n) {
            if i + half < n {
                src[i] = src[i] + src[i + half];
            } else {
                src[i] = src[i] + 0.0;
            }
        }
    }
}

// The sum, once `rows` rows of parts (every column of each) were sent toward it: in
// parts[pbase] (one-shot, on cores 0..nt-1) or in site (reduce-scatter: this core's
// blocks summed in parts[pbase], then the nb blocks all-gathered into site on cores
// 0..nt-1, counted on gsem; qsem: the all-gather's relays).
fn ar_sum<S, PC, NS>(parts: vmem f32[S][BATCH, PC], pbase: i32, lg: i32, rows: i32, site: vmem f32[BATCH, NS],
                     nb: i32, rs: bool, me: i32, nt: i32, rsem: sem, gsem: sem, qsem: sem, net: Net) {
    let mine = select(rs, (max(nb - me, 0) + NCORES - 1) / NCORES * 128, NS);
    let sums = select(rs, me < nb, me < nt);
    region "allreduce" {
        drain(net);
        if sums {
            wait(rsem, rows * mine * 4);
        }
    }
    if sums {
        region "combine" {
            psum(parts, pbase, lg);
        }
    }
    if rs {
        all_gather(parts[pbase], site, nb, me, nt, gsem, qsem, net);
    }
}
