"""The files a K3 run names (--model, --routing) that are not what they claim: a
device or pipe is refused without being read (/dev/zero would fill memory), nesting
thousands deep is an error rather than a RecursionError, and each error names the
file or the flag."""

from __future__ import annotations

import os

import pytest

from mkemu.cli import main

RUN = ["run", "programs/k3_megakernel.mk", "--prompt-len", "1", "--steps", "1"]


def not_files(tmp_path):
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    return [fifo, folder]


def test_a_model_config_that_is_not_a_regular_file_is_refused_unread(capsys, tmp_path):
    for path in not_files(tmp_path):
        assert main([*RUN, "--model", str(path)]) == 1
        err = capsys.readouterr().err
        assert f"{path}: error: cannot read model config: it is not a regular file" in err, err


def test_a_model_config_nested_thousands_deep_is_invalid_toml(capsys, tmp_path):
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    assert main([*RUN, "--model", str(deep)]) == 1
    err = capsys.readouterr().err
    assert f"{deep}: error: invalid TOML: nested too deeply to read" in err and "Traceback" not in err


def test_an_unknown_model_names_the_flag(capsys):
    assert main([*RUN, "--model", "k3-huge"]) == 1
    assert capsys.readouterr().err.startswith("--model: error: unknown model 'k3-huge'")


@pytest.mark.parametrize("kind", ["fifo", "folder", "deep"])
def test_a_routing_record_that_cannot_be_one_is_refused(capsys, tmp_path, kind):
    if kind == "deep":
        path = tmp_path / "deep.json"
        path.write_text("[" * 100000 + "]" * 100000)
        message = "cannot read the routing record: nested too deeply to read"
    else:
        path = not_files(tmp_path)[kind == "folder"]
        message = "cannot read the routing record: it is not a regular file"
    assert main([*RUN, "--model", "k3-tiny", "--timing-only", "--routing", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: error: {message}" in err and "Traceback" not in err, err
