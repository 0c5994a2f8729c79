"""``cpuprof calibrate``: measure the machine's roofs under a launch, as ``decode`` would run.

The roofs (STREAM-style memory bandwidth, peak GEMM compute per dtype, the best decode GEMV torch
reaches) depend on the thread count, the CPUs and the OpenMP runtime, so they are measured in a
child launched exactly like a decode child, and cached under that launch's key; ``decode`` then
reads them from the cache.
"""

from __future__ import annotations

import argparse
import sys

from .. import options_spec as spec
from ..errors import CpuprofError
from ..launch import parent, run_dir
from ..launch.options import DecodeOptions, ProfileOptions
from ..reports import render
from .decode import launch_from_args

COMMAND = spec.Command(
    "calibrate", help="measure the machine's memory bandwidth, peak compute and GEMV kernel roof (cached)",
    description="Measures, in a child launched like `decode` with the same launch options, the roofs every GEMM and "
                "the decode ceiling are judged against: read-only, copy and triad memory bandwidth (native OpenMP "
                "kernels, the fastest of their ISA builds), the cores' f32 FMA peak beside the theoretical one, "
                "peak GEMM GFLOP/s per dtype and the best decode GEMV bandwidth torch reaches over its paths "
                "(eager, prepacked); each with its spread over repetitions. The result is cached per machine, "
                "torch, OpenMP runtime, thread count and CPUs, and `decode` uses it.",
    groups=(spec.LAUNCH_GROUP, spec.Group(None, spec.calibrate_output())))


def run(args: argparse.Namespace) -> int:
    options = DecodeOptions(launch=launch_from_args(args), profile=ProfileOptions(enabled=False),
                            roofs="remeasure", calibrate_only=True)
    with run_dir.claimed(args.out, "calibrate", overwrite=args.overwrite) as out_dir:
        outcome = parent.launch(options, out_dir)
        if outcome.profile is not None and outcome.profile.roofs is not None:
            render(outcome.profile, sys.stdout, format=args.format)
        elif outcome.returncode == 0:
            raise CpuprofError(f"the calibration child wrote no roofs (see {out_dir})")
        return parent.check_outcome(outcome)
