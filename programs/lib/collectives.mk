// Collectives over every core of every chip, built from remote DMAs and semaphores:
// all-reduce, reduce-scatter and all-gather (rings per level, composed over the
// levels, one or two directions) and all-to-all with run-time sizes.
// docs/collectives.md has the algorithms, their reduction orders and their timings.
//
// Participants. Every core of every chip takes part; participant
//     p = core_id() * num_chips() + chip_id()
// so core 0 of chip c is participant c and core 1 of chip c is num_chips() + c.
//
// Data. The ring collectives work on a VMEM buffer x: f32[rows, cols] in blocks of
// `br` rows (one block is one DMA); only blocks 0 .. nblocks-1 take part (nblocks is
// a run-time value, the same on every core).
//
// Levels. A composed collective runs one ring per level:
//     level 0:       the cores of this chip (over the on-chip path)
//     level 1, 2, 3: the chips along mesh axis X, Y, Z, ring rank = chip coordinate
//                    (on a line the wrap-around edge is routed back along the line)
// The reduce-scatter visits the levels in the order 0, 3, 2, 1 (cores, Z, Y, X) and
// the all-gather in the reverse order 1, 2, 3, 0. Each level cuts the current segment
// [lo, hi) of blocks into n chunks, chunk c = [lo + len*c/n, lo + len*(c+1)/n), and
// the core of rank r keeps chunk r; so participant p ends up owning the p-th of
// num_chips() * num_cores() equal parts.
//
// Directions. With dirs = 1 a ring sends to rank r+1. With dirs = 2 (bidirectional)
// the first half of every chunk [a, b), [a, a + (b-a)/2), goes to rank r+1 and the
// second half to rank r-1, over the other direction of the links.
//
// Reduction order, which a numpy reference repeats to get the same bits: at each
// level, for the blocks of chunk c that go up the ring (to rank r+1),
//     acc = v[c+1]; acc = acc + v[c+2]; ...; acc = acc + v[c+n]     (ranks mod n)
// and for those that go down (to rank r-1)
//     acc = v[c-1]; acc = acc + v[c-2]; ...; acc = acc + v[c-n]
// where v[q] is the block as rank q holds it after the earlier levels; f32 adds.
//
// Protocol. A reduce-scatter step moves one block per DMA into one of CL_SLOTS
// receive slots per direction (2: double buffering). The sender waits for a credit
// before each block; the receiver grants CL_SLOTS credits when it enters the level and
// one more whenever it has consumed a slot and blocks are still to come, so every
// credit is used. An all-gather writes straight into the receiver's x once the
// receiver, having entered the level, said it is ready (one credit); its steps count
// on CL_AG_SEMS receive semaphores in turn, and a sender reuses one only after the
// blocks it last counted have landed (cl_ag_level). So data for a
// level only arrives while the receiver is in that level; credits are per level and
// direction, so a neighbour that is ahead cannot be mistaken for the current one.
// Every DMA is waited for within its level; every semaphore ends at 0.

param CL_SLOTS = 2 in {1, 2, 3, 4} "receive slots per ring direction (ring depth): 2 is double buffering";
param CL_AG_SEMS = 2 in {2, 3, 4, 6, 8} "all-gather: receive semaphores per ring direction that the steps take in turn; more let a sender run further ahead (4 on a line of 8 chips)";
const CL_RECV = max(CL_SLOTS, CL_AG_SEMS);   // receive semaphores per direction
const CL_MAX_ROWS = 8192;     // all_to_all: capacity limit (one DMA per power of two)

// Stop here, with a deadlock report naming every core and this line, unless the
// machine is one the program was sized for: `cores` cores per chip and at most
// `max_parts` participants (0: any number).
fn expect_mesh(cores: i32, max_parts: i32) {
    sem mesh_ok;
    let parts = num_chips() * num_cores();
    if num_cores() == cores && (max_parts == 0 || parts <= max_parts) {
        signal(mesh_ok, 1);
    }
    wait(mesh_ok, 1);   // stuck here? this machine's cores per chip or participants do not fit the program
}

