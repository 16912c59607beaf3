"""Hardware profiles: shipped files load, units convert, every bad input names file and key."""

from __future__ import annotations

import math
import os
from pathlib import Path

import attrs
import pytest

from mkemu.errors import ConfigError
from mkemu.isa import hardware
from mkemu.isa.hardware import (
    TIMING_CLASSES,
    HardwareProfile,
    TimingClass,
    list_profiles,
    load_profile,
    profile_to_text,
)

SHIPPED = ("tpu-v7-like", "tpu-v5p-like", "test")
TEST_TOML = (Path(hardware.__file__).parent / "profiles" / "test.toml").read_text()
TEST_DIMS = "dims = [2, 1, 1]"      # the test profile's mesh


def write(tmp_path: Path, text: str, name: str = "user.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def edited(old: str, new: str) -> str:
    """The shipped test profile with one line changed."""
    assert old in TEST_TOML, old
    return TEST_TOML.replace(old, new, 1)


def config_error(path: Path | str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_profile(path)
    return info.value


# --------------------------------------------------------------------------- shipped


def test_list_profiles_names_the_shipped_files():
    assert list_profiles() == sorted(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_profile_loads_with_every_timing_class(name):
    p = load_profile(name)
    assert isinstance(p, HardwareProfile)
    assert p.name == name
    assert p.source == f"builtin:{name}"
    assert tuple(p.timing) == TIMING_CLASSES
    assert all(isinstance(t, TimingClass) for t in p.timing.values())
    assert p.vmem_tile == (8, 128)
    assert (p.sregs, p.vregs, p.mregs) == (32, 32, 8)
    assert p.mxu_dim % 128 == 0
    assert len(p.mesh_dims) == 3 and len(p.mesh_wrap) == 3
    text = profile_to_text(p)
    assert name in text and "bytes/cycle" in text and "mxu_ldw" in text


def test_default_profile_is_tpu_v7_like():
    assert load_profile().name == "tpu-v7-like"


def test_profile_is_frozen():
    p = load_profile("test")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        p.vmem_bytes = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.timing["valu"] = TimingClass(1, 1)  # type: ignore[index]


def test_timing_classes_tuple_is_exact():
    assert TIMING_CLASSES == (
        "scalar", "scalar_mul", "scalar_div", "branch", "smem", "vextract", "vld", "vst",
        "valu", "vcvt", "xlu", "eup", "mxu_ldw", "mxu_push", "mxu_mac", "mxu_pop",
        "dma_issue", "sync", "misc",
    )  # fmt: skip


# --------------------------------------------------------------------------- calibration


def test_v7_peak_bf16_is_within_10_percent_of_2307_tflops():
    p = load_profile("tpu-v7-like")
    assert p.peak_flops_per_s == pytest.approx(2307e12, rel=0.10)


def test_v7_weight_tile_takes_about_20_ns():
    p = load_profile("tpu-v7-like")
    assert p.mxu_dim == 256
    seconds = p.cycles_to_seconds(p.timing["mxu_ldw"].occupancy_cycles)
    assert seconds == pytest.approx(20e-9, rel=0.20)


def test_v7_one_core_streams_about_3_tb_per_s_and_chip_hbm_is_7_38():
    p = load_profile("tpu-v7-like")
    assert p.dma_engine_bw_bytes_per_cycle * p.clock_hz == pytest.approx(3.0e12, rel=1e-9)
    assert p.hbm_bw_bytes_per_s == pytest.approx(7.38e12, rel=1e-9)
    assert p.hbm_bytes == 192 << 30
    assert p.vmem_bytes == 64 << 20 and p.smem_bytes == 1 << 20


@pytest.mark.parametrize(
    ("size_bytes", "target_bytes_per_s"), [(256 << 10, 101e9), (16 << 20, 610e9)]
)
def test_v7_sibling_copy_matches_measurements_within_25_percent(size_bytes, target_bytes_per_s):
    p = load_profile("tpu-v7-like")
    cycles = (
        p.dma_start_latency_cycles
        + p.sibling_latency_cycles
        + size_bytes / min(p.sibling_bw_bytes_per_cycle, p.dma_engine_bw_bytes_per_cycle)
    )
    achieved = size_bytes / p.cycles_to_seconds(cycles)
    assert achieved == pytest.approx(target_bytes_per_s, rel=0.25)


def test_v5p_peak_bf16_is_within_10_percent_of_459_tflops():
    p = load_profile("tpu-v5p-like")
    assert p.peak_flops_per_s == pytest.approx(459e12, rel=0.10)
    assert p.hbm_bytes == 95 << 30


# --------------------------------------------------------------------------- units


def test_test_profile_units_by_hand():
    p = load_profile("test")
    assert p.clock_hz == 1e9
    assert p.hbm_bw_bytes_per_cycle == 64.0  # 64e9 B/s / 1e9 Hz
    assert p.dma_engine_bw_bytes_per_cycle == 32.0
    assert p.link_bw_bytes_per_cycle == 8.0
    assert p.sibling_bw_bytes_per_cycle == 16.0
    assert p.vmem_bw_bytes_per_cycle == 256.0
    assert p.dma_start_latency_cycles == 10
    assert p.cycles_to_seconds(1000) == pytest.approx(1e-6)
    assert p.mxu_flops_per_cycle_per_chip == 2 * 128 * 128 * 2 * 2


def test_seconds_round_up_to_whole_cycles(tmp_path):
    path = write(
        tmp_path,
        'extends = "test"\n'
        "[chip]\nclock_hz = 2.2e9\nhbm_bw_bytes_per_s = 7.38e12\n"
        "[ici]\nhop_latency_s = 0.69e-6\n"
        "[dma]\nstart_latency_s = 1.0001e-9\n",
    )
    p = load_profile(path)
    assert p.hbm_bw_bytes_per_cycle == pytest.approx(7.38e12 / 2.2e9)  # 3354.54...
    assert p.hop_latency_cycles == 1518  # 0.69e-6 * 2.2e9 = 1518.0 exactly, no spurious +1
    assert p.dma_start_latency_cycles == 3  # 2.2002 cycles round up
    assert p.seconds_to_cycles(1e-9) == 3  # 2.2 -> 3


# --------------------------------------------------------------------------- extends


def test_extends_overrides_a_few_values_and_merges_timing_tables(tmp_path):
    path = write(
        tmp_path,
        'extends = "tpu-v7-like"\n'
        "[core]\nvmem_bytes = 134_217_728\n"
        "[ici]\nhop_latency_cycles = 100\n"
        "[timing]\nvalu = { latency_cycles = 5 }\n",
        name="big-vmem.toml",
    )
    base = load_profile("tpu-v7-like")
    p = load_profile(path)
    assert p.name == "big-vmem"
    assert p.source == str(path)
    assert p.vmem_bytes == 128 << 20
    assert p.hop_latency_cycles == 100  # the other unit replaces the base's hop_latency_s
    assert p.timing["valu"] == TimingClass(latency_cycles=5, occupancy_cycles=1)
    assert p.timing["xlu"] == base.timing["xlu"]
    assert p.hbm_bw_bytes_per_cycle == base.hbm_bw_bytes_per_cycle
    assert attrs.evolve(
        p, name=base.name, description=base.description, source=base.source,
        vmem_bytes=base.vmem_bytes, hop_latency_cycles=base.hop_latency_cycles,
        timing=base.timing,
    ) == base  # fmt: skip


def test_extends_a_relative_path_chain(tmp_path):
    write(tmp_path, 'extends = "test"\nname = "mid"\n[core]\nsemaphores = 3\n', name="mid.toml")
    top = write(tmp_path, 'extends = "mid.toml"\n[core]\nmregs = 4\n', name="top.toml")
    p = load_profile(top)
    assert (p.semaphores, p.mregs, p.name) == (3, 4, "top")


def test_extends_cycle_is_an_error(tmp_path):
    write(tmp_path, 'extends = "b.toml"\n', name="a.toml")
    write(tmp_path, 'extends = "a.toml"\n', name="b.toml")
    err = config_error(tmp_path / "a.toml")
    assert "cycle" in str(err) and err.key == "extends"


def test_extends_unknown_base_lists_known_profiles(tmp_path):
    path = write(tmp_path, 'extends = "tpu-v9-like"\n')
    err = config_error(path)
    assert "tpu-v9-like" in str(err) and "tpu-v7-like" in str(err)
    # The error is the extending file's, at its key (it named neither).
    assert err.file == str(path) and err.key == "extends"
    assert str(err).startswith(f"{path}: extends: error: unknown hardware profile 'tpu-v9-like'")


def test_extends_a_missing_file_names_the_file_that_extends_it(tmp_path):
    path = write(tmp_path, 'extends = "base.toml"\n[core]\nmregs = 4\n')
    err = config_error(path)
    assert err.file == str(path) and err.key == "extends"
    assert f"{tmp_path / 'base.toml'}: no such file" in str(err)


def test_override_giving_both_units_is_an_error(tmp_path):
    path = write(tmp_path, edited("hop_latency_cycles = 50", "hop_latency_cycles = 50\nhop_latency_s = 1e-6"))
    err = config_error(path)
    assert err.file == str(path) and err.key == "ici.hop_latency_s"
    assert "not both" in str(err)


def test_an_extending_profile_giving_both_units_is_an_error(tmp_path):
    # (the merge took each key in turn, so the last unit used to win silently)
    path = write(tmp_path, 'extends = "test"\n[chip]\nhbm_bw_bytes_per_s = 1e12\nhbm_bw_bytes_per_cycle = 100\n')
    err = config_error(path)
    assert err.file == str(path) and err.key == "chip.hbm_bw_bytes_per_s" and "not both" in str(err)


def test_a_default_mesh_past_the_chip_limit_is_an_error_at_load(tmp_path):
    path = write(tmp_path, 'extends = "test"\n[mesh]\ndims = [41, 5, 5]\n')
    err = config_error(path)
    assert err.key == "mesh.dims" and "1,025 chips" in str(err) and "at most 1,024" in str(err)


# --------------------------------------------------------------------------- errors


def test_unknown_key_suggests_the_closest(tmp_path):
    path = write(tmp_path, edited("vmem_bytes = ", "vmem_byts = "))
    err = config_error(path)
    assert (err.file, err.key) == (str(path), "core.vmem_byts")
    assert "did you mean 'vmem_bytes'" in str(err)
    assert str(path) in str(err) and "core.vmem_byts" in str(err)


def test_key_in_the_wrong_section_says_where_it_belongs(tmp_path):
    path = write(tmp_path, 'extends = "test"\n[core]\nhop_latency_cycles = 3\n')
    err = config_error(path)
    assert err.key == "core.hop_latency_cycles" and "[ici]" in str(err)


def test_unknown_section_and_timing_class_suggest(tmp_path):
    err = config_error(write(tmp_path, 'extends = "test"\n[dmaa]\nmax_in_flight = 2\n'))
    assert err.key == "dmaa" and "did you mean 'dma'" in str(err)
    err = config_error(write(tmp_path, 'extends = "test"\n[timing]\nvalux = { latency_cycles = 1 }\n'))
    assert err.key == "timing.valux" and "did you mean 'valu'" in str(err)
    err = config_error(write(tmp_path, 'extends = "test"\n[timing]\nvalu = { latency = 1 }\n'))
    assert err.key == "timing.valu.latency" and "did you mean 'latency_cycles'" in str(err)


@pytest.mark.parametrize(
    ("old", "new", "key", "words"),
    [
        ("semaphores = 16", 'semaphores = "16"', "core.semaphores", "expected an integer"),
        ("semaphores = 16", "semaphores = true", "core.semaphores", "expected an integer"),
        ("semaphores = 16", "semaphores = 16.0", "core.semaphores", "expected an integer"),
        ("clock_hz = 1e9", 'clock_hz = "fast"', "chip.clock_hz", "expected a number"),
        ("hbm_bw_bytes_per_s = 64e9", "hbm_bw_bytes_per_s = false", "chip.hbm_bw_bytes_per_s", "expected a number"),
        ("dims = [2, 1, 1]", "dims = [2, 1]", "mesh.dims", "expected 3 entries"),
        ("dims = [2, 1, 1]", "dims = 2", "mesh.dims", "expected an array"),
        ("dims = [2, 1, 1]", 'dims = [2, "1", 1]', "mesh.dims[1]", "expected an integer"),
        ("wrap = [false, false, false]", "wrap = [0, 0, 0]", "mesh.wrap[0]", "expected true or false"),
        ("per_core_links = false", "per_core_links = 1", "ici.per_core_links", "expected true or false"),
        (
            "valu       = { latency_cycles = 2,  occupancy_cycles = 1 }",
            "valu = 2",
            "timing.valu",
            "inline table",
        ),
        (
            "valu       = { latency_cycles = 2,  occupancy_cycles = 1 }",
            'valu = { latency_cycles = "2", occupancy_cycles = 1 }',
            "timing.valu.latency_cycles",
            "expected an integer",
        ),
        ('name = "test"', "name = 3", "name", "expected a string"),
        # (a tile other than the one the ISA models would be shown, not emulated)
        ("vmem_tile = [8, 128]", "vmem_tile = [8, 100]", "core.vmem_tile", "must be [8, 128]"),
    ],
)
def test_wrong_type_names_file_and_key(tmp_path, old, new, key, words):
    path = write(tmp_path, edited(old, new))
    err = config_error(path)
    assert (err.file, err.key) == (str(path), key)
    assert words in str(err)


@pytest.mark.parametrize(
    ("old", "key"),
    [
        ("semaphores = 16\n", "core.semaphores"),
        ("hop_latency_cycles = 50\n", "ici.hop_latency_s"),
        ("sibling_signal_latency_cycles = 40\n", "chip.sibling_signal_latency_s"),
        ("per_core_links = false\n", "ici.per_core_links"),
        ("hbm_bw_bytes_per_s = 64e9", "chip.hbm_bw_bytes_per_s"),
        ("mxu_pop    = { latency_cycles = 2,  occupancy_cycles = 1 }\n", "timing.mxu_pop"),
        ("[launch]\nkernel_launch_cycles = 1000\n", "launch"),
    ],
)
def test_missing_value_names_file_and_key(tmp_path, old, key):
    path = write(tmp_path, edited(old, ""))
    err = config_error(path)
    assert (err.file, err.key) == (str(path), key)
    assert "missing" in str(err)


def test_missing_timing_field(tmp_path):
    path = write(tmp_path, edited(", occupancy_cycles = 8 }", " }"))
    err = config_error(path)
    assert err.key == "timing.mxu_mac.occupancy_cycles" and "missing" in str(err)


@pytest.mark.parametrize(
    ("old", "new", "key", "words"),
    [
        ("mxu_dim = 128", "mxu_dim = 192", "core.mxu_dim", "multiple of 128"),
        ("mxu_dim = 128", "mxu_dim = 0", "core.mxu_dim", "positive"),
        ("vmem_bytes = 4_194_304", "vmem_bytes = 4_194_000", "core.vmem_bytes", "multiple of 4096"),
        ("vmem_bytes = 4_194_304", "vmem_bytes = -4096", "core.vmem_bytes", "positive"),
        ("hbm_bytes = 67_108_864", "hbm_bytes = 0", "chip.hbm_bytes", "positive"),
        ("smem_bytes = 65_536", "smem_bytes = 65_535", "core.smem_bytes", "multiple of 4"),
        ("hbm_bw_bytes_per_s = 64e9", "hbm_bw_bytes_per_s = 0", "chip.hbm_bw_bytes_per_s", "positive"),
        ("clock_hz = 1e9", "clock_hz = -1e9", "chip.clock_hz", "positive"),
        ("clock_hz = 1e9", "clock_hz = nan", "chip.clock_hz", "finite"),
        ("cores_per_chip = 2", "cores_per_chip = 0", "chip.cores_per_chip", "1..16"),
        ("dims = [2, 1, 1]", "dims = [2, 0, 1]", "mesh.dims", "at least 1"),
        ("sregs = 32", "sregs = 64", "core.sregs", "2..32"),
        ("mregs = 8", "mregs = 9", "core.mregs", "2..8"),
        ("max_in_flight = 4", "max_in_flight = 0", "dma.max_in_flight", "at least 1"),
        ("hop_latency_cycles = 50", "hop_latency_cycles = -1", "ici.hop_latency_cycles", "negative"),
        # (a negative time in seconds under one cycle rounded up to 0 and passed)
        ("hop_latency_cycles = 50", "hop_latency_s = -1e-10", "ici.hop_latency_s", "negative"),
        ("kernel_launch_cycles = 1000", "kernel_launch_s = -4e-10", "launch.kernel_launch_s", "negative"),
        ("mxus_per_core = 2", "mxus_per_core = 5", "core.mxus_per_core", "1..4"),
        (
            "mxu_mac    = { latency_cycles = 16, occupancy_cycles = 8 }",
            "mxu_mac = { latency_cycles = 99999999999999999999, occupancy_cycles = 8 }",
            "timing.mxu_mac.latency_cycles",
            "64-bit integers",
        ),
        ("mxu_accumulators = 4", "mxu_accumulators = 17", "core.mxu_accumulators", "1..16"),
        ("cores_per_chip = 2", "cores_per_chip = 17", "chip.cores_per_chip", "1..16"),
        ("semaphores = 16", "semaphores = 65_537", "core.semaphores", "1..65536"),
        ("vmem_bytes = 4_194_304", "vmem_bytes = 2_147_483_648", "core.vmem_bytes", "at most 1,073,741,824"),
        ("smem_bytes = 65_536", "smem_bytes = 134_217_728", "core.smem_bytes", "at most 67,108,864"),
        ("semaphores = 16", "semaphores = 99999999999999999999", "core.semaphores", "64-bit integers"),
        ("kernel_launch_cycles = 1000", "kernel_launch_cycles = 99999999999999999999",
         "launch.kernel_launch_cycles", "64-bit integers"),
        ("dims = [2, 1, 1]", "dims = [2, 99999999999999999999, 1]", "mesh.dims", "64-bit integers"),
        (
            "vld        = { latency_cycles = 2,  occupancy_cycles = 1 }",
            "vld = { latency_cycles = 0, occupancy_cycles = 1 }",
            "timing.vld.latency_cycles",
            "at least 1",
        ),
        (
            "vld        = { latency_cycles = 2,  occupancy_cycles = 1 }",
            "vld = { latency_cycles = 2, occupancy_cycles = 0 }",
            "timing.vld.occupancy_cycles",
            "at least 1",
        ),
    ],
)
def test_impossible_value_names_file_and_key(tmp_path, old, new, key, words):
    path = write(tmp_path, edited(old, new))
    err = config_error(path)
    assert (err.file, err.key) == (str(path), key)
    assert words in str(err)
    assert str(path) in str(err) and key in str(err)


def test_bad_toml_syntax_reports_line_and_column(tmp_path):
    path = write(tmp_path, 'name = "x"\n[chip]\nclock_hz = = 1e9\n')
    err = config_error(path)
    # (the file is the path a program can open; the place is in line and column)
    assert (err.file, err.line, err.column) == (str(path), 3, 12)
    assert str(err).startswith(f"{path}:3:12: error: invalid TOML")


def test_a_byte_order_mark_before_the_toml_is_read_past(tmp_path):
    # (some editors start a UTF-8 file with one; it was "invalid TOML: Invalid statement")
    path = tmp_path / "bom.toml"
    path.write_bytes("\ufeff".encode() + b'extends = "test"\nname = "bom"\n[chip]\nclock_hz = 2e9\n')
    profile = load_profile(str(path))
    assert (profile.name, profile.clock_hz) == ("bom", 2e9)
    path.write_bytes("\ufeff".encode() + b'name = "x"\n[chip]\nclock_hz = = 1e9\n')
    assert (config_error(path).line, config_error(path).column) == (3, 12)


def test_unreadable_file(tmp_path):
    err = config_error(tmp_path / "nope.toml")
    assert err.file == str(tmp_path / "nope.toml") and "cannot read" in str(err)


def test_unknown_profile_name_lists_known_ones():
    with pytest.raises(ConfigError) as info:
        load_profile("tpu-v7")
    text = str(info.value)
    assert "unknown hardware profile 'tpu-v7'" in text
    assert "did you mean 'tpu-v7-like'" in text
    for name in SHIPPED:
        assert name in text


def test_error_in_a_user_base_names_the_base_file(tmp_path):
    base = write(tmp_path, edited("semaphores = 16", "semaphores = 0"), name="base.toml")
    top = write(tmp_path, 'extends = "base.toml"\n[core]\nmregs = 4\n', name="top.toml")
    err = config_error(top)
    assert (err.file, err.key) == (str(base), "core.semaphores")


def test_path_object_and_relative_path(tmp_path, monkeypatch):
    path = write(tmp_path, 'extends = "test"\n', name="mine.toml")
    assert load_profile(path).name == "mine"
    monkeypatch.chdir(tmp_path)
    assert load_profile("mine.toml").source == str(tmp_path / "mine.toml")
    assert not math.isnan(load_profile("mine.toml").clock_hz)


def test_toml_key_finds_the_section_of_a_value():
    assert hardware.toml_key("hbm_bw_bytes_per_s") == "chip.hbm_bw_bytes_per_s"
    assert hardware.toml_key("ici.hop_latency_s") == "ici.hop_latency_s"
    assert hardware.toml_key("mxus_per_core") == "core.mxus_per_core"
    with pytest.raises(ConfigError, match=r"no profile value 'chip.mxus_per_core' \(did you mean "
                                          r"'core.mxus_per_core'\?\); the values: chip.clock_hz, "):
        hardware.toml_key("chip.mxus_per_core")
    with pytest.raises(ConfigError, match=r"no profile value 'mxu_per_core' \(did you mean 'mxus_per_core'\?\)"):
        hardware.toml_key("mxu_per_core")


@pytest.mark.parametrize("text, key, message", [
    # a decimal integer of thousands of digits: tomllib's int() raised a ValueError traceback
    ('extends = "test"\n[core]\nsemaphores = ' + "9" * 5000 + "\n", None, "invalid TOML: an integer of thousands"),
    # a hex one is read, then the check's message printed it with str(), which refused it
    ('extends = "test"\n[core]\nsemaphores = 0x' + "f" * 5000 + "\n", "core.semaphores", "20000 bits"),
    ('extends = 0x' + "f" * 4000 + "\n", "extends", "16000 bits"),
    # an integer past float's range in a number field: OverflowError from math.isfinite
    ('extends = "test"\n[chip]\nclock_hz = 1' + "0" * 400 + "\n", "chip.clock_hz", "1329 bits"),
    ('extends = "test"\n[dma]\nstart_latency_s = 1' + "0" * 400 + "\n", "dma.start_latency_s", "1329 bits"),
    ('extends = "test"\n[timing]\nscalar = { latency_cycles = 1' + "0" * 400 + ", occupancy_cycles = 1 }\n",
     "timing.scalar.latency_cycles", "1329 bits"),
])
def test_an_integer_of_huge_width_is_a_config_error(tmp_path, text, key, message):
    err = config_error(write(tmp_path, text))
    assert message in str(err)
    if key:
        assert key in err.render()


def test_a_wide_but_not_huge_integer_keeps_its_message(tmp_path):
    err = config_error(write(tmp_path, 'extends = "test"\n[core]\nsemaphores = 99999999999999999999999\n'))
    assert "got 99999999999999999999999" in str(err)


def test_a_profile_that_is_not_a_regular_file_is_refused_unread(tmp_path):
    # (a device or a pipe may never end: /dev/zero filled memory; a pipe blocked)
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    (tmp_path / "folder.toml").mkdir()
    for path in (fifo, tmp_path / "folder.toml"):
        assert "cannot read profile: it is not a regular file" in str(config_error(path))
    err = config_error(write(tmp_path, f'extends = "{fifo}"\n'))
    assert "cannot read profile: it is not a regular file" in str(err) and str(fifo) in err.render()


def test_a_profile_nested_thousands_deep_is_invalid_toml(tmp_path):
    err = config_error(write(tmp_path, "x = " + "[" * 5000 + "]" * 5000 + "\n"))
    assert "invalid TOML: nested too deeply to read" in str(err)


# --------------------------------------------------------------------------- machine size


def test_a_profile_whose_mesh_holds_more_cores_than_the_emulator_takes_is_refused(tmp_path):
    # 16 cores per chip and 512 chips are each allowed alone; together 8,192 cores would
    # need about 26 GB of host memory.
    text = edited("cores_per_chip = 2", "cores_per_chip = 16").replace(TEST_DIMS, "dims = [16, 16, 2]", 1)
    err = config_error(write(tmp_path, text))
    assert err.key == "mesh.dims"
    assert "512 chips of 16 cores are 8,192 cores; the emulator takes at most 4,096" in err.message
    assert "about 26 GB" in err.message


def test_a_profile_of_exactly_the_most_cores_loads(tmp_path):
    text = edited("cores_per_chip = 2", "cores_per_chip = 16").replace(TEST_DIMS, "dims = [16, 16, 1]", 1)
    p = load_profile(write(tmp_path, text))
    assert math.prod(p.mesh_dims) * p.cores_per_chip == hardware.MAX_CORES


@pytest.mark.parametrize("clock", ["5e-324", "1e-300", "0.5"])
def test_a_clock_below_1_hz_is_refused_naming_it(tmp_path, clock):
    # With bandwidths in bytes per cycle nothing else trips: a run then printed "inf us"
    # and a sweep's record held Infinity, which is not JSON.
    text = TEST_TOML.replace("clock_hz = 1e9", f"clock_hz = {clock}")
    for key, per_s, per_cycle in (("hbm", "64e9", 64), ("sibling", "16e9", 16), ("engine", "32e9", 32),
                                  ("link", "8e9", 8)):
        text = text.replace(f"{key}_bw_bytes_per_s = {per_s}", f"{key}_bw_bytes_per_cycle = {per_cycle}")
    assert "_per_s" not in text.split("[timing]")[0]
    error = config_error(write(tmp_path, text))
    assert (error.key, error.message) == ("chip.clock_hz", f"must be at least 1 (Hz), got {float(clock)}")
    assert load_profile(write(tmp_path, text.replace(f"clock_hz = {clock}", "clock_hz = 1"), "one.toml")).clock_hz == 1
