"""Decode steps found in the op stream of programs cpuprof does not own, against what the programs
know of themselves: the built-in decoder's own step times, transformers generate()'s own clock, and
a training loop, which is no language model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli_runs import cpuprof

from cpuprof.analysis.steps import DECODE, PREFILL, Steps, decode_tokens_per_s, find_steps
from cpuprof.model import Profile

SCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "scripts"


def test_the_built_in_decoders_steps_are_found_with_its_own_count_and_times(tmp_path: Path):
    """Known answer: the decoder times each step itself (forward and sampling). Steps of ~20 ms (two
    layers of a 1B's widths, its 128,256-token LM head), so that what runs between its steps (its own
    progress line, outside its timing, inside the detector's) is under 2% of a step; no checkpoint
    (a save of the profile so far, also between steps, tens of ms) within the run."""
    result = cpuprof("decode", "--preset", "llama-3.2-1b", "--hidden", "1024", "--ffn", "4096", "--layers", "2",
                     "--heads", "16", "--kv-heads", "4", "--prompt-len", "8", "--new-tokens", "12", "--warmup", "2",
                     "--timeline", "100000", "--roofs", "off", "--checkpoint-s", "3600", "--out", str(tmp_path),
                     timeout=600)
    assert result.returncode == 0, result.stderr
    profile = Profile.load(tmp_path)
    found = find_steps(profile)
    assert isinstance(found, Steps), found
    wl = profile.workload
    assert wl is not None
    assert [s.kind for s in found.steps] == [PREFILL] + [DECODE] * wl.new_tokens
    assert found.lm_head == "aten::linear onto 128,256 outputs from 1,024 (bf16)"
    decode = found.of_kind(DECODE)
    assert sum(s.wall_ns for s in decode) / 1e9 == pytest.approx(sum(wl.step_latencies_s), rel=0.02)


@pytest.mark.parametrize("family, batch", [("llama", 1), ("qwen2", 2)])
def test_a_generate_scripts_decode_is_found_with_its_own_tokens_per_second(tmp_path: Path, family: str, batch: int):
    """Known answer: generate() with max_new_tokens = min_new_tokens = N makes one prefill and N - 1
    decode steps; the script's own clock, once per generated token, gives its tokens/s."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    new = 24
    timing = tmp_path / "timing.json"
    out = tmp_path / "out"
    result = cpuprof("run", "--out", str(out), "--", "python", str(SCRIPTS / "generate_timed.py"), family,
                     str(batch), str(new), str(timing), timeout=600)
    assert result.returncode == 0, result.stderr
    own = json.loads(timing.read_text())
    found = find_steps(Profile.load(out))
    assert isinstance(found, Steps), found
    decode = found.of_kind(DECODE)
    assert [s.kind for s in found.steps] == [PREFILL] + [DECODE] * (new - 1)
    assert {s.sequences for s in decode} == {batch} and found.steps[0].tokens == batch * 12
    assert [s.kv_len for s in decode] == list(range(13, 12 + new))  # the cache's keys, one more each step
    script = own["tokens_per_call"] * (own["calls"] - 1) / own["decode_s"]
    assert decode_tokens_per_s(decode) == pytest.approx(script, rel=0.05)
    report = " ".join(result.stdout.split())
    assert "Decode (inferred from the op stream)" in report and f"over {new - 1} decode steps" in report


TRAINING = """
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 32), torch.randint(0, 10, (128,))
for _ in range(20):
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
"""


def test_a_program_that_is_not_a_language_model_gets_no_decode_section_and_one_line_why(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(TRAINING)
    result = cpuprof("run", "--out", str(tmp_path / "out"), "--", "python", str(script), timeout=300)
    assert result.returncode == 0, result.stderr
    report = " ".join(result.stdout.split())
    assert "Decode (inferred" not in report and "Decode against the memory roof" not in report
    assert "decode steps: none found in the op stream (" in report
    assert sys.executable  # the program ran under cpuprof's own Python