// Stop here, with a deadlock report naming every core and this line, unless
// 0 <= nblocks <= limit. `guard` is the caller's send semaphore, not yet used by any DMA.
fn cl_check_blocks(nblocks: i32, limit: i32, guard: sem) {
    if nblocks >= 0 && nblocks <= limit {
        signal(guard, 1);
    }
    wait(guard, 1);     // stuck here? nblocks is outside 0 .. rows / br
}

// ---------------------------------------------------------------- ring geometry

// This core's ring at `level`: geo = [size, rank, up, down], where up and down are
// the global core ids of ranks rank+1 and rank-1 (mod size).
fn cl_ring(level: i32, geo: smem i32[4]) {
    if level == 0 {
        let size = num_cores();
        let rank = core_id();
        geo[0] = size;
        geo[1] = rank;
        geo[2] = global_core(chip_id(), (rank + 1) % size);
        geo[3] = global_core(chip_id(), (rank + size - 1) % size);
    } else {
        var size: i32 = 1;
        var rank: i32 = 0;
        var stride: i32 = 1;             // chip id difference of one step along the axis
        if level == 1 {
            size = mesh_dim(0);
            rank = chip_coord(0);
        } else if level == 2 {
            size = mesh_dim(1);
            rank = chip_coord(1);
            stride = mesh_dim(0);
        } else {
            size = mesh_dim(2);
            rank = chip_coord(2);
            stride = mesh_dim(0) * mesh_dim(1);
        }
        geo[0] = size;
        geo[1] = rank;
        geo[2] = global_core(chip_id() + ((rank + 1) % size - rank) * stride, core_id());
        geo[3] = global_core(chip_id() + ((rank + size - 1) % size - rank) * stride, core_id());
    }
}

// The blocks [out[0], out[1]) of chunk `chunk_no` (taken mod size; chunk_no >= -size)
// of segment [seg_lo, seg_hi) that direction `dir` carries: all of it with one
// direction, else the first (dir 0) or second (dir 1) half.
fn cl_part(seg_lo: i32, seg_hi: i32, size: i32, chunk_no: i32, dir: i32, dirs: i32, out: smem i32[2]) {
    let chunk = (chunk_no + size) % size;
    let first = seg_lo + (seg_hi - seg_lo) * chunk / size;
    let last = seg_lo + (seg_hi - seg_lo) * (chunk + 1) / size;
    if dirs == 1 {
        out[0] = first;
        out[1] = last;
    } else if dir == 0 {
        out[0] = first;
        out[1] = first + (last - first) / 2;
    } else {
        out[0] = first + (last - first) / 2;
        out[1] = last;
    }
}

// Enter `level` without communicating: save the segment seg[0..2) in
// seg[2 + 2*level ..] and keep chunk `rank` of it.
fn cl_descend(level: i32, seg: smem i32[10]) {
    smem geo: i32[4];
    cl_ring(level, geo);
    let size = geo[0];
    let rank = geo[1];
    let seg_lo = seg[0];
    let seg_hi = seg[1];
    seg[2 + 2 * level] = seg_lo;
    seg[3 + 2 * level] = seg_hi;
    seg[0] = seg_lo + (seg_hi - seg_lo) * rank / size;
    seg[1] = seg_lo + (seg_hi - seg_lo) * (rank + 1) / size;
}

// ---------------------------------------------------------------- one ring level

