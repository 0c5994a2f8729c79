"""Finding shared libraries the launcher preloads, and the ones mapped into this process.

One search for every library cpuprof looks for (Intel's OpenMP runtime, jemalloc, tcmalloc), so
``doctor`` and ``--omp intel`` can never disagree on whether a library is installed.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from fnmatch import fnmatch
from pathlib import Path

# The ABI tag `ldconfig -p` prints for libraries this interpreter can load.
_LDCONFIG_ABI = {"x86_64": "x86-64", "aarch64": "AArch64"}


@functools.cache
def ldconfig_libraries() -> tuple[tuple[str, str], ...]:
    """(file name, path) pairs from the dynamic linker's cache for this interpreter's ABI."""
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.access(p, os.X_OK)), None
    )
    if ldconfig is None:
        return ()
    try:
        output = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, check=False, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    abi = _LDCONFIG_ABI.get(os.uname().machine)
    entries = []
    for line in output.splitlines():
        match = re.match(r"\s+(\S+) \(([^)]*)\) => (\S+)$", line)
        if match and (abi is None or abi in match.group(2)):
            entries.append((match.group(1), match.group(3)))
    return tuple(entries)


def system_lib_dirs() -> list[Path]:
    multiarch = sysconfig.get_config_var("MULTIARCH") or f"{os.uname().machine}-linux-gnu"
    dirs = (f"/usr/lib/{multiarch}", f"/lib/{multiarch}", "/usr/lib64", "/usr/lib", "/usr/local/lib")
    return [Path(d) for d in dirs]


def python_lib_dirs() -> list[Path]:
    """<prefix>/lib of this interpreter and of every prefix that holds its site-packages,
    which is where ``pip install intel-openmp`` puts libiomp5.so."""
    site_dirs = [*site.getsitepackages(), site.getusersitepackages()]
    # <prefix>/lib/pythonX.Y/site-packages -> <prefix>/lib
    dirs = [Path(sys.prefix, "lib"), *(Path(d).parents[1] for d in site_dirs), Path(sys.base_prefix, "lib")]
    return list(dict.fromkeys(dirs))


def find_library(patterns: Sequence[str], first_dirs: Sequence[Path]) -> Path | None:
    """Search ``first_dirs``, then the ldconfig cache, then the usual system lib dirs."""
    for directory in first_dirs:
        for pattern in patterns:
            matches = sorted(directory.glob(pattern))
            if matches:
                return matches[0]
    for pattern in patterns:
        for name, path in ldconfig_libraries():
            if fnmatch(name, pattern):
                return Path(path)
    return next((m for d in system_lib_dirs() for pattern in patterns for m in sorted(d.glob(pattern))), None)


def mappings() -> list[tuple[int, int, str]]:
    """(start, end, path) of every file-backed mapping of this process."""
    result = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/"):
            start, end = (int(x, 16) for x in parts[0].split("-"))
            result.append((start, end, parts[5]))
    return result
