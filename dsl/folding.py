"""Compile-time arithmetic and the scalar analyses behind static bounds checks.

`fold_int` folds an operator with the language's C semantics (`/` and `%` truncate);
`f32_round`, `decimal_f32` and `fold_f32` give float constants the bits the vector
unit would (docs/numerics.md: IEEE binary32, one rounding to nearest even per
operation); `broadcast` is numpy's rule on 2-D tile shapes; `linear` writes a scalar
expression as a sum of atoms with integer coefficients, which is how slice lengths
and the `if`-narrowing of loop ranges are worked out.
"""

from __future__ import annotations

import numpy as np

from mkemu.dsl import ir
from mkemu.isa import numerics
from mkemu.isa.encoding import parse_f32_bits

# Compile-time integers are Python's (unbounded): a literal or a folded result beyond this
# many bits is an error, not hours of arithmetic, an integer too long to print or one
# float() refuses.
MAX_INT_BITS = 512


def int_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def int_rem(a: int, b: int) -> int:
    return a - b * int_div(a, b)


def fold_int(op: str, a: int, b: int) -> int:
    match op:
        case "+": return a + b
        case "-": return a - b
        case "*": return a * b
        case "/": return int_div(a, b)
        case "%": return int_rem(a, b)
        case "<<": return a << b
        case ">>": return a >> b
        case "&": return a & b
        case "|": return a | b
        case "^": return a ^ b
        case "==": return int(a == b)
        case "!=": return int(a != b)
        case "<": return int(a < b)
        case "<=": return int(a <= b)
        case ">": return int(a > b)
        case ">=": return int(a >= b)
        case "&&": return int(bool(a) and bool(b))
        case "||": return int(bool(a) or bool(b))
        case "min": return min(a, b)
        case "max": return max(a, b)
    raise AssertionError(op)


# ------------------------------------------------------------ f32 constants

def decimal_f32(text: str) -> float:
    """The float32 nearest a decimal number's exact value (a float literal's text, or an
    integer's digits), ties to even, rounded once as the assembler rounds its immediates
    (`isa.encoding.parse_f32_bits`): +-inf past the f32 range, 0 below half its smallest
    subnormal."""
    return float(np.array([parse_f32_bits(text)], np.uint32).view(np.float32)[0])


def f32_round(x: int) -> float:
    """An integer as the float32 nearest it (ties to even; +-inf past the f32 range)."""
    return decimal_f32(str(x))


def fold_f32(op: str, x: float, y: float) -> float:
    """x op y for float32 values, as the vector unit computes it (numpy float32: one
    IEEE rounding; x / 0 is +-inf or NaN, overflow is inf)."""
    a, b = np.float32(x), np.float32(y)
    with np.errstate(all="ignore"):
        match op:
            case "+": r = a + b
            case "-": r = a - b
            case "*": r = a * b
            case "/": r = a / b
            case _: raise AssertionError(op)
    return float(r)


def f32_extreme(op: str, x: float, y: float) -> float:
    """max / min of float32 values as the vector unit's `f32_max` / `f32_min`
    (docs/numerics.md: NaN propagates, max(+0, -0) = +0, min(+0, -0) = -0)."""
    return float((numerics.f32_max if op == "max" else numerics.f32_min)(x, y))


def broadcast(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return (out[0], out[1])



# ----------------------------------------------------------- scalar analyses


def skey(e) -> tuple:
    """A structural key of a scalar expression (for comparing slice bounds)."""
    match e:
        case ir.Const():
            return ("c", e.value)
        case ir.ScalarRead():
            return ("v", id(e.var))
        case ir.ScalarOp():
            return (e.op,) + tuple(skey(a) for a in e.args)
        case ir.SmemLoad():
            return ("m", id(e.ref.buffer), skey(e.ref.slot) if e.ref.slot else None) + tuple(
                skey(o) for o in e.ref.offsets
            )
        case ir.Spmd():
            return ("s", e.name) + tuple(skey(a) for a in e.args)
    return ("?", id(e))


def linear(e) -> dict:
    """e as {atom key: coefficient} (key 1 for the constant term)."""
    if isinstance(e, ir.Const):
        return {1: e.value}
    if isinstance(e, ir.ScalarOp):
        if e.op in ("+", "-"):
            a, b = linear(e.args[0]), linear(e.args[1])
            sign = 1 if e.op == "+" else -1
            for k, v in b.items():
                a[k] = a.get(k, 0) + sign * v
            return {k: v for k, v in a.items() if v}
        if e.op == "neg":
            return {k: -v for k, v in linear(e.args[0]).items()}
        if e.op == "*":
            for c, other in ((e.args[0], e.args[1]), (e.args[1], e.args[0])):
                if isinstance(c, ir.Const):
                    return {k: v * c.value for k, v in linear(other).items() if v * c.value}
    return {skey(e): 1}

