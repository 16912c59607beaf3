"""docs/k3.md, docs/k3_programs.md and README.md against the runs and compiles they quote:
the model table and the active-parameter split, the measured per-op / super-op /
megakernel times at batch 1 (tensor parallel) and what the text derives from them, the
kernels per step, which cores route, the k3-full HBM need, VMEM map and semaphore
budget, the semaphore errors of Limits, and the report keys README and k3.md promise.

Every figure is read from the doc's own text, so a change that moves one fails here
until the doc is updated.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest

from mkemu.programs.k3.config import load_config, param_counts, tensor_specs
from tests.programs.test_k3_docs import run, run_json
from tests.programs.test_k3_programs import hbm_need_bytes

ROOT = Path(__file__).parents[2]
K3 = (ROOT / "docs" / "k3.md").read_text()
PROGRAMS_DOC = (ROOT / "docs" / "k3_programs.md").read_text()
README = (ROOT / "README.md").read_text()
PER_OP, SUPER, MEGA = (str(ROOT / "programs" / f"{p}.mk") for p in ("k3_per_op", "k3_superop", "k3_megakernel"))


def section(doc: str, start: str, end: str) -> str:
    return doc[doc.index(start):doc.index(end, doc.index(start))]


def flat(text: str) -> str:
    """The text with every run of whitespace one space (the docs wrap lines anywhere)."""
    return " ".join(text.split())


def table(text: str, header: str) -> list[list[str]]:
    """The body rows of the markdown table whose header line starts with `header`."""
    lines = text[text.index(header):].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def shown(value: float, text: str) -> bool:
    """`value` (bytes) printed as the doc prints it: '5.81 MB', '565 MB', '207.59 GB'."""
    number, unit = re.fullmatch(r"([\d.]+) (KB|MB|GB)", text).groups()
    decimals = len(number.split(".")[1]) if "." in number else 0
    return f"{value / {'KB': 1e3, 'MB': 1e6, 'GB': 1e9}[unit]:.{decimals}f}" == number


# ------------------------------------------------------------------ k3.md: the models


def test_model_table_is_what_the_configs_and_model_show_give(capsys):
    rows = {r[0]: r[1:] for r in table(K3, "| key | k3-tiny | k3-mini | k3-full |")}
    for column, name in enumerate(("k3-tiny", "k3-mini", "k3-full")):
        cfg, counts = load_config(name), param_counts(load_config(name))
        code, out, _ = run(capsys, "model", "show", name)
        assert code == 0
        cell = {key: cells[column] for key, cells in rows.items()}
        for key in ("dim", "n_layers", "conv_kernel", "vocab", "max_seq"):
            assert cell[f"`{key}`"].split()[0] == str(getattr(cfg, key)), (name, key)
        assert cell["`expert_dtype`"] == cfg.expert_dtype
        assert cell["`n_heads` × `head_dim`"] == f"{cfg.n_heads} × {cfg.head_dim}"
        assert cell["`q_rank` / `kv_rank`"] == f"{cfg.q_rank} / {cfg.kv_rank}"
        assert cell["`n_experts` / `top_k` / `n_shared`"] == f"{cfg.n_experts} / {cfg.top_k} / {cfg.n_shared}"
        assert cell["`latent_dim` / `expert_inter`"] == f"{cfg.latent_dim} / {cfg.expert_inter}"
        assert cell["KDA / MLA layers"] == f"{len(cfg.kda_layers)} / {len(cfg.mla_layers)}"
        total, active = cell["total parameters"].split()[0], cell["active per token"].split()[0]
        assert f"total {total} " in out and f"active per token {active} " in out
        assert total == f"{counts.total:,}" and active == f"{counts.active:,}"
        assert shown(counts.bytes_per_token_bf16, cell["weight bytes per token (bf16, batch 1)"])
        assert shown(counts.bytes_per_token_mxfp4_experts, cell["… with MXFP4 experts"])
        assert shown(counts.state_bytes, cell["decode state per sequence"])


def test_k3_full_active_split_and_beta_padding_are_the_tensor_tables():
    cfg = load_config("k3-full")
    groups: dict[str, int] = {}
    for spec in tensor_specs(cfg):
        n = spec.size * cfg.top_k // cfg.n_experts if spec.routed else spec.size
        name = spec.name
        group = ("experts" if name.startswith(("moe_w", "moe_shared_")) else
                 "router + latent down/up projections" if name.startswith("moe_") else
                 "embedding + LM head" if name in ("embed", "lm_head") else
                 "KDA" if name.startswith("kda_") else "MLA" if name.startswith("mla_") else
                 "dense layer" if name.startswith("dense_") else "norms")
        groups[group] = groups.get(group, 0) + n
    text = flat(K3)
    split = re.search(r"Of the active ([\d.]+)B: experts ([\d.]+)B \(.*?\), KDA ([\d.]+)B, MLA ([\d.]+)B, "
                      r"router \+ latent down/up projections ([\d.]+)B, dense layer ([\d.]+)B, "
                      r"embedding \+ LM head ([\d.]+)B\.", text)
    assert split, "the active split sentence moved"
    names = ("experts", "KDA", "MLA", "router + latent down/up projections", "dense layer", "embedding + LM head")
    assert split.group(1) == f"{param_counts(cfg).active / 1e9:.2f}"
    for name, figure in zip(names, split.groups()[1:]):
        assert figure == f"{groups[name] / 1e9:.2f}", name
    extra, percent = re.search(r"which adds ([\d.]+)M \(([\d.]+)%\) to k3-full's count", text).groups()
    padding = len(cfg.kda_layers) * cfg.dim * (cfg.beta_cols - cfg.n_heads)
    assert extra == f"{padding / 1e6:.1f}"
    assert percent == f"{100 * padding / param_counts(cfg).total:.4f}"


# ------------------------------------------------- k3_programs.md: measured and kernels


def test_measured_batch_1_tensor_parallel_row_and_what_the_text_derives(capsys, tmp_path):
    """The doc's setup (k3-mini, 2x2x2, 4 prompt + 4 generated tokens, SCHEME=0, batch 1):
    the megakernel's data run, and the per-op and super-op programs replaying its routing
    record timing-only, which gives exactly their data runs' cycles (the contract with the
    timing-only mode; their bits are held by test_k3_programs.py)."""
    row = next(r for r in table(section(PROGRAMS_DOC, "## Measured", "## Limits"), "| batch | scheme |")
               if r[:2] == ["1", "TP"])
    setup = ("--mesh", "2x2x2", "--set", "SCHEME=0", "--batch", "1")
    record = str(tmp_path / "routing.json")
    mega = run_json(capsys, MEGA, *setup, "--record-routing", record)
    assert mega["bit_exact"] is True and mega["steps_run"] == 7
    per_op, superop = (run_json(capsys, p, *setup, "--timing-only", "--routing", record) for p in (PER_OP, SUPER))
    us = [r["us_per_step"] for r in (per_op, superop, mega)]
    assert row[2:5] == [f"{u:.1f}" for u in us]
    assert row[5] == " / ".join(str(r["kernels_per_step"]) for r in (per_op, superop, mega))
    assert not [k for k in k3_report_keys() if k not in mega]
    text = flat(section(PROGRAMS_DOC, "## Measured", "## Limits"))
    launches, launch_us, vs_super, vs_mega = re.search(
        r"\*\*Per-op\*\* pays (\d+) launches × (\d+) µs and a cold start in every kernel: ([\d.]+)x slower "
        r"than the super-operators, ([\d.]+)x than the megakernel", text).groups()
    assert int(launches) == per_op["kernels_per_step"]
    assert float(launch_us) * int(launches) == pytest.approx(per_op["breakdown_us"]["launch_overhead"])
    assert (vs_super, vs_mega) == (f"{us[0] / us[1]:.1f}", f"{us[0] / us[2]:.1f}")
    super_launches, super_us, faster = re.search(
        r"pay (\d+) launches \((\d+) µs\).*?: ([\d.]+)x faster at batch 1", text).groups()
    assert int(super_launches) == superop["kernels_per_step"]
    assert float(super_us) == pytest.approx(superop["breakdown_us"]["launch_overhead"])
    assert faster == f"{us[1] / us[2]:.1f}"
    now, compute = re.search(r"; ([\d.]+) now\).*?\(compute ([\d.]+) µs per step per core", text).groups()
    assert now == f"{us[2]:.1f}" and compute == f"{mega['breakdown_us']['compute']:.1f}"
    # The kernels-per-step table at the top of the page.
    kernels = {r[0]: r[1] for r in table(PROGRAMS_DOC, "| program | kernels per step (k3-mini) |")}
    assert kernels["`programs/k3_per_op.mk`"].startswith(f"{per_op['kernels_per_step']} (`SCHEME=1`: ")
    assert kernels["`programs/k3_superop.mk`"] == f"{superop['kernels_per_step']} = 2 × layers + 2"
    assert superop["kernels_per_step"] == 2 * load_config("k3-mini").n_layers + 2
    assert kernels["`programs/k3_megakernel.mk`"] == str(mega["kernels_per_step"])


def test_per_op_expert_parallel_kernels_per_step(capsys):
    cell = next(r[1] for r in table(PROGRAMS_DOC, "| program | kernels per step (k3-mini) |")
                if r[0] == "`programs/k3_per_op.mk`")
    expected = int(re.search(r"`SCHEME=1`: (\d+)", cell).group(1))
    report = run_json(capsys, PER_OP, "--timing-only", "--prompt-len", "1", "--steps", "1", "--set", "SCHEME=1")
    assert report["kernels_per_step"] == expected


# ------------------------------------------------------- k3_programs.md: who routes


@pytest.mark.parametrize("program, scheme, row, column", [
    (MEGA, 0, "megakernel, super-op", 1),
    (MEGA, 1, "megakernel, super-op", 2),
    (PER_OP, 0, "per-op (`topk` kernel, one launch per MoE layer)", 1),
], ids=["megakernel-scheme0", "megakernel-scheme1", "per_op-scheme0"])
def test_which_cores_route_is_what_a_routing_record_holds(capsys, tmp_path, program, scheme, row, column):
    """On 2 chips (4 cores) at batch 2: every core, cores 0 .. 1, or core 0 of each chip."""
    rows = {r[0]: r[1:] for r in table(PROGRAMS_DOC, "| program | `SCHEME=0` | `SCHEME=1` |")}
    rule = rows[row][column - 1]
    cores, batch, per_chip = 4, 2, 2
    expected = {"every core": list(range(cores)),
                "the homes, cores `0 .. min(BATCH, NCORES) - 1`": list(range(min(batch, cores))),
                "core 0 of every chip": list(range(0, cores, per_chip))}[rule]
    record = tmp_path / "r.json"
    report = run_json(capsys, program, "--model", "k3-tiny", "--mesh", "2", "--batch", str(batch),
                      "--prompt-len", "1", "--steps", "2", "--set", f"SCHEME={scheme}",
                      "--record-routing", str(record))
    assert report["cores"] == cores and report["bit_exact"] is True
    cfg = load_config("k3-tiny")
    for step in json.loads(record.read_text())["steps"]:
        routing = [core for core, ids in enumerate(step["readbacks"]) if ids]
        assert routing == expected
        assert {len(step["readbacks"][c]) for c in routing} == {len(cfg.moe_layers) * batch * cfg.top_k}


# ------------------------------------------------ k3_programs.md: k3-full compiled


@functools.cache
def _k3_full(program: str, batch: int, scheme: int):
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
    return checked, compile_program(checked, profile)


def _vmem_cells(text: str) -> list[tuple[str, str | None]]:
    """'1.4 / 2.5 (12)' -> [('1.4', '12'), ('2.5', '12')]: MiB and ring slots (None: not given)."""
    parts = [re.fullmatch(r"([\d.]+)(?: \((\d+)\))?", p.strip()).groups() for p in text.split(" / ")]
    return [(mib, slots or parts[-1][1]) for mib, slots in parts]


@pytest.mark.parametrize("batch", [1, 8])
def test_k3_full_vmem_map_and_hbm_need_on_4x2x2(batch):
    """Static VMEM of the largest kernel (MiB) and the weight ring's slots of the
    super-operators and the megakernel, both schemes, and the HBM need of the map with
    MXFP4 experts (as compiled) and with bf16 ones (the same layout)."""
    vmem = next(r for r in table(PROGRAMS_DOC, "| model | mesh | batch | scheme |")
                if r[0] == "k3-full" and r[2] == str(batch))
    assert vmem[1] == "4x2x2" and vmem[3] == "0 / 1"
    need_row = next(r for r in table(PROGRAMS_DOC, "| | bf16 experts | MXFP4 experts |")
                    if r[0].startswith("**need, batch 1 / 2 / 4 / 8**"))
    index = (1, 2, 4, 8).index(batch)
    bf16_need, mx_need = (c.strip("*").split(" / ")[index] for c in need_row[1:3])
    for column, program in ((5, SUPER), (6, MEGA)):
        for scheme, (mib, slots) in enumerate(_vmem_cells(vmem[column])):
            checked, compiled = _k3_full(program, batch, scheme)
            assert f"{max(k.vmem_bytes for k in compiled.kernels.values()) / 2**20:.1f}" == mib, (program, scheme)
            rings = {sum(b.slots for b in k.buffers if b.name in ("r.w0", "r.w1"))
                     for k in checked.kernels.values() if any(b.name == "r.w0" for b in k.buffers)}
            assert rings == {int(slots)}, (program, scheme)
            assert f"{compiled.hbm_bytes / 2**30:.2f}" == mx_need
            assert f"{hbm_need_bytes(compiled.buffers, 'bf16') / 2**30:.2f}" == bf16_need


@pytest.mark.parametrize("index", range(5))    # (one row each: 30 compiles in all, about 10 s)
def test_small_model_vmem_rows_are_the_compiled_programs(index):
    """The VMEM table's k3-tiny and k3-mini rows (1 chip and 2x2x2, batch 1 / 8): the
    largest kernel's static VMEM of each program and, where the cell gives it, the
    weight ring's slots (compiles only)."""
    from mkemu.dsl.compiler import compile_program
    from mkemu.dsl.frontend import load_program
    from mkemu.emulator.topology import Mesh
    from mkemu.isa.hardware import load_profile
    from mkemu.programs.k3 import driver
    from mkemu.session import machine_info

    profile = load_profile("tpu-v7-like")
    rows = [r for r in table(PROGRAMS_DOC, "| model | mesh | batch | scheme |") if r[0] in ("k3-tiny", "k3-mini")]
    assert len(rows) == 5
    for model, mesh, batches, scheme, *cells in rows[index:index + 1]:
        dims = (1, 1, 1) if mesh == "1 chip" else tuple(int(d) for d in mesh.split("x"))
        assert batches == "1 / 8"
        for program, cell in zip((PER_OP, SUPER, MEGA), cells):
            given = "(" in cell
            for batch, (mib, slots) in zip((1, 8), _vmem_cells(cell)):
                params = driver.params({"model": model, "batch": batch}, machine_info(profile, Mesh(dims)))
                params["SCHEME"] = int(scheme)
                checked = load_program(program, params)
                compiled = compile_program(checked, profile)
                where = (model, mesh, batch, scheme, program)
                assert f"{max(k.vmem_bytes for k in compiled.kernels.values()) / 2**20:.1f}" == mib, where
                if given:
                    rings = {sum(b.slots for b in k.buffers if b.name in ("r.w0", "r.w1"))
                             for k in checked.kernels.values() if any(b.name == "r.w0" for b in k.buffers)}
                    assert rings == {int(slots)}, where