// Reduce-scatter over the ring of `level` on the segment seg[0..2): afterwards this
// core holds the sum over the ring of chunk `rank`, and seg is that chunk. With
// gather = 1 it also tells its senders that the all-gather of this level, which must
// come next, may write the chunks it does not own. (Only next: the all-gather counts
// its bytes on the first CL_AG_SEMS recv of each direction, which another level's ring
// still uses.)
fn cl_rs_level(x: vmem f32[rows, cols], rows: i32, cols: i32, br: i32, dirs: i32, level: i32,
               gather: i32, seg: smem i32[10], slot: vmem f32[CL_SLOTS * dirs][br, cols],
               recv: sem[rstride * dirs], rstride: i32, send: sem, credit: sem[4 * dirs]) {
    smem geo: i32[4];
    smem part: i32[2];
    smem count: i32[2, 3];       // per direction: blocks sent, received, to receive in all
    smem span: i32[2, 4];        // per direction: blocks sent [0, 1) and received [2, 3) this step
    cl_ring(level, geo);
    let size = geo[0];
    let rank = geo[1];
    let seg_lo = seg[0];
    let seg_hi = seg[1];
    let block_bytes = br * cols * 4;
    if size > 1 {
        region "reduce_scatter" (level) {
            // The chunks are `extra` of q + 1 blocks and size - extra of q blocks; the
            // first halves of all of them add up to `halves` blocks.
            let seg_len = seg_hi - seg_lo;
            let q = seg_len / size;
            let extra = seg_len % size;
            let halves = (size - extra) * (q / 2) + extra * ((q + 1) / 2);
            for dir in 0..dirs {
                let sign = 1 - 2 * dir;        // +1: we send up the ring, -1: down
                // We receive every chunk's part but our sender's own (rank - sign).
                var total: i32 = seg_len;
                if dirs == 2 {
                    total = halves + dir * (seg_len - 2 * halves);
                }
                cl_part(seg_lo, seg_hi, size, rank - sign, dir, dirs, part);
                total -= part[1] - part[0];
                count[dir, 0] = 0;
                count[dir, 1] = 0;
                count[dir, 2] = total;
                if total > 0 {
                    signal(credit[4 * dir + level] @ geo[3 - dir], min(total, CL_SLOTS));
                }
            }
            // Step i sends chunk rank - sign*(i+1) and receives chunk rank - sign*(i+2),
            // which step i+1 sends on. Within a step the sends run CL_SLOTS - 1 blocks
            // ahead of the receives, so CL_SLOTS blocks per direction can be in flight.
            for step_no in 0..size - 1 {
                var most: i32 = 0;
                for dir in 0..dirs {
                    let sign = 1 - 2 * dir;
                    cl_part(seg_lo, seg_hi, size, rank - sign * (step_no + 1), dir, dirs, part);
                    span[dir, 0] = part[0];
                    span[dir, 1] = part[1];
                    cl_part(seg_lo, seg_hi, size, rank - sign * (step_no + 2), dir, dirs, part);
                    span[dir, 2] = part[0];
                    span[dir, 3] = part[1];
                    most = max(most, max(span[dir, 1] - span[dir, 0], span[dir, 3] - span[dir, 2]));
                }
                for item in 0..most + CL_SLOTS - 1 {
                    for dir in 0..dirs {
                        let blk = span[dir, 0] + item;
                        if blk < span[dir, 1] {
                            let slot_no = CL_SLOTS * dir + count[dir, 0] % CL_SLOTS;
                            wait(credit[4 * dir + level], 1);
                            start copy(x[blk * br +: br, :], slot[slot_no] @ geo[2 + dir], send, recv[slot_no]);
                            count[dir, 0] = count[dir, 0] + 1;
                        }
                    }
                    for dir in 0..dirs {
                        let blk = span[dir, 2] + item - (CL_SLOTS - 1);
                        if blk >= span[dir, 2] && blk < span[dir, 3] {
                            let slot_no = CL_SLOTS * dir + count[dir, 1] % CL_SLOTS;
                            wait(recv[slot_no], block_bytes);
                            // the sender's partial sum + our block: the ring order above
                            x[blk * br +: br, :] = slot[slot_no] + x[blk * br +: br, :];
                            if count[dir, 1] + CL_SLOTS < count[dir, 2] {
                                signal(credit[4 * dir + level] @ geo[3 - dir], 1);
                            }
                            count[dir, 1] = count[dir, 1] + 1;
                        }
                    }
                }
            }
            for dir in 0..dirs {
                wait(send, count[dir, 0] * block_bytes);
                if gather == 1 {
                    signal(credit[4 * dir + level] @ geo[3 - dir], 1);
                }
            }
        }
    }
    cl_descend(level, seg);
}

