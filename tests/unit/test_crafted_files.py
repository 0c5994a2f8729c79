"""Files that are not what they claim: every file cpuprof reads back (profile.json, compare.json,
ranks.json, launch.json, the roofs cache) is read only when it is a regular file of bounded size,
parsed without a RecursionError, and checked against the model's invariants on load. Each crafted
file is one line naming it and exit 2: never a hang (a FIFO), never memory filled (/dev/zero, a
huge sparse file), never a traceback (deep nesting, an index past the end, NaN).

The in-process reads run under an alarm and the CLI under a subprocess timeout, so a hang fails the
test instead of stalling CI."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.profiles import make_profile, settings

from cpuprof import defaults, exit_codes
from cpuprof.cli import main
from cpuprof.errors import FileFormatError
from cpuprof.launch.child_run import LAUNCH_FILE, read_launch_file, write_launch_file
from cpuprof.launch.environment import LaunchSettings
from cpuprof.launch.options import ProfileOptions
from cpuprof.launch.script_child import ScriptConfig, ScriptTarget
from cpuprof.machine import roofs
from cpuprof.model import Profile
from cpuprof.model.compare import COMPARE_FILE, Comparison, RunMetrics, SweepConfig, SweepRun
from cpuprof.model.io import PROFILE, FileKind
from cpuprof.model.ranks import RANKS_FILE, MultiRun, RankOutcome

SRC = Path(__file__).resolve().parents[2] / "src"
MEMORY_LIMIT = 4 * 1024**3  # address space for each command run: far more than one needs


def comparison() -> Comparison:
    metrics = RunMetrics(tokens_per_s=10.0, step_ms=[100.0], ttft_s=0.5, p50_ms=100.0, p99_ms=100.0)
    return Comparison(format=COMPARE_FILE.format, version=COMPARE_FILE.version, created="2026-11-21T00:00:00+00:00",
                      cpuprof_version="test", argv=["cpuprof", "compare"], base={}, axes={"threads": ["1", "2"]},
                      configs=[SweepConfig(label="threads=1", values={"threads": "1"}),
                               SweepConfig(label="threads=2", values={"threads": "2"})],
                      repetitions=1, order=[[0, 1], [1, 1]], baseline=0,
                      runs=[SweepRun(config=0, repetition=1, status="done", out_dir="x", metrics=metrics),
                            SweepRun(config=1, repetition=1, status="done", out_dir="y", metrics=metrics)])


def multi_run() -> MultiRun:
    return MultiRun(mode="tp", world_size=1, backend="gloo", argv=["x"], timeout_s=5.0, finished=True,
                    ranks=[RankOutcome(rank=0, dir="rank-0", cpus=[0], node=None, threads=1, returncode=0)])


def script_config(out: str) -> ScriptConfig:
    s = settings()
    return ScriptConfig(target=ScriptTarget(path="/tmp/x.py", module=None, args=[]), profile=ProfileOptions(),
                        launch=LaunchSettings(threads=2), requested=s.requested, cpu_set=s.cpu_set,
                        topology=s.topology, out=out)


# Each kind: its file, how a good one is written into a directory, how the directory is read back.
KINDS: dict[str, tuple[FileKind, Callable[[Path], object], Callable[[Path], object]]] = {
    "profile": (PROFILE, lambda d: make_profile().save(d), Profile.load),
    "comparison": (COMPARE_FILE, lambda d: comparison().save(d), Comparison.load),
    "ranks file": (RANKS_FILE, lambda d: multi_run().save(d), MultiRun.load),
    "launch file": (LAUNCH_FILE, lambda d: write_launch_file(d, script_config(str(d))),
                    lambda d: read_launch_file(d, ScriptConfig)),
}


def _sparse(path: Path) -> None:
    with open(path, "wb"):
        pass
    os.truncate(path, defaults.MAX_READ_BYTES + 1)  # sparse: no disk, no memory, just a size


# Each crafted file: how it is made at a path, and what the one-line error must say of it.
CRAFTED: dict[str, tuple[Callable[[Path], None], str]] = {
    "symlink to /dev/zero": (lambda p: p.symlink_to("/dev/zero"),
                             "is not a regular file: it is a symbolic link to /dev/zero, a character device"),
    "FIFO": (lambda p: os.mkfifo(p), "is not a regular file: it is a FIFO"),
    "directory": (lambda p: p.mkdir(), "is not a regular file: it is a directory"),
    "huge sparse file": (_sparse, f"bytes, more than the {defaults.MAX_READ_BYTES / 1024**3:g} GiB ("),
    "deep nesting": (lambda p: p.write_text("[" * 100_000 + "]" * 100_000), "nested too deep"),
    "NaN": (lambda p: p.write_text('{"x": NaN}'), "NaN is not a number cpuprof writes"),
    "5000-digit number": (lambda p: p.write_text('{"x": ' + "7" * 5000 + "}"), "a number too long to read"),
    "not UTF-8": (lambda p: p.write_bytes(b'{"x": "\xff"}'), "not UTF-8 text at byte 7"),
}


@pytest.fixture
def no_hang() -> Iterator[None]:
    """A read that blocks (a FIFO opened without O_NONBLOCK) is interrupted by SIGALRM and fails."""
    def hung(signum: int, frame: object) -> None:
        raise TimeoutError("the read blocked")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _one_line(error: BaseException, *parts: str) -> str:
    message = str(error)
    assert "\n" not in message
    for part in parts:
        assert part in message, message
    return message


# Read in a subprocess only (test_every_kind_refuses_files_that_would_fill_memory): were the check
# missing, reading them would fill this process's memory, not fail a test.
FILLS_MEMORY = ("symlink to /dev/zero", "huge sparse file")
IN_PROCESS = [craft for craft in CRAFTED if craft not in FILLS_MEMORY]


@pytest.mark.parametrize("craft", IN_PROCESS)
@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_reads_only_a_regular_json_file(tmp_path: Path, kind: str, craft: str, no_hang: None):
    file_kind, _, read = KINDS[kind]
    make, says = CRAFTED[craft]
    make(tmp_path / file_kind.filename)
    with pytest.raises(FileFormatError) as caught:
        read(tmp_path)
    _one_line(caught.value, str(tmp_path / file_kind.filename), says)
    assert caught.value.exit_code == exit_codes.USAGE


@pytest.mark.parametrize("craft", IN_PROCESS)
def test_roofs_cache_that_is_not_a_file_is_measured_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          craft: str, no_hang: None):
    monkeypatch.setenv("CPUPROF_CACHE_DIR", str(tmp_path))
    make, says = CRAFTED[craft]
    make(roofs.cache_path())
    found, reason = roofs.cached(2, [0, 1])
    assert found is None and reason is not None and reason.endswith("; measuring again")
    _one_line(ValueError(reason), str(roofs.cache_path()), says)


def test_a_file_swapped_for_a_fifo_after_the_check_does_not_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  no_hang: None):
    """The type is checked again on the opened descriptor: a FIFO put in place between the stat and
    the open is refused, not waited on."""
    make_profile().save(tmp_path)
    path = tmp_path / PROFILE.filename
    real_open = os.open

    def swap_then_open(file: object, flags: int, *args: object, **kwargs: object) -> int:
        if Path(str(file)) == path:
            path.unlink()
            os.mkfifo(path)
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", swap_then_open)
    with pytest.raises(FileFormatError) as caught:
        Profile.load(tmp_path)
    _one_line(caught.value, "it is a FIFO")


def _save_edited(directory: Path, kind: str, edit: Callable[[dict], None]) -> None:
    file_kind, write, _ = KINDS[kind]
    write(directory)
    path = directory / file_kind.filename
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data).replace('"1e400"', "1e400"))  # JSON's own spelling of a number past float


# Loaded data that is valid JSON of the right shape but not what cpuprof could have written.
INVALID: dict[str, tuple[str, Callable[[dict], None], str]] = {
    "order past the configurations": ("comparison", lambda d: d["order"].append([5, 1]),
                                      "order holds [5, 1], not a [configuration, repetition] of the 2"),
    "baseline past the configurations": ("comparison", lambda d: d.update(baseline=7),
                                         "baseline 7 is not one of the 2 configurations"),
    "negative repetitions": ("comparison", lambda d: d.update(repetitions=-3),
                             "repetitions is -3, not a positive count"),
    "a run of no configuration": ("comparison", lambda d: d["runs"][0].update(config=-1),
                                  "runs[0] is configuration -1"),
    "infinite metric": ("comparison", lambda d: d["runs"][0]["metrics"].update(tokens_per_s="1e400"),
                        "tokens_per_s: inf is not a finite number"),
    "zero world size": ("ranks file", lambda d: d.update(world_size=0), "world_size is 0, not a positive count"),
    "rank outside the group": ("ranks file", lambda d: d["ranks"][0].update(rank=3), "rank 3 is not one of the 1"),
    "rank directory outside the group's": ("ranks file", lambda d: d["ranks"][0].update(dir="../../etc"),
                                           "directory '../../etc' is not inside the group's"),
    "op counts of another thread count": ("profile", lambda d: d["ops"][0]["counters_self"]["task-clock"].pop(),
                                          "per-thread values for"),
}


@pytest.mark.parametrize("case", INVALID)
def test_loaded_data_is_validated(tmp_path: Path, case: str):
    kind, edit, says = INVALID[case]
    _save_edited(tmp_path, kind, edit)
    with pytest.raises(FileFormatError) as caught:
        KINDS[kind][2](tmp_path)
    path = tmp_path / KINDS[kind][0].filename
    _one_line(caught.value, f"{path} is a damaged cpuprof {kind} (", says)


def test_deeply_nested_model_values_are_one_line(tmp_path: Path):
    """Within the JSON parser's depth, but deeper than the model's decoder can follow (an op input's
    items within items): a RecursionError is caught where the model is decoded."""
    def edit(d: dict) -> None:
        inner: dict = {"kind": "tensor"}
        for _ in range(400):
            inner = {"kind": "tensor_list", "items": [inner]}
        d["ops"][0]["inputs"] = [inner]

    _save_edited(tmp_path, "profile", edit)
    with pytest.raises(FileFormatError) as caught:
        Profile.load(tmp_path)
    _one_line(caught.value, "nested too deep")


def test_a_path_through_a_file_is_one_line(tmp_path: Path):
    """A component of the path that is a file: refused even for root."""
    (tmp_path / "plain").write_text("x")
    with pytest.raises(FileFormatError) as caught:
        Profile.load(tmp_path / "plain" / "profile.json")
    _one_line(caught.value, "cannot read (Not a directory)")


# -- the real commands ------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}


def cpuprof_all(*commands: list[str], prefix: tuple[str, ...] = ()) -> list[subprocess.CompletedProcess[str]]:
    """Each ``python -m cpuprof ARGS``, all at once (the battery stays a few seconds); a hang fails
    the test after 20 s instead of stalling CI, and a read of /dev/zero fills no memory but theirs."""
    started = [subprocess.Popen([*prefix, sys.executable, *(args if args[0] == "-c" else ["-m", "cpuprof", *args])],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                                preexec_fn=_limit_memory) for args in commands]
    results = []
    try:
        for args, process in zip(commands, started, strict=True):
            out, err = process.communicate(timeout=20)
            results.append(subprocess.CompletedProcess(args, process.returncode, out, err))
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    return results


def _limit_memory() -> None:
    """A read that fills memory ends in a MemoryError in the child, not in the machine's OOM killer."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def assert_refused(result: subprocess.CompletedProcess[str], *says: str) -> None:
    where = f"{' '.join(map(str, result.args))}: {result.stderr}"
    assert "Traceback" not in result.stderr, where
    lines = result.stderr.splitlines()
    assert result.returncode == exit_codes.USAGE, where
    assert len(lines) == 1 and lines[0].startswith("cpuprof: error: "), where
    for part in says:
        assert part in lines[0], where


