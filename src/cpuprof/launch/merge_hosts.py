"""Several hosts' runs of one job made one run (``cpuprof merge DIR... --out M``).

Each host's launcher wrote its own run directory (``cpuprof run --out DIR -- torchrun --nnodes H
--node-rank R ...``). Merging copies each whole under ``M/hosts/<host>/`` (file by file: nothing is
loaded to copy it) and reads each host's processes one at a time, keeping only what ties the hosts'
clocks together: each rank's collectives' entries and exits (:class:`~.analysis.rank_groups.
RankTimeline`). The offsets found go into ``M/merge.json``; ``report``, ``trace``, ``flamegraph``,
``diff`` and the HTML page read M as one run, its ranks grouped by host.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from ..analysis.rank_groups import RankTimeline, align_hosts, rank_timeline
from ..errors import UsageError
from ..model.io import PROFILE_FILENAME, is_directory, present
from ..model.merged import HOSTS_DIRNAME, MergedHost, MergedRun
from ..model.run_layout import has_followed, is_merged, iter_processes, windows_of

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def merge_runs(directories: list[str], out: str | os.PathLike[str]) -> MergedRun:
    """Merges the run directories into ``out`` (an empty directory); what could not be merged is
    one line each in the result's ``problems``. UsageError when none could be."""
    hosts_dir = Path(out) / HOSTS_DIRNAME
    if os.path.lexists(hosts_dir):
        raise UsageError(f"{hosts_dir} exists (an interrupted merge's, or another program's): remove it, or give "
                         "another --out")
    merged = MergedRun()
    timelines: list[RankTimeline] = []
    labels: set[str] = set()
    for directory in directories:
        path = Path(directory)
        refused = _refusal(path, Path(out))
        if refused:
            merged.problems.append(f"{directory}: {refused}: left out")
            continue
        hostname = _hostname(path)
        label = _label(hostname, labels)
        copy = hosts_dir / label
        partial = hosts_dir / f".partial-{label}"
        try:
            shutil.copytree(path, partial, symlinks=False, ignore=_not_copied)
            partial.rename(copy)
        except (OSError, shutil.Error) as exc:
            shutil.rmtree(partial, ignore_errors=True)
            labels.discard(label)
            merged.problems.append(f"{directory}: could not be copied ({_first_error(exc)}): left out")
            continue
        host_timelines = _read_host(copy)  # the copy: what the merged run holds is what was aligned
        for t in host_timelines:
            t.host = label
        timelines.extend(host_timelines)
        merged.hosts.append(MergedHost(label=label, hostname=hostname, source=str(path.resolve())))
    if not merged.hosts:
        raise UsageError("nothing to merge: " + "; ".join(merged.problems))
    reference, clocks, problems = align_hosts(timelines)
    merged.problems.extend(problems)
    ranked = {t.host for t in timelines}
    for host in merged.hosts:
        if host.label == reference:
            host.reference, host.offset_ns, host.residual_ns = True, 0, 0
        elif host.label in clocks:
            clock = clocks[host.label]
            host.offset_ns, host.residual_ns, host.matched = clock.offset_ns, clock.residual_ns, clock.matched
        elif host.label not in ranked and len(merged.hosts) > 1:
            merged.problems.append(f"host {host.label}: none of its processes joined a torch.distributed job (or "
                                   "kept a timeline): its clock is not aligned with the others'")
    merged.save(out)
    return merged


def _refusal(path: Path, out: Path) -> str | None:
    if not is_directory(path):
        return "no such directory" if not os.path.lexists(path) else "not a directory"
    source, target = path.resolve(), out.resolve()
    if source == target or target.is_relative_to(source) or source.is_relative_to(target):
        return f"it holds the merge's --out {out}, or is inside it: merge into a directory of its own"
    if is_merged(path):
        return "a merged run already: give the hosts' own run directories"
    if windows_of(path) and not has_followed(path) and not present(path / PROFILE_FILENAME):
        return "an --on-demand run, whose profiles are its windows: give its window-N directories"
    if not present(path / PROFILE_FILENAME) and not has_followed(path):
        return "not a run's directory (no profile.json, no processes/PID/profile.json)"
    return None


def _hostname(path: Path) -> str:
    """The host's name, as the first profile there says it (one profile read)."""
    for p in iter_processes(path, warn=False):
        if p.profile.meta.hostname:
            return p.profile.meta.hostname
    return path.name


def _first_error(exc: BaseException) -> str:
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        return str(exc.args[0][0][-1])[:200]
    return (getattr(exc, "strerror", None) or str(exc))[:200]


def _read_host(path: Path) -> list[RankTimeline]:
    """The host's ranks' collectives: one profile in memory at a time."""
    timelines = []
    for p in iter_processes(path):
        t = rank_timeline(p.profile, p.profile.meta.role or "the program")
        if t is not None:
            timelines.append(t)
    return timelines


def _label(hostname: str, taken: set[str]) -> str:
    """A directory name for the host: its name's safe characters, made unique (two launchers on one
    host, or hosts of one name)."""
    base = _UNSAFE.sub("_", hostname).strip("._") or "host"
    label, n = base, 2
    while label in taken:
        label, n = f"{base}-{n}", n + 1
    taken.add(label)
    return label


def _not_copied(directory: str, names: list[str]) -> set[str]:
    """What a merge leaves behind: the run's lock, and anything but regular files and directories (a
    link could point anywhere; reading a FIFO would block the copy forever)."""
    left = set()
    for name in names:
        where = os.path.join(directory, name)
        if name == ".cpuprof.lock" or os.path.islink(where) or not (os.path.isfile(where) or os.path.isdir(where)):
            left.add(name)
    return left