// All-gather over the ring of `level`: this core owns chunk `rank` of the segment
// that cl_rs_level or cl_descend saved for the level; afterwards it holds the whole
// segment. granted = 1: the reduce-scatter of this level already told our senders we
// are ready.
//
// Step i's blocks of direction dir arrive on recv[rstride * dir + i % CL_AG_SEMS] and
// leave on send[i % CL_AG_SEMS] (rstride >= CL_AG_SEMS). Before step i reuses the
// semaphores of step i - CL_AG_SEMS, the sender waits for that step's blocks to land,
// so a receiver's count for step i can only be step i's bytes. (With one semaphore
// for every step, a block of step i+1 landing before a late one of step i would let
// the receiver pass on bytes still on their way.) The later steps' blocks may still
// be in flight: they count on the other semaphores. On a long ring the blocks of step
// i-2 may still be moving when step i is due: on a line of 8 chips, whose
// wrap-around crosses every link, CL_AG_SEMS = 2 makes the all-reduce 9% slower than
// 4 does, which costs 2 more semaphores per direction and 2 more send semaphores.
fn cl_ag_level(x: vmem f32[rows, cols], rows: i32, cols: i32, br: i32, dirs: i32, level: i32,
               granted: i32, seg: smem i32[10], recv: sem[rstride * dirs], rstride: i32,
               send: sem[CL_AG_SEMS], credit: sem[4 * dirs]) {
    smem geo: i32[4];
    smem part: i32[2];
    smem sent: i32[CL_AG_SEMS];  // per rotation slot: blocks sent and not yet waited for
    cl_ring(level, geo);
    let size = geo[0];
    let rank = geo[1];
    let seg_lo = seg[2 + 2 * level];
    let seg_hi = seg[3 + 2 * level];
    let block_bytes = br * cols * 4;
    if size > 1 {
        region "all_gather" (level) {
            if granted == 0 {
                // Ready: our senders may now write the chunks we do not own.
                for dir in 0..dirs {
                    signal(credit[4 * dir + level] @ geo[3 - dir], 1);
                }
            }
            for dir in 0..dirs {
                wait(credit[4 * dir + level], 1);
            }
            for turn_no in 0..CL_AG_SEMS {
                sent[turn_no] = 0;
            }
            // Step i passes on chunk rank - sign*i (ours at i = 0) straight into the
            // receiver's x and receives chunk rank - sign*(i+1) into ours.
            for step_no in 0..size - 1 {
                let turn = step_no % CL_AG_SEMS;
                wait(send[turn], sent[turn] * block_bytes);     // step i - CL_AG_SEMS
                sent[turn] = 0;
                for dir in 0..dirs {
                    let sign = 1 - 2 * dir;
                    cl_part(seg_lo, seg_hi, size, rank - sign * step_no, dir, dirs, part);
                    for blk in part[0]..part[1] {
                        start copy(x[blk * br +: br, :], x[blk * br +: br, :] @ geo[2 + dir],
                                   send[turn], recv[rstride * dir + turn]);
                    }
                    sent[turn] = sent[turn] + part[1] - part[0];
                }
                for dir in 0..dirs {
                    let sign = 1 - 2 * dir;
                    cl_part(seg_lo, seg_hi, size, rank - sign * (step_no + 1), dir, dirs, part);
                    wait(recv[rstride * dir + turn], (part[1] - part[0]) * block_bytes);
                }
            }
            for turn_no in 0..CL_AG_SEMS {
                wait(send[turn_no], sent[turn_no] * block_bytes);
            }
        }
    }
    seg[0] = seg_lo;
    seg[1] = seg_hi;
}

// ---------------------------------------------------------------- ring collectives