def report(path: Path, capsys: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess[str]:
    """``cpuprof report PATH`` in this process, for files that can neither block nor fill memory."""
    code = main(["report", str(path)])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(["report", str(path)], code, captured.out, captured.err)


COMMANDS = {
    "report": ("report", "{dir}"),
    "diff": ("diff", "{dir}", "{dir}"),
    "flamegraph": ("flamegraph", "{dir}", "-o", "{out}"),
    "trace": ("trace", "{dir}", "-o", "{out}"),
}


def test_commands_refuse_a_profile_that_is_not_a_file(tmp_path: Path):
    """report, diff, flamegraph and trace on a profile.json that is a link to /dev/zero (read until
    the OOM killer came) or a FIFO (blocked forever)."""
    commands, expected = [], []
    for craft in ("symlink to /dev/zero", "FIFO"):
        run_dir = tmp_path / craft.replace(" ", "-").replace("/", "")
        run_dir.mkdir()
        CRAFTED[craft][0](run_dir / PROFILE.filename)
        for name, args in COMMANDS.items():
            commands.append([a.format(dir=run_dir, out=tmp_path / f"{name}.out") for a in args])
            expected.append(f"{run_dir / PROFILE.filename} {CRAFTED[craft][1]}")
    for result, says in zip(cpuprof_all(*commands), expected, strict=True):
        assert_refused(result, says)


ROOFS_REASON = ("from cpuprof.machine import roofs; import sys; sys.stderr.write(roofs.cached(2, [0, 1])[1]); "
                "sys.exit(2)")


def test_every_kind_refuses_files_that_would_fill_memory(tmp_path: Path):
    """Each file as a link to /dev/zero and as a sparse file past the limit, read by the command
    that reads it: report (profile, comparison, ranks), compare --from (launch), a run's roofs."""
    commands, expected = [], []
    for craft in FILLS_MEMORY:
        make, says = CRAFTED[craft]
        for kind, (file_kind, _, _) in KINDS.items():
            directory = tmp_path / f"{kind}-{craft}".replace(" ", "-").replace("/", "")
            directory.mkdir()
            if kind == "launch file":
                make_profile().save(directory)
                commands.append(["compare", "--from", str(directory)])
            else:
                commands.append(["report", str(directory)])
            make(directory / file_kind.filename)
            expected.append((str(directory / file_kind.filename), says))
        cache = tmp_path / f"cache-{craft}".replace(" ", "-").replace("/", "")
        cache.mkdir()
        make(cache / "roofs.json")
        commands.append(["-c", f"import os; os.environ['CPUPROF_CACHE_DIR'] = {str(cache)!r}; {ROOFS_REASON}"])
        expected.append((str(cache / "roofs.json"), says))
    for result, (path, says) in zip(cpuprof_all(*commands), expected, strict=True):
        if result.args[0] == "-c":  # the roofs cache's reason is a warning, not an error line
            assert "Traceback" not in result.stderr and path in result.stderr and says in result.stderr, result.stderr
            continue
        assert_refused(result, path, says)


@pytest.mark.parametrize("kind", ["comparison", "ranks file"])
def test_report_names_the_fifo_it_found_not_a_missing_profile(tmp_path: Path, kind: str,
                                                             capsys: pytest.CaptureFixture[str], no_hang: None):
    """A directory's compare.json or ranks.json that is a FIFO is what report reads and refuses;
    it does not pass over it to look for a profile.json that is not there."""
    os.mkfifo(tmp_path / KINDS[kind][0].filename)
    assert_refused(report(tmp_path, capsys), f"{KINDS[kind][0].filename} is not a regular file: it is a FIFO")


def _nan_metric(directory: Path) -> None:
    comparison().save(directory)
    path = directory / COMPARE_FILE.filename
    path.write_text(path.read_text().replace('"tokens_per_s": 10.0', '"tokens_per_s": NaN', 1))


# compare.json files report and compare --resume must refuse: how each is made, what the line says.
BAD_COMPARISONS: dict[str, tuple[Callable[[Path], object], str]] = {
    "deep nesting": (lambda d: CRAFTED["deep nesting"][0](d / COMPARE_FILE.filename), "nested too deep"),
    "NaN metric": (_nan_metric, "NaN is not a number cpuprof writes"),
    **{case: (lambda d, case=case: _save_edited(d, "comparison", INVALID[case][1]),
              f"is a damaged cpuprof comparison ({INVALID[case][2]}")
       for case in ("order past the configurations", "baseline past the configurations", "negative repetitions")},
    "base options it cannot run": (lambda d: _save_edited(d, "comparison", lambda c: c.update(base={"bogus": 1})),
                                   "comparison.base: unknown field(s) bogus"),
}


@pytest.mark.parametrize("case", BAD_COMPARISONS)
def test_report_refuses_a_bad_comparison(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]):
    make, says = BAD_COMPARISONS[case]
    make(tmp_path)
    assert_refused(report(tmp_path, capsys), says)


