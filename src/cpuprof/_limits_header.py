"""The one reader of ``csrc/common/limits.h``, the core's limits' one definition.

The build runs this file (CMakeLists.txt, at configure time, a viewer's build too) to write both
crossings from the same parse: the ``LIMITS`` dict of ``cpuprof/_build_info.py`` (for Python code
that must not import torch) and ``limits_table.h``, the table ``_native.limits`` iterates, whose
``static_assert``s fail the build if the compiler reads a value other than the one parsed here.
``defaults.py`` reads the header with the same function when run from a source tree without a build.
Adding a limit is one ``constexpr <type> kName = <digits>;`` line in limits.h; a ``constexpr`` line
in any other form is an error here, never a limit silently left out.

Standard library only: the build runs it as a script, before anything is installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: A limit's line in limits.h: ``constexpr <type> kName = <digits>;`` (a comment may follow).
LIMIT_LINE = re.compile(r"^constexpr [a-z_:0-9]+ (k[A-Za-z]+) = ([0-9]+);")


def read_limits_header(text: str) -> dict[str, int]:
    """Every limit of limits.h, in its order; ValueError names a ``constexpr`` line of another form."""
    limits: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("constexpr"):
            continue
        match = LIMIT_LINE.match(line)
        if match is None:
            raise ValueError(f"limits.h:{number}: not a limit of the form 'constexpr <type> kName = <digits>;' "
                             f"(one definition per line): {line.strip()}")
        name, value = match.groups()
        if name in limits:
            raise ValueError(f"limits.h:{number}: {name} is defined twice")
        limits[name] = int(value)
    return limits


def python_dict_body(limits: dict[str, int]) -> str:
    """The entries of ``_build_info.LIMITS``, one a line."""
    return "".join(f'    "{name}": {value},\n' for name, value in limits.items())


def cxx_table(limits: dict[str, int]) -> str:
    """``limits_table.h``: the table ``_native.limits`` is built from, checked against the compiler."""
    asserts = "".join(f'static_assert({name} == {value}LL, "limits.h: {name} parsed as {value}");\n'
                      for name, value in limits.items())
    rows = "".join(f'    {{"{name}", static_cast<long long>({name})}},\n' for name, value in limits.items())
    return ("// Generated from csrc/common/limits.h by src/cpuprof/_limits_header.py at configure time; do not edit.\n"
            "#pragma once\n\n#include \"common/limits.h\"\n\nnamespace cpuprof {\n\n"
            "struct LimitEntry {\n  const char* name;\n  long long value;\n};\n\n"
            f"{asserts}\nconstexpr LimitEntry kLimitTable[] = {{\n{rows}}};\n\n}}  // namespace cpuprof\n")


def main(argv: list[str]) -> int:
    """``_limits_header.py LIMITS_H PY_FRAGMENT_OUT CXX_HEADER_OUT``: writes both crossings."""
    if len(argv) != 3:
        sys.stderr.write("usage: _limits_header.py LIMITS_H PY_FRAGMENT_OUT CXX_HEADER_OUT\n")
        return 2
    header, py_out, cxx_out = (Path(a) for a in argv)
    try:
        limits = read_limits_header(header.read_text())
    except ValueError as e:
        sys.stderr.write(f"{header}: {e}\n")
        return 1
    for path, text in ((py_out, python_dict_body(limits)), (cxx_out, cxx_table(limits))):
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text() != text:  # unchanged: no rebuild of what includes it
            path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