// All-reduce: afterwards every participant holds, in blocks 0 .. nblocks-1 of x, the
// sum over all participants (reduce-scatter over levels 0, 3, 2, 1, then all-gather
// over 1, 2, 3, 0). Blocks from nblocks on are left alone.
fn all_reduce(x: vmem f32[rows, cols], rows: i32, cols: i32, br: i32, dirs: i32, nblocks: i32) {
    assert br > 0, "all_reduce: the block rows br must be positive"; assert rows % br == 0, "all_reduce: rows must be a multiple of the block rows br";
    assert dirs == 1 || dirs == 2, "all_reduce: dirs is 1 (rings) or 2 (bidirectional rings)";
    vmem slot: f32[CL_SLOTS * dirs][br, cols];
    sem recv[CL_RECV * dirs];
    sem send[CL_AG_SEMS];
    sem credit[4 * dirs];
    smem seg: i32[10];
    cl_check_blocks(nblocks, rows / br, send[0]);
    seg[0] = 0;
    seg[1] = nblocks;
    cl_rs_level(x, rows, cols, br, dirs, 0, 0, seg, slot, recv, CL_RECV, send[0], credit);
    cl_rs_level(x, rows, cols, br, dirs, 3, 0, seg, slot, recv, CL_RECV, send[0], credit);
    cl_rs_level(x, rows, cols, br, dirs, 2, 0, seg, slot, recv, CL_RECV, send[0], credit);
    cl_rs_level(x, rows, cols, br, dirs, 1, 1, seg, slot, recv, CL_RECV, send[0], credit);
    cl_ag_level(x, rows, cols, br, dirs, 1, 1, seg, recv, CL_RECV, send, credit);
    cl_ag_level(x, rows, cols, br, dirs, 2, 0, seg, recv, CL_RECV, send, credit);
    cl_ag_level(x, rows, cols, br, dirs, 3, 0, seg, recv, CL_RECV, send, credit);
    cl_ag_level(x, rows, cols, br, dirs, 0, 0, seg, recv, CL_RECV, send, credit);
}

// All-reduce over the ring of one level only: level 0 sums over this chip's cores,
// level 1, 2, 3 over the chips along mesh axis X, Y, Z (the same core on each).
fn all_reduce_level(x: vmem f32[rows, cols], rows: i32, cols: i32, br: i32, dirs: i32, level: i32,
                    nblocks: i32) {
    assert br > 0, "all_reduce_level: the block rows br must be positive"; assert rows % br == 0, "all_reduce_level: rows must be a multiple of the block rows br";
    assert dirs == 1 || dirs == 2, "all_reduce_level: dirs is 1 (ring) or 2 (bidirectional ring)";
    assert level >= 0 && level <= 3, "all_reduce_level: level is 0 (cores) or 1, 2, 3 (mesh axis X, Y, Z)";
    vmem slot: f32[CL_SLOTS * dirs][br, cols];
    sem recv[CL_RECV * dirs];
    sem send[CL_AG_SEMS];
    sem credit[4 * dirs];
    smem seg: i32[10];
    cl_check_blocks(nblocks, rows / br, send[0]);
    seg[0] = 0;
    seg[1] = nblocks;
    cl_rs_level(x, rows, cols, br, dirs, level, 1, seg, slot, recv, CL_RECV, send[0], credit);
    cl_ag_level(x, rows, cols, br, dirs, level, 1, seg, recv, CL_RECV, send, credit);
}

