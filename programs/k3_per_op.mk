// Kimi-K3 decode, one kernel per operator (the per-op baseline).
//
// The host launches, for every layer in order: norm, each projection, each all-gather,
// the KDA conv, gating, state update and output norm (or MLA latent norms + cache row,
// absorbed attention), each head's part of the output projection, the attention
// all-reduce, residual add, norm, then the dense FFN or the MoE, residual add; then the
// final norm, LM head and its gather. The MoE is picked at compile time by SCHEME
// (programs/k3/shard.mk): tensor parallel (0: router, top-k, each routed-expert slot,
// each shared expert, the MoE all-reduce of their outputs, moe_up, its gather) or expert
// parallel (1: router, top-k, the all-to-all dispatch, the owners' experts with the
// combine's return, each shared expert at the rows' homes, the homes' psum, moe_up on
// the homes' rows, their gather). Every intermediate goes to HBM and comes back in the
// next kernel; every launch pays the profile's launch overhead. Same maths
// (programs/k3/model.mk), the same HBM arrays (programs/k3/tensors.mk) and the same bits
// as the super-operators and the megakernel; the kernels are in programs/k3/ops.mk and
// programs/k3/ep_ops.mk (expert parallel).
//
// The launch sequence is fixed at compile time, so the layer layout is the K3 one:
// dense FFN at layer 0, gated MLA at layers l % 4 == 3 and the last layer, KDA elsewhere.
import "k3/tensors.mk";
import "k3/embed.mk";
import "k3/ops.mk";
import "k3/ep_ops.mk";

reference "mkemu.programs.k3.driver:drive";

// The library's VMEM all-reduce is not used here (kernel boundaries, HBM parts); its
// buffers, sized for one slot, are only part of the working sets the kernels share.
param GROT = 1 in {1} "slots of the library's collective buffers: one (not used here: kernel boundaries order everything)";

assert NMLA == NLAYERS / 4 + i32(NLAYERS % 4 != 0),
    "k3_per_op.mk unrolls the K3 layer layout (MLA at l % 4 == 3 and at the last layer)";

// ------------------------------------------------------- MoE, expert parallel (SCHEME = 1)

// The homes send their rows' latent inputs to the experts' owners (the all-to-all with counts).
kernel ep_dispatch(topi: hbm i32[BATCH * TOPK], xl: hbm f32[BATCH, LATENT],
                   ep_x: hbm f32[CORES_PER_CHIP * EP_INBOX, LATENT], ep_tag: hbm i32[CORES_PER_CHIP * EP_INBOX],
                   ep_cnt: hbm i32[CORES_PER_CHIP * NHOME]) {
    op_ep_dispatch(topi, xl, ep_x, ep_tag, ep_cnt);
}
// The owners run the experts they received rows for and send the results to the rows' homes.
kernel ep_experts(ep_x: hbm f32[CORES_PER_CHIP * EP_INBOX, LATENT], ep_tag: hbm i32[CORES_PER_CHIP * EP_INBOX],
                  ep_cnt: hbm i32[CORES_PER_CHIP * NHOME], w: K3Weights, eo: hbm f32[NROWS_EO, LATENT], fi: i32) {
    op_ep_experts(ep_x, ep_tag, ep_cnt, w, eo, fi);
}
// The homes weight the routed parts and psum them with the shared experts' into z.
kernel ep_combine(eo: hbm f32[NROWS_EO, LATENT], topw: hbm f32[BATCH, TOPK], z: hbm f32[BATCH, LATENT]) {
    op_ep_combine(eo, topw, z);
}
// moe_up on the rows' homes, then the rows all-gathered.
kernel proj_rows<K, N>(x: hbm f32[BATCH, K], w: hbm bf16[K, N], y: hbm f32[BATCH, N]) {
    op_proj_rows(x, w, y);
}
kernel gather_rows<N>(y: hbm f32[BATCH, N]) { op_gather_rows(y); }

// ------------------------------------------------------------------------- host

