"""What an output reads: a saved profile, a configuration sweep, a group of ranks, two profiles to
diff, or a profile's merged stacks. Each is one small typed value with a ``kind`` (what an output's
``reads`` names); those a report is made from also build it (:func:`report_of`), so a format that
lays out a report's tables reads every one of them alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from .. import defaults
from ..analysis.flame import FlameGraph
from ..analysis.processes import ProcessRow
from ..analysis.report_model import Report
from ..errors import UsageError
from ..model import Profile
from ..model.compare import Comparison
from ..model.ranks import MultiRun
from ..model.run_layout import ProcessProfile

SourceKind = Literal["profile", "sweep", "ranks", "processes", "diff", "stacks"]
# The sources a report (sections and tables) is made from; "stacks" is drawn, not reported.
REPORT_SOURCES: tuple[SourceKind, ...] = ("profile", "sweep", "ranks", "processes", "diff")


@dataclass(frozen=True)
class OutputOptions:
    """What the caller chose about an output beyond its format."""

    top: int = defaults.TOP_OPS  # rows of the ops (and GEMM, region) tables
    whole_run: bool = False  # a program's tables over its whole run, not over the decode steps found in it


@dataclass(frozen=True)
class ProfileSource:
    profile: Profile
    kind: ClassVar[SourceKind] = "profile"

    def report(self, options: OutputOptions) -> Report:
        from ..analysis.report import build_report

        return build_report(self.profile, top=options.top, whole_run=options.whole_run)


@dataclass(frozen=True)
class SweepSource:
    """A configuration sweep (``cpuprof compare``), finished or not."""

    comparison: Comparison
    directory: str | None = None  # where it is saved, for the command that resumes it
    kind: ClassVar[SourceKind] = "sweep"

    def report(self, options: OutputOptions) -> Report:
        from ..analysis.compare import comparison_report

        return comparison_report(self.comparison, self.directory)


@dataclass(frozen=True)
class RanksSource:
    """The processes of one multi-process run (decode --tp/--instances, run --nproc): the group's
    record and the directory that holds each rank's profile."""

    run: MultiRun
    directory: Path
    kind: ClassVar[SourceKind] = "ranks"

    def report(self, options: OutputOptions) -> Report:
        from ..analysis.ranks import ranks_report

        return ranks_report(self.run, self.run.profiles(self.directory), self.directory)

    def profiles(self) -> list[tuple[int, Profile]]:
        """(rank, profile) of every rank whose profile was saved."""
        return [(r.rank, p) for r, p in zip(self.run.ranks, self.run.profiles(self.directory), strict=True)
                if p is not None]


def merged_lines(directory: str | Path) -> list[str] | None:
    """A merged run's hosts, where each came from, and how their clocks were aligned; None for a
    run of one host."""
    from ..analysis.rank_groups import clock_lines
    from ..model.merged import MergedRun
    from ..model.run_layout import is_merged

    if not is_merged(directory):
        return None
    merged = MergedRun.load(directory)
    reference = next((h.label for h in merged.hosts if h.reference), None)
    lines = [f"Merged from {len(merged.hosts)} hosts' runs: " + "; ".join(
        f"{h.label} ({h.hostname}) from {h.source}" for h in merged.hosts)]
    lines += clock_lines(reference, [(h.label, h.offset_ns, h.residual_ns, h.matched) for h in merged.hosts])
    lines += [f"note: {p}" for p in merged.problems]
    return lines


@dataclass(frozen=True)
class ProcessesSource:
    """A run whose program started processes that cpuprof followed: a row for each process, and the
    profile of the one that ran the most op time. Loaded one profile at a time, so that the memory a
    run of thousands of processes takes is that of their rows and one profile."""

    rows: list[ProcessRow]
    shown: ProcessProfile | None
    directory: Path
    kind: ClassVar[SourceKind] = "processes"
    merged: list[str] | None = None  # a merged run's lines on its hosts and clocks

    def report(self, options: OutputOptions) -> Report:
        from ..analysis.processes import processes_report
        from ..model.run_layout import unsaved_processes

        return processes_report(self.rows, self.shown, top=options.top, unsaved=unsaved_processes(self.directory),
                                whole_run=options.whole_run, merged=self.merged)

    @classmethod
    def load(cls, directory: str | Path) -> ProcessesSource:
        from ..analysis.processes import busiest_row, row
        from ..model.run_layout import iter_processes

        rows = [row(p) for p in iter_processes(directory)]  # each profile dropped once its row is made
        best = busiest_row(rows)
        shown = None
        if best is not None:
            where = Path(best.directory)
            shown = ProcessProfile(where, Profile.load(where), followed=best.followed, host=best.host)
        return cls(rows, shown, Path(directory), merged=merged_lines(directory))


@dataclass(frozen=True)
class DiffSource:
    """Two profiles to compare, before (a) and after (b), with the names the report calls them."""

    before: Profile
    after: Profile
    before_name: str
    after_name: str
    kind: ClassVar[SourceKind] = "diff"

    def report(self, options: OutputOptions) -> Report:
        from ..analysis.diff import diff_report

        return diff_report(self.before, self.after, a_name=self.before_name, b_name=self.after_name,
                           top=options.top)


@dataclass(frozen=True)
class StacksSource:
    """A profile's merged stacks, titled (:func:`cpuprof.analysis.flame.flame_graph`)."""

    graph: FlameGraph
    kind: ClassVar[SourceKind] = "stacks"


Source = ProfileSource | SweepSource | RanksSource | ProcessesSource | DiffSource | StacksSource


def report_of(source: Source, options: OutputOptions) -> Report:
    if isinstance(source, StacksSource):
        raise UsageError("merged stacks make a flame graph, not a report")
    return source.report(options)


__all__ = ["REPORT_SOURCES", "DiffSource", "OutputOptions", "ProcessesSource", "ProfileSource", "RanksSource", "Source",
           "SourceKind", "StacksSource", "SweepSource", "report_of"]