// Reduce-scatter: afterwards participant p holds the sum over all participants of its
// own part of blocks 0 .. nblocks-1: the p-th of P equal parts when P divides nblocks
// (in general the nested chunks described at the top). Other blocks hold partial sums.
fn reduce_scatter(x: vmem f32[rows, cols], rows: i32, cols: i32, br: i32, dirs: i32, nblocks: i32) {
    assert br > 0, "reduce_scatter: the block rows br must be positive"; assert rows % br == 0, "reduce_scatter: rows must be a multiple of the block rows br";
    assert dirs == 1 || dirs == 2, "reduce_scatter: dirs is 1 (rings) or 2 (bidirectional rings)";
    vmem slot: f32[CL_SLOTS * dirs][br, cols];
    sem recv[CL_SLOTS * dirs];
    sem send;
    sem credit[4 * dirs];
    smem seg: i32[10];
    cl_check_blocks(nblocks, rows / br, send);
    seg[0] = 0;
    seg[1] = nblocks;
    cl_rs_level(x, rows, cols, br, dirs, 0, 0, seg, slot, recv, CL_SLOTS, send, credit);
    cl_rs_level(x, rows, cols, br, dirs, 3, 0, seg, slot, recv, CL_SLOTS, send, credit);
    cl_rs_level(x, rows, cols, br, dirs, 2, 0, seg, slot, recv, CL_SLOTS, send, credit);
    cl_rs_level(x, rows, cols, br, dirs, 1, 0, seg, slot, recv, CL_SLOTS, send, credit);
}

// All-gather: participant p brings its own part of blocks 0 .. nblocks-1 (the part
// reduce_scatter leaves it); afterwards every participant holds all the parts.
fn all_gather(x: vmem f32[rows, cols], rows: i32, cols: i32, br: i32, dirs: i32, nblocks: i32) {
    assert br > 0, "all_gather: the block rows br must be positive"; assert rows % br == 0, "all_gather: rows must be a multiple of the block rows br";
    assert dirs == 1 || dirs == 2, "all_gather: dirs is 1 (rings) or 2 (bidirectional rings)";
    sem recv[CL_AG_SEMS * dirs];
    sem send[CL_AG_SEMS];
    sem credit[4 * dirs];
    smem seg: i32[10];
    cl_check_blocks(nblocks, rows / br, send[0]);
    seg[0] = 0;
    seg[1] = nblocks;
    cl_descend(0, seg);
    cl_descend(3, seg);
    cl_descend(2, seg);
    cl_descend(1, seg);
    cl_ag_level(x, rows, cols, br, dirs, 1, 0, seg, recv, CL_AG_SEMS, send, credit);
    cl_ag_level(x, rows, cols, br, dirs, 2, 0, seg, recv, CL_AG_SEMS, send, credit);
    cl_ag_level(x, rows, cols, br, dirs, 3, 0, seg, recv, CL_AG_SEMS, send, credit);
    cl_ag_level(x, rows, cols, br, dirs, 0, 0, seg, recv, CL_AG_SEMS, send, credit);
}

// Reduce-scatter over the ring of one level: afterwards the core of rank r in that
// ring holds the ring's sum of chunk r of blocks 0 .. nblocks-1.
fn reduce_scatter_level(x: vmem f32[rows, cols], rows: i32, cols: i32, br: i32, dirs: i32,
                        level: i32, nblocks: i32) {
    assert br > 0, "reduce_scatter_level: the block rows br must be positive"; assert rows % br == 0, "reduce_scatter_level: rows must be a multiple of the block rows br";
    assert dirs == 1 || dirs == 2, "reduce_scatter_level: dirs is 1 (ring) or 2 (bidirectional ring)";
    assert level >= 0 && level <= 3, "reduce_scatter_level: level is 0 (cores) or 1, 2, 3 (mesh axis X, Y, Z)";
    vmem slot: f32[CL_SLOTS * dirs][br, cols];
    sem recv[CL_SLOTS * dirs];
    sem send;
    sem credit[4 * dirs];
    smem seg: i32[10];
    cl_check_blocks(nblocks, rows / br, send);
    seg[0] = 0;
    seg[1] = nblocks;
    cl_rs_level(x, rows, cols, br, dirs, level, 0, seg, slot, recv, CL_SLOTS, send, credit);
}

