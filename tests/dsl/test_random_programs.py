"""Random valid programs: the IR interpreter agrees with numpy, and compiled code run
on the emulator agrees with the interpreter bit for bit."""

from __future__ import annotations

import importlib

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ir_interp import run_program
from random_programs import Generated, elementwise_programs, matmul_programs

from mkemu.dsl.frontend import load_program

SLOW = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)


def same_bits(expected: np.ndarray, actual: np.ndarray) -> bool:
    """Bit-exact equality, any NaN equal to any NaN (the contract's comparison)."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.shape != actual.shape:
        return False
    if expected.dtype.kind == "f":
        e, a = expected.astype(np.float32), actual.astype(np.float32)
        return bool(np.all((e.view(np.uint32) == a.view(np.uint32)) | (np.isnan(e) & np.isnan(a))))
    return bool(np.array_equal(expected, actual))


def first_difference(expected: np.ndarray, actual: np.ndarray) -> str:
    if expected.shape != actual.shape:
        return f"shape {actual.shape}, expected {expected.shape}"
    for idx in np.ndindex(expected.shape):
        if not same_bits(expected[idx], actual[idx]):
            return f"at {idx}: got {actual[idx]!r}, expected {expected[idx]!r}"
    return "none"


def interpret(gen: Generated, inputs: dict) -> np.ndarray:
    program = load_program("random.mk", text=gen.text)
    return run_program(program, inputs)["out"]


def check_interpreter(gen: Generated, seed: int, specials: bool) -> None:
    inputs = gen.make_inputs(seed, specials)
    expected = np.asarray(gen.expected(inputs))
    actual = interpret(gen, inputs)
    assert same_bits(expected, actual), f"{first_difference(expected, actual)}\n{gen.text}"


@SLOW
@given(elementwise_programs(), st.integers(0, 2**32 - 1), st.booleans())
def test_interpreter_agrees_with_numpy_on_elementwise_programs(gen, seed, specials):
    check_interpreter(gen, seed, specials)


@SLOW
@given(matmul_programs(), st.integers(0, 2**32 - 1))
def test_interpreter_agrees_with_numpy_on_matmul_programs(gen, seed):
    check_interpreter(gen, seed, False)


# ------------------------------------------------------------ on the emulator


def compiler():
    """The back end."""
    return importlib.import_module("mkemu.dsl.compiler")


def emulate(gen: Generated, inputs: dict) -> np.ndarray:
    from mkemu import runner
    from mkemu.emulator.machine import Machine
    from mkemu.emulator.topology import Mesh
    from mkemu.isa.hardware import load_profile

    profile = load_profile("test")
    program = compiler().compile_text(gen.text, "random.mk", profile)
    machine = Machine(profile, Mesh((1, 1, 1)))
    machine.load(program)
    for inp in gen.inputs:
        machine.write_buffer(0, inp.name, runner.to_storage(inputs[inp.name], inp.dtype))
    machine.run()
    return runner.from_storage(machine.read_buffer(0, "out"), gen.output.dtype)


def check_emulator(gen: Generated, seed: int, specials: bool) -> None:
    inputs = gen.make_inputs(seed, specials)
    expected = interpret(gen, inputs)
    actual = emulate(gen, inputs)
    assert same_bits(expected, actual), f"{first_difference(expected, actual)}\n{gen.text}"


@SLOW
@given(elementwise_programs(), st.integers(0, 2**32 - 1), st.booleans())
def test_elementwise_programs_run_bit_exact_on_the_emulator(gen, seed, specials):
    compiler()
    check_emulator(gen, seed, specials)


@SLOW
@given(matmul_programs(), st.integers(0, 2**32 - 1))
def test_matmul_programs_run_bit_exact_on_the_emulator(gen, seed):
    compiler()
    check_emulator(gen, seed, False)
