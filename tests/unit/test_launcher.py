"""Launcher validation: every bad input gets a one-line UsageError; good input the right env."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cpuprof.errors import UsageError
from cpuprof.launch import environment as launcher
from cpuprof.launch import follow_env
from cpuprof.launch.environment import (
    GOMP_SPINS_PER_MS,
    LAUNCH_CPUS_VAR,
    LAUNCH_ENV_VAR,
    LaunchSettings,
    parse_blocktime,
    parse_cpus,
    parse_numa,
    parse_threads,
    validate,
)
from cpuprof.launch.follow_env import give_back_the_programs_env
from cpuprof.machine import libraries, openmp
from cpuprof.machine.topology import Topology, format_cpulist, read_topology
from cpuprof.model import MemPolicy, Requested
from cpuprof.model.run_layout import FRONT_END_FILENAME

VENV_IOMP = str(Path(sys.prefix, "lib", "libiomp5.so"))


def write_two_socket_tree(root: Path) -> Path:
    """Two nodes of 4 cores x 2 threads: node 0 = CPUs 0-3,8-11, node 1 = 4-7,12-15."""
    cpu_dir = root / "sys/devices/system/cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text("0-15\n")
    for cpu in range(16):
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "core_id").write_text(f"{cpu % 4}\n")
        (topo / "physical_package_id").write_text(f"{cpu % 8 // 4}\n")
        (topo / "thread_siblings_list").write_text(f"{cpu % 8},{cpu % 8 + 8}\n")
    for node, (cpulist, distance) in enumerate([("0-3,8-11", "10 21"), ("4-7,12-15", "21 10")]):
        path = root / f"sys/devices/system/node/node{node}"
        path.mkdir(parents=True)
        (path / "cpulist").write_text(cpulist + "\n")
        (path / "distance").write_text(distance + "\n")
        (path / "meminfo").write_text(f"Node {node} MemTotal:       65536 kB\nNode {node} MemFree: 1 kB\n")
    return root


@pytest.fixture
def fake(tmp_path: Path) -> Topology:
    return read_topology(write_two_socket_tree(tmp_path / "machine"))


@pytest.fixture
def real() -> Topology:
    return read_topology()


def validate_fake(settings: LaunchSettings, topo: Topology) -> launcher.ResolvedLaunch:
    """validate() on the fake machine, as if this process could use all of it."""
    return validate(settings, topo, allowed_cpus=topo.online_cpus, allowed_nodes=topo.node_ids)


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


# --- --threads ---------------------------------------------------------------


@pytest.mark.parametrize("text", ["0", "abc", "-1", "", "1.5", "2x"])
def test_parse_threads_rejects(text: str) -> None:
    with pytest.raises(UsageError) as exc:
        parse_threads(text)
    assert one_line(exc) == f"--threads {text}: expected a positive whole number"
    assert exc.value.exit_code == 2


def test_parse_threads_accepts() -> None:
    assert parse_threads("2") == 2
    assert parse_threads(" 16 ") == 16


def test_threads_zero_in_settings_rejected(fake: Topology) -> None:
    with pytest.raises(UsageError, match="--threads 0: expected a positive whole number"):
        validate_fake(LaunchSettings(threads=0), fake)


def test_more_threads_than_cpus(fake: Topology) -> None:
    with pytest.raises(UsageError) as exc:
        validate_fake(LaunchSettings(threads=9, numa=0), fake)
    assert one_line(exc) == (
        "--threads 9: only 8 CPUs in the chosen set (node 0: 0-3,8-11); pass --oversubscribe to allow it"
    )
    resolved = validate_fake(LaunchSettings(threads=9, numa=0, oversubscribe=True), fake)
    assert resolved.cpus == [0, 1, 2, 3, 8, 9, 10, 11]
    assert resolved.env["OMP_NUM_THREADS"] == "9"


def test_more_threads_than_cpus_on_this_machine(real: Topology) -> None:
    usable = sorted(os.sched_getaffinity(0))
    threads = len(usable) + 2
    with pytest.raises(UsageError) as exc:
        validate(LaunchSettings(threads=threads), real)
    assert one_line(exc) == (
        f"--threads {threads}: only {len(usable)} CPU{'s' if len(usable) > 1 else ''} in the chosen set "
        f"(all usable CPUs: {format_cpulist(usable)}); pass --oversubscribe to allow it"
    )
    assert validate(LaunchSettings(threads=threads, oversubscribe=True), real).cpus == usable


# --- --numa ------------------------------------------------------------------


def test_numa_missing_on_fake(fake: Topology) -> None:
    with pytest.raises(UsageError) as exc:
        validate_fake(LaunchSettings(threads=1, numa=7), fake)
    assert one_line(exc) == "--numa 7: this machine has NUMA node(s) 0-1; pick one of them or drop --numa"


def test_numa_missing_on_this_machine(real: Topology) -> None:
    with pytest.raises(UsageError) as exc:
        validate(LaunchSettings(threads=1, numa=7), real)
    nodes = format_cpulist(real.node_ids)
    assert one_line(exc).startswith(f"--numa 7: this machine has NUMA node(s) {nodes};")


def test_numa_on_this_machine(real: Topology) -> None:
    resolved = validate(LaunchSettings(threads=1, numa=0), real)
    assert resolved.mem_nodes == [0]
    assert set(resolved.cpus) <= set(real.node(0).cpus)


@pytest.mark.parametrize("text", ["abc", "-1", ""])
def test_parse_numa_rejects(text: str) -> None:
    with pytest.raises(UsageError, match=r"expected a NUMA node number"):
        parse_numa(text)


def test_numa_node_not_allowed(fake: Topology) -> None:
    with pytest.raises(UsageError, match="--numa 1: this process may only allocate on node\\(s\\) 0"):
        validate(LaunchSettings(threads=1, numa=1), fake, allowed_cpus=fake.online_cpus, allowed_nodes=[0])


def test_numa_selects_node_cpus(fake: Topology) -> None:
    resolved = validate_fake(LaunchSettings(threads=2, numa=1), fake)
    assert resolved.cpus == [4, 5, 6, 7, 12, 13, 14, 15]
    assert resolved.mem_nodes == [1]
    assert resolved.cpu_set_description == "node 1: 4-7,12-15"


# --- --cpus ------------------------------------------------------------------


def test_cpus_outside_machine(fake: Topology) -> None:
    with pytest.raises(UsageError) as exc:
        parse_cpus("0-3,99", fake)
    assert one_line(exc) == "--cpus 0-3,99: CPU(s) 99 not on this machine (online CPUs: 0-15)"
    with pytest.raises(UsageError, match="CPU\\(s\\) 99 not on this machine"):
        validate_fake(LaunchSettings(threads=1, cpus=[99]), fake)


def test_cpus_outside_this_machine(real: Topology) -> None:
    beyond = real.online_cpus[-1] + 1
    with pytest.raises(UsageError, match=f"online CPUs: {format_cpulist(real.online_cpus)}"):
        parse_cpus(str(beyond), real)


@pytest.mark.parametrize("text", ["", "a-b", "3-1", ","])
def test_cpus_bad_syntax(fake: Topology, text: str) -> None:
    with pytest.raises(UsageError) as exc:
        parse_cpus(text, fake)
    assert one_line(exc) == f"--cpus {text}: expected a CPU list like 0-3,8-11"


def test_cpus_and_numa_disjoint(fake: Topology) -> None:
    with pytest.raises(UsageError) as exc:
        validate_fake(LaunchSettings(threads=1, numa=1, cpus=parse_cpus("0-3", fake)), fake)
    assert one_line(exc) == (
        "--cpus 0-3 and --numa 1 share no usable CPU (node 1 has CPUs 4-7,12-15; allowed CPUs: 0-15)"
    )


def test_cpus_and_numa_intersect(fake: Topology) -> None:
    resolved = validate_fake(LaunchSettings(threads=2, numa=1, cpus=[2, 3, 4, 5]), fake)
    assert resolved.cpus == [4, 5]
    assert resolved.cpu_set_description == "node 1, --cpus 2-5: 4-5"


def test_cpus_not_allowed_for_this_process(fake: Topology) -> None:
    with pytest.raises(UsageError) as exc:
        validate(LaunchSettings(threads=1, cpus=[2, 3]), fake, allowed_cpus=[0, 1, 2], allowed_nodes=[0, 1])
    assert one_line(exc) == "--cpus 2-3: CPU(s) 3 are outside this process's allowed CPUs (0-2)"


# --- choices, blocktime --------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("bind", "tight", "--bind tight: expected one of close, spread, none"),
        ("omp", "llvm", "--omp llvm: expected one of gnu, intel"),
        ("allocator", "mimalloc", "--allocator mimalloc: expected one of default, jemalloc, tcmalloc"),
    ],
)
def test_bad_choices(fake: Topology, field: str, value: str, message: str) -> None:
    settings = LaunchSettings(threads=1)
    setattr(settings, field, value)
    with pytest.raises(UsageError) as exc:
        validate_fake(settings, fake)
    assert one_line(exc) == message


@pytest.mark.parametrize("text", ["abc", "-1", "1.5", ""])
def test_parse_blocktime_rejects(text: str) -> None:
    with pytest.raises(UsageError, match=r"expected milliseconds .* or 'infinite'"):
        parse_blocktime(text)


def test_parse_blocktime_accepts() -> None:
    assert parse_blocktime("0") == 0
    assert parse_blocktime("200") == 200
    assert parse_blocktime("Infinite") == "infinite"


@pytest.mark.parametrize(
    ("omp", "blocktime", "expected"),
    [
        ("gnu", 0, {"GOMP_SPINCOUNT": "0"}),
        ("gnu", 5, {"GOMP_SPINCOUNT": str(5 * GOMP_SPINS_PER_MS)}),
        ("gnu", "infinite", {"GOMP_SPINCOUNT": "infinite"}),
        ("intel", 0, {"KMP_BLOCKTIME": "0"}),
        ("intel", "infinite", {"KMP_BLOCKTIME": "infinite"}),
    ],
)
def test_blocktime_env(fake: Topology, omp: str, blocktime: int | str, expected: dict[str, str]) -> None:
    env = validate_fake(LaunchSettings(threads=1, omp=omp, blocktime_ms=blocktime), fake).env
    assert {key: env[key] for key in expected} == expected
    assert not {"GOMP_SPINCOUNT", "KMP_BLOCKTIME"} - set(expected) & set(env)


# --- runtimes and allocators ---------------------------------------------------


def test_intel_runtime_found_in_this_venv(fake: Topology) -> None:
    resolved = validate_fake(LaunchSettings(threads=1, omp="intel"), fake)
    assert resolved.omp_library == VENV_IOMP
    assert resolved.env["LD_PRELOAD"] == VENV_IOMP


@pytest.fixture
def no_system_libraries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Hide every library outside an empty tmp prefix, so "not found" is deterministic."""
    prefix = tmp_path / "prefix"
    (prefix / "lib").mkdir(parents=True)
    monkeypatch.setattr(launcher.sys, "prefix", str(prefix))
    monkeypatch.setattr(openmp, "python_lib_dirs", lambda: [prefix / "lib"])
    monkeypatch.setattr(libraries, "ldconfig_libraries", lambda: ())
    monkeypatch.setattr(libraries, "system_lib_dirs", lambda: [])
    return prefix