// All-gather over the ring of one level: the core of rank r in that ring brings
// chunk r of blocks 0 .. nblocks-1; afterwards every core of the ring holds all of them.
fn all_gather_level(x: vmem f32[rows, cols], rows: i32, cols: i32, br: i32, dirs: i32,
                    level: i32, nblocks: i32) {
    assert br > 0, "all_gather_level: the block rows br must be positive"; assert rows % br == 0, "all_gather_level: rows must be a multiple of the block rows br";
    assert dirs == 1 || dirs == 2, "all_gather_level: dirs is 1 (ring) or 2 (bidirectional ring)";
    assert level >= 0 && level <= 3, "all_gather_level: level is 0 (cores) or 1, 2, 3 (mesh axis X, Y, Z)";
    sem recv[CL_AG_SEMS * dirs];
    sem send[CL_AG_SEMS];
    sem credit[4 * dirs];
    smem seg: i32[10];
    cl_check_blocks(nblocks, rows / br, send[0]);
    seg[0] = 0;
    seg[1] = nblocks;
    cl_descend(level, seg);
    cl_ag_level(x, rows, cols, br, dirs, level, 0, seg, recv, CL_AG_SEMS, send, credit);
}

// ---------------------------------------------------------------- all-to-all

// One piece of cl_rows: if `count` has the bit `piece`, move the `piece` rows that
// belong to that bit, rows [src + off, src + off + piece) of x to the same offset from
// `dst` in y, on global core `target` (on this core when local = 1).
fn cl_rows_piece(x: vmem f32[xrows, cols], y: vmem f32[yrows, cols], xrows: i32, yrows: i32, cols: i32,
                 piece: i32, cap: i32, src: i32, dst: i32, rows_to_move: i32, local: i32, target: i32,
                 send: sem, recv: sem) {
    if piece <= cap {
        if rows_to_move % (2 * piece) >= piece {
            let off = rows_to_move - rows_to_move % (2 * piece);     // rows of the larger pieces
            if local == 1 {
                start copy(x[src + off +: piece, :], y[dst + off +: piece, :], send);
            } else {
                start copy(x[src + off +: piece, :], y[dst + off +: piece, :] @ target, send, recv);
            }
        }
    }
}

// Rows [src, src + rows_to_move) of x to rows [dst, ...) of y (a run-time row count,
// at most cap), as one DMA of static size per power of two in rows_to_move.
fn cl_rows(x: vmem f32[xrows, cols], y: vmem f32[yrows, cols], xrows: i32, yrows: i32, cols: i32,
           cap: i32, src: i32, dst: i32, rows_to_move: i32, local: i32, target: i32,
           send: sem, recv: sem) {
    cl_rows_piece(x, y, xrows, yrows, cols, 4096, cap, src, dst, rows_to_move, local, target, send, recv);
    cl_rows_piece(x, y, xrows, yrows, cols, 2048, cap, src, dst, rows_to_move, local, target, send, recv);
    cl_rows_piece(x, y, xrows, yrows, cols, 1024, cap, src, dst, rows_to_move, local, target, send, recv);
    cl_rows_piece(x, y, xrows, yrows, cols, 512, cap, src, dst, rows_to_move, local, target, send, recv);
    cl_rows_piece(x, y, xrows, yrows, cols, 256, cap, src, dst, rows_to_move, local, target, send, recv);
    cl_rows_piece(x, y, xrows, yrows, cols, 128, cap, src, dst, rows_to_move, local, target, send, recv);
    cl_rows_piece(x, y, xrows, yrows, cols, 64, cap, src, dst, rows_to_move, local, target, send, recv);
    cl_rows_piece(x, y, xrows, yrows, cols, 32, cap, src, dst, rows_to_move, local, target, send, recv);
    cl_rows_piece(x, y, xrows, yrows, cols, 16, cap, src, dst, rows_to_move, local, target, send, recv);
    cl_rows_piece(x, y, xrows, yrows, cols, 8, cap, src, dst, rows_to_move, local, target, send, recv);
    cl_rows_piece(x, y, xrows, yrows, cols, 4, cap, src, dst, rows_to_move, local, target, send, recv);
    cl_rows_piece(x, y, xrows, yrows, cols, 2, cap, src, dst, rows_to_move, local, target, send, recv);
    cl_rows_piece(x, y, xrows, yrows, cols, 1, cap, src, dst, rows_to_move, local, target, send, recv);
}

