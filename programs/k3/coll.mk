// The collective buffers of the megakernel and the super-operators: where other cores'
// pushes land (written by DMAs only, read after their semaphore counted every byte),
// one set per slot g = 0 .. GROT-1 (the megakernel rotates them by layer, slot l % GROT,
// GROT = 2 or 3, with a barrier every GROT layers; a super-operator is one layer, GROT = 1).
import "reduce.mk";
import "stream.mk";

struct Coll {
    g_a: vmem f32[GROT * NPA][BATCH, ACOLS];     // attention parts (head h, or core h's heads: LOCAL_A, in slot g*NPA + h)
    g_att: vmem f32[GROT][BATCH, DIM];           // the attention sum, gathered (reduce-scatter form)
    g_lat: vmem f32[GROT][BATCH, QRANK + KVRANK];   // the MLA latent, gathered (split form)
    g_rl: vmem f32[GROT][BATCH, EPAD + LATENT];  // [router logits | moe_down], gathered (split form)
    g_eo: vmem f32[GROT * PPE][BATCH, ECOLS];    // MoE parts, tensor parallel (routed slot j, then shared TOPK + s)
    g_z: vmem f32[GROT][BATCH, LATENT];          // the MoE sum, gathered (reduce-scatter form)
    g_f: vmem f32[GROT][BATCH, DIM];             // the FFN output, gathered
    g_u: vmem f32[BATCH, DENSE_INTER];           // the dense hidden, gathered (split form)
    g_lm: vmem f32[BATCH, select(LM_ROOT, VOCAB, 128)];   // the logits, on core 0 (LM_ROOT)
    r_o: sem[GROT];
    r_att: sem[GROT];
    r_lat: sem[GROT];
    r_rl: sem[GROT];
    r_eo: sem[GROT];
    r_z: sem[GROT];
    r_f: sem[GROT];
    r_u: sem;
    r_lm: sem;
    q: sem[NQ];                                  // the all-gathers' relays (gather.mk), by site
}

// Relay semaphore of each gathered site: q[QS_ATT] ... (one unused semaphore without relays).
const NQ = select(AG_RELAY, 6, 1);
const QS_ATT = min(0, NQ - 1);
const QS_LAT = min(1, NQ - 1);
const QS_RL = min(2, NQ - 1);
const QS_Z = min(3, NQ - 1);
const QS_F = min(4, NQ - 1);
const QS_U = min(5, NQ - 1);

// The attention sum of slot g (either form of the all-reduce).
fn attn_sum(c: Coll, g: i32, net: Net, me: i32) {
    ar_sum(c.g_a, g * NPA, LGH - LGT, min(HEADS, NPA) * BATCH, c.g_att[g], NDB, RS_A, me, NCORES, c.r_o[g],
           c.r_att[g], c.q[QS_ATT], net);
}
