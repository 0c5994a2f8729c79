"""The parent side of a launched run: validate, start the child configured as asked, wait for it.

The parent never imports torch. It validates everything a user can get wrong (threads, CPUs,
NUMA node, preset, memory, paths) before anything starts, so bad input costs nothing and gets one
line. The child (:mod:`cpuprof.launch.child`) starts already pinned and memory-bound (see
:mod:`cpuprof.launch.environment`), builds the model, profiles prefill and decode, reads back
the settings in force, and writes the profile; it checkpoints while it runs, so a crash or a
kill still leaves what was measured on disk.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import defaults, exit_codes
from ..errors import ChildFailed, UsageError
from ..machine.topology import read_topology
from ..model import PROFILE_FILENAME, Profile
from ..safe_text import printable
from ..workload.dtypes import check_dtype, dtype_bytes
from . import environment
from .child_run import LAUNCH_FILENAME, REMOVE_PERF_MAP, perf_map_path, write_launch_file
from .options import CRASH_FILENAME, ChildConfig, DecodeOptions, WorkloadOptions

if TYPE_CHECKING:
    from ..model.workload import ModelConfig

KILL_GRACE_S = 15.0  # after the launcher's interrupt: time for a child to save its profile before SIGKILL
CHILD_MODULE = "cpuprof.launch.child"  # the decode child; `run` starts cpuprof.launch.script_child
# The children whose perf map cpuprof asked for (start_child). Each removes its own at any ending it
# can catch; the launcher removes it once the child is dead, for the endings it cannot (SIGKILL).
_OWN_PERF_MAP: weakref.WeakSet[subprocess.Popen[bytes]] = weakref.WeakSet()


@dataclass
class DecodeOutcome:
    out_dir: Path
    profile: Profile | None
    returncode: int
    # The launcher passed a SIGINT/SIGTERM on to the child: the run was interrupted whatever its exit
    # code (a child still starting Python dies of the KeyboardInterrupt with status 1).
    interrupted: bool = False


def check_out_dir(path: Path, flag: str = "--out") -> None:
    """Raises UsageError when ``path`` cannot hold the results: checked before any work starts."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path}: exists and is not a directory")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{flag} {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: {existing} is not writable")
    # Directories above the one asked for that do not exist are made too, and said: a typo in a path
    # is then seen, not silently made into a tree.
    missing = [parent for parent in path.parents if not parent.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".cpuprof-write-test-"):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from exc
    if missing:
        made = ", ".join(printable(str(p)) for p in reversed(missing))
        print(f"cpuprof: note: {flag} {printable(str(path))}: made the directories above it that did not exist "
              f"({made})", file=sys.stderr)


def _available_memory(mem_nodes: list[int]) -> int:
    """MemAvailable, or the free memory of the bound nodes when memory is bound (less, often)."""
    from ..workload.presets import available_memory_bytes

    available = available_memory_bytes()
    if mem_nodes:
        topology = read_topology()
        node_free = sum(topology.node(n).mem_free_bytes or 0 for n in mem_nodes)
        if node_free:
            available = min(available, node_free)
    return available


def _check_hf(path: str, dtype: str, batch: int, max_seq: int, available: int) -> None:
    """What can be known without loading the checkpoint; the child checks its architecture."""
    from ..workload.checkpoints import estimate_memory_bytes, read_config

    config = read_config(path)
    if importlib.util.find_spec("transformers") is None:
        raise UsageError("--hf needs transformers, which is not installed: pip install 'cpuprof[hf]'")
    if not config.get("model_type"):
        raise UsageError(f"--hf {path}: config.json names no model_type, so transformers cannot load it")
    needed = estimate_memory_bytes(path, dtype, batch, max_seq)
    if needed > available:
        raise UsageError(f"--hf {path} needs about {needed / 1e9:.1f} GB in {dtype} but only {available / 1e9:.1f} GB "
                         "is available; try --dtype bf16, a smaller --batch or a shorter run")


def check_group_size_used(group_size: int | None, quant_modes: list[str]) -> None:
    """--group-size means something only to int4 weights: given without them, it is a mistake."""
    if group_size is not None and "int4" not in quant_modes:
        raise UsageError(f"--group-size sets the groups of int4 weights; it needs --quant int4 (not "
                         f"{','.join(quant_modes)})")


def with_group_size(wl: WorkloadOptions, quant_modes: list[str], shards: tuple[int, ...] = (1,)) -> WorkloadOptions:
    """``wl`` with int4's group size decided, once, before anything starts: the one given, or the
    default where it divides the built-in model's widths, or the largest size that does (said in a
    note: tiny's width 64 takes no group of 128). A checkpoint's widths are the child's to check."""
    from ..model.workload import DEFAULT_GROUP_SIZE
    from ..workload.presets import resolve_config

    if "int4" not in quant_modes or wl.group_size is not None or wl.hf:
        return wl
    cfg = resolve_config(wl.preset, wl.overrides)
    chosen = cfg.int4_group_size(shards)
    if chosen != DEFAULT_GROUP_SIZE:
        print(f"cpuprof: note: --quant int4: groups of {chosen} inputs (the default {DEFAULT_GROUP_SIZE} does not "
              f"divide {cfg.name}'s projection widths; --group-size chooses)", file=sys.stderr)
    return dataclasses.replace(wl, group_size=chosen)


# Causal LMs transformers builds with its Conv1D ([in, out] weights) instead of nn.Linear.
CONV1D_MODEL_TYPES = frozenset({"gpt2", "openai-gpt", "imagegpt"})


def _check_hf_quant(wl: WorkloadOptions) -> None:
    """What config.json tells of a checkpoint's projections; the child checks every layer once loaded."""
    from ..workload.checkpoints import read_config

    assert wl.hf is not None
    config = read_config(wl.hf)
    model_type = config.get("model_type")
    if model_type in CONV1D_MODEL_TYPES:
        raise UsageError(f"--quant {wl.quant}: --hf {wl.hf} is a {model_type} model, whose projections are "
                         "transformers' Conv1D, not nn.Linear: torch's weight-only kernels take an nn.Linear's weight")
    quant = wl.weight_quant()
    if quant.mode != "int4":
        return
    nested = config.get("text_config")
    text: dict = nested if isinstance(nested, dict) else config
    for key in ("hidden_size", "intermediate_size"):
        width = text.get(key)
        if isinstance(width, int) and width % quant.group_size:
            raise UsageError(f"--group-size {quant.group_size} does not divide the checkpoint's {key} {width} "
                             "(each row is quantized in groups of that many inputs)")


def check_quant(wl: WorkloadOptions, shards: int = 1) -> None:
    """--quant and --group-size, before anything starts: what the kernels take, on the model asked for
    (with ``shards``: on a tensor-parallel rank's slices)."""
    from ..model.workload import QUANT_MODES
    from ..workload.presets import resolve_config

    if wl.quant not in QUANT_MODES:
        raise UsageError(f"--quant {wl.quant}: expected one of {', '.join(QUANT_MODES)}")
    if wl.quant == "none":
        return
    if wl.hf:
        _check_hf_quant(wl)
        return
    problem = resolve_config(wl.preset, wl.overrides).quant_problem(wl.weight_quant(), shards)
    if problem is not None:
        raise UsageError(problem)


def check_context(wl: WorkloadOptions) -> tuple[ModelConfig, int]:
    """The built-in model's config and the positions the run needs; UsageError when they exceed its
    context. (A --hf checkpoint's context is the child's to check, with the checkpoint loaded.)"""
    from ..workload.presets import resolve_config

    model = resolve_config(wl.preset, wl.overrides)
    max_seq = wl.prompt_len + wl.new_tokens + (1 if wl.compile else 0)  # compiled: one spare position
    if max_seq > model.max_seq:
        spare = " + 1 (--compile)" if wl.compile else ""
        raise UsageError(f"--prompt-len + --new-tokens{spare} = {max_seq} exceeds the model's context of "
                         f"{model.max_seq}")
    if wl.sampling == "topk" and wl.top_k > model.vocab:
        raise UsageError(f"--top-k {wl.top_k}: the model's vocabulary has {model.vocab} tokens")
    return model, max_seq


def prepare(options: DecodeOptions, out_dir: Path) -> tuple[environment.ResolvedLaunch, ChildConfig]:
    """Validates options against this machine; returns the launch and the child's config."""
    from ..workload.presets import check_memory

    wl = options.workload
    topology = read_topology()
    # Each number's own range is its option's type (options_spec); what ties two of them is checked here.
    assert min(wl.prompt_len, wl.new_tokens, wl.batch) >= 1 and wl.warmup >= 0, "options_spec checks each range"
    if wl.warmup >= wl.new_tokens:
        raise UsageError(f"--warmup {wl.warmup}: expected 0 to {wl.new_tokens - 1} "
                         f"(fewer than --new-tokens {wl.new_tokens})")
    check_dtype(wl.dtype)
    check_quant(wl)
    resolved = environment.validate(options.launch, topology)
    model = None
    if options.calibrate_only:
        pass  # no model: the roofs are measured under this launch alone
    elif wl.hf:
        if wl.compile:
            raise UsageError("--compile compiles the built-in model; a --hf checkpoint runs as transformers runs it")
        _check_hf(wl.hf, wl.dtype, wl.batch, wl.prompt_len + wl.new_tokens, _available_memory(resolved.mem_nodes))
    else:
        model, max_seq = check_context(wl)
        try:
            check_memory(model, dtype_bytes(wl.dtype), wl.batch, max_seq,
                         available_bytes=_available_memory(resolved.mem_nodes), quant=wl.weight_quant())
        except UsageError as exc:
            if not resolved.mem_nodes:
                raise
            nodes = ",".join(map(str, resolved.mem_nodes))
            raise UsageError(f"{exc} (free memory of node(s) {nodes}, where --numa binds it)") from exc
    check_out_dir(out_dir)
    assert resolved.settings.threads is not None
    config = ChildConfig(
        options=dataclasses.replace(options, launch=resolved.settings, out=str(out_dir)),
        model=model, threads=resolved.settings.threads, requested=resolved.requested(),
        cpu_set=resolved.cpu_set_description, topology=topology, out=str(out_dir),
    )
    return resolved, config


def launch(options: DecodeOptions, out_dir: Path, log: Path | None = None) -> DecodeOutcome:
    """Runs the child and waits for it; Ctrl-C reaches the child, which saves what it has.
    ``log``: the child's output goes to this file instead of this process's stdout and stderr."""
    resolved, config = prepare(options, out_dir)
    return run_child(resolved, config, out_dir, profiled=options.profile.enabled, log=log)


def run_child(resolved: environment.ResolvedLaunch, config: object, out_dir: Path, profiled: bool,
              log: Path | None = None, module: str = CHILD_MODULE) -> DecodeOutcome:
    """Starts ``python -m module out_dir/launch.json`` (``config``, a dataclass, as JSON) pinned and
    configured as ``resolved`` says, waits for it, and loads the profile it saved, if any."""
    with Supervision() as group:
        group.add(start_child(resolved, config, out_dir, profiled, log=log, module=module))
        (ended,) = group.wait(timeout_s=math.inf)
    return finish_child(out_dir, ended.returncode, interrupted=ended.interrupted)


def start_child(resolved: environment.ResolvedLaunch, config: object, out_dir: Path, profiled: bool,
                log: Path | None = None, module: str = CHILD_MODULE,
                extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Writes ``out_dir/launch.json`` and starts the child on it, without waiting.
    ``extra_env``: variables set on top of the launch's (a rank's place in its group)."""
    try:
        launch_file = write_launch_file(out_dir, config)
    except OSError as exc:  # a full disk, a quota: the directory cannot hold the run (as check_out_dir says)
        raise UsageError(f"cannot write {out_dir / LAUNCH_FILENAME}: {exc.strerror or exc}; the run was not "
                         "started") from exc
    profile_path = out_dir / PROFILE_FILENAME
    for stale in (profile_path, out_dir / CRASH_FILENAME):
        stale.unlink(missing_ok=True)  # never report an earlier run's profile or crash as this one's
    env = resolved.child_env()
    if profiled and resolved.omp_library is not None and os.environ.get("CPUPROF_OMPT") != "off":
        # An OMPT-capable runtime loads cpuprof's tool as it starts: exact barrier and lock waits.
        # Without the tool built, the child's report says why there are none.
        from ..collect.ompt import launch_env, tool_library

        tool = tool_library()
        if tool is not None:
            env.update(launch_env(tool))
    if profiled and "ONEDNN_JIT_PROFILE" not in env:
        # oneDNN names its JIT kernels in a perf map only when asked before it generates any;
        # the child removes the map when it has read it.
        env["ONEDNN_JIT_PROFILE"] = "2"
        env[REMOVE_PERF_MAP] = "1"
    command = json.dumps(["python", "-m", "cpuprof", *sys.argv[1:]])
    if len(command) < defaults.MAX_COMMAND_ENV_BYTES:  # one environment string has a limit (128 KiB)
        env[defaults.COMMAND_ENV] = command
    env.update(extra_env or {})
    log_file = open(log, "w") if log is not None else None  # noqa: SIM115 (the child keeps its own copy)
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", module, str(launch_file)],
            env=env,
            preexec_fn=resolved.preexec(),
            stdout=log_file, stderr=log_file,
        )
        if env.get(REMOVE_PERF_MAP) == "1":
            _OWN_PERF_MAP.add(child)
        return child
    finally:
        if log_file is not None:
            log_file.close()  # the child holds its own descriptor


def finish_child(out_dir: Path, returncode: int, interrupted: bool = False) -> DecodeOutcome:
    """The outcome of a child that exited with ``returncode``: its profile, if it saved one.
    ``interrupted``: the launcher passed it a SIGINT or SIGTERM."""
    crash_file = out_dir / CRASH_FILENAME
    if crash_file.exists() and (returncode >= 0 or crash_file.stat().st_size == 0):
        crash_file.unlink()  # no crash, or one faulthandler could not see (SIGKILL): nothing to keep
    profile_path = out_dir / PROFILE_FILENAME
    profile = Profile.load(profile_path) if profile_path.exists() else None
    return DecodeOutcome(out_dir=out_dir, profile=profile, returncode=returncode,
                         interrupted=interrupted and returncode != 0)


@dataclass
class Ended:
    index: int
    returncode: int
    ended_s: float  # since supervision began: tells the rank that failed first from those that followed
    stopped_by: str | None = None  # "SIGINT" or "SIGKILL" when the launcher stopped it
    interrupted: bool = False  # a SIGINT/SIGTERM sent to the launcher was passed on to it


class Supervision:
    """Waits for children and passes them a SIGINT or SIGTERM sent to this process.

    A terminal's Ctrl-C reaches the children too, but a signal sent to the launcher alone must be
    passed on, or they would run on, unprofiled, after it is gone. Forwarding is in force from
    ``__enter__``, before the first child starts: a signal that arrives while a child is being
    started is passed to it as soon as it is added, instead of killing the launcher with a
    KeyboardInterrupt and leaving the child orphaned.

    A signal no child's outcome carries (every child exited 0 anyway: it came as they finished,
    or after) is raised here as KeyboardInterrupt when the block ends, so a sweep stops instead of
    starting its next run. An exception out of the block interrupts the children still running,
    then kills them: none is left behind. A dead child's perf map, when cpuprof asked for one, is
    removed here: a child killed by SIGKILL cannot remove its own."""

    def __init__(self, raise_uncarried: bool = True) -> None:
        # False where the caller reports the outcome whatever it is (a program that handles SIGINT and
        # exits 0 has still saved its profile, and `run` shows it): no KeyboardInterrupt at the end.
        self.raise_uncarried = raise_uncarried
        self.children: list[subprocess.Popen[bytes]] = []
        self.forwarded: list[int] = []
        self._previous: dict[int, Any] = {}
        self._carried = False  # a child ended non-zero after a forwarded signal: its outcome says so
        self._seen_by_wait = 0  # signals forwarded when wait() returned

    def __enter__(self) -> Supervision:
        self._previous = {sig: signal.signal(sig, self._forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_exc: object) -> None:
        try:
            if exc_type is not None:
                self._stop_running()
        finally:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
        if (self.raise_uncarried and exc_type is None and self.forwarded
                and (not self._carried or len(self.forwarded) > self._seen_by_wait)):
            raise KeyboardInterrupt

    def _stop_running(self) -> None:
        running = [c for c in self.children if c.poll() is None]
        for child in running:
            _send(child, signal.SIGINT)  # it saves what it measured
        deadline = time.monotonic() + KILL_GRACE_S
        for child in running:
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            _remove_perf_map(child)

    def _forward(self, signum: int, _frame: object) -> None:
        self.forwarded.append(signum)
        for child in self.children:
            _send(child, signum)

    def add(self, child: subprocess.Popen[bytes]) -> None:
        self.children.append(child)
        if self.forwarded:
            _send(child, self.forwarded[0])  # the signal came while this child was being started

    def wait(self, timeout_s: float, poll_s: float = 0.05, on_poll: Callable[[], None] | None = None) -> list[Ended]:
        """Waits for every child. Once one has failed, the others get ``timeout_s`` to end by
        themselves (a peer's death fails their next all-reduce at once; a hang needs the timeout),
        then SIGINT, then SIGKILL."""
        children = self.children
        started = time.monotonic()
        ended: dict[int, Ended] = {}
        stopped: dict[int, str] = {}
        failed_at: float | None = None
        interrupted_at: float | None = None
        while True:
            now = time.monotonic()
            for i, child in enumerate(children):
                code = _poll(child)
                if code is not None and i not in ended:
                    ended[i] = Ended(index=i, returncode=int(code), ended_s=now - started, stopped_by=stopped.get(i),
                                     interrupted=bool(self.forwarded))
            if len(ended) == len(children):
                self._seen_by_wait = len(self.forwarded)
                self._carried = any(e.interrupted and e.returncode != 0 for e in ended.values())
                return [ended[i] for i in range(len(children))]
            if failed_at is None and any(e.returncode != 0 for e in ended.values()):
                failed_at = now
            if failed_at is not None and interrupted_at is None and now - failed_at > timeout_s:
                interrupted_at = now
                for i, child in enumerate(children):
                    if i not in ended:
                        stopped[i] = "SIGINT"
                        _send(child, signal.SIGINT)
            if interrupted_at is not None and now - interrupted_at > KILL_GRACE_S:
                for i, child in enumerate(children):
                    if i not in ended:
                        stopped[i] = "SIGKILL"
                        child.kill()
            if on_poll is not None:
                on_poll()
            time.sleep(poll_s)


def _poll(child: subprocess.Popen[bytes]) -> int | None:
    """``child.poll()``; a dead child's perf map is removed first, while it is a zombie: its pid
    cannot be another process's yet, so the map removed is certainly the child's."""
    if child.returncode is None and child in _OWN_PERF_MAP:
        try:
            dead = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            dead = False  # reaped elsewhere: poll() below says so
        if dead:
            _remove_perf_map(child)
    return child.poll()


def _remove_perf_map(child: subprocess.Popen[bytes]) -> None:
    """The perf map cpuprof asked ``child`` for, which a killed child leaves behind in /tmp."""
    if child in _OWN_PERF_MAP:
        _OWN_PERF_MAP.discard(child)
        try:
            perf_map_path(child.pid).unlink(missing_ok=True)
        except OSError:
            pass  # not ours to remove after all (another user's file): leave it


def _send(child: subprocess.Popen[bytes], signum: int) -> None:
    if child.poll() is None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass  # it ended between the poll and the signal


def failure_message(outcome: DecodeOutcome, child: str = "the decode child") -> str | None:
    """One line for a child that did not finish, saying what is on disk; None if it finished.
    ``child`` names the process as the line says it."""
    rc = outcome.returncode
    if rc == 0:
        return None
    saved = outcome.profile
    where = outcome.out_dir / PROFILE_FILENAME
    if saved is not None:
        wl = saved.workload
        progress = f" ({wl.steps_done} of {wl.new_tokens} decode steps)" if wl is not None else ""
        what = "the profile measured so far" if saved.profiled else "what was measured so far (not profiled)"
        kept = f"{what}{progress} is in {where}"
    else:
        kept = "it had not yet written a profile"
    if rc == exit_codes.INTERRUPTED or outcome.interrupted:
        what = "decoding" if child == "the decode child" else child
        return f"{what} was interrupted; {kept}"
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        hint = " (often the kernel's out-of-memory killer)" if -rc == signal.SIGKILL else ""
        crash = outcome.out_dir / CRASH_FILENAME
        if crash.exists() and crash.stat().st_size > 0:
            kept += f"; the threads' stacks at the crash are in {crash}"
        return f"{child} was killed by {name}{hint}; {kept}"
    return f"{child} failed with exit code {rc}; {kept}"


def check_outcome(outcome: DecodeOutcome) -> int:
    """The exit code for the CLI; raises ChildFailed with one line for a crash or an interrupt."""
    message = failure_message(outcome)
    if message is None:
        return exit_codes.OK
    if outcome.returncode in exit_codes.REPORTED_BY_CHILD and not outcome.interrupted:
        return outcome.returncode  # the child already said, in one line, what it rejected or what failed
    raise ChildFailed(message, exit_codes.of_child(outcome.returncode, outcome.interrupted))