def test_intel_runtime_missing(fake: Topology, no_system_libraries: Path) -> None:
    with pytest.raises(UsageError) as exc:
        validate_fake(LaunchSettings(threads=1, omp="intel"), fake)
    assert one_line(exc).endswith("install it with: pip install intel-openmp")


@pytest.mark.parametrize(
    ("allocator", "package"), [("jemalloc", "libjemalloc2"), ("tcmalloc", "libtcmalloc-minimal4")]
)
def test_allocator_missing(fake: Topology, no_system_libraries: Path, allocator: str, package: str) -> None:
    with pytest.raises(UsageError) as exc:
        validate_fake(LaunchSettings(threads=1, allocator=allocator), fake)
    message = one_line(exc)
    assert message.startswith(f"--allocator {allocator}: lib{allocator}")
    assert message.endswith(f"install it with: apt-get install {package}")


def test_allocator_found_is_preloaded_after_openmp(fake: Topology, no_system_libraries: Path) -> None:
    jemalloc = no_system_libraries / "lib" / "libjemalloc.so.2"
    jemalloc.touch()
    (no_system_libraries / "lib" / "libiomp5.so").touch()
    resolved = validate_fake(LaunchSettings(threads=1, omp="intel", allocator="jemalloc"), fake)
    assert resolved.env["LD_PRELOAD"] == f"{no_system_libraries}/lib/libiomp5.so:{jemalloc}"
    assert resolved.requested().allocator_library == str(jemalloc)


