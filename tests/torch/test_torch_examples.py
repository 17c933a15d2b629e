"""The PyTorch examples run, and the digits CNN on N ranks matches its single-process
reference (same global batches) in final parameters and test accuracy; the elastic-mode
example learns."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.launch import REPO, job_env, run_job
from tests.torch.torch_mp import run_ranks

EXAMPLES = REPO / "examples" / "pytorch"
DIGITS = EXAMPLES / "train_digits_cnn.py"
ACC = re.compile(r"final test accuracy: ([0-9.]+)")


def reference(tmp_path: Path, epochs: int, batch: int) -> tuple[float, dict[str, np.ndarray]]:
    params = tmp_path / f"ref_{batch}.npz"
    proc = subprocess.run([sys.executable, str(DIGITS), "--reference", "--no-progress", "--float64",
                           "--epochs", str(epochs), "--batch-size", str(batch), "--checkpoint", "",
                           "--save-params", str(params)],
                          cwd=tmp_path, env=job_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return float(ACC.findall(proc.stdout)[-1]), dict(np.load(params))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n,batch", [(2, 64), (3, 60)])
def test_digits_cnn_matches_single_process(tmp_path: Path, n: int, batch: int) -> None:
    epochs = 4
    ref_acc, ref_params = reference(tmp_path, epochs, batch)
    params = tmp_path / "dist.npz"
    ckpt = tmp_path / "ckpt.pt"
    out = run_ranks(n, DIGITS, "--float64", "--epochs", str(epochs), "--batch-size", str(batch),
                    "--checkpoint", str(ckpt), "--save-params", str(params), timeout=400)
    accs = ACC.findall(out)
    assert len(accs) == 1, f"rank 0 alone prints the final accuracy:\n{out}"
    # In float64 the different summation order leaves the runs ~1e-12 apart (in float32 a
    # ReLU or max-pool decision can flip after many steps and the runs drift apart).
    assert abs(float(accs[0]) - ref_acc) < 1e-9, (accs[0], ref_acc)
    assert ref_acc > 0.8, f"the reference itself did not learn: {ref_acc}"
    got = dict(np.load(params))
    assert got.keys() == ref_params.keys()
    for k in got:
        np.testing.assert_allclose(got[k], ref_params[k], rtol=1e-8, atol=1e-10, err_msg=k)
    assert ckpt.exists(), "rank 0 writes a checkpoint"
    assert out.count("epoch ") >= epochs  # per-epoch metrics on rank 0


@pytest.mark.timeout(300)
def test_digits_cnn_with_one_bit_adam_ends_within_a_point_of_adam() -> None:
    """``--optimizer onebit-adam`` (hvd.OneBitAdam, 20 % warm-up, then 1-bit momentum)
    against ``--optimizer adam`` (Adam in DistributedOptimizer) on the same batches: the
    final test accuracy is within 1 point."""
    accs = {}
    for opt in ("adam", "onebit-adam"):
        out = run_ranks(2, DIGITS, "--optimizer", opt, "--no-progress", "--checkpoint", "", timeout=250)
        accs[opt] = float(ACC.findall(out)[-1])
    assert accs["adam"] > 0.95, accs
    assert abs(accs["onebit-adam"] - accs["adam"]) <= 0.01, accs


ZERO_RUN = ("--optimizer", "adam", "--float64", "--epochs", "3", "--no-progress")


@pytest.fixture(scope="module")
def distributed_optimizer_params(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """The final parameters of ``ZERO_RUN`` on 2 ranks with hvd.DistributedOptimizer."""
    params = tmp_path_factory.mktemp("zero0") / "stage0.npz"
    out = run_ranks(2, DIGITS, *ZERO_RUN, "--checkpoint", "", "--save-params", str(params), timeout=200)
    assert float(ACC.findall(out)[-1]) > 0.85, out
    return dict(np.load(params))


@pytest.mark.timeout(400)
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_digits_cnn_zero_stage_ends_where_distributed_optimizer_does(
        tmp_path: Path, stage: int, distributed_optimizer_params: dict[str, np.ndarray]) -> None:
    """``--zero-stage N`` (hvd.ZeroRedundancyOptimizer over Adam, in float64) takes the
    steps hvd.DistributedOptimizer takes: the same final parameters up to rounding. At
    stage 3 (parameters sharded) the run stops after 2 epochs and resumes from its
    checkpoint (the whole optimizer state, consolidated on rank 0, and the parameters,
    gathered) for the third, which checks the checkpoint as well."""
    params = tmp_path / f"stage{stage}.npz"
    ckpt = tmp_path / "ckpt.pt"
    args = (*ZERO_RUN, "--zero-stage", str(stage), "--checkpoint", str(ckpt), "--save-params", str(params))
    if stage == 3:
        first = run_ranks(2, DIGITS, *args, "--epochs", "2", timeout=200)
        assert "with ZeRO stage 3" in first, first
        out = run_ranks(2, DIGITS, *args, "--resume", timeout=200)
        assert "epoch   2:" not in out and "epoch   3:" in out, out
    else:
        out = run_ranks(2, DIGITS, *args, timeout=200)
    assert f"trained on 2 ranks with ZeRO stage {stage}" in out, out
    accs = ACC.findall(out)
    assert len(accs) == 1 and float(accs[0]) > 0.85, out
    got = dict(np.load(params))
    assert got.keys() == distributed_optimizer_params.keys()
    for k, want in distributed_optimizer_params.items():
        assert got[k].shape == want.shape, k
        np.testing.assert_allclose(got[k], want, rtol=1e-9, atol=1e-12, err_msg=k)
    assert ckpt.exists(), "rank 0 writes a checkpoint"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("other,why", [(("--optimizer", "onebit-adam"), "onebit-adam"),
                                       (("--reference",), "--reference")])
def test_digits_cnn_refuses_zero_stage_with_what_it_cannot_shard(
        tmp_path: Path, other: tuple[str, ...], why: str) -> None:
    proc = subprocess.run([sys.executable, str(DIGITS), "--zero-stage", "2", *other, "--epochs", "1"],
                          cwd=tmp_path, env=job_env(), capture_output=True, text=True, timeout=100)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "error: --zero-stage" in proc.stderr and why in proc.stderr, proc.stderr


@pytest.mark.timeout(300)
def test_digits_cnn_resumes_from_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    run_ranks(2, DIGITS, "--epochs", "1", "--checkpoint", str(ckpt), "--no-progress", timeout=200)
    out = run_ranks(2, DIGITS, "--epochs", "2", "--checkpoint", str(ckpt), "--resume",
                    "--no-progress", timeout=200)
    assert "epoch   1:" not in out and "epoch   2:" in out, out


@pytest.mark.timeout(300)
def test_digits_cnn_shows_progress_bar_on_rank_0(tmp_path: Path) -> None:
    # Under the launcher a rank's stdout is a 0x0 pseudo-terminal and its stderr a pipe;
    # the bar must still be drawn (on stderr), by rank 0 alone. (The job's output is read
    # as text, so the bar's carriage returns arrive here as newlines.)
    proc = run_job(2, DIGITS, "--epochs", "2", "--checkpoint", "", cwd=tmp_path, timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    err = proc.stderr
    steps = int(1797 * 0.8) // 64  # training images // global batch
    for epoch in (1, 2):
        assert re.search(rf"(?m)^epoch {epoch}/2: +\d+%\|.*\| \d+/{steps} ", err), err[-3000:]
        assert f"epoch {epoch}/2: 100%" in err, err[-3000:]
    losses = [float(v) for v in re.findall(r"loss=([0-9.]+)", err)]
    assert losses and all(0.0 < v < 10.0 for v in losses), err[-3000:]
    # One bar: each step of each epoch is drawn once (a second rank would double it).
    assert err.count(f" 1/{steps} ") == 2, err[-3000:]
    assert "epoch 1/2" not in proc.stdout, "the bar belongs on stderr"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("model", ["mlp", "resnet", "resnet18"])
def test_synthetic_benchmark_runs(model: str) -> None:
    out = run_ranks(2, EXAMPLES / "pytorch_synthetic_benchmark.py", "--model", model,
                    "--batch-size", "4", "--num-warmup-batches", "1",
                    "--num-batches-per-iter", "1", "--num-iters", "2", timeout=250)
    m = re.search(r"Total img/sec on 2 rank\(s\): ([0-9.]+)", out)
    assert m and float(m.group(1)) > 0, out
    assert "Img/sec per rank" in out


@pytest.mark.timeout(300)
def test_elastic_digits_example_learns() -> None:
    out = run_ranks(2, EXAMPLES / "train_digits_elastic.py", "--epochs", "4", timeout=250)
    accs = ACC.findall(out)
    assert len(accs) == 1, f"rank 0 alone prints the final accuracy:\n{out}"
    assert float(accs[0]) >= 0.9, out  # chance is 0.1
    losses = [float(v) for v in re.findall(r"epoch \d+: loss ([0-9.]+)", out)]
    assert len(losses) == 4 and losses[-1] < losses[0] / 2, losses
