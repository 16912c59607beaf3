"""A newcomer's reference mistakes (helper-72): each is one clear message, never a
PASS that checked nothing, and never a pointer into mkemu's own code."""

import numpy as np
import pytest

import mkemu

DOUBLE = """
reference "r.py:{fn}";
kernel k(x: hbm f32[8, 128], y: hbm f32[8, 128]) {{
    vmem xv: f32[8, 128];
    sem s;
    start copy(x, xv, s);
    wait copy(x, xv, s);
    xv = xv * 2.0;
    start copy(xv, y, s);
    wait copy(xv, y, s);
}}
"""

REFS = """
import numpy as np
def empty(inputs, *, chips, cores_per_chip):
    return {}
def other_chip_only(inputs, *, chips, cores_per_chip):
    return {"y@0": inputs["x@0"] * np.float32(2)}
def small(inputs, *, chips, cores_per_chip):
    return {"y": np.zeros((4, 4), np.float32)}
def positional(inputs):
    return {"y": inputs["x@0"] * 2}
def bf16(inputs, *, chips, cores_per_chip):
    import ml_dtypes
    return {"y": (inputs["x@0"] * 2).astype(ml_dtypes.bfloat16)}
def leaves(inputs, *, chips, cores_per_chip):
    import sys
    sys.exit(0)
"""


def run(tmp_path, fn):
    (tmp_path / "r.py").write_text(REFS)
    kernel = mkemu.compile_source(DOUBLE.format(fn=fn), tmp_path / "p.mk", hw="test", mesh="1")
    return kernel(x=np.ones((8, 128), np.float32))


def test_a_reference_that_leaves_out_an_output_is_an_error_not_a_pass(tmp_path):
    # It used to PASS (bit_exact True) having compared nothing.
    with pytest.raises(mkemu.ConfigError, match="gives no expected value for output 'y', so it would not be checked"):
        run(tmp_path, "empty").check()
    assert run(tmp_path, "other_chip_only").check() is None     # name@chip for some chips is a choice


def test_a_reference_of_another_shape_says_so_without_an_index(tmp_path):
    # It said "differs at index []: ... (-1 element(s) differ)".
    mismatch = run(tmp_path, "small").check()
    assert mismatch.render() == ("FAIL: y on chip 0: the expected value has shape (4, 4), "
                                 "the output has shape (8, 128)")


def test_a_reference_without_the_contracts_keywords_names_its_own_file(tmp_path):
    # It said "(at .../mkemu/runner.py:NNN)": mkemu's line, not the user's.
    with pytest.raises(mkemu.ConfigError) as info:
        run(tmp_path, "positional").check()
    text = str(info.value)
    assert "cannot be called as reference(inputs, *, chips, cores_per_chip)" in text
    assert f"(defined at {tmp_path / 'r.py'}:9)" in text and "runner.py" not in text


def test_a_bfloat16_reference_output_is_refused_with_the_fix(tmp_path):
    pytest.importorskip("ml_dtypes")
    with pytest.raises(mkemu.ConfigError, match=r"give bf16 values as float32 \(\.astype\(np\.float32\)\)"):
        run(tmp_path, "bf16").check()


def test_mkemu_run_with_an_empty_reference_fails_in_one_line(tmp_path, capsys):
    from mkemu.cli import main

    (tmp_path / "r.py").write_text(REFS)
    (tmp_path / "p.mk").write_text(DOUBLE.format(fn="empty"))
    code = main(["run", str(tmp_path / "p.mk"), "--hw", "test", "--mesh", "1"])
    out, err = capsys.readouterr()
    assert code == 1 and "PASS" not in out and "Traceback" not in err
    assert err.strip() == ("r.py:empty: error: the reference gives no expected value for output 'y', so it would "
                           "not be checked: return 'y' (every chip) or 'y@CHIP' (it returned nothing)")


