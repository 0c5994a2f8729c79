"""vLLM's CPU backend, unchanged, under ``cpuprof run``: offline ``LLM.generate`` in vLLM's default
(multi-process) mode. The engine core and the worker it spawns are followed; the worker, which runs
the model, has the most op time and its report has vLLM's own GEMMs (``_C::onednn_mm``,
``_C::weight_packed_linear``) with N and K equal to the checkpoint's projection sizes and 2·M·N·K
FLOPs per call: the known answers, from the config the test writes.

One engine start is about 25 s here (more under cpuprof), so there is one test. Skipped where vLLM is
not installed (README command 2 installs it)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from tests.cli_runs import cpuprof
from tests.gloo_jobs import free_port
from tests.vllm_checkpoint import FFN, HEAD_DIM, HIDDEN, KV_HEADS, LAYERS, VOCAB, write_checkpoint
from tests.vllm_server import ENV, Client, interrupt, on_demand_server, wait_until_serving

from cpuprof.analysis.gemm import gemm_work
from cpuprof.analysis.processes import busiest, ending, op_time_ns, row
from cpuprof.analysis.rank_groups import jobs
from cpuprof.analysis.report import build_report
from cpuprof.analysis.steps import DECODE, MIXED, Steps, find_steps
from cpuprof.launch.followed_run import followed_alive
from cpuprof.model.run_layout import load_processes

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM's CPU backend is not installed here (README command 2 installs it)")

PROMPTS, NEW_TOKENS = 4, 16

GENERATE = f"""
import sys

from vllm import LLM, SamplingParams


def main():
    llm = LLM(model=sys.argv[1], dtype="bfloat16", max_model_len=256, enforce_eager=True)
    prompts = [" ".join(f"w{{(i * 7 + j) % 4000 + 3}}" for j in range(16)) for i in range({PROMPTS})]
    outputs = llm.generate(prompts, SamplingParams(max_tokens={NEW_TOKENS}, ignore_eos=True, temperature=0))
    print("generated", sum(len(o.outputs[0].token_ids) for o in outputs))


if __name__ == "__main__":
    main()
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("vllm") / "model"
    write_checkpoint(directory)
    return directory




