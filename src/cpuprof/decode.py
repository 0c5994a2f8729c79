"""The decode job: launch LLM decoding in a child configured exactly as asked, profile it there.

The parent never imports torch. It validates everything a user can get wrong (threads, CPUs,
NUMA node, preset, memory, ``--hf`` path) before anything starts, so bad input costs nothing and
gets one line. The child (``cpuprof._decode_child``) starts already pinned and memory-bound
(see :mod:`cpuprof.launcher`), builds the model, profiles prefill and decode, reads back the
settings in force, and writes the profile; it checkpoints while it runs, so a crash or a kill
still leaves what was measured on disk.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import launcher, model
from .errors import ChildFailed, UsageError
from .topology import read_topology

DTYPE_BYTES = {"bf16": 2, "fp32": 4}
# Exit codes the child uses for outcomes the parent must tell apart from a crash.
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


@dataclass
class DecodeOptions:
    """Everything ``cpuprof decode`` accepts, as the CLI parsed it (strings where they are checked later)."""

    preset: str = "llama-3.2-1b"
    overrides: dict[str, int] = field(default_factory=dict)
    dtype: str = "bf16"
    prompt_len: int = 32
    new_tokens: int = 32
    batch: int = 1
    warmup: int = 2
    sampling: str = "greedy"
    top_k: int = 50
    seed: int = 0
    hf: str | None = None
    threads: str | None = None  # None: every CPU of the chosen set
    numa: str | None = None
    cpus: str | None = None
    bind: str = "close"
    omp: str = "gnu"
    blocktime: str | None = None
    allocator: str = "default"
    oversubscribe: bool = False
    profile: bool = True
    events: str = "default"
    mode: str = "sampled"
    sample_interval_us: int = 4000
    record_shapes: bool = True
    timeline: int = 0
    out: str | None = None
    checkpoint_s: float = 5.0


@dataclass
class DecodeOutcome:
    out_dir: Path
    profile: model.Profile | None
    returncode: int


def default_out_dir() -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("cpuprof-out") / f"decode-{stamp}"


def _available_memory(mem_nodes: list[int]) -> int:
    """MemAvailable, or the free memory of the bound nodes when memory is bound (less, often)."""
    from .workload.presets import available_memory_bytes

    available = available_memory_bytes()
    if mem_nodes:
        topology = read_topology()
        node_free = sum(topology.node(n).mem_free_bytes or 0 for n in mem_nodes)
        if node_free:
            available = min(available, node_free)
    return available


def _check_hf(path: str) -> None:
    p = Path(path)
    if not p.is_dir() or not os.access(p, os.R_OK | os.X_OK) or not (p / "config.json").is_file():
        raise UsageError(f"--hf {path}: not a readable directory with a config.json (a local Hugging Face checkpoint)")
    if importlib.util.find_spec("transformers") is None:
        raise UsageError("--hf needs transformers, which is not installed: pip install 'cpuprof[hf]'")


def prepare(options: DecodeOptions) -> tuple[launcher.ResolvedLaunch, dict[str, Any]]:
    """Validates options against this machine; returns the launch and the child's config."""
    from .workload.presets import check_memory, resolve_config

    topology = read_topology()
    for flag, value in (("--prompt-len", options.prompt_len), ("--new-tokens", options.new_tokens),
                        ("--batch", options.batch)):
        if value < 1:
            raise UsageError(f"{flag} {value}: expected a positive whole number")
    if options.warmup < 0 or options.warmup >= options.new_tokens:
        raise UsageError(f"--warmup {options.warmup}: expected 0 to {options.new_tokens - 1} "
                         f"(fewer than --new-tokens {options.new_tokens})")
    if options.dtype not in DTYPE_BYTES:
        raise UsageError(f"--dtype {options.dtype}: choose one of {', '.join(DTYPE_BYTES)}")
    cpus = launcher.parse_cpus(options.cpus, topology) if options.cpus else None
    numa = launcher.parse_numa(options.numa) if options.numa is not None else None
    blocktime = launcher.parse_blocktime(options.blocktime) if options.blocktime is not None else None
    # Threads default to the CPUs of the chosen set, so resolve the set first with one thread.
    probe = launcher.validate(launcher.LaunchSettings(threads=1, numa=numa, cpus=cpus), topology)
    threads = launcher.parse_threads(options.threads) if options.threads is not None else len(probe.cpus)
    resolved = launcher.validate(
        launcher.LaunchSettings(threads=threads, numa=numa, cpus=cpus, bind=options.bind, omp=options.omp,
                                blocktime_ms=blocktime, allocator=options.allocator,
                                oversubscribe=options.oversubscribe),
        topology,
    )
    if options.hf:
        _check_hf(options.hf)
        cfg_dict = None
    else:
        cfg = resolve_config(options.preset, options.overrides)
        max_seq = options.prompt_len + options.new_tokens
        if max_seq > cfg.max_seq:
            raise UsageError(f"--prompt-len + --new-tokens = {max_seq} exceeds the model's context of {cfg.max_seq}")
        try:
            check_memory(cfg, DTYPE_BYTES[options.dtype], options.batch, max_seq,
                         available_bytes=_available_memory(resolved.mem_nodes))
        except UsageError as exc:
            if not resolved.mem_nodes:
                raise
            nodes = ",".join(map(str, resolved.mem_nodes))
            raise UsageError(f"{exc} (free memory of node(s) {nodes}, where --numa binds it)") from exc
        cfg_dict = asdict(cfg)
    config = {
        "options": asdict(options),
        "model": cfg_dict,
        "threads": threads,
        "requested": resolved.requested(),
        "cpu_set": resolved.cpu_set_description,
        "topology": topology.to_dict(),
    }
    return resolved, config


