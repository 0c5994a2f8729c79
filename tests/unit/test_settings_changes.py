"""What a process changed in its own settings between its import of torch and its end, from two
hand-made reads shaped as vLLM's worker's: its memory policy bound to a node, its OpenMP threads
sized and bound by vLLM, a variable set, threads started since on one CPU."""

from __future__ import annotations

from dataclasses import replace

from tests.profiles import settings

from cpuprof.analysis.decode import changes_since_start, settings_lines
from cpuprof.model import FrontEndGivenBack, InForce, MemPolicy, ThreadPlacement, TorchThreads


def _state(threads: int, policy: MemPolicy, placements: list[ThreadPlacement], env: dict[str, str]) -> InForce:
    base = settings().in_force
    assert base is not None
    return replace(base, pid=100, threads=placements, mempolicy=policy, env=env,
                   torch=TorchThreads(num_threads=threads, num_interop_threads=2, parallel_info=""))


START = _state(2, MemPolicy("default"), [ThreadPlacement(100, "python", "R", [0, 1], 0)],
               {"OMP_NUM_THREADS": "2", "OMP_PLACES": "cores"})
END = _state(1, MemPolicy("bind", [0]),
             [ThreadPlacement(100, "python", "R", [0], 0), ThreadPlacement(101, "VLLM::Worker", "S", [0], 0),
              ThreadPlacement(102, "python", "S", [0], 0), ThreadPlacement(103, "gloo", "S", [0, 1], 1)],
             {"OMP_NUM_THREADS": "1", "GOMP_CPU_AFFINITY": "0"})


def test_every_change_is_named_with_its_before_and_after():
    assert changes_since_start(START, END) == [
        "torch threads 2 → 1",
        "in its environment, for the processes it starts: GOMP_CPU_AFFINITY unset → 0, OMP_NUM_THREADS 2 → 1, "
        "OMP_PLACES cores → unset",
        "memory policy default → bind to node(s) 0",
        "1 thread moved from CPUs 0-1 to CPUs 0",
        "threads started since and alive at the end: 2 on CPUs 0, 1 on CPUs 0-1",
    ]


def test_no_change_says_nothing_and_threads_started_on_the_process_cpus_are_not_a_change():
    assert changes_since_start(START, START) == []
    plain = replace(START, threads=[*START.threads, ThreadPlacement(104, "python", "S", [0, 1], 1)])
    assert changes_since_start(START, plain) == []


def test_the_settings_section_names_the_changes_and_what_the_program_set():
    shown = replace(settings(), at_start=START, in_force=END, warnings=[],
                    from_program=["OMP_NUM_THREADS=1"])
    lines = settings_lines(shown)
    assert any(line.startswith("set for it by its program") and line.endswith("OMP_NUM_THREADS=1") for line in lines)
    (changed,) = [line for line in lines if line.startswith("changed since its import of torch")]
    assert "torch threads 2 → 1" in changed and "memory policy default → bind to node(s) 0" in changed
    assert not any("changed since" in line for line in settings_lines(replace(shown, at_start=None)))


def test_the_front_ends_cpus_given_by_cpuprof_are_not_the_programs_change_and_its_own_moves_still_are():
    """A front end's threads moved by cpuprof from the binding's CPU to the launch's set, and threads
    started on that set since, are cpuprof's doing; a move of the program's own elsewhere is still
    named (a mutation that drops every move once a front end was freed fails here)."""
    front = FrontEndGivenBack(pid=100, by_pid=200, threads=2, cpus_from=[0], cpus_to=[0, 1])
    began = replace(START, env={}, threads=[ThreadPlacement(100, "python", "R", [0], 0),
                                            ThreadPlacement(101, "python", "S", [0], 0)])
    freed = replace(began, threads=[ThreadPlacement(100, "python", "R", [0, 1], 0),
                                    ThreadPlacement(101, "python", "S", [0, 1], 0),
                                    ThreadPlacement(102, "ZMQbg", "S", [0, 1], 1)])
    assert changes_since_start(began, freed, front) == []
    assert changes_since_start(began, freed) == ["2 threads moved from CPUs 0 to CPUs 0-1",
                                                 "threads started since and alive at the end: 1 on CPUs 0-1"]
    own = replace(freed, threads=[*freed.threads[:1], ThreadPlacement(101, "python", "S", [1], 1)])
    assert changes_since_start(began, own, front) == ["1 thread moved from CPUs 0 to CPUs 1"]