def cli(tmp_path, capsys, fn: str, refs: str = REFS) -> tuple[int, str, str]:
    from mkemu.cli import main

    (tmp_path / "r.py").write_text(refs)
    (tmp_path / "p.mk").write_text(DOUBLE.format(fn=fn))
    code = main(["run", str(tmp_path / "p.mk"), "--hw", "test", "--mesh", "1"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


@pytest.mark.parametrize("fn, refs, message", [
    # sys.exit(0) in the function, or while its file loads, ended mkemu with status 0,
    # printing nothing: a pass to any script that ran it
    ("leaves", REFS, "reference function leaves raised SystemExit: 0 (at "),
    ("leaves", "import sys\nsys.exit(0)\n", "failed to load: SystemExit: 0"),
])
def test_a_reference_that_exits_is_an_error_not_a_silent_pass(tmp_path, capsys, fn, refs, message):
    code, out, err = cli(tmp_path, capsys, fn, refs)
    assert code == 1 and "PASS" not in out and message in err, err


def test_a_reference_function_the_file_lacks_is_an_error_at_the_reference_line(tmp_path, capsys):
    # It named the program alone, with no line: a missing file was already at its line.
    code, _, err = cli(tmp_path, capsys, "refrence")
    assert code == 1
    assert err.splitlines() == [f"{tmp_path / 'p.mk'}:2:12: error: reference file {tmp_path / 'r.py'} has no "
                                "function 'refrence'",
                                '  reference "r.py:refrence";',   # the line and a caret, as every located error
                                "             ^^^^^^^^^^^^^"]


@pytest.mark.parametrize("refs, where, message, line, caret", [
    # Each was the program's reference line alone (p.mk:2:12), no line shown, a syntax
    # error's place in the message, an exception's place nowhere.
    ("import numpy as np\n\ndef double(inputs, *, chips, cores_per_chip):\n    return {'y': inputs['x@0'] +* 2}\n",
     "4:33", "SyntaxError: invalid syntax", "    return {'y': inputs['x@0'] +* 2}", 32 * " " + "^"),
    ("import numpy as np\n\nSCALE = 1 / 0\n", "3:9", "ZeroDivisionError: division by zero",
     "SCALE = 1 / 0", 8 * " " + "^^^^^"),
    ("def table():\n    return {}['a']\n\nTABLE = table()\n", "2:12", "KeyError: 'a'", "    return {}['a']",
     11 * " " + "^^^^^^^"),
    ("import numpyy as np\n", "1:1", "no module named 'numpyy'", "import numpyy as np", 19 * "^"),
    ("import sys\nsys.exit(0)\n", "2:1", "SystemExit: 0", "sys.exit(0)", 11 * "^"),
    # Columns in characters, not UTF-8 bytes; an exception whose message cannot be made,
    # or that is not an Exception, is one error all the same (they were tracebacks).
    ('x = "\u65e5\u672c\u8a9e"; y = 1/0\n', "1:16", "ZeroDivisionError: division by zero",
     'x = "\u65e5\u672c\u8a9e"; y = 1/0', 15 * " " + "^^^"),
    ('x = "\u00e9\u00e9"; y = 1 +* 2\n', "1:18", "SyntaxError: invalid syntax", 'x = "\u00e9\u00e9"; y = 1 +* 2',
     17 * " " + "^"),
    ("class E(Exception):\n    def __str__(self):\n        return 1 / 0\n\nraise E()\n", "5:1",
     "E: (its message cannot be shown: its __str__ raises)", "raise E()", 9 * "^"),
    ("raise GeneratorExit\n", "1:1", "GeneratorExit", "raise GeneratorExit", 19 * "^"),
])
def test_a_reference_file_that_fails_to_load_is_one_error_at_its_line_with_a_caret(tmp_path, capsys, refs, where,
                                                                                  message, line, caret):
    code, out, err = cli(tmp_path, capsys, "double", refs)
    assert code == 1 and "PASS" not in out
    assert err.splitlines() == [f"{tmp_path / 'r.py'}:{where}: error: reference {tmp_path / 'r.py'} failed to load: "
                                f"{message}", f"  {line}", f"  {caret}"]


def test_a_failing_reference_file_is_named_by_its_full_path_however_the_program_was_named(tmp_path, capsys,
                                                                                          monkeypatch):
    # (api.md: "the file named by its full path"; the message named it as the program
    # was given, `r.py` from the program's own folder)
    from mkemu.cli import main

    (tmp_path / "r.py").write_text("import numpy as np\n\nSCALE = 1 / 0\n")
    (tmp_path / "p.mk").write_text(DOUBLE.format(fn="double"))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "p.mk", "--hw", "test", "--mesh", "1"]) == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (f"{tmp_path / 'r.py'}:3:9: error: reference {tmp_path / 'r.py'} failed to load: "
                     "ZeroDivisionError: division by zero")


