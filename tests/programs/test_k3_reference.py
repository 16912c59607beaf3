"""The K3 model configs, weights and numpy reference decoder (programs/k3).

Each reference component is checked against a plain float64 numpy formula of the
same math (close, not bit-exact: the float64 side only shares the bf16 rounding of
matrix-unit inputs, and MLA is checked against the non-absorbed formulation). Then
whole-model properties: determinism, batch rows independent to the bit, a sensible
range over many steps, config validation and the k3-full parameter counts.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from mkemu.cli import main as cli_main
from mkemu.errors import ConfigError
from mkemu.isa import numerics
from mkemu.programs.k3 import reference as R
from mkemu.programs.k3.config import config_from_dict, list_configs, load_config, param_counts
from mkemu.programs.k3.weights import check_weights, generate_weight_bits, generate_weights

F64 = np.float64


@pytest.fixture(scope="module")
def tiny():
    cfg = load_config("k3-tiny")
    return cfg, generate_weights(cfg, seed=0)


def _x(cfg, batch, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal((batch, cfg.dim)) * scale).astype(np.float32)


def _state_dict(cfg, batch):
    return {k.removeprefix("state_"): v.copy() for k, v in R.init_state(cfg, batch).arrays().items()
            if k != "state_pos"}


def _close(actual, expected, rel):
    """max |actual - expected| within rel of expected's rms."""
    actual, expected = np.asarray(actual, F64), np.asarray(expected, F64)
    scale = np.sqrt(np.mean(expected**2))
    err = np.max(np.abs(actual - expected))
    assert err <= rel * scale, f"max error {err:.3g} > {rel} x rms {scale:.3g}"


# --------------------------------------------------------- float64 formulas


def bf(x):
    return numerics.bf16_round(np.asarray(x, np.float32)).astype(F64)


def mm64(x, w):
    """The matrix unit's math in float64: bf16 operands, exact-ish accumulation."""
    return bf(x) @ bf(w)


def sig64(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, F64)))


def silu64(x):
    return np.asarray(x, F64) * sig64(x)


