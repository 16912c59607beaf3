"""A small generator of random valid .mk programs, for property tests.

A program loads one to three HBM inputs of shapes [R, C], [R, 1], [1, C] or [1, 1]
(R in 1..16, C in 1..300; f32, bf16 or i32) into VMEM, binds up to two `let` tiles,
stores one expression tree of depth <= 3 (elementwise arithmetic, transcendentals,
compare/select, broadcasting, reductions along either axis, argmax, conversions) into
an [R, C] output and copies it back. A second family multiplies a bf16 [R, K] by a
bf16 [K, N] on the matrix unit, optionally split along K into a `var` accumulator.

Every generated expression carries its own numpy evaluation, written from the numeric
contract independently of `ir_interp`, so the interpreter can be checked against it.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import numpy as np
from hypothesis import strategies as st

from mkemu.isa import numerics as nx

F32_UNARY = ("exp", "log", "exp2", "log2", "sqrt", "rsqrt", "recip", "sigmoid", "tanh", "silu", "abs", "neg")
F32_BINARY = ("+", "-", "*", "/", "max", "min")
I32_BINARY = ("+", "-", "*", "&", "|", "^", "max", "min")
COMPARES = ("<", "<=", "==", "!=", ">", ">=")
REDUCTIONS = ("sum", "max", "min")
F32_LITERALS = (0.0, 1.0, 0.5, 2.0, 3.0, 1e-05, 1500.0, -1.0, -0.25)
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -3e38, 3e38], np.float32)
I32_MIN, I32_MAX = -(2**31), 2**31 - 1

Env = dict  # name -> value (f32/bf16 inputs as float32 arrays, i32 as int32)


@attrs.frozen
class Expr:
    text: str
    dtype: str                      # "f32" or "i32"
    shape: tuple[int, int]
    eval: Callable[[Env], np.ndarray]
    literal: bool = False           # a bare literal (a weak constant in the language)


@attrs.frozen
class Input:
    name: str
    dtype: str
    shape: tuple[int, int]


@attrs.frozen
class Generated:
    text: str
    inputs: tuple[Input, ...]
    output: Input
    expected: Callable[[Env], np.ndarray]

    def make_inputs(self, seed: int, specials: bool) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        out = {}
        for inp in self.inputs:
            if inp.dtype == "i32":
                out[inp.name] = rng.integers(-1000, 1000, size=inp.shape, dtype=np.int32)
                continue
            x = (rng.standard_normal(inp.shape) * rng.choice([1.0, 100.0])).astype(np.float32)
            if specials:
                pick = rng.random(inp.shape) < 0.15
                x = np.where(pick, rng.choice(SPECIALS, size=inp.shape), x).astype(np.float32)
            out[inp.name] = nx.bf16_round(x) if inp.dtype == "bf16" else x
        return out


# -------------------------------------------------------------- the contract


def _broadcast(*shapes):
    return tuple(max(s[d] for s in shapes) for d in range(2))


def _pad(x: np.ndarray, axis: int, identity) -> np.ndarray:
    n = x.shape[axis]
    full = 8 if axis == 0 else 128
    while full < n:
        full *= 2
    width = [(0, 0), (0, 0)]
    width[axis] = (0, full - n)
    return np.pad(x, width, constant_values=identity)


def f32_reduce(op: str, x: np.ndarray, axis: int) -> np.ndarray:
    identity = {"sum": 0.0, "max": -np.inf, "min": np.inf}[op]
    tree = {"sum": nx.tree_sum_f32, "max": nx.tree_max_f32, "min": nx.tree_min_f32}[op]
    return tree(_pad(x, axis, np.float32(identity)), axis=axis, keepdims=True)


def i32_reduce(op: str, x: np.ndarray, axis: int) -> np.ndarray:
    if op == "sum":  # wrapping addition is associative: any order gives the same bits
        return nx.i32_wrap(x.astype(np.int64).sum(axis=axis, keepdims=True))
    return (np.max if op == "max" else np.min)(x, axis=axis, keepdims=True)


def argmax(x: np.ndarray, axis: int) -> np.ndarray:
    """The lowest index whose value equals the tree maximum; if that is NaN (a NaN
    propagates through f32_max), the lowest NaN."""
    top = f32_reduce("max", x, axis)
    hit = np.where(np.isnan(top), np.isnan(x), x == top)
    return np.argmax(hit, axis=axis).astype(np.int32).reshape(top.shape)


def f32_binary(op: str, a, b):
    if op == "max":
        return nx.f32_max(a, b)
    if op == "min":
        return nx.f32_min(a, b)
    return {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}[op](a, b)


def i32_binary(op: str, a, b):
    if op == "max":
        return np.maximum(a, b)
    if op == "min":
        return np.minimum(a, b)
    a, b = a.astype(np.int64), b.astype(np.int64)
    fn = {"+": np.add, "-": np.subtract, "*": np.multiply, "&": np.bitwise_and, "|": np.bitwise_or,
          "^": np.bitwise_xor, "<<": np.left_shift, ">>": np.right_shift}[op]
    return nx.i32_wrap(fn(a, b))


def f32_unary(op: str, x):
    if op == "neg":
        return -x
    if op == "abs":
        return np.abs(x)
    return {"exp": nx.exp, "log": nx.log, "exp2": nx.exp2, "log2": nx.log2, "sqrt": nx.sqrt,
            "rsqrt": nx.rsqrt, "recip": nx.reciprocal, "sigmoid": nx.sigmoid, "tanh": nx.tanh,
            "silu": nx.silu}[op](x)


def compare(op: str, a, b):
    return {"<": np.less, "<=": np.less_equal, "==": np.equal, "!=": np.not_equal,
            ">": np.greater, ">=": np.greater_equal}[op](a, b)


# ----------------------------------------------------------------- generator


class _Builder:
    """Draws expressions over a fixed set of leaves."""

    def __init__(self, draw, leaves: list[Expr], allow_argmax: bool):
        self.draw = draw
        self.leaves = leaves
        self.allow_argmax = allow_argmax

    def leaf(self, dtype: str) -> Expr:
        choices = [e for e in self.leaves if e.dtype == dtype]
        if not choices:  # convert a leaf of the other dtype
            other = self.draw(st.sampled_from(self.leaves))
            return self.convert(other, dtype)
        return self.draw(st.sampled_from(choices))

    def convert(self, e: Expr, dtype: str) -> Expr:
        if dtype == "f32":
            return Expr(f"f32({e.text})", "f32", e.shape, lambda env: nx.i32_to_f32(e.eval(env)))
        return Expr(f"i32({e.text})", "i32", e.shape, lambda env: nx.f32_to_i32(e.eval(env)))

    def literal(self, dtype: str) -> Expr:
        if dtype == "i32":
            v = self.draw(st.integers(-7, 7))
            return Expr(f"({v})" if v < 0 else str(v), "i32", (1, 1),
                        lambda env: np.full((1, 1), v, np.int32), literal=True)
        v = self.draw(st.sampled_from(F32_LITERALS))
        text = repr(v)
        return Expr(f"({text})" if v < 0 else text, "f32", (1, 1),
                    lambda env: np.full((1, 1), np.float32(v)), literal=True)

    def expr(self, dtype: str, depth: int) -> Expr:
        if depth == 0 or self.draw(st.integers(0, 3)) == 0:
            return self.leaf(dtype)
        return (self.f32 if dtype == "f32" else self.i32)(depth)

    def operand(self, dtype: str, depth: int) -> Expr:
        """A right-hand operand: sometimes a literal (the left one never is)."""
        if self.draw(st.integers(0, 4)) == 0:
            return self.literal(dtype)
        return self.expr(dtype, depth)

    def f32(self, depth: int) -> Expr:
        kinds = ["unary", "binary", "binary", "where", "reduce", "round", "from_i32"]
        if self.allow_argmax:
            kinds.append("argmax")
        kind = self.draw(st.sampled_from(kinds))
        d = depth - 1
        if kind == "unary":
            op = self.draw(st.sampled_from(F32_UNARY))
            a = self.expr("f32", d)
            text = f"-({a.text})" if op == "neg" else f"{op}({a.text})"
            return Expr(text, "f32", a.shape, lambda env: f32_unary(op, a.eval(env)))
        if kind == "binary":
            op = self.draw(st.sampled_from(F32_BINARY))
            a, b = self.expr("f32", d), self.operand("f32", d)
            text = f"{op}({a.text}, {b.text})" if op in ("max", "min") else f"({a.text} {op} {b.text})"
            return Expr(text, "f32", _broadcast(a.shape, b.shape),
                        lambda env: f32_binary(op, a.eval(env), b.eval(env)))
        if kind == "where":
            op = self.draw(st.sampled_from(COMPARES))
            a, b = self.expr("f32", d), self.operand("f32", d)
            x, y = self.expr("f32", d), self.operand("f32", d)
            shape = _broadcast(a.shape, b.shape, x.shape, y.shape)
            return Expr(f"where({a.text} {op} {b.text}, {x.text}, {y.text})", "f32", shape,
                        lambda env: np.where(compare(op, a.eval(env), b.eval(env)), x.eval(env), y.eval(env)))
        if kind == "reduce":
            op = self.draw(st.sampled_from(REDUCTIONS))
            axis = self.draw(st.integers(0, 1))
            a = self.expr("f32", d)
            shape = (1, a.shape[1]) if axis == 0 else (a.shape[0], 1)
            return Expr(f"{op}({a.text}, axis={axis})", "f32", shape,
                        lambda env: f32_reduce(op, np.broadcast_to(a.eval(env), a.shape), axis))
        if kind == "round":
            a = self.expr("f32", d)
            return Expr(f"f32(bf16({a.text}))", "f32", a.shape, lambda env: nx.bf16_round(a.eval(env)))
        if kind == "from_i32":
            return self.convert(self.expr("i32", d), "f32")
        axis = self.draw(st.integers(0, 1))
        a = self.expr("f32", d)
        shape = (1, a.shape[1]) if axis == 0 else (a.shape[0], 1)
        return Expr(f"f32(argmax({a.text}, axis={axis}))", "f32", shape,
                    lambda env: nx.i32_to_f32(argmax(np.broadcast_to(a.eval(env), a.shape), axis)))

    def i32(self, depth: int) -> Expr:
        kind = self.draw(st.sampled_from(["binary", "binary", "shift", "unary", "reduce", "from_f32"]))
        d = depth - 1
        if kind == "binary":
            op = self.draw(st.sampled_from(I32_BINARY))
            a, b = self.expr("i32", d), self.operand("i32", d)
            text = f"{op}({a.text}, {b.text})" if op in ("max", "min") else f"({a.text} {op} {b.text})"
            return Expr(text, "i32", _broadcast(a.shape, b.shape),
                        lambda env: i32_binary(op, a.eval(env), b.eval(env)))
        if kind == "shift":
            op = self.draw(st.sampled_from(["<<", ">>"]))
            a, n = self.expr("i32", d), self.draw(st.integers(0, 31))
            return Expr(f"({a.text} {op} {n})", "i32", a.shape,
                        lambda env: i32_binary(op, a.eval(env), np.int32(n)))
        if kind == "unary":
            op = self.draw(st.sampled_from(["abs", "neg"]))
            a = self.expr("i32", d)
            text = f"-({a.text})" if op == "neg" else f"abs({a.text})"
            fn = np.negative if op == "neg" else np.abs
            return Expr(text, "i32", a.shape, lambda env: nx.i32_wrap(fn(a.eval(env).astype(np.int64))))
        if kind == "reduce":
            op = self.draw(st.sampled_from(REDUCTIONS))
            axis = self.draw(st.integers(0, 1))
            a = self.expr("i32", d)
            shape = (1, a.shape[1]) if axis == 0 else (a.shape[0], 1)
            return Expr(f"{op}({a.text}, axis={axis})", "i32", shape,
                        lambda env: i32_reduce(op, np.broadcast_to(a.eval(env), a.shape), axis))
        return self.convert(self.expr("f32", d), "i32")


@st.composite
def elementwise_programs(draw) -> Generated:
    R = draw(st.integers(1, 16))
    C = draw(st.integers(1, 300))
    shapes = {"full": (R, C), "col": (R, 1), "row": (1, C), "one": (1, 1)}
    n = draw(st.integers(1, 3))
    inputs = []
    for i in range(n):
        kind = "full" if i == 0 else draw(st.sampled_from(list(shapes)))
        dtype = draw(st.sampled_from(["f32", "f32", "f32", "bf16", "i32"]))
        inputs.append(Input(f"a{i}", dtype, shapes[kind]))
    leaves = []
    for i, inp in enumerate(inputs):
        if inp.dtype == "i32":
            leaves.append(Expr(f"v{i}", "i32", inp.shape, lambda env, k=inp.name: env[k]))
        else:  # bf16 takes part in arithmetic only through f32()
            text = f"f32(v{i})" if inp.dtype == "bf16" else f"v{i}"
            leaves.append(Expr(text, "f32", inp.shape, lambda env, k=inp.name: env[k]))
    allow_argmax = draw(st.booleans())
    b = _Builder(draw, leaves, allow_argmax)
    lets = []
    for k in range(draw(st.integers(0, 2))):
        dtype = draw(st.sampled_from(["f32", "f32", "i32"]))
        e = b.expr(dtype, 2)
        if e.literal:
            continue
        name = f"t{k}"
        lets.append((name, e))
        b.leaves.append(Expr(name, e.dtype, e.shape, lambda env, k=name: env[k]))
    out_dtype = draw(st.sampled_from(["f32", "f32", "bf16", "i32"]))
    body = b.i32(3) if out_dtype == "i32" else b.f32(3)
    value = f"bf16({body.text})" if out_dtype == "bf16" else body.text

    def expected(env: Env) -> np.ndarray:
        env = dict(env)
        with np.errstate(all="ignore"):
            for name, e in lets:
                env[name] = np.broadcast_to(e.eval(env), e.shape)
            y = np.broadcast_to(body.eval(env), (R, C))
        return nx.bf16_round(y) if out_dtype == "bf16" else y

    output = Input("out", out_dtype, (R, C))
    text = _kernel_text(inputs, output, [f"let {name} = {e.text};" for name, e in lets] + [f"vo = {value};"])
    return Generated(text, tuple(inputs), output, expected)


@st.composite
def matmul_programs(draw) -> Generated:
    """y = matmul(x, w) (+ an f32 epilogue), or the same split along K into a var."""
    R = draw(st.integers(1, 16))
    K = draw(st.integers(1, 300))
    N = draw(st.integers(1, 300))
    inputs = (Input("a0", "bf16", (R, K)), Input("a1", "bf16", (K, N)))
    output = Input("out", "f32", (R, N))
    split = K > 1 and draw(st.booleans())
    if split:
        k1 = draw(st.integers(1, K - 1))
        lines = [
            f"var acc: f32[{R}, {N}] = 0.0;",
            f"acc += matmul(v0[:, 0:{k1}], v1[0:{k1}, :]);",
            f"acc += matmul(v0[:, {k1}:{K}], v1[{k1}:{K}, :]);",
            "vo = acc;",
        ]

        def expected(env: Env) -> np.ndarray:
            # Each matmul starts from zero; `+=` is one more float32 addition.
            x, w, zero = env["a0"], env["a1"], np.zeros((R, N), np.float32)
            acc = zero + nx.mxu_matmul(zero, x[:, :k1], w[:k1])
            return acc + nx.mxu_matmul(zero, x[:, k1:], w[k1:])
    else:
        epilogue = draw(st.sampled_from(["", "silu", "scale"]))
        mm = "matmul(v0, v1)"
        value = {"": mm, "silu": f"silu({mm})", "scale": f"{mm} * 0.5 + f32(v0[:, 0:1])"}[epilogue]
        lines = [f"vo = {value};"]

        def expected(env: Env) -> np.ndarray:
            y = nx.mxu_matmul(np.zeros((R, N), np.float32), env["a0"], env["a1"])
            if epilogue == "silu":
                return nx.silu(y)
            if epilogue == "scale":
                return y * np.float32(0.5) + env["a0"][:, 0:1]
            return y
    return Generated(_kernel_text(inputs, output, lines), inputs, output, expected)


def _decl(shape) -> str:
    return ", ".join(map(str, shape))


def _kernel_text(inputs, output: Input, body_lines: list[str]) -> str:
    params = ", ".join(f"{i.name}: hbm {i.dtype}[{_decl(i.shape)}]" for i in inputs)
    lines = [f"kernel k({params}, out: hbm {output.dtype}[{_decl(output.shape)}]) {{"]
    for n, i in enumerate(inputs):
        lines.append(f"    vmem v{n}: {i.dtype}[{_decl(i.shape)}];")
    lines.append(f"    vmem vo: {output.dtype}[{_decl(output.shape)}];")
    lines.append("    sem s;")
    for n, i in enumerate(inputs):
        lines.append(f"    start copy({i.name}, v{n}, s);")
    for n, i in enumerate(inputs):
        lines.append(f"    wait copy({i.name}, v{n}, s);")
    lines += [f"    {line}" for line in body_lines]
    lines += ["    start copy(vo, out, s);", "    wait copy(vo, out, s);", "}", "", "host {"]
    for i in inputs:
        lines.append(f"    input {i.name}: {i.dtype}[{_decl(i.shape)}];")
    lines.append(f"    output out: {output.dtype}[{_decl(output.shape)}];")
    args = ", ".join(i.name for i in inputs)
    lines += [f"    launch k({args}, out);", "}", ""]
    return "\n".join(lines)
