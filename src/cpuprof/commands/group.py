"""What a command shows after a group of processes (``decode --tp/--instances``, ``run --nproc``):
one merged report, where the profiles are, and one error line, with one exit code, if any failed.
The group itself runs through :func:`cpuprof.launch.ranks.run_group`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from .. import exit_codes
from ..launch.ranks import group_failure
from ..model.ranks import MultiRun
from ..safe_text import cpuprof_command
from .common import after_report


def show_group(run: MultiRun, out_dir: Path, fmt: str, also: str = "") -> TextIO:
    """The merged report on stdout, then where the profiles are (on stderr when the report is data);
    returns that stream, for what the command adds. ``also``: a last clause for the line."""
    from ..analysis.ranks import ranks_report
    from ..reports import get_renderer

    get_renderer(fmt).render(ranks_report(run, run.profiles(out_dir), out_dir), sys.stdout)
    stream, gap = after_report(fmt)
    stream.write(gap + f"{run.world_size} profiles saved in {out_dir}/rank-*; "
                 f"re-render the merged report with: {cpuprof_command('report', out_dir)}; a trace with one process "
                 f"per rank: {cpuprof_command('trace', out_dir, '-o', 'trace.json')}{also}\n")
    return stream


def group_exit(run: MultiRun, out_dir: Path, member: str = "rank") -> int:
    """OK when every child ended well; otherwise raises the group's one error (ChildFailed)."""
    error = group_failure(run, out_dir, member)
    if error is not None:
        raise error
    return exit_codes.OK
