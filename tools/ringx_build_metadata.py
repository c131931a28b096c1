"""scikit-build-core metadata provider for ringx's dependencies.

ringx's extension is built against one torch release and only loads into that
one (c10d's C++ classes have no stable ABI), so the wheel requires exactly the
torch found in the build environment: pip then refuses to pair the wheel with
another torch instead of installing a package that cannot load. The version is
torch's public one (2.13.0 for 2.13.0+cpu): the CPU and CUDA builds of a
release share the C++ ABI.
"""

from importlib.metadata import PackageNotFoundError, version


def built_for_torch():
    try:
        return version("torch").split("+")[0]
    except PackageNotFoundError as e:
        raise RuntimeError(
            "ringx builds against the torch in the build environment and none is installed: "
            "install torch first, then pip install --no-build-isolation ."
        ) from e


def dynamic_metadata(field, settings=None):
    if field != "dependencies":
        raise ValueError(f"ringx_build_metadata provides 'dependencies', not {field!r}")
    return [f"torch=={built_for_torch()}", *(settings or {}).get("also", [])]
