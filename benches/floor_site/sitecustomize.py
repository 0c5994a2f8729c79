"""torch's RecordFunction floor in every Python process of a program: bench_vllm_follow's "torch's
floor" variant puts this directory first on PYTHONPATH, so that the front end, vLLM's engine core
and its worker (every process it spawns inherits the variable) each register, as they start,
RecordFunction callbacks that do nothing, registered as cpuprof's op hook is (inputs boxed, as
recording shapes makes torch do). What following costs beyond this is cpuprof's own.

Imported by Python at every start while the directory is on the path; does nothing unless
CPUPROF_BENCH_FLOOR is set ("shapes": inputs boxed; anything else: not). Each process that
installed the callbacks appends its pid to CPUPROF_BENCH_FLOOR_LOG, so the bench can tell that the
floor was in force in the engine's processes.
"""

import os

_FLOOR = os.environ.get("CPUPROF_BENCH_FLOOR")
if _FLOOR:
    from cpuprof import native

    native.load().testing.inject_empty_callbacks(True, _FLOOR == "shapes")
    _LOG = os.environ.get("CPUPROF_BENCH_FLOOR_LOG")
    if _LOG:
        with open(_LOG, "a") as log:
            log.write(f"{os.getpid()}\n")
