"""``cpuprof report DIR``: re-render a saved profile (or a saved comparison) in any format."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import options_spec as spec
from ..model import Profile
from ..model.compare import COMPARE_FILENAME
from ..model.io import PROFILE_FILENAME, is_directory, present
from ..model.ranks import RANKS_FILENAME, MultiRun
from ..model.run_layout import has_followed, windows_of
from ..reports import (
    OutputOptions,
    ProcessesSource,
    ProfileSource,
    RanksSource,
    Source,
    SweepSource,
    get_output,
)
from ..safe_text import cpuprof_command, say
from .common import write_output

COMMAND = spec.Command("report", help="re-render a saved profile or comparison (a directory, profile.json or "
                                      "compare.json)", groups=(spec.Group(None, spec.report_options()),))


# present(), not is_file(): a FIFO or device named compare.json is read as one and refused in one
# line saying what it is, not passed over for a profile.json that is not there.
def _is_comparison(path: str) -> bool:
    p = Path(path)
    if is_directory(p):
        return present(p / COMPARE_FILENAME) and not present(p / PROFILE_FILENAME)
    return p.name == COMPARE_FILENAME


def _is_ranks(path: str) -> bool:
    p = Path(path)
    return present(p / RANKS_FILENAME) if is_directory(p) else p.name == RANKS_FILENAME


def load_source(path: str) -> Source:
    """What ``path`` holds: a group of ranks, a sweep, the windows of an --on-demand run (the last
    one's report, the others listed), or one profile."""
    windows = [w for w in windows_of(path) if has_followed(w) or present(w / PROFILE_FILENAME)] \
        if is_directory(path) else []
    if windows:
        listed = "; ".join(cpuprof_command("report", str(w)) for w in windows)
        say(f"cpuprof: {path}: an --on-demand run of {len(windows)} window{'s' if len(windows) != 1 else ''}; the "
            f"report is of the last, {windows[-1].name}; each window's report: {listed}")
        return load_source(str(windows[-1]))
    if _is_ranks(path):
        directory = Path(path) if is_directory(path) else Path(path).parent
        return RanksSource(MultiRun.load(directory), directory)
    if _is_comparison(path):
        from ..launch.sweep import load

        return SweepSource(load(path), str(Path(path) if is_directory(path) else Path(path).parent))
    if is_directory(path) and has_followed(path):
        return ProcessesSource.load(path)
    return ProfileSource(Profile.load(path))


def run(args: argparse.Namespace) -> int:
    source = load_source(args.path)
    output = get_output(args.format, source.kind, roles=("report", "page"))
    options = OutputOptions(top=args.top, whole_run=args.whole_run)
    write_output(args.output, lambda out: output.write(source, out, options))
    if args.output != "-":
        say(f"wrote {args.output} ({args.format})")
    return 0