def launch(options: DecodeOptions, out_dir: Path) -> DecodeOutcome:
    """Runs the child and waits for it; Ctrl-C reaches the child, which saves what it has."""
    resolved, config = prepare(options)
    out_dir.mkdir(parents=True, exist_ok=True)
    config["out"] = str(out_dir)
    (out_dir / "launch.json").write_text(json.dumps(config, indent=1))
    profile_path = out_dir / model.PROFILE_FILENAME
    if profile_path.exists():
        profile_path.unlink()  # never report a stale profile from an earlier run as this one's
    child = subprocess.Popen(
        [sys.executable, "-m", "cpuprof._decode_child", str(out_dir / "launch.json")],
        env=resolved.child_env(),
        preexec_fn=resolved.preexec(),
    )

    def forward(signum: int, _frame: object) -> None:
        # A terminal's Ctrl-C reaches the child too; a signal sent to the parent alone must be
        # passed on, or the child would run on, unprofiled, after we are gone.
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        returncode = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    profile = model.Profile.load(profile_path) if profile_path.exists() else None
    return DecodeOutcome(out_dir=out_dir, profile=profile, returncode=returncode)


def failure_message(outcome: DecodeOutcome) -> str | None:
    """One line for a child that did not finish, saying what is on disk; None if it finished."""
    rc = outcome.returncode
    if rc == 0:
        return None
    saved = outcome.profile
    where = outcome.out_dir / model.PROFILE_FILENAME
    if saved is not None:
        done = saved.workload.get("steps_done")
        total = saved.workload.get("new_tokens")
        progress = f" ({done} of {total} decode steps)" if done is not None else ""
        kept = f"the profile measured so far{progress} is in {where}"
    else:
        kept = "it had not yet written a profile"
    if rc == EXIT_INTERRUPTED:
        return f"decoding was interrupted; {kept}"
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        hint = " (often the kernel's out-of-memory killer)" if -rc == signal.SIGKILL else ""
        return f"the decode child was killed by {name}{hint}; {kept}"
    return f"the decode child failed with exit code {rc}; {kept}"


def check_outcome(outcome: DecodeOutcome) -> int:
    """The exit code for the CLI; raises ChildFailed with one line for a crash or an interrupt."""
    message = failure_message(outcome)
    if message is None:
        return 0
    if outcome.returncode == EXIT_USAGE:
        return EXIT_USAGE  # the child already said, in one line, what it rejected
    error = ChildFailed(message)
    error.exit_code = EXIT_INTERRUPTED if outcome.returncode == EXIT_INTERRUPTED else 1
    raise error
