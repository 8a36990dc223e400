"""Where NVIDIA's shared libraries are looked for: the pip wheel, CUDA_HOME, the system."""

from __future__ import annotations

import ctypes.util
import os
from pathlib import Path


def library_candidates(name: str, soname: str) -> list[str]:
    """Paths or names to try for lib`name`, in order; `soname` is the last resort."""
    found: list[str] = []
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        path = load_nvidia_dynamic_lib(name).abs_path
        if path:
            found.append(path)
    except Exception:  # noqa: BLE001 - any failure just means "try the next place"
        pass
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        for lib in ("lib64", "lib"):
            found += sorted(str(p) for p in Path(home, lib).glob(f"lib{name}.so*"))
    system = ctypes.util.find_library(name)
    if system:
        found.append(system)
    return found + [soname]