def test_ldconfig_cache_is_parsed() -> None:
    """This machine's libgomp is in the ldconfig cache (it is a dependency of gcc)."""
    names = dict(libraries.ldconfig_libraries())
    if "libgomp.so.1" not in names:
        pytest.skip("libgomp.so.1 is not in this machine's ldconfig cache")
    assert Path(names["libgomp.so.1"]).name == "libgomp.so.1"


# --- the environment -----------------------------------------------------------

EXPECTED_AFFINITY_ENV = {
    ("gnu", "close"): {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"},
    ("gnu", "spread"): {"OMP_PROC_BIND": "spread", "OMP_PLACES": "cores"},
    ("gnu", "none"): {},
    ("intel", "close"): {"KMP_AFFINITY": "granularity=fine,compact,1,0"},
    ("intel", "spread"): {"KMP_AFFINITY": "granularity=fine,scatter"},
    ("intel", "none"): {},
}


@pytest.mark.parametrize(("omp", "bind"), list(EXPECTED_AFFINITY_ENV))
def test_env_matrix(fake: Topology, omp: str, bind: str) -> None:
    resolved = validate_fake(LaunchSettings(threads=4, numa=0, omp=omp, bind=bind), fake)
    expected = {"OMP_NUM_THREADS": "4", **EXPECTED_AFFINITY_ENV[(omp, bind)]}
    if omp == "intel":
        expected["LD_PRELOAD"] = VENV_IOMP
    assert resolved.env == expected
    assert resolved.places == (None if bind == "none" or omp == "intel" else "cores")


def test_places_are_threads_when_cores_run_out(fake: Topology) -> None:
    resolved = validate_fake(LaunchSettings(threads=6, numa=0), fake)  # node 0 has 4 cores
    assert resolved.env["OMP_PLACES"] == "threads"


def test_child_env_owns_threads_binding_and_preloads(fake: Topology, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow_env, "before_launch", None)
    base = {
        "PATH": "/usr/bin",
        "OMP_PROC_BIND": "true",
        "KMP_AFFINITY": "compact",
        "OMP_NUM_THREADS": "64",
        "MKL_NUM_THREADS": "64",  # removed, not set: it would size torch's pool in the processes a program starts
        "KMP_BLOCKTIME": "7",
        "LD_PRELOAD": "/opt/intel/libiomp5.so /usr/lib/libjemalloc.so.2:/opt/libfoo.so",
    }
    gnu = validate_fake(LaunchSettings(threads=2, bind="none"), fake).child_env(base)
    launch = json.loads(gnu.pop(LAUNCH_ENV_VAR))
    assert json.loads(gnu.pop(LAUNCH_CPUS_VAR)) == validate_fake(LaunchSettings(threads=2, bind="none"), fake).cpus
    assert gnu == {"PATH": "/usr/bin", "KMP_BLOCKTIME": "7", "OMP_NUM_THREADS": "2",
                   "LD_PRELOAD": "/opt/libfoo.so"}
    # The launch's variables and what they were: the processes the program starts get those back,
    # less what the program itself set.
    assert launch == {"OMP_NUM_THREADS": ["2", "64"], "MKL_NUM_THREADS": [None, "64"],
                      "OMP_PROC_BIND": [None, "true"], "KMP_AFFINITY": [None, "compact"]}
    program_env = {**gnu, LAUNCH_ENV_VAR: json.dumps(launch), "MKL_NUM_THREADS": "3"}  # the program set one
    assert give_back_the_programs_env(program_env) == {"OMP_NUM_THREADS": "64", "OMP_PROC_BIND": "true",
                                                       "KMP_AFFINITY": "compact"}
    assert program_env["OMP_NUM_THREADS"] == "64" and program_env["MKL_NUM_THREADS"] == "3"
    assert LAUNCH_ENV_VAR not in program_env  # the processes it starts inherit what it has now
    assert follow_env.before_launch is not None and follow_env.before_launch["OMP_NUM_THREADS"] == "64"


@pytest.mark.parametrize("said", ["not json", "[1, 2]", '{"LD_PRELOAD": ["a", "b"]}', '{"OMP_NUM_THREADS": [1, 2]}',
                                  '{"OMP_NUM_THREADS": ["2", "a\\u0000b"]}', "[" * 100_000, '{"OMP_PLACES": ["x"]}'])
def test_an_unreadable_launch_account_changes_nothing(said: str) -> None:
    """The account is read back from an environment the program controls: anything but the launch's
    own variables with string values is ignored whole, never half applied."""
    env = {LAUNCH_ENV_VAR: said, "OMP_NUM_THREADS": "2", "LD_PRELOAD": "a"}
    assert give_back_the_programs_env(env) == {}
    assert env == {"OMP_NUM_THREADS": "2", "LD_PRELOAD": "a"}


def test_the_boot_side_knows_the_launchs_variables() -> None:
    assert follow_env.LAUNCH_OWNED_VARS == launcher.OWNED_VARS
    assert follow_env.LAUNCH_CPUS_ENV == LAUNCH_CPUS_VAR
    assert follow_env.FRONT_END_FILENAME == FRONT_END_FILENAME


GIVE_BACK = """
import json, os, sys
from cpuprof.launch import follow_env
launch, mine, parent = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
os.sched_setaffinity(0, mine)  # as inherited: this process's main thread is the 'parent' below
given = follow_env.give_back_the_cpu_set(launch, parent=os.getpid() if parent == "self" else int(parent))
print(json.dumps([given, sorted(os.sched_getaffinity(0)), follow_env.cpus_given_back]))
"""


def _give_back(launch: list[int], mine: list[int], parent: str, env: dict[str, str] | None = None) -> list:
    done = subprocess.run([sys.executable, "-c", GIVE_BACK, json.dumps(launch), json.dumps(mine), parent],
                          capture_output=True, text=True, timeout=60, check=True, env=env)
    return json.loads(done.stdout)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a CPU set smaller than the launch's needs 2 CPUs")
def test_a_process_started_from_an_openmp_bound_thread_gets_the_launchs_cpu_set_back() -> None:
    """Known answers, in a real process: started on the one CPU its parent's main thread is bound to,
    it gets the launch's set back; started on a set its parent's main thread is not bound to (a
    taskset of the program's), or on the launch's whole set, it keeps its own."""
    launch = sorted(os.sched_getaffinity(0))[:2]
    one = launch[:1]
    assert _give_back(launch, one, "self") == [True, launch, [one, launch]]
    assert _give_back(launch, one, str(os.getpid())) == [False, one, None]  # this pytest: not bound to it
    assert _give_back(launch, launch, "self") == [False, launch, None]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a CPU set smaller than the launch's needs 2 CPUs")
def test_a_process_started_before_its_parent_was_freed_as_a_front_end_gets_the_launchs_cpu_set_back(
        tmp_path: Path) -> None:
    """A sibling started while the program was still bound, booting after another process freed it:
    the record beside the follow file says the parent was on this CPU set; a record about another
    process, another set, or not a record, gives nothing back."""
    launch = sorted(os.sched_getaffinity(0))[:2]
    one = launch[:1]
    parent = str(os.getpid())  # this pytest, not bound to `one`: only the record can say it was
    env = {**os.environ, follow_env.FOLLOW_ENV: str(tmp_path / "follow.json")}
    record = tmp_path / FRONT_END_FILENAME
    for said, given in ((dict(pid=os.getpid(), cpus_from=one), True), (dict(pid=os.getpid() + 1, cpus_from=one), False),
                        (dict(pid=os.getpid(), cpus_from=launch), False), ("not json", False)):
        record.write_text(json.dumps(said) if isinstance(said, dict) else said)
        expected = [True, launch, [one, launch]] if given else [False, one, None]
        assert _give_back(launch, one, parent, env) == expected, said


@pytest.mark.parametrize("said", ["not json", "{}", "[0, -1]", "[0, 1.5]", "[true]", '["0"]', "[" * 100_000])
def test_an_unreadable_launch_cpu_set_gives_nothing_back(said: str) -> None:
    assert follow_env._cpu_list(said) == [] and follow_env._cpu_list("[3, 1, 1]") == [1, 3]
    env = {LAUNCH_ENV_VAR: json.dumps({"OMP_PROC_BIND": ["close", None]}), LAUNCH_CPUS_VAR: said}
    before = follow_env.cpus_given_back
    give_back_the_programs_env(env)
    assert LAUNCH_CPUS_VAR not in env and follow_env.cpus_given_back == before


def test_child_env_preloads(fake: Topology) -> None:
    base = {"LD_PRELOAD": "/opt/intel/libiomp5.so /usr/lib/libjemalloc.so.2:/opt/libfoo.so"}
    intel = validate_fake(LaunchSettings(threads=2, omp="intel", blocktime_ms=0), fake).child_env(base)
    assert intel["LD_PRELOAD"] == f"{VENV_IOMP}:/opt/libfoo.so"
    assert intel["KMP_BLOCKTIME"] == "0"
    assert "OMP_PROC_BIND" not in intel
    plain = validate_fake(LaunchSettings(threads=1), fake)
    assert "LD_PRELOAD" not in plain.child_env({"LD_PRELOAD": "libgomp.so.1"})


def test_requested(fake: Topology) -> None:
    resolved = validate_fake(LaunchSettings(threads=2, numa=1, omp="intel", bind="spread"), fake)
    assert resolved.requested() == Requested(
        threads=2, cpus=[4, 5, 6, 7, 12, 13, 14, 15], bind="spread", places=None, omp="intel",
        omp_library=VENV_IOMP, allocator="default", allocator_library=None,
        mempolicy=MemPolicy(mode="bind", nodes=[1]),
        env={"OMP_NUM_THREADS": "2", "KMP_AFFINITY": "granularity=fine,scatter"},
    )


def test_threads_default_to_the_cpu_set(fake: Topology) -> None:
    resolved = validate_fake(LaunchSettings(numa=1), fake)
    assert resolved.settings.threads == 8 and resolved.env["OMP_NUM_THREADS"] == "8"


def test_doctor_and_launcher_find_the_same_intel_runtime(fake: Topology) -> None:
    """One search: doctor can never say "not installed" while --omp intel works, or the reverse."""
    found = openmp.find_intel_openmp()
    resolved = validate_fake(LaunchSettings(threads=1, omp="intel"), fake)
    assert found is not None and resolved.omp_library == str(found)


def test_preexec_pins_and_binds_the_child(real: Topology) -> None:
    resolved = validate(LaunchSettings(threads=1, numa=0, cpus=[real.node(0).cpus[0]]), real)
    status = subprocess.run(
        ["cat", "/proc/self/status", "/proc/self/numa_maps"],
        preexec_fn=resolved.preexec(), capture_output=True, text=True, check=True,
    ).stdout
    assert f"Cpus_allowed_list:\t{resolved.cpus[0]}\n" in status
    assert " bind:0 " in status  # numa_maps shows the task policy for its mappings