host {
    input w: K3Weights;
    input io: K3Io;
    hbm st: K3State;
    output o: K3Out;
    // intermediates
    hbm h: f32[BATCH, DIM];
    hbm xn: f32[BATCH, DIM];
    hbm a_q: f32[BATCH, W];
    hbm a_k: f32[BATCH, W];
    hbm a_v: f32[BATCH, W];
    hbm a_g: f32[BATCH, W];
    hbm a_og: f32[BATCH, W];
    hbm a_beta: f32[BATCH, 128];
    hbm a_qn: f32[BATCH, W];
    hbm a_kn: f32[BATCH, W];
    hbm a_vn: f32[BATCH, W];
    hbm a_gd: f32[BATCH, W];
    hbm a_bs: f32[BATCH, W];
    hbm a_core: f32[BATCH, W];
    hbm a_o: f32[BATCH, W];
    hbm a_parts: f32[HEADS * BATCH, DIM];
    hbm a_attn: f32[BATCH, DIM];
    hbm m_lq: f32[BATCH, QRANK];
    hbm m_lkv: f32[BATCH, KVRANK];
    hbm m_cq: f32[BATCH, QRANK];
    hbm m_q: f32[BATCH, W];
    hbm m_gate: f32[BATCH, W];
    hbm d_a: f32[BATCH, DENSE_INTER];
    hbm d_b: f32[BATCH, DENSE_INTER];
    hbm d_u: f32[BATCH, DENSE_INTER];
    hbm e_rl: f32[BATCH, NEXP];
    hbm e_xl: f32[BATCH, LATENT];
    hbm e_topi: i32[BATCH * TOPK];
    hbm e_topw: f32[BATCH, TOPK];
    hbm e_out: f32[NROWS_EO, LATENT];
    // expert-parallel inboxes: rows, tags and counts of each core of the chip (ep_ops.mk)
    hbm ep_x: f32[CORES_PER_CHIP * EP_INBOX, LATENT];
    hbm ep_tag: i32[CORES_PER_CHIP * EP_INBOX];
    hbm ep_cnt: i32[CORES_PER_CHIP * NHOME];
    hbm e_z: f32[BATCH, LATENT];
    hbm f_out: f32[BATCH, DIM];

    launch embed_tokens(w, io, h);
    for l in 0..NLAYERS {
        // ---- attention
        launch norm(h, w.attn_norm[l], xn);
        if l % 4 == 3 || l == NLAYERS - 1 {
            let mi = select(l % 4 == 3, l / 4, NMLA - 1);
            launch proj(xn, w.mla_wdq[mi], m_lq);
            launch gather(m_lq);
            launch proj(xn, w.mla_wdkv[mi], m_lkv);
            launch gather(m_lkv);
            launch mla_latent(m_lq, m_lkv, w, st, io, mi, m_cq);
            launch proj(m_cq, w.mla_wuq[mi], m_q);
            launch proj(xn, w.mla_wgate[mi], m_gate);
            launch mla_attention(m_q, m_gate, w, st, io, mi, a_o);
            launch attn_part(a_o, w.mla_wo[mi], a_parts);
        } else {
            let ai = l - l / 4;
            if KSH {        // each chip holds its heads' columns (shard.mk)
                launch head_proj(xn, w.kda_wq[ai], a_q);
                launch head_proj(xn, w.kda_wk[ai], a_k);
                launch head_proj(xn, w.kda_wv[ai], a_v);
                launch head_proj(xn, w.kda_wg[ai], a_g);
                launch proj(xn, w.kda_wb[ai], a_beta);
                launch head_proj(xn, w.kda_wog[ai], a_og);
            } else {
                launch proj(xn, w.kda_wq[ai], a_q);
                launch proj(xn, w.kda_wk[ai], a_k);
                launch proj(xn, w.kda_wv[ai], a_v);
                launch proj(xn, w.kda_wg[ai], a_g);
                launch proj(xn, w.kda_wb[ai], a_beta);
                launch proj(xn, w.kda_wog[ai], a_og);
            }
            launch gather(a_beta);
            if SPECR {
                launch kda_conv_spec(a_q, a_k, a_v, w, st, io, ai, a_qn, a_kn, a_vn);
            } else {
                launch kda_conv(a_q, a_k, a_v, w, st, ai, a_qn, a_kn, a_vn);
            }
            launch kda_gate(a_g, a_beta, w, ai, a_gd, a_bs);
            if SPECR {
                launch kda_update_spec(a_qn, a_kn, a_vn, a_gd, a_bs, st, io, ai, a_core);
            } else {
                launch kda_update_state(a_qn, a_kn, a_vn, a_gd, a_bs, st, ai, a_core);
            }
            launch kda_output(a_core, a_og, w, ai, a_o);
            if KSH {
                launch head_part(a_o, w.kda_wo[ai], a_parts);
            } else {
                launch attn_part(a_o, w.kda_wo[ai], a_parts);
            }
        }
        launch allreduce_attn(a_parts, a_attn);
        launch residual(h, a_attn, o.dbg_attn[l]);
        // ---- FFN
        launch norm(h, w.ffn_norm[l], xn);
        if l == 0 {
            launch proj(xn, w.dense_w1[0], d_a);
            launch proj(xn, w.dense_w3[0], d_b);
            launch swiglu(d_a, d_b, d_u);
            launch gather(d_u);
            launch proj(d_u, w.dense_w2[0], f_out);
            launch gather(f_out);
        } else {
            let fi = l - 1;
            launch router_proj(xn, w.moe_router[fi], e_rl);
            launch gather(e_rl);
            launch proj(xn, w.moe_down[fi], e_xl);
            launch gather(e_xl);
            launch topk(e_rl, w, fi, e_topi, e_topw);
            if EXPERT_PARALLEL {
                launch ep_dispatch(e_topi, e_xl, ep_x, ep_tag, ep_cnt);
                launch ep_experts(ep_x, ep_tag, ep_cnt, w, e_out, fi);
            } else {
                for j in 0..TOPK {
                    launch expert(e_xl, e_topi, e_topw, w, e_out, fi, j);
                }
            }
            for sx in 0..NSHARED {
                launch shared_expert(e_xl, w, e_out, fi, sx);
            }
            if EXPERT_PARALLEL {
                launch ep_combine(e_out, e_topw, e_z);
                launch proj_rows(e_z, w.moe_up[fi], f_out);
                launch gather_rows(f_out);
            } else {
                launch allreduce_moe(e_out, e_z);
                launch proj(e_z, w.moe_up[fi], f_out);
                launch gather(f_out);
            }
        }
        launch residual(h, f_out, o.dbg_ffn[l]);
    }
    launch norm(h, w.final_norm, xn);
    launch lm_proj(xn, w.lm_head, o.logits);
    launch gather(o.logits);
}
