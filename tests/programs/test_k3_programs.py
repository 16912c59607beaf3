"""The K3 decode programs against the numpy reference, through `mkemu run`'s driver."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mkemu.cli import main

PROGRAMS = ["programs/k3_megakernel.mk", "programs/k3_per_op.mk", "programs/k3_superop.mk"]


def run_json(capsys, *args) -> tuple[int, dict]:
    code = main(["run", *args, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("scheme", [0, 1])
@pytest.mark.parametrize("mesh,batch", [("1", 1), ("1", 8), ("2x2x2", 1), ("2x2x2", 8)])
def test_k3_tiny_logits_bit_exact_every_step(capsys, program, scheme, mesh, batch):
    """Tensor-parallel (SCHEME=0) and expert-parallel (SCHEME=1) sharding, one chip and
    eight: every step's logits equal the reference's, so all of them equal each other.
    (k3-mini on 2x2x2 at batch 1 and 8 is held by the golden runs.)"""
    code, report = run_json(capsys, program, "--model", "k3-tiny", "--mesh", mesh, "--batch", str(batch),
                            "--prompt-len", "2", "--steps", "4", "--set", f"SCHEME={scheme}")
    assert code == 0, report["mismatch"]
    assert report["bit_exact"] is True
    assert report["steps_run"] == 5 and report["batch"] == batch
    assert np.array(report["tokens"]).shape == (batch, 4)
    assert report["us_per_step"] > 0 and report["hbm_bytes_per_step"] > 0
    for key in ("tokens_per_s", "hbm_bw_fraction", "floor_us_per_step", "fraction_of_floor",
                "kernels_per_step", "breakdown_us", "wall_s", "chips", "cores"):
        assert key in report
    # The run's totals, under a plain program's keys.
    assert report["cycles"] == sum(report["cycles_per_step"])
    assert report["hbm_bytes"] == pytest.approx(report["hbm_bytes_per_step"] * 5)
    assert report["instructions"] == pytest.approx(report["instructions_per_step"] * 5)
    assert report["seconds"] == pytest.approx(report["us_per_step"] * 5e-6)
    assert sum(report["unit_busy_cycles"].values()) > 0 and report["unit_busy_cycles"]["mxu0"] > 0


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("scheme", [0, 1])
@pytest.mark.parametrize("batch", [1, 8])
def test_k3_mini_on_one_chip_bit_exact(capsys, program, scheme, batch):
    """Two cores, four heads: each core adds its two heads' parts of the attention sum
    itself and sends one (LOCAL_A in programs/k3/reduce.mk)."""
    code, report = run_json(capsys, program, "--mesh", "1", "--batch", str(batch), "--prompt-len", "1",
                            "--steps", "1", "--set", f"SCHEME={scheme}")
    assert code == 0, report["mismatch"]
    assert report["bit_exact"] is True and report["model"] == "k3-mini" and report["chips"] == 1


# k3-full's choices (every projection split, the LM head split, reduce-scatter
# all-reduces, experts split by columns over a chip's cores, a 4-slot weight ring, each
# expert on its home chip only, each chip holding only its KDA heads' columns), forced
# at k3-mini so that the code k3-full runs is held to the reference's bits.
FULL_PATHS = ("--set", "REPL_BYTES=0", "--set", "LM_ROOT_BYTES=0", "--set", "AR_BYTES=0",
              "--set", "ESPLIT_BYTES=0", "--set", "WR_MAX=4", "--set", "HOME_BYTES=0", "--set", "KDA_SHARD_BYTES=0")


@pytest.mark.parametrize("program", PROGRAMS)
def test_k3_programs_hold_under_adversarial_dma_schedules(capsys, program):
    """Every DMA landing as late as synchronisation allows, or in a shuffled order: the
    same bits and no race. (The prologues once waited for a plan row on a semaphore the
    norm weights' bytes also counted on, which only a shuffled schedule showed.)"""
    code, report = run_json(capsys, program, "--model", "k3-tiny", "--mesh", "2x2x2", "--batch", "8",
                            "--prompt-len", "1", "--steps", "1", "--schedules", "3")
    assert code == 0 and report["bit_exact"] is True
    assert [s["outcome"] for s in report["schedules"]] == ["same"] * 3, report["schedules"]


@pytest.mark.parametrize("scheme", [0, 1])
def test_relayed_all_gathers_bit_exact_and_race_free(capsys, scheme):
    """Past AG_DIRECT_MAX cores the super-operators' all-gathers go through one relay per
    group of cores (programs/k3/gather.mk); forced here on 16 cores (groups of 4), with
    every projection split so that every all-gather runs."""
    code, report = run_json(capsys, "programs/k3_superop.mk", "--mesh", "2x2x2", "--batch", "8", "--prompt-len",
                            "1", "--steps", "1", "--set", f"SCHEME={scheme}", "--set", "AG_DIRECT_MAX=0",
                            *FULL_PATHS, "--schedules", "2")
    assert code == 0, report["mismatch"]
    assert report["bit_exact"] is True
    assert [s["outcome"] for s in report["schedules"]] == ["same"] * 2, report["schedules"]


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("scheme", [0, 1])
@pytest.mark.parametrize("mesh", ["2x2x2", "1"])
def test_k3_full_code_paths_bit_exact_at_k3_mini(capsys, program, scheme, mesh):
    """On one chip (2 cores, 4 heads) the reduce-scatter sums parts already added on
    their core, as k3-full's 32 cores do with 96 heads."""
    code, report = run_json(capsys, program, "--mesh", mesh, "--batch", "8", "--prompt-len", "1",
                            "--steps", "2", "--set", f"SCHEME={scheme}", *FULL_PATHS)
    assert code == 0, report["mismatch"]
    assert report["bit_exact"] is True


def test_launches_per_step_megakernel_one_superop_a_tenth_of_per_op(capsys):
    args = ("--model", "k3-tiny", "--mesh", "1", "--prompt-len", "1", "--steps", "1")
    mega, per_op, superop = (run_json(capsys, program, *args)[1] for program in PROGRAMS)
    assert mega["kernels_per_step"] == 1
    assert superop["kernels_per_step"] == 2 * 4 + 2        # k3-tiny: 4 layers, two blocks each
    assert per_op["kernels_per_step"] >= 10 * superop["kernels_per_step"]
    assert mega["tokens"] == per_op["tokens"] == superop["tokens"]


def hbm_need_bytes(buffers, expert_dtype: str) -> int:
    """What the emulator's out-of-memory check compares with the profile (Program.hbm_bytes)
    for these buffers, with the routed experts stored as `expert_dtype` instead."""
    from mkemu.isa.program import Program, layout_buffers

    specs = [(b.name, expert_dtype if b.name in ("moe_w1", "moe_w3", "moe_w2") else b.dtype, b.shape, b.kind)
             for b in buffers]
    return Program(kernels={}, launches=(), buffers=layout_buffers(specs)).hbm_bytes


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("scheme", [0, 1])
def test_k3_full_fits_hbm_on_4x2x2(program, batch, scheme):
    """k3-full on 16 chips of tpu-v7-like: each chip's HBM holds its 56 experts per layer
    (expert homes), stored as MXFP4 (k3-full's expert_dtype), and its 6 of 96 KDA heads'
    projection columns (head shards), the rest whole: the program's HBM need fits the
    chip's 192 GiB (with bf16 experts it would not). The same compile (k3-full's front
    end takes seconds) also has every kernel's VMEM map inside the profile (the back end
    refuses a kernel that does not fit), and the megakernel's weight ring is 12 x 1.75 MiB
    (two halves of 6) at batch 1."""
    from mkemu.dsl.compiler import compile_program
    from mkemu.dsl.frontend import load_program
    from mkemu.emulator.topology import Mesh
    from mkemu.isa.hardware import load_profile
    from mkemu.programs.k3 import driver

    from mkemu.session import machine_info

    profile = load_profile("tpu-v7-like")
    params = driver.params({"model": "k3-full", "batch": batch, "timing_only": True},
                           machine_info(profile, Mesh((4, 2, 2))))
    params["SCHEME"] = scheme
    checked = load_program(program, params)
    compiled = compile_program(checked, profile)
    # VMEM and the weight ring.
    assert max(k.vmem_bytes for k in compiled.kernels.values()) <= profile.vmem_bytes
    if program.endswith("megakernel.mk") and batch == 1:
        ring = [b for b in checked.kernels["k3_step"].buffers if b.name in ("r.w0", "r.w1")]
        assert [(b.slots, b.shape) for b in ring] == [(6, (7168, 128))] * 2
    # HBM.
    arrays = {b.name: (b.dtype, b.shape) for b in compiled.buffers}
    assert arrays["moe_w1"] == ("mxfp4", (92 * 56, 3584, 3072))   # 896 experts / 32 cores * 2 cores a chip
    assert arrays["moe_shared_w1"][0] == "bf16"
    assert arrays["kda_wq"][1] == (69, 7168, 6 * 128) and arrays["kda_wo"][1] == (69, 6 * 128, 7168)
    assert arrays["embed"][1] == (163840, 7168)                    # everything else whole on every chip
    bf16 = hbm_need_bytes(compiled.buffers, "bf16")
    print(f"{program} batch {batch} scheme {scheme}: HBM need per chip {compiled.hbm_bytes / 2**30:.2f} GiB "
          f"with MXFP4 experts ({bf16 / 2**30:.2f} GiB with bf16), of {profile.hbm_bytes / 2**30:.0f} GiB")
    assert compiled.hbm_bytes <= profile.hbm_bytes < bf16


# MXFP4 routed experts (expert_dtype = "mxfp4", or --set EXPERT_MX=1): the weights are
# MXFP4 values, the programs stream them as MXFP4 and multiply with mxu.ldw.mx, and every
# step's logits are still the reference's bits.
@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("scheme", [0, 1])
def test_k3_tiny_mxfp4_experts_bit_exact(capsys, program, scheme):
    code, report = run_json(capsys, program, "--model", "k3-tiny", "--mesh", "2x2x2", "--batch", "8",
                            "--prompt-len", "2", "--steps", "2", "--set", f"SCHEME={scheme}", "--set", "EXPERT_MX=1")
    assert code == 0, report["mismatch"]
    assert report["bit_exact"] is True


def test_k3_full_code_paths_with_mxfp4_experts_bit_exact_at_k3_mini(capsys, tmp_path):
    """k3-full's paths (split experts, expert homes, ...) with MXFP4 experts, chosen by a
    model file's expert_dtype."""
    from mkemu.programs.k3.config import _configs_dir

    text = _configs_dir().joinpath("k3-mini.toml").read_text()
    (tmp_path / "k3-mini-mx.toml").write_text(text.replace('name = "k3-mini"', 'name = "k3-mini-mx"')
                                              + 'expert_dtype = "mxfp4"\n')
    code, report = run_json(capsys, "programs/k3_megakernel.mk", "--model", str(tmp_path / "k3-mini-mx.toml"),
                            "--mesh", "2x2x2", "--batch", "8", "--prompt-len", "1", "--steps", "1", *FULL_PATHS)
    assert code == 0, report["mismatch"]
    assert report["bit_exact"] is True


def test_mxfp4_expert_weights_are_exact_and_the_rest_unchanged():
    from mkemu.isa import numerics as nx
    from mkemu.programs.k3.config import load_config
    from mkemu.programs.k3.weights import generate_weights

    cfg = load_config("k3-tiny")
    bf16, mx = generate_weights(cfg), generate_weights(cfg, expert_dtype="mxfp4")
    for name in bf16:
        if name in ("moe_w1", "moe_w3", "moe_w2"):
            w = mx[name]
            assert not np.array_equal(w, bf16[name])
            stored = nx.mxfp4_from_bytes(nx.mxfp4_to_bytes(w), w.shape)      # MXFP4 storage is lossless
            assert np.array_equal(stored.view(np.uint32), w.view(np.uint32))
            assert np.array_equal(nx.bf16_round(w), w)
        else:
            assert np.array_equal(mx[name], bf16[name])


def test_expert_dtype_is_validated():
    from mkemu import ConfigError
    from mkemu.programs.k3.config import config_from_dict, load_config
    import attrs

    raw = attrs.asdict(load_config("k3-tiny"))
    with pytest.raises(ConfigError, match="expected one of 'bf16', 'mxfp4'"):
        config_from_dict({**raw, "expert_dtype": "fp8"})
    assert load_config("k3-full").expert_dtype == "mxfp4" and load_config("k3-mini").expert_dtype == "bf16"


def test_same_run_same_bits_and_cycles(capsys):
    args = (PROGRAMS[0], "--model", "k3-tiny", "--mesh", "1", "--prompt-len", "1", "--steps", "2")
    _, a = run_json(capsys, *args)
    _, b = run_json(capsys, *args)
    for r in (a, b):
        r.pop("wall_s"), r.pop("compile_s")
    assert a == b


def test_check_layers_mode_passes_and_dump_writes_npz(capsys, tmp_path):
    code, report = run_json(capsys, PROGRAMS[0], "--model", "k3-tiny", "--mesh", "1", "--prompt-len", "1",
                            "--steps", "2", "--check-layers", "--dump", str(tmp_path))
    assert code == 0 and report["bit_exact"] is True
    with np.load(tmp_path / "reference.npz") as ref, np.load(tmp_path / "emulator.npz") as emu:
        assert np.array_equal(ref["logits"].view(np.uint32), emu["logits"].view(np.uint32))
    with np.load(tmp_path / "weights.npz") as weights:
        assert "embed" in weights.files


def test_a_broken_weight_is_named_by_layer_and_operator(capsys, monkeypatch):
    """Corrupt layer 1's FFN norm on the emulator side only: the check names that layer."""
    from mkemu.session import Session

    real_write = Session.write

    def write(self, name, array, chip=None):
        if name == "ffn_norm":
            array = np.array(array, np.float32)
            array[1] *= np.float32(2)
        real_write(self, name, array, chip)

    monkeypatch.setattr(Session, "write", write)
    code, report = run_json(capsys, PROGRAMS[0], "--model", "k3-tiny", "--mesh", "1", "--prompt-len", "1",
                            "--steps", "1")
    assert code == 1 and report["bit_exact"] is False
    assert "layer 1, operator ffn" in report["mismatch"]