def test_k3_full_megakernel_semaphores_leave_no_room_for_relays():
    used, budget = map(int, re.search(r"\((\d+) of (\d+) at k3-full\) does not have", PROGRAMS_DOC).groups())
    checked, _ = _k3_full(MEGA, 1, 0)
    assert sum(s.count or 1 for s in checked.kernels["k3_step"].sems) == used
    assert used + 12 > budget


# ----------------------------------------------- k3_programs.md: Limits, the errors


def test_megakernel_verify_step_with_mxfp4_experts_is_one_semaphore_over(capsys):
    limits = flat(section(PROGRAMS_DOC, "## Limits", "Routing turns the top-k"))
    quoted = re.search(r"\(`(kernel 'k3_step' uses \d+ semaphores; the profile has \d+)`\)", limits).group(1)
    for model in ("k3-tiny", "k3-mini"):
        code, out, err = run(capsys, "run", MEGA, "--model", model, "--mesh", "1", "--prompt-len", "1",
                             "--steps", "1", "--spec-rows", "2", "--set", "EXPERT_MX=1")
        assert code == 1 and not out and "Traceback" not in err
        assert err.splitlines()[0].endswith(f"error: {quoted}"), err


def test_the_test_profile_is_too_small_at_k3_mini_too(capsys):
    limits = flat(section(PROGRAMS_DOC, "## Limits", "Routing turns the top-k"))
    figures = re.search(r"At k3-tiny and k3-mini the megakernel's `k3_step` uses (\d+) semaphores, the "
                        r"super-operators' `attn_block` (\d+) and the per-op `expert` kernel (\d+)", limits).groups()
    for program, kernel, used in zip((MEGA, SUPER, PER_OP), ("k3_step", "attn_block", "expert"), figures):
        code, out, err = run(capsys, "run", program, "--hw", "test", "--mesh", "1", "--prompt-len", "1",
                             "--steps", "1")
        assert code == 1 and not out and "Traceback" not in err
        assert f"error: kernel '{kernel}' uses {used} semaphores; the profile has 16" in err.splitlines()[0]


# ------------------------------------------------------- README and k3.md: report keys


def k3_report_keys() -> list[str]:
    """README's K3 key list and k3.md's `--json` table, but the keys of a timing-only run
    (`routing`), of --dump, of --trace and of --spec-rows."""
    keys = re.findall(r"`(\w+)`", re.search(r"for K3 programs (.*?) \(see `docs/k3.md`\)", flat(README)).group(1))
    assert "us_per_step" in keys
    for row in table(K3, "| key | meaning |"):
        if "with `--spec-rows` only" not in row[1]:
            keys += [k for k in re.findall(r"`(\w+)`", row[0]) if k not in ("routing", "dump", "trace")]
    assert "routing_record" in keys and "cycles_per_step" in keys
    return keys


def test_readme_plain_program_report_keys(capsys):
    plain = re.findall(r"`(\w+)`", re.search(r"for plain programs at least (.*?); for K3 programs",
                                            flat(README)).group(1))
    assert "cycles" in plain and "bit_exact" in plain
    report = run_json(capsys, "vector_add", "--hw", "test")
    assert not [k for k in plain if k not in report] and report["bit_exact"] is True