def test_a_reference_module_that_fails_to_import_is_placed_in_its_file(tmp_path, monkeypatch):
    # (a `module:function` reference was placed at the program's line only)
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "mkemu_test_badmod.py").write_text("X = 1\nY = X / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    source = DOUBLE.replace('"r.py:{fn}"', '"mkemu_test_badmod:double"').format()
    with pytest.raises(mkemu.ConfigError) as info:
        mkemu.compile_source(source, str(tmp_path / "p.mk"), hw="test", mesh="1")
    assert str(info.value).splitlines() == [
        f"{tmp_path / 'mods' / 'mkemu_test_badmod.py'}:2:5: error: reference mkemu_test_badmod failed to load: "
        "ZeroDivisionError: division by zero", "  Y = X / 0", "      ^^^^^"]


def test_a_reference_file_that_fails_to_load_is_a_config_error_at_its_line(tmp_path):
    # (the API's class for a failing reference, docs/api.md; its line and column as fields)
    (tmp_path / "r.py").write_text("x = 1\nx = (\n")
    with pytest.raises(mkemu.ConfigError) as info:
        mkemu.compile_source(DOUBLE.format(fn="double"), str(tmp_path / "p.mk"), hw="test", mesh="1")
    error = info.value
    assert (error.file, error.line, error.column, error.source_line) == (str(tmp_path / "r.py"), 2, 5, "x = (")
    assert error.render().splitlines()[1:] == ["  x = (", "      ^"]


BF16_OUT = """
reference "r.py:{fn}";
kernel k(x: hbm f32[8, 128], y: hbm bf16[8, 128]) {{
    vmem xv: f32[8, 128];
    vmem yv: bf16[8, 128];
    sem s;
    start copy(x, xv, s);
    wait copy(x, xv, s);
    yv = bf16(xv * 1.0001);
    start copy(yv, y, s);
    wait copy(yv, y, s);
}}
"""
BF16_REFS = """
import numpy as np
from mkemu.isa.numerics import bf16_round
def unrounded(inputs, *, chips, cores_per_chip):
    return {"y": inputs["x@0"] * np.float32(1.0001)}
def rounded(inputs, *, chips, cores_per_chip):
    return {"y": bf16_round(inputs["x@0"] * np.float32(1.0001))}
"""


def test_a_bf16_output_whose_expected_values_are_not_bf16_says_so(tmp_path):
    # A reference that forgot to round its bf16 output just failed, with no hint.
    (tmp_path / "r.py").write_text(BF16_REFS)
    x = np.linspace(1, 2, 8 * 128, dtype=np.float32).reshape(8, 128)
    kernel = mkemu.compile_source(BF16_OUT.format(fn="unrounded"), tmp_path / "p.mk", hw="test", mesh="1")
    assert kernel(x=x).check().render().endswith(
        "; the expected values are not all bf16 values: the buffer holds bf16, so round the reference's result to "
        "bf16 where the program does")
    kernel = mkemu.compile_source(BF16_OUT.format(fn="rounded"), tmp_path / "p2.mk", hw="test", mesh="1")
    assert kernel(x=x).check() is None


@pytest.mark.parametrize("refs, fn, message", [
    # reading inputs["x"]: a bare KeyError 'x', not the keys it was given
    ("def by_name(inputs, *, chips, cores_per_chip):\n    return {'y': inputs['x'] * 2}\n", "by_name",
     "raised KeyError: 'x' (at {r}:2); its inputs are x@0 (name@chip)"),
    # returning another output's key: not what it did return
    ("def other_key(inputs, *, chips, cores_per_chip):\n    return {'out@0': inputs['x@0'] * 2}\n", "other_key",
     "gives no expected value for output 'y', so it would not be checked: return 'y' (every chip) or 'y@CHIP' "
     "(it returned 'out@0')"),
])
def test_a_reference_keyed_wrong_is_told_the_keys(tmp_path, refs, fn, message):
    (tmp_path / "r.py").write_text(refs)
    kernel = mkemu.compile_source(DOUBLE.format(fn=fn), tmp_path / "p.mk", hw="test", mesh="1")
    with pytest.raises(mkemu.ConfigError) as info:
        kernel(x=np.ones((8, 128), np.float32)).check()
    assert message.format(r=tmp_path / "r.py") in info.value.message