def test_resume_refuses_a_bad_comparison_before_any_run(tmp_path: Path):
    """In a subprocess: a resume that did not refuse would start the sweep's runs."""
    commands = []
    for i, (make, _) in enumerate(BAD_COMPARISONS.values()):
        (tmp_path / str(i)).mkdir()
        make(tmp_path / str(i))
        commands.append(["compare", "--resume", str(tmp_path / str(i))])
    for result, (_, says) in zip(cpuprof_all(*commands), BAD_COMPARISONS.values(), strict=True):
        assert_refused(result, says)


@pytest.fixture
def without_root_privileges() -> tuple[str, ...]:
    """A command prefix under which file permissions apply: root ignores them, so as root the
    command runs without the capabilities that let it (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH)."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root ignores file permissions, and there is no setpriv here to drop that privilege")
    return (setpriv, "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search")


def test_a_directory_without_permission_is_one_line(tmp_path: Path, without_root_privileges: tuple[str, ...]):
    """report on a directory that cannot be read, and on one inside a directory that cannot be searched."""
    locked = tmp_path / "run"
    make_profile().save(locked / "inner")
    make_profile().save(locked)
    locked.chmod(0)
    try:
        results = cpuprof_all(["report", str(locked)], ["report", str(locked / "inner")],
                              prefix=without_root_privileges)
    finally:
        locked.chmod(0o755)
    for result in results:
        assert_refused(result, "cannot read (Permission denied")


@pytest.mark.parametrize("command", ["flamegraph", "trace"])
def test_a_run_made_without_profiling_says_so_to_the_commands_that_need_one(command: str, tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]):
    """A --no-profile decode's directory has settings and throughput, no ops, stacks or timeline: the
    flame graph and the trace say that in one line and exit 2, and write nothing."""
    unprofiled = tmp_path / "run"
    unprofiled.mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / "fixtures" / "profile-v1-unprofiled.json",
                unprofiled / "profile.json")
    output = tmp_path / ("out.svg" if command == "flamegraph" else "out.json")
    code = main([command, str(unprofiled), "-o", str(output)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == exit_codes.USAGE
    assert len(err) == 1 and "this run was not profiled (it was made with --no-profile)" in err[0], err
    assert not output.exists()


@pytest.mark.parametrize("beside, words", [
    ("window-1", "its windows were profiled, each into its own directory (window-1): give one of those"),
    ("processes", "the program's own process was not profiled (it never imported torch); the processes it started"),
    ("interrupted", "nothing was profiled (interrupted by SIGINT while building the model)"),
])
def test_an_unprofiled_profile_says_where_the_profile_is(beside: str, words: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]):
    """The top directory of run --on-demand (its windows hold the profiles), of a run whose program never
    imported torch (its processes do), of a run stopped before profiling began: each named as it is."""
    unprofiled = tmp_path / "run"
    unprofiled.mkdir()
    fixture = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "profile-v1-unprofiled.json").read_text())
    if beside == "interrupted":
        fixture["status"] = {"complete": False, "reason": "interrupted by SIGINT while building the model"}
    else:
        (unprofiled / beside).mkdir()
    (unprofiled / "profile.json").write_text(json.dumps(fixture))
    assert main(["flamegraph", str(unprofiled), "-o", str(tmp_path / "f.svg")]) == exit_codes.USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