// All-to-all with per-destination row counts known only at run time (MoE dispatch
// and combine). With P = num_chips() * num_cores() participants (P <= maxp),
// participant p sends rows [d*cap, d*cap + cnt[d]) of x to participant d, where they
// land at rows [p*cap, p*cap + cnt[d]) of d's y; rcnt[s] becomes the number of rows
// participant s sent. Rows of y past the received counts and entries of rcnt from P
// on are not written. Needs 0 <= cnt[d] <= cap, unchecked (all_to_all_checked checks).
// Order: every participant first tells all others that its y and rcnt may be
// written; then it sends count and rows to p+1, p+2, ... (staggered, so at any moment
// the participants send to different destinations), one DMA per power of two in the
// count, and finally waits for the counts, then for the rows they announce.
fn all_to_all(x: vmem f32[maxp * cap, cols], y: vmem f32[maxp * cap, cols],
              cnt: smem i32[maxp], rcnt: smem i32[maxp], maxp: i32, cap: i32, cols: i32) {
    assert cap < CL_MAX_ROWS, "all_to_all: cap must be below 8192 rows";
    sem fits;
    sem ready;
    sem count_sent;
    sem count_arrived;
    sem rows_sent;
    sem rows_arrived;
    let chips = num_chips();
    let parts = chips * num_cores();
    if parts <= maxp {
        signal(fits, 1);
    }
    wait(fits, 1);      // stuck here? more participants than the buffers have room for (maxp)
    let me = core_id() * chips + chip_id();
    for offset in 1..parts {
        let peer_no = (me + offset) % parts;
        signal(ready @ global_core(peer_no % chips, peer_no / chips), 1);
    }
    wait(ready, parts - 1);
    rcnt[me] = cnt[me];
    cl_rows(x, y, maxp * cap, maxp * cap, cols, cap, me * cap, me * cap, cnt[me], 1, 0,
            rows_sent, rows_arrived);
    var rows_out: i32 = cnt[me];
    for offset in 1..parts {
        let peer_no = (me + offset) % parts;
        let target = global_core(peer_no % chips, peer_no / chips);
        start copy(cnt[peer_no +: 1], rcnt[me +: 1] @ target, count_sent, count_arrived);
        cl_rows(x, y, maxp * cap, maxp * cap, cols, cap, peer_no * cap, me * cap, cnt[peer_no], 0,
                target, rows_sent, rows_arrived);
        rows_out += cnt[peer_no];
    }
    wait(count_arrived, 4 * (parts - 1));
    var rows_in: i32 = 0;
    for peer_no in 0..parts {
        if peer_no != me {
            rows_in += rcnt[peer_no];
        }
    }
    wait(rows_arrived, rows_in * cols * 4);
    wait(count_sent, 4 * (parts - 1));
    wait(rows_sent, rows_out * cols * 4);
}

// all_to_all after a check of this participant's counts: stop here, with a deadlock
// report naming every core (those with a bad count at this line, the others waiting
// for their "ready" in all_to_all), unless 0 <= cnt[d] <= cap for every participant d.
// all_to_all itself does not check: a count out of range ends in a fault far from
// its cause, or in none (docs/collectives.md, All-to-all). One more semaphore (7) and
// a few instructions per participant.
fn all_to_all_checked(x: vmem f32[maxp * cap, cols], y: vmem f32[maxp * cap, cols],
                      cnt: smem i32[maxp], rcnt: smem i32[maxp], maxp: i32, cap: i32, cols: i32) {
    sem counts_ok;
    var counts_bad: i32 = 0;
    for peer_no in 0..min(num_chips() * num_cores(), maxp) {
        if cnt[peer_no] < 0 || cnt[peer_no] > cap {
            counts_bad = 1;
        }
    }
    if counts_bad == 0 {
        signal(counts_ok, 1);
    }
    wait(counts_ok, 1);     // stuck here? a count cnt[d] is outside 0 .. cap
    all_to_all(x, y, cnt, rcnt, maxp, cap, cols);
}