def rms64(x, w, eps):
    x = np.asarray(x, F64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(w, F64)


def ffn64(x, w1, w3, w2):
    return mm64(silu64(mm64(x, w1)) * mm64(x, w3), w2)


def kda64(cfg, w, i, x, st):
    B, H, D = x.shape[0], cfg.n_heads, cfg.head_dim
    heads = {}
    for n in "qkv":
        u = mm64(x, w[f"kda_w{n}"][i])
        taps = np.concatenate([st[f"conv_{n}"], u[:, None]], axis=1)
        st[f"conv_{n}"] = taps[:, 1:]
        y = np.einsum("btc,tc->bc", taps, w[f"kda_conv_{n}"][i].astype(F64))
        heads[n] = silu64(y).reshape(B, H, D)
    l2 = lambda u: u / np.sqrt(np.sum(u * u, axis=-1, keepdims=True) + 1e-6)  # noqa: E731
    q, k, v = l2(heads["q"]) / np.sqrt(D), l2(heads["k"]), heads["v"]
    g = -5.0 * sig64(np.exp(w["kda_a_log"][i].astype(F64)) * (mm64(x, w["kda_wg"][i]) + w["kda_dt_bias"][i]))
    beta = sig64(mm64(x, w["kda_wb"][i]))[:, :H]
    S = st["S"] * np.exp(g).reshape(B, H, D)[..., None]
    S = S + np.einsum("bhk,bhv->bhkv", k, beta[..., None] * (v - np.einsum("bhk,bhkv->bhv", k, S)))
    st["S"] = S
    o = rms64(np.einsum("bhk,bhkv->bhv", q, S), w["kda_onorm"][i], cfg.eps)
    o = o * sig64(mm64(x, w["kda_wog"][i])).reshape(B, H, D)
    return mm64(o.reshape(B, H * D), w["kda_wo"][i])


def mla64(cfg, w, i, x, cache, pos):
    """Non-absorbed MLA: per-head keys and values are expanded from the latent cache."""
    H, D = cfg.n_heads, cfg.head_dim
    q = mm64(rms64(mm64(x, w["mla_wdq"][i]), w["mla_qnorm"][i], cfg.eps), w["mla_wuq"][i])
    cache[:, pos] = bf(rms64(mm64(x, w["mla_wdkv"][i]), w["mla_kvnorm"][i], cfg.eps))
    C = cache[:, : pos + 1]
    outs = []
    for h in range(H):
        keys = C @ w["mla_wuk"][i][h].astype(F64).T  # [B, T, D]
        values = C @ w["mla_wuv"][i][h].astype(F64)
        scores = np.einsum("bd,btd->bt", q[:, h * D:(h + 1) * D], keys) / np.sqrt(D)
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        outs.append(np.einsum("bt,btd->bd", p, values))
    o = np.concatenate(outs, axis=1) * sig64(mm64(x, w["mla_wgate"][i]))
    return mm64(o, w["mla_wo"][i])


def route64(cfg, logits, bias):
    s = sig64(logits)
    idx = np.argsort(-(s + bias), axis=1, kind="stable")[:, : cfg.top_k]
    chosen = np.take_along_axis(s, idx, axis=1)
    return idx, chosen / chosen.sum(axis=1, keepdims=True)


# ------------------------------------------------------------- components


@pytest.mark.parametrize("n", [128, 256, 300, 7168])
def test_rmsnorm_and_reductions(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((3, n)) * 4).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    np.testing.assert_allclose(R.rmsnorm(x, w, 1e-5), rms64(x, w, 1e-5), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(R.reduce_sum(x), x.astype(F64).sum(axis=-1), rtol=1e-5, atol=1e-3)
    assert np.array_equal(R.reduce_max(x), x.max(axis=-1))


@pytest.mark.parametrize("n_parts", [1, 2, 3, 4, 6, 18])
def test_psum_is_the_padded_halving_tree(n_parts):
    rng = np.random.default_rng(n_parts)
    parts = [(rng.standard_normal((2, 128)) * 10.0 ** rng.integers(-3, 4)).astype(np.float32)
             for _ in range(n_parts)]
    got = R.psum(parts)
    np.testing.assert_allclose(got, np.sum(np.array(parts, F64), axis=0), rtol=1e-5, atol=1e-2)
    # The order by hand: pad to a power of two, then x[i] += x[i + half] while half >= 1.
    level = parts + [np.zeros_like(parts[0])] * ((1 << (n_parts - 1).bit_length()) - n_parts)
    while len(level) > 1:
        half = len(level) // 2
        level = [level[i] + level[i + half] for i in range(half)]
    assert np.array_equal(got.view(np.uint32), level[0].view(np.uint32))


def test_head_partials_sum_to_the_projection():
    rng = np.random.default_rng(7)
    o = rng.standard_normal((3, 4 * 128)).astype(np.float32)
    wo = R.numerics.bf16_round(rng.standard_normal((4 * 128, 256)) / 20)
    got = R.head_partial_mm(o, wo, 128)
    _close(got, R.numerics.bf16_round(o).astype(F64) @ wo.astype(F64), 1e-5)


def test_l2norm_and_conv():
    rng = np.random.default_rng(1)
    u = rng.standard_normal((2, 3, 128)).astype(np.float32)
    expected = u / np.sqrt(np.sum(u.astype(F64) ** 2, axis=-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(R.l2norm(u), expected, rtol=1e-6, atol=1e-7)

    hist = rng.standard_normal((2, 3, 256)).astype(np.float32)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    w = rng.standard_normal((4, 256)).astype(np.float32)
    y, new_hist = R.causal_conv(x, hist, w)
    taps = np.concatenate([hist, x[:, None]], axis=1).astype(F64)
    np.testing.assert_allclose(y, np.einsum("btc,tc->bc", taps, w), rtol=1e-5, atol=1e-5)
    assert np.array_equal(new_hist, np.concatenate([hist[:, 1:], x[:, None]], axis=1))
    # The contract's order: ((w0*s0 + w1*s1) + w2*s2) + w3*u, one float32 rounding each.
    assert np.array_equal(y, ((w[0] * hist[:, 0] + w[1] * hist[:, 1]) + w[2] * hist[:, 2]) + w[3] * x)


def test_kda_steps_match_float64(tiny):
    cfg, w = tiny
    B, i = 3, 1
    st = _state_dict(cfg, B)
    st64 = {f"conv_{n}": np.zeros((B, cfg.conv_kernel - 1, cfg.attn_width)) for n in "qkv"}
    st64["S"] = np.zeros((B, cfg.n_heads, cfg.head_dim, cfg.head_dim))
    for step in range(5):
        x = _x(cfg, B, 10 + step)
        out = R.kda(cfg, w, i, x, st, lambda *a: None, "t")
        _close(out, kda64(cfg, w, i, x, st64), 5e-3)
        _close(st["kda_s"][i], st64["S"], 1e-4)


def test_mla_absorbed_matches_non_absorbed_float64(tiny):
    cfg, w = tiny
    B = 2
    st = _state_dict(cfg, B)
    cache64 = np.zeros((B, cfg.max_seq, cfg.kv_rank))
    for pos in range(6):
        x = _x(cfg, B, 20 + pos)
        out = R.mla(cfg, w, 0, x, st, pos, lambda *a: None, "t")
        # The absorbed form rounds q~, p and the context to bf16 on the way into the
        # matrix unit; the expanded float64 form does not: about 1% apart.
        _close(out, mla64(cfg, w, 0, x, cache64, pos), 3e-2)
    # Positions after the current one never contribute: the cache there is still zero.
    assert not st["mla_cache"][0][:, 6:].any()


def test_mla_masks_future_positions_exactly(tiny):
    cfg, w = tiny
    st = _state_dict(cfg, 1)
    st["mla_cache"][0][:, 5:] = 7.0  # garbage beyond the current position
    trace = {}
    R.mla(cfg, w, 0, _x(cfg, 1, 3), st, 2, trace.__setitem__, "t")
    p = trace["t.mla.p"]
    assert np.all(p[..., 3:] == 0.0) and np.all(p[..., :3] > 0)
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=1e-6)


def test_router_topk_and_renormalisation():
    cfg = load_config("k3-mini")
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((6, cfg.n_experts)).astype(np.float32) * 2
    bias = (0.3 * rng.standard_normal(cfg.n_experts)).astype(np.float32)
    idx, weight = R.route(cfg, logits, bias)
    idx64, weight64 = route64(cfg, logits, bias)
    assert np.array_equal(idx, idx64)
    np.testing.assert_allclose(weight, weight64, rtol=1e-6)
    # The bias picks experts but does not weight them; ties go to the lowest index.
    tied = np.zeros((1, cfg.n_experts), np.float32)
    idx, weight = R.route(cfg, tied, np.zeros(cfg.n_experts, np.float32))
    assert idx.tolist() == [list(range(cfg.top_k))]
    assert np.all(weight == np.float32(1 / cfg.top_k))


def test_moe_matches_float64(tiny):
    cfg, w = tiny
    i, x = 1, _x(cfg, 4, 7)
    trace = {}
    out = R.moe(cfg, w, i, x, trace.__setitem__, "t")
    idx, weight = route64(cfg, mm64(x, w["moe_router"][i]), w["moe_bias"][i])
    assert np.array_equal(trace["t.moe.idx"], idx)
    xl = mm64(x, w["moe_down"][i])
    z = np.zeros_like(xl)
    for b in range(x.shape[0]):
        for j in range(cfg.top_k):
            e = idx[b, j]
            expert = ffn64(xl[b:b + 1], w["moe_w1"][i][e], w["moe_w3"][i][e], w["moe_w2"][i][e])
            z[b] += weight[b, j] * expert[0]
    for j in range(cfg.n_shared):
        z += ffn64(xl, w["moe_shared_w1"][i][j], w["moe_shared_w3"][i][j], w["moe_shared_w2"][i][j])
    _close(out, mm64(z, w["moe_up"][i]), 5e-3)


def test_dense_ffn_matches_float64(tiny):
    cfg, w = tiny
    x = _x(cfg, 3, 8)
    args = (w["dense_w1"][0], w["dense_w3"][0], w["dense_w2"][0])
    _close(R.gated_ffn(x, *args), ffn64(x, *args), 5e-3)


# ------------------------------------------------------------- whole model


def test_weights_are_deterministic_and_complete(tiny):
    cfg, w = tiny
    again = generate_weights(cfg, seed=0)
    assert list(again) == list(w)
    assert all(np.array_equal(w[k], again[k]) for k in w)
    other = generate_weights(cfg, seed=1)
    assert not np.array_equal(w["lm_head"], other["lm_head"])
    for name, array in w.items():
        assert array.dtype == np.float32 and np.array_equal(array, numerics.bf16_round(array)), name
    check_weights(cfg, w)
    with pytest.raises(ConfigError, match="moe_w1"):
        check_weights(cfg, {**w, "moe_w1": w["moe_w1"][:, :1]})
    with pytest.raises(ConfigError, match="timing-only"):
        generate_weights(load_config("k3-full"))


@pytest.mark.parametrize("expert_dtype", ["bf16", "mxfp4"])
def test_weight_bits_kept_in_the_cache_are_the_drawn_ones(tiny, tmp_path, monkeypatch, expert_dtype):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cfg, _ = tiny
    drawn = generate_weights(cfg, seed=3, expert_dtype=expert_dtype)
    for _ in range(2):    # drawn and kept, then read back from the cache
        bits = generate_weight_bits(cfg, seed=3, expert_dtype=expert_dtype)
        assert list(bits) == list(drawn)
        assert all(np.array_equal(np.asarray(bits[k]), drawn[k]) for k in drawn)
    assert len(list((tmp_path / "mkemu" / "arrays").glob("*.npy"))) == 1


def test_a_flipped_byte_in_the_kept_weights_is_not_used(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cfg, _ = tiny
    drawn = generate_weights(cfg, seed=3)
    generate_weight_bits(cfg, seed=3)                     # drawn and kept
    (path,) = (tmp_path / "mkemu" / "arrays").glob("*.npy")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40                          # a bit of some weight, on disk
    path.write_bytes(bytes(data))
    for _ in range(2):    # drawn afresh and the file written over, then read back from it
        bits = generate_weight_bits(cfg, seed=3)
        assert all(np.array_equal(np.asarray(bits[k]), drawn[k]) for k in drawn)
    assert path.read_bytes() != bytes(data)


def test_batch_rows_are_independent_to_the_bit(tiny):
    cfg, w = tiny
    prompt = np.array([[1, 2, 3], [400, 5, 6], [7, 8, 9], [10, 11, 12]])
    full = R.generate(cfg, w, prompt, 4)
    for b in (0, 3):
        one = R.generate(cfg, w, prompt[b:b + 1], 4)
        assert np.array_equal(one.logits[:, 0], full.logits[:, b])
        assert np.array_equal(one.tokens[0], full.tokens[b])


def test_generate_feeds_prompt_then_greedy_tokens(tiny):
    cfg, w = tiny
    res = R.generate(cfg, w, np.array([[3, 1, 4]]), 3)
    assert res.logits.shape == (5, 1, cfg.vocab) and res.state.pos == 5
    assert res.inputs[:3, 0].tolist() == [3, 1, 4]
    assert res.tokens[0].tolist() == [int(np.argmax(res.logits[s, 0])) for s in (2, 3, 4)]
    assert res.inputs[3:, 0].tolist() == res.tokens[0, :2].tolist()
    with pytest.raises(ValueError, match="max_seq"):
        R.generate(cfg, w, np.zeros((1, 10), int), cfg.max_seq)
    with pytest.raises(ValueError, match="batch"):
        R.init_state(cfg, 9)


def test_trace_names_every_layer_in_order(tiny):
    cfg, w = tiny
    trace = {}
    logits, state = R.decode_step(cfg, w, R.init_state(cfg, 2), np.array([5, 6]), trace=trace)
    names = list(trace)
    assert names[0] == "embed" and names[-1] == "final.logits"
    assert np.array_equal(trace["final.logits"], logits)
    hs = [n for n in names if n.endswith(".h")]
    assert hs == [f"layer{l}.h" for l in range(cfg.n_layers)]
    assert "layer3.mla.p" in trace and "layer0.kda.g" in trace and "layer1.moe.idx" in trace
    assert state.pos == 1 and trace["layer3.mla.c_new"].shape == (2, cfg.kv_rank)


def _check_range(cfg, w, batch, steps):
    prompt = np.random.default_rng(0).integers(0, cfg.vocab, (batch, 2))
    res = R.generate(cfg, w, prompt, steps - 1)
    assert np.all(np.isfinite(res.logits))
    std = res.logits.std(axis=-1)
    assert np.all((0.3 < std) & (std < 10)), std
    last = {}
    R.decode_step(cfg, w, R.init_state(cfg, batch), res.tokens[:, -1], trace=last)
    for l in range(cfg.n_layers):
        h = last[f"layer{l}.h"]
        assert np.all(np.isfinite(h)) and np.abs(h).max() < 50, (l, np.abs(h).max())
    assert np.all(np.abs(res.state.kda_s) < 100)
    # Greedy decoding does not collapse onto one token.
    assert len(np.unique(res.tokens)) > res.tokens.size // 2


def test_sensible_range_tiny_32_steps(tiny):
    cfg, w = tiny
    long = attrs.evolve(cfg, max_seq=32)
    _check_range(long, w, 2, 32)


def test_sensible_range_mini_8_steps():
    cfg = load_config("k3-mini")
    _check_range(cfg, generate_weights(cfg, seed=3), 1, 8)


# ------------------------------------------------------------------ configs


def test_shipped_configs_and_full_counts():
    assert list_configs() == ["k3-full", "k3-mini", "k3-tiny"]
    full = load_config("k3-full")
    assert (len(full.kda_layers), len(full.mla_layers)) == (69, 24)
    assert full.mla_layers[-1] == 92 and all(l % 4 == 3 for l in full.mla_layers[:-1])
    c = param_counts(full)
    assert abs(c.total / 2.8e12 - 1) < 0.05, c.total
    assert abs(c.active / 104e9 - 1) < 0.05, c.active
    assert c.bytes_per_token_bf16 == 2 * c.streamed
    assert c.bytes_per_token_mxfp4_experts < c.bytes_per_token_bf16
    mini = load_config("k3-mini")
    assert mini.mla_layers == (3, 7) and mini.layer_plan()[7].attn_index == 1
    assert mini.layer_plan()[4].attn_index == 3 and mini.layer_plan()[4].ffn_index == 3


@pytest.mark.parametrize("change, key", [
    ({"dim": 200}, "dim"),
    ({"vocab": 1000}, "vocab"),
    ({"head_dim": 64}, "head_dim"),
    ({"top_k": 9}, "top_k"),
    ({"n_layers": 0}, "n_layers"),
    ({"n_heads": True}, "n_heads"),
    ({"eps": -1.0}, "eps"),
    ({"mla_layers": [3, 4]}, "mla_layers"),
    ({"dense_layers": [1, 0]}, "dense_layers"),
    ({"mla_layers": 3}, "mla_layers"),
    ({"n_layers": 2**63 - 1}, "n_layers"),      # (it hung `model show`, planning every layer)
    ({"n_layers": 65_537}, "n_layers"),
    ({"dim": 2**63 - 128}, "dim"),
    ({"max_seq": 2**31}, "max_seq"),
])
def test_bad_config_values_name_the_key(change, key):
    cfg = load_config("k3-tiny")
    with pytest.raises(ConfigError) as err:
        attrs.evolve(cfg, **change)
    assert err.value.key == key


def test_bad_config_files(tmp_path):
    raw = attrs.asdict(load_config("k3-tiny"))
    with pytest.raises(ConfigError, match="did you mean 'top_k'"):
        config_from_dict({**raw, "topk": 2}, file="x.toml")
    del raw["vocab"]
    with pytest.raises(ConfigError, match="missing key") as err:
        config_from_dict(raw, file="x.toml")
    assert err.value.key == "vocab" and err.value.file == "x.toml"
    with pytest.raises(ConfigError, match="did you mean 'k3-mini'"):
        load_config("k3-mimi")
    path = tmp_path / "bad.toml"
    path.write_text("dim = [")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(str(path))


def test_cli_model_list_and_show(capsys):
    assert cli_main(["model", "list"]) == 0
    out = capsys.readouterr().out
    assert "k3-tiny" in out and "k3-full" in out
    assert cli_main(["model", "show", "k3-full"]) == 0
    out = capsys.readouterr().out
    assert "69 KDA + 24 gated MLA" in out and "active per token" in out and "bytes per token" in out
    assert cli_main(["model", "show", "k3-nope"]) == 1


def test_reference_depends_only_on_numpy_and_numerics():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(R))
    imported = {node.module if isinstance(node, ast.ImportFrom) else alias.name
                for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names}
    assert imported <= {"__future__", "dataclasses", "typing", "numpy", "mkemu.isa"}
    assert "from mkemu.isa import numerics" in inspect.getsource(R)
