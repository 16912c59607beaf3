// The K3 programs' HBM arrays, declared once for all three programs (per-op, super-op,
// megakernel): the weights (one member per tensor of programs/k3/weights.py, same name
// and shape, so the driver writes them by name), the decode state, the step's inputs
// and its outputs. A program's host block makes one instance of each
// (`input w: K3Weights;` makes the 40 input arrays), its kernels take them whole
// (`kernel k(w: K3Weights, ...)`), and every library fn reads `w.kda_wq[...]`.
//
// Tensors with more than three axes are stored flattened over their leading axes (HBM
// arrays have at most three): mla_wuk/wuv [NMLA*HEADS, ...], the experts
// [NMOE*NEXP, ...] and [NMOE*NSHARED, ...] (same bytes, row-major).
//
// A chip's arrays may hold only its share (shard.mk, "per-chip HBM homes"): the routed
// experts [NMOE*NEL, ...] (NEL = NEXP, or the EPC experts the chip is home to) and the KDA
// head projections [.., KWL] (KWL = W, or the KSL head blocks of the chip's cores).
//
// The routed experts are stored as ET (model.mk: bf16, or MXFP4 with EXPERT_MX = 1); the
// shared experts and every other weight are bf16.
import "model.mk";
import "shard.mk";

struct K3Weights {
    embed: hbm bf16[VOCAB, DIM];
    attn_norm: hbm bf16[NLAYERS, DIM];
    ffn_norm: hbm bf16[NLAYERS, DIM];
    kda_wq: hbm bf16[NKDA, DIM, KWL];
    kda_wk: hbm bf16[NKDA, DIM, KWL];
    kda_wv: hbm bf16[NKDA, DIM, KWL];
    kda_conv_q: hbm bf16[NKDA, CONVK, W];
    kda_conv_k: hbm bf16[NKDA, CONVK, W];
    kda_conv_v: hbm bf16[NKDA, CONVK, W];
    kda_wg: hbm bf16[NKDA, DIM, KWL];
    kda_a_log: hbm bf16[NKDA, W];
    kda_dt_bias: hbm bf16[NKDA, W];
    kda_wb: hbm bf16[NKDA, DIM, 128];
    kda_onorm: hbm bf16[NKDA, HD];
    kda_wog: hbm bf16[NKDA, DIM, KWL];
    kda_wo: hbm bf16[NKDA, KWL, DIM];
    mla_wdq: hbm bf16[NMLA, DIM, QRANK];
    mla_qnorm: hbm bf16[NMLA, QRANK];
    mla_wuq: hbm bf16[NMLA, QRANK, W];
    mla_wdkv: hbm bf16[NMLA, DIM, KVRANK];
    mla_kvnorm: hbm bf16[NMLA, KVRANK];
    mla_wuk: hbm bf16[NMLA * HEADS, HD, KVRANK];
    mla_wuv: hbm bf16[NMLA * HEADS, KVRANK, HD];
    mla_wgate: hbm bf16[NMLA, DIM, W];
    mla_wo: hbm bf16[NMLA, W, DIM];
    dense_w1: hbm bf16[NDENSE, DIM, DENSE_INTER];
    dense_w3: hbm bf16[NDENSE, DIM, DENSE_INTER];
    dense_w2: hbm bf16[NDENSE, DENSE_INTER, DIM];
    moe_router: hbm bf16[NMOE, DIM, NEXP];
    moe_bias: hbm bf16[NMOE, NEXP];
    moe_down: hbm bf16[NMOE, DIM, LATENT];
    moe_w1: hbm ET[NMOE * NEL, LATENT, EINTER];
    moe_w3: hbm ET[NMOE * NEL, LATENT, EINTER];
    moe_w2: hbm ET[NMOE * NEL, EINTER, LATENT];
    moe_shared_w1: hbm bf16[NMOE * NSHARED, LATENT, EINTER];
    moe_shared_w3: hbm bf16[NMOE * NSHARED, LATENT, EINTER];
    moe_shared_w2: hbm bf16[NMOE * NSHARED, EINTER, LATENT];
    moe_up: hbm bf16[NMOE, LATENT, DIM];
    final_norm: hbm bf16[DIM];
    lm_head: hbm bf16[DIM, VOCAB];
}

// The decode state, zero at load and kept in HBM across steps (every chip its own copy;
// a piece is read and written only by the core that owns it, docs/k3_programs.md):
// - kda_state: entry (ai*BATCH + b)*HEADS + h is S of KDA layer ai, row b, head h
//   (K rows, V columns);
// - conv_state: KDA layer ai, columns = channels; for row b = g*RB + i of row group g
//   (shard.mk), history s (0 oldest) of n = q, k, v at row (g*9 + n*3 + s)*RB + i;
// - mla_cache: one private copy per core of a chip (two head owners on one chip never
//   share it): entry (mi*CORES_PER_CHIP + core)*BATCH + b, rows = positions.
// Verify rows (SPEC, model.mk) are one sequence: kda_state entry (ai*BATCH + r)*HEADS + h
// and conv_state row (n*3 + s)*BATCH + r hold the state after row r, and the next step
// starts from the row spec_base names; the MLA cache has one entry per core and layer.
struct K3State {
    kda_state: hbm f32[NKDA * BATCH * HEADS, HD, HD];
    conv_state: hbm f32[NKDA, 9 * BATCH, W];
    mla_cache: hbm bf16[NMLA * CORES_PER_CHIP * NSEQ, MAXSEQ, KVRANK];
}

// The step's inputs, written by the driver: the layer plan (attention kind 0 KDA / 1 MLA,
// its index within its kind, FFN kind 0 dense / 1 MoE, its index), the tokens, the position
// (of row 0), and with verify rows (SPEC) the row of the previous step that was accepted last.
struct K3Io {
    layer_plan: hbm i32[NLAYERS, 4];
    tokens: hbm i32[BATCH];
    pos: hbm i32[1];
    spec_base: hbm i32[1];   // SPEC: the previous step's last accepted row (whose state this step starts from)
}

// The outputs: chip 0's logits, and each layer's attention and FFN output (the reference's
// layerL.attn / layerL.ffn, for the per-layer check).
struct K3Out {
    logits: hbm f32[BATCH, VOCAB];
    dbg_attn: hbm f32[NLAYERS, BATCH, DIM];
    dbg_ffn: hbm f32[NLAYERS, BATCH, DIM];
}
