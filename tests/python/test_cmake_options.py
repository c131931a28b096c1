"""CMake options that take a boolean take any CMake spelling of one
(cmake/bool_choice.cmake, which RINGX_CUDA goes through)."""

import os
import shutil
import subprocess

import pytest

HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cmake", "bool_choice.cmake")


def choose(tmp_path, value):
    script = tmp_path / "choose.cmake"
    script.write_text(f'include("{HELPER}")\nset(RINGX_CUDA "${{V}}")\nringx_bool_choice(RINGX_CUDA auto)\n'
                      'message(STATUS "chose=${RINGX_CUDA}")\n')
    cmake = shutil.which("cmake")
    assert cmake, "make test's machine lacks cmake"
    return subprocess.run([cmake, f"-DV={value}", "-P", str(script)], capture_output=True, text=True)


@pytest.mark.parametrize("value,want", [("ON", "on"), ("on", "on"), ("TRUE", "on"), ("1", "on"), ("Yes", "on"),
                                        ("OFF", "off"), ("False", "off"), ("0", "off"), ("no", "off"),
                                        ("auto", "auto"), ("AUTO", "auto")])
def test_every_spelling_of_a_choice_is_taken(tmp_path, value, want):
    r = choose(tmp_path, value)
    assert r.returncode == 0, r.stderr
    assert f"chose={want}" in r.stdout


def test_anything_else_stops_the_configure_naming_what_it_takes(tmp_path):
    r = choose(tmp_path, "maybe")
    assert r.returncode != 0
    message = " ".join(r.stderr.split())
    assert "RINGX_CUDA must be auto, on or off" in message and "not 'maybe'" in message, message
