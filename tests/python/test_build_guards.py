"""cmake/check_shared_libstdcxx.cmake, which every build of ringx._C runs, on two small
libraries: one linked against the shared libstdc++, one carrying a static copy."""

import os
import shutil
import subprocess

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cmake",
                      "check_shared_libstdcxx.cmake")
SOURCE = "#include <sstream>\n#include <string>\n" \
         "std::string format(long v) { std::ostringstream o; o << v; return o.str(); }\n"


def tools():
    found = {name: shutil.which(name) for name in ("g++", "cmake", "readelf")}
    missing = [name for name, path in found.items() if path is None]
    assert not missing, f"make test's machine lacks {missing}"
    return found


def library(tmp_path, name, flags):
    src = tmp_path / "format.cc"
    src.write_text(SOURCE)
    out = tmp_path / name
    subprocess.run([tools()["g++"], "-shared", "-fPIC", *flags, str(src), "-o", str(out)],
                   check=True)
    return out


def check(lib):
    t = tools()
    return subprocess.run([t["cmake"], f"-DLIB={lib}", f"-DREADELF={t['readelf']}", "-DCXX=g++",
                           "-P", SCRIPT], capture_output=True, text=True)


def test_shared_libstdcxx_passes(tmp_path):
    result = check(library(tmp_path, "shared.so", []))
    assert result.returncode == 0, result.stderr


def test_static_libstdcxx_fails_and_says_why(tmp_path):
    lib = library(tmp_path, "static.so", ["-static-libstdc++"])
    result = check(lib)
    assert result.returncode != 0
    message = " ".join(result.stderr.split())
    assert "does not load the shared libstdc++" in message, message
    assert "-static-libstdc++" in message, message


@pytest.mark.parametrize("lib", ["", "/nonexistent/_C.so"])
def test_missing_library_is_an_error(lib):
    result = check(lib)
    assert result.returncode != 0
    assert "no library to check" in result.stderr
