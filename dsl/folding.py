"""Compile-time integer arithmetic and the scalar analyses behind static bounds checks.

`fold_int` folds an operator with the language's C semantics (`/` and `%` truncate);
`broadcast` is numpy's rule on 2-D tile shapes; `linear` writes a scalar expression
as a sum of atoms with integer coefficients, which is how slice lengths and the
`if`-narrowing of loop ranges are worked out.
"""

from __future__ import annotations

from mkemu.dsl import ir

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

