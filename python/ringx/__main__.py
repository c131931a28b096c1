"""``python -m ringx``: what a bug report about ringx needs.

Prints ringx's version and build, the torch in use, the UCX library in use and
the transports it offers, what this host allows between ranks, and every
RINGX_* setting in effect. ``--markdown-settings`` prints the README's table of
settings instead (the README holds its output; a test keeps them equal).
"""

import argparse
import os
import platform
import sys

import torch

import ringx
from ringx import _build_info, _C


def settings_markdown():
    rows = [
        "| Variable | Values | Default | Ranks must agree | What it does |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in _C._settings():
        agree = "yes" if s["ranks_must_agree"] else "no"
        rows.append(f"| `{s['name']}` | {s['values']} | {s['default']} | {agree} | {s['help']} |")
    return "\n".join(rows)


def _usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


def _cuda_text():
    if not _build_info.cuda:
        return "off"
    return f"on (architectures {', '.join(_build_info.cuda_archs)})"


def _setting_values(name):
    values = next(s["values"] for s in _C._settings() if s["name"] == name)
    return values.replace("`", "") + ("" if _build_info.cuda else " (in a CUDA build)")


def _memory_events_text():
    events = _C._ucx_memory_events()
    if events is None:
        return "unknown"
    return "on (RDMA registration caches)" if events else "off"


def report():
    simd = _C._simd()
    ucx = _C._ucx()
    host = _C._host()
    lines = [
        f"ringx {ringx.__version__} ({os.path.dirname(ringx.__file__)})",
        f"  built for torch {_build_info.torch_version}, with {_build_info.compiler}, "
        f"{_build_info.build_type}, CUDA {_cuda_text()}",
        f"  CUDA data paths (RINGX_CUDA_PATH): {_setting_values('RINGX_CUDA_PATH')}",
        f"  ipc all_reduce algorithms (RINGX_IPC_ALGO): {_setting_values('RINGX_IPC_ALGO')}",
        f"  CPU kernels for {', '.join(simd['targets'])}; this CPU runs {simd['in_use']}",
        f"torch {torch.__version__} ({os.path.dirname(torch.__file__)})",
        f"python {platform.python_version()} on {platform.platform()}, "
        f"{_usable_cpus()} of {os.cpu_count()} CPUs usable",
        f"UCX {ucx['version']} ({ucx['library'] or 'library path unknown'})",
        f"  ringx was built against UCX {_build_info.ucx_version} "
        f"({'the libucx wheel' if _build_info.ucx == 'wheel' else 'the system'}'s)",
        f"  transports: {', '.join(ucx['transports']) or 'none found'}",
        f"  memory hooks (UCX_MEM_EVENTS): {_memory_events_text()}",
    ]
    if ucx["error"]:
        lines.append(f"  listing them failed for: {ucx['error']}")
    yes = {True: "yes", False: "NO"}
    lines += [
        f"shared memory between ranks: {yes[host['shm']]} ({host['shm_detail']})",
        f"single copy (CMA, process_vm_readv): {yes[host['cma']]} ({host['cma_detail']})",
        "settings (* = set in the environment; = means ranks of a group must agree):",
    ]
    rows = _C._settings()
    width = max(len(s["name"]) for s in rows)
    vwidth = max(len(s["effective"] or "unset") for s in rows)
    for s in rows:
        mark = "*" if s["set"] is not None else " "
        agree = "=" if s["ranks_must_agree"] else " "
        value = s["effective"] or "unset"
        default = s["default"].replace("`", "")
        lines.append(f"  {mark}{agree} {s['name']:<{width}}  {value:<{vwidth}}  (default {default})")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ringx", description=__doc__.splitlines()[0])
    parser.add_argument("--markdown-settings", action="store_true",
                        help="print the README's table of RINGX_* settings and exit")
    args = parser.parse_args(argv)
    print(settings_markdown() if args.markdown_settings else report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
