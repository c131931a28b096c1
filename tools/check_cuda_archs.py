"""Check that a CUDA build of ringx carries its kernels for every architecture.

No GPU runs CI, so a kernel left out of one architecture's code would first
show as "no kernel image is available" on a user's machine. This reads the
fatbinaries of the given files (the extension, or the kernels' static library)
with cuobjdump and fails, naming what is missing, unless every kernel of each
family (reduce, scale, reduceN) is there as SASS for each --sass architecture
and as PTX for each --ptx one.

    python tools/check_cuda_archs.py build/.../ringx/_C.cpython-311-x86_64-linux-gnu.so
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig

# Substrings of the mangled kernel names in csrc/core/reduce/reduce_cuda.cu
# and flags_cuda.cu (the ipc path's flag waits and signals).
FAMILIES = {
    "reduce": "10ReduceStep",
    "scale": "9ScaleStep",
    "reduceN": "13reduceNKernel",
    "waitFlags": "15waitFlagsKernel",
    "signalFlags": "17signalFlagsKernel",
}


def find_cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    # The nvidia-cuda-cuobjdump wheel, installed beside the running python's torch.
    site = sysconfig.get_paths()["purelib"]
    wheel = sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "bin", "cuobjdump")))
    return wheel[-1] if wheel else None


def kernels_by_target(cuobjdump, path):
    """{("sass", "sm_80"): {mangled kernel names}, ("ptx", "sm_100"): {...}, ...}"""
    found = {}
    # -symbols lists each cubin's symbol table (kernels are STO_ENTRY); -ptx
    # prints each PTX module, whose kernels are .entry directives.
    for flag, kind, pattern in (("-symbols", "sass", re.compile(r"\bSTO_ENTRY\s+(\S+)")),
                                ("-ptx", "ptx", re.compile(r"\.entry\s+([^\s(]+)"))):
        out = subprocess.run([cuobjdump, flag, path], check=True, capture_output=True, text=True).stdout
        section, arch = None, None
        for line in out.splitlines():
            if line.startswith("Fatbin elf code"):
                section = "sass"
            elif line.startswith("Fatbin ptx code"):
                section = "ptx"
            elif line.startswith("arch = "):
                arch = line.split("=", 1)[1].strip()
            elif section == kind and arch:
                m = pattern.search(line)
                if m:
                    found.setdefault((kind, arch), set()).add(m.group(1))
    return found


def demangle(names):
    filt = shutil.which("c++filt")
    if not filt:
        return names
    out = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def describe(kind, arch):
    return f"SASS for {arch}" if kind == "sass" else f"PTX for compute_{arch[3:]}"


def check(found, sass, ptx):
    """Problems, one line each; empty when everything is there."""
    targets = [("sass", f"sm_{a}") for a in sass] + [("ptx", f"sm_{a}") for a in ptx]
    problems = []
    for kind, arch in targets:
        if (kind, arch) not in found:
            problems.append(f"{describe(kind, arch)}: missing (not one kernel)")
    targets = [t for t in targets if t in found]
    for family, marker in FAMILIES.items():
        every = set()
        for names in found.values():
            every |= {n for n in names if marker in n}
        if not every:
            problems.append(f"no {family} kernel in any architecture")
            continue
        for kind, arch in targets:
            missing = sorted(every - found.get((kind, arch), set()))
            if missing:
                example = demangle(missing[:1])[0].split("(", 1)[0]
                problems.append(f"{describe(kind, arch)}: {len(missing)} of {len(every)} {family} kernels "
                                f"missing, e.g. {example}")
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="shared objects or static libraries holding ringx's kernels")
    parser.add_argument("--sass", default="80,90,100", help="architectures that must have SASS (default %(default)s)")
    parser.add_argument("--ptx", default="100", help="architectures that must have PTX (default %(default)s)")
    parser.add_argument("--cuobjdump", help="cuobjdump to run (default: PATH, then the nvidia-cuda-cuobjdump wheel)")
    args = parser.parse_args(argv)
    cuobjdump = args.cuobjdump or find_cuobjdump()
    if not cuobjdump:
        print("check_cuda_archs: FAILED: no cuobjdump on PATH nor from the nvidia-cuda-cuobjdump wheel")
        return 1
    sass = [a for a in args.sass.split(",") if a]
    ptx = [a for a in args.ptx.split(",") if a]
    rc = 0
    for path in args.files:
        found = kernels_by_target(cuobjdump, path)
        problems = check(found, sass, ptx)
        if problems:
            rc = 1
            print(f"check_cuda_archs: FAILED for {path}:")
            for p in problems:
                print(f"  {p}")
            continue
        counts = ", ".join(
            f"{family} {len({n for names in found.values() for n in names if marker in n})}"
            for family, marker in FAMILIES.items())
        print(f"check_cuda_archs: ok: {path}: kernels ({counts}) as SASS for "
              f"{', '.join('sm_' + a for a in sass)} and PTX for {', '.join('compute_' + a for a in ptx)}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
