"""A program's driver module as the program's own code (`mkemu.runner.call_driver`,
`call_hook`): what it raises, returns or hands the progress line is the program's error
in one line at the driver's line, or shown as the figures it meant."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import mkemu
from mkemu.cli import main

DRIVERS = textwrap.dedent('''
    import numpy as np

    def drive(session, options):
        mode = options.get("model")
        if mode == "dtype":
            session.write("a", np.full((8, 128), 0.5))
        figures = session.run()
        if options.get("progress") is not None:
            options["progress"](1, 1, {"cycles": figures["cycles"]})     # (no seconds)
        if mode == "array":
            return {"bit_exact": True, "cycles": figures["cycles"], "kept": np.arange(3)}
        if mode == "numpy":
            return {"bit_exact": np.bool_(False), "mismatch": "row 3", "cycles": np.int64(figures["cycles"])}
        return {"bit_exact": True, "cycles": figures["cycles"]}
    drive.mkemu_driver = True

    def params(options, info):
        mode = options.get("model")
        if mode == "params_raise":
            raise RuntimeError("no params today")
        if mode == "params_text":
            return {"N": "256"}
        return {"N": np.int64(128)}
    drive.params = params

    def drive_rendered(session, options):
        return drive(session, options)
    drive_rendered.mkemu_driver = True

    def render(report):
        raise KeyError("nope")
    drive_rendered.render = render

    def drive_tuples(session, options):
        figures = session.run()
        return {"bit_exact": True, "cycles": figures["cycles"], "pair": (1, (2, 3)), "d": {"t": (4,)}}
    drive_tuples.mkemu_driver = True
''')
PROGRAM = textwrap.dedent('''
    reference "drivers.py:drive";
    param N = 64;
    kernel k(a: hbm i32[8, 128], y: hbm i32[8, 128]) {
        vmem v: i32[8, 128];
        sem s;
        start copy(a, v, s);
        wait copy(a, v, s);
        start copy(v, y, s);
        wait copy(v, y, s);
    }
''')


@pytest.fixture
def program(tmp_path):
    (tmp_path / "drivers.py").write_text(DRIVERS)
    (tmp_path / "k.mk").write_text(PROGRAM)
    return tmp_path / "k.mk"


def run(capsys, program, mode: str | None, *more) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["run", str(program), "--hw", "test", "--mesh", "1", *(("--model", mode) if mode else ()), *more])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


@pytest.mark.parametrize("mode, message", [
    ("params_raise", "the program's driver hook params raised RuntimeError: no params today (at {drivers}:"),
    ("params_text", "the program's driver hook params returned 'N': '256', not a param name and an integer "
                    "(defined at {drivers}:"),
])
def test_a_params_hook_that_fails_is_one_error_at_its_line(capsys, program, mode, message):
    # (a traceback: a TypeError deep in the program cache, or the hook's own exception)
    code, _, err = run(capsys, program, mode, "--json")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert message.format(drivers=program.parent / "drivers.py") in err


def test_a_render_hook_that_raises_is_one_error_at_its_line(capsys, program):
    rendered = program.parent / "r.mk"
    rendered.write_text(PROGRAM.replace("drivers.py:drive", "drivers.py:drive_rendered"))
    code, _, err = run(capsys, rendered, None)
    assert code == 1
    assert err.strip() == (f"{rendered}: error: the program's driver hook render raised KeyError: 'nope' "
                           f"(at {program.parent / 'drivers.py'}:32)")


def test_figures_json_cannot_hold_are_refused_when_the_driver_returns_them(capsys, program):
    # (--json was a traceback from the JSON encoder; the text output printed PASS)
    code, _, err = run(capsys, program, "array", "--json")
    assert code == 1 and "returned figures whose kept holds a value of type ndarray, which a report cannot hold" in err


def test_numpy_figures_are_the_values_they_hold(capsys, program, monkeypatch):
    # A numpy bool_ bit_exact of False read as no check in the text (yet exit 1) and
    # False in the JSON; the progress line took figures without "seconds" (a KeyError).
    from mkemu import cli

    monkeypatch.setattr(cli._Progress, "QUIET_S", -1.0)
    code, out, err = run(capsys, program, "numpy")
    assert code == 1 and out.startswith("FAIL: row 3\ncycles: ")
    assert err.startswith("step 1/1: ") and "emulated" not in err
    run_ = mkemu.compile(str(program), hw="test", mesh="1", model="numpy")()
    assert run_.report.bit_exact is False and type(run_.report.figures["cycles"]) is int


def test_figures_are_what_their_json_holds(program):
    # Tuples stayed tuples (a run's own launch_cycles and per_core, and a driver's), so
    # figures were not equal to the `mkemu run --json` they are documented as.
    import json

    tuples = program.parent / "t.mk"
    tuples.write_text(PROGRAM.replace("drivers.py:drive", "drivers.py:drive_tuples"))
    figures = mkemu.compile(str(tuples), hw="test", mesh="2")().report.figures
    assert (figures["pair"], figures["d"]) == ([1, [2, 3]], {"t": [4]})
    figures = mkemu.compile("vector_add", hw="test", mesh="2")().report.figures
    assert json.loads(json.dumps(figures)) == figures
    assert (figures["launch_cycles"], type(figures["per_core"])) == ([figures["cycles"]], list)


def test_a_session_s_refusal_of_a_value_names_the_driver_s_line(capsys, program):
    # (the i32 buffer's refusal of float values came from below the session method and
    # named no line)
    code, _, err = run(capsys, program, "dtype")
    assert code == 1
    assert err.strip().startswith(f"{program.parent / 'drivers.py'}:7: a: error: buffer a (i32): got float64 values")


def test_a_driver_that_prints_leaves_json_alone(tmp_path, capsys):
    """--json prints one JSON object on stdout: a driver's own prints go to stderr
    (with and without --json they are still shown)."""
    import json

    (tmp_path / "drivers.py").write_text(DRIVERS.replace("    figures = session.run()\n",
                                                         "    figures = session.run()\n    print('ran once')\n"))
    (tmp_path / "k.mk").write_text(PROGRAM)
    code, out, err = run(capsys, tmp_path / "k.mk", None, "--json")
    assert code == 0 and json.loads(out)["bit_exact"] is True and "ran once" in err
    code, out, err = run(capsys, tmp_path / "k.mk", None)
    assert code == 0 and "ran once" in out
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "k.mk"), str(tmp_path / "k.mk"), "--hw", "test", "--mesh", "1",
                 "--json"]) == 0
    out, err = capsys.readouterr()
    assert len(json.loads(out)["reports"]) == 2 and err.count("ran once") == 2


def test_figures_that_are_not_finite_are_null_in_every_json_written():
    """(`mkemu run --json` wrote null for them, but a sweep's or a tune's record wrote
    `Infinity`, which is not JSON)"""
    import json

    from mkemu.runner import finite

    held = {"us": float("inf"), "rows": [float("nan"), 1.5, (np.float32("-inf"), 2)], "n": 3, "name": "x"}
    assert finite(held) == {"us": None, "rows": [None, 1.5, [None, 2]], "n": 3, "name": "x"}
    json.loads(json.dumps(finite(held)), parse_constant=lambda token: pytest.fail(f"{token} written"))