def test_offline_generate_is_profiled_in_the_worker_with_vllms_gemms(tmp_path: Path, model: Path):
    program = tmp_path / "generate.py"
    program.write_text(textwrap.dedent(GENERATE))
    out = tmp_path / "out"
    result = cpuprof("run", "--threads", "2", "--out", str(out), "--", "python", str(program), str(model),
                     timeout=900, env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"generated {PROMPTS * NEW_TOKENS}" in result.stdout

    processes = load_processes(out)
    roles = {p.profile.meta.role for p in processes if p.followed}
    assert "EngineCore" in roles and any(r and r.startswith("VllmWorker") for r in roles), roles
    worker = busiest(processes)
    table = [(p.profile.meta.role, p.directory.name, op_time_ns(p.profile), ending(p.profile)) for p in processes]
    assert worker is not None and (worker.profile.meta.role or "").startswith("VllmWorker"), \
        (table, result.stderr[-3000:])

    # The projections by their (N, K), from the config: gate and up fused, down, lm_head; q, k and v fused, o.
    expected = {(2 * FFN, HIDDEN), (HIDDEN, FFN), (VOCAB, HIDDEN), (HIDDEN + 2 * KV_HEADS * HEAD_DIM, HIDDEN),
                (HIDDEN, HIDDEN)}
    seen = set()
    for op in worker.profile.ops:
        if op.kind != "op" or op.name not in ("_C::onednn_mm", "_C::weight_packed_linear"):
            continue
        work = gemm_work(op)
        assert work is not None, op
        assert (work.n, work.k) in expected, (op.name, work)
        assert work.flops == 2 * work.m * work.n * work.k
        seen.add((work.n, work.k))
    assert any(n == 2 * FFN for n, _ in seen) and (HIDDEN, FFN) in seen, seen
    assert "GEMMs against the roofs" in result.stdout and "_C::onednn_mm" in result.stdout
    # The steps found in the worker's op stream: every forward samples one token per sequence, so
    # they count what vLLM returned. The decode steps hold all but the first token of each sequence,
    # less those vLLM sampled in a step that also ran a prompt's prefill (its scheduler decides, run
    # by run: one such mixed step was seen): those steps are "mixed", their tokens not split.
    found = find_steps(worker.profile)
    assert isinstance(found, Steps), found
    assert sum(s.sequences for s in found.steps) == PROMPTS * NEW_TOKENS
    decoded = sum(s.sequences for s in found.of_kind(DECODE))
    in_mixed = sum(s.sequences for s in found.of_kind(MIXED))
    assert decoded + in_mixed >= PROMPTS * (NEW_TOKENS - 1) >= decoded >= PROMPTS * (NEW_TOKENS - 2)
    assert all(s.sequences <= PROMPTS for s in found.steps)
    assert found.steps[0].kind != DECODE and sum(s.tokens for s in found.steps if s.kind != DECODE) >= PROMPTS * 16
    report = " ".join(result.stdout.split())
    assert "Decode (inferred from the op stream)" in report and "decode steps (" in report
    # Steady state first: the worker's start-up (the KV cache's fill of a GiB, handles, warm-up) is in
    # a section of its own, and the op table over the steps is led by none of its ops: not by the
    # fill, whatever leads the whole run (the fill, or an op of the steps, run by run).
    steady = build_report(worker.profile)
    top = steady.section("ops").tables[0].rows[0]
    startup = steady.section("startup")
    assert startup is not None and "aten::fill_" in [row["op"] for row in startup.tables[0].rows]
    assert top["op"] != "aten::fill_"


def test_tensor_parallel_workers_are_ranks_matched_at_their_shared_memory_all_reduces(tmp_path: Path, model: Path):
    """``tensor_parallel_size=2``: vLLM's two workers are one job's ranks, matched at the shared-memory
    collectives vLLM's CPU backend makes inside its own ops. Known answer, from the checkpoint's
    config: every forward all-reduces twice a layer (after attention, after the MLP) and once for the
    vocab-parallel embedding, and gathers the logits once, so each rank's _C::shm_allreduce calls
    are (2 × layers + 1) × its _C::shm_all_gather calls."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("vLLM binds one worker to each of 2 CPUs: this machine lets the process use fewer")
    program = tmp_path / "generate.py"
    program.write_text(textwrap.dedent(GENERATE).replace("enforce_eager=True", "enforce_eager=True, "
                                                                                 "tensor_parallel_size=2"))
    out = tmp_path / "out"
    env = {**ENV, "VLLM_CPU_OMP_THREADS_BIND": "0|1"}  # vLLM refuses 2 workers on one node without it
    result = cpuprof("run", "--out", str(out), "--", "python", str(program), str(model), timeout=900, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"generated {PROMPTS * NEW_TOKENS}" in result.stdout

    rows = [row(p) for p in load_processes(out)]
    ranks = [r.rank for r in rows if r.rank is not None]
    assert sorted((t.rank, t.world_size) for t in ranks) == [(0, 2), (1, 2)], [r.role for r in rows]
    (job,) = jobs(ranks)
    for f in job.ranks:
        calls = {kind: len(enters) for kind, (enters, _) in f.timeline.calls.items()}
        assert calls["_C::shm_allreduce"] == (2 * LAYERS + 1) * calls["_C::shm_all_gather"], calls
    assert job.kinds["_C::shm_allreduce"] == len(job.ranks[0].timeline.calls["_C::shm_allreduce"][0])
    assert all(0 <= f.wait_ns <= f.in_matched_ns for f in job.ranks)
    report = " ".join(result.stdout.split())
    assert "Ranks: the processes of one torch.distributed job" in report and "_C::shm_allreduce" in report


def test_a_window_of_the_openai_server_while_a_client_sends_requests(tmp_path: Path, model: Path):
    """The OpenAI server under ``run --on-demand``: a window opened and closed with ``cpuprof signal``
    while three clients send completions. Every request succeeds; the window's busiest process (the
    worker) has vLLM's GEMMs and none of the start-up (the weights' oneDNN handles, the KV cache's
    fill); a start and a stop cost each process what its progress lines say."""
    port, out, log = free_port(), tmp_path / "out", tmp_path / "server.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(on_demand_server(model, port, out), stdout=sink, stderr=subprocess.STDOUT, env=ENV)
    client = Client(port, model)
    try:
        wait_until_serving(port, proc, log)
        client.start()
        time.sleep(3)
        opened = time.monotonic()
        started = cpuprof("signal", str(proc.pid), "start")
        assert started.returncode == 0, started.stderr
        time.sleep(5)
        assert cpuprof("signal", str(proc.pid), "stop").returncode == 0
        closed = time.monotonic()
        deadline = closed + 120
        while not (out / "window-1" / "profile.json").exists():
            assert time.monotonic() < deadline, f"window 1 was not saved:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        time.sleep(3)
    finally:
        client.stop()
        interrupt(proc)
    text = log.read_text()
    failed = [outcome for _, _, outcome in client.outcomes if outcome != "ok"]
    assert not failed, failed[:5]
    assert client.answered_between(opened, closed) >= 3, client.outcomes
    assert followed_alive(out) == [], "a followed process outlived the run"

    window = load_processes(out / "window-1")
    worker = busiest(window)
    roles = [p.profile.meta.role for p in window]
    assert worker is not None and worker.profile.meta.role.startswith("VllmWorker"), roles
    names = {op.name for op in worker.profile.ops if op.kind == "op"}
    assert "_C::onednn_mm" in names
    assert all(gemm_work(op) is not None for op in worker.profile.ops if op.name == "_C::onednn_mm")
    assert "_C::create_onednn_mm_handler" not in names  # the weights' handles are made at start-up
    assert not any(op.name == "aten::fill_" and op.inputs and op.inputs[0].sizes
                   and op.inputs[0].sizes[0] >= 1 << 28 for op in worker.profile.ops)  # the KV cache's fill
    assert 4 < worker.profile.collection.wall_ns / 1e9 < 60
    # What a start and a stop cost: said by every profiled process as it opens and closes the window.
    costs = re.findall(r"window 1 open: .*\(starting the profile took (\d+) ms\)", text)
    assert len(costs) >= 2, text[-3000:]  # the worker and the engine core at least
    assert re.search(r"window 1 closed: saved .* \(stopping and saving took", text)
