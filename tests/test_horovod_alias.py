"""hvdlite's horovod alias (``alias/``, the ``hvdlite-horovod-alias`` distribution),
installed with pip as a user would, into scratch environments made here: ``import
horovod.torch as hvd`` and the other Horovod names give hvdlite's own modules, a 2-rank
job that imports only ``horovod.*`` runs hvdlite through the real launcher, what hvdlite
lacks raises ``ModuleNotFoundError`` naming what to use instead, and the alias refuses to
install or to run beside a real Horovod (a ``horovod-0.28.1.dist-info`` put there).

Each scratch venv sees this environment's packages (hvdlite, torch, TensorFlow) through a
``.pth`` file, and gets no pip of its own: this environment's pip runs with the scratch
venv's interpreter, which makes it install there. Nothing is downloaded."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import numpy as np
import pytest

import hvdlite
from tests.launch import REPO, run_ok

ALIAS = REPO / "alias"
FAKE_HOROVOD_METADATA = "Metadata-Version: 2.1\nName: horovod\nVersion: 0.28.1\n"


def _venv(path: Path, with_hvdlite: bool) -> tuple[Path, Path]:
    """A venv without pip at ``path``; with ``with_hvdlite`` it also sees this
    environment's site-packages and this checkout. Returns (python, site-packages)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    # This environment's pip (alone, in a folder of its own), run by the scratch interpreter.
    pip_only = path / "pip_only"
    pip_only.mkdir()
    (pip_only / "pip").symlink_to(Path(__import__("pip").__file__).parent)
    lines = [str(pip_only)]
    if with_hvdlite:
        lines += [f"import site; site.addsitedir({sysconfig.get_path('purelib')!r})", str(REPO)]
    (site / "scratch.pth").write_text("\n".join(lines) + "\n")
    return python, site


def _pip_install(python: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    return subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index",
                           "--disable-pip-version-check", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=180)


def _python(python: Path, code: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return subprocess.run([str(python), "-c", textwrap.dedent(code)], cwd="/", env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A scratch venv with hvdlite visible and the alias installed by the README's command."""
    python, site = _venv(tmp_path_factory.mktemp("alias") / "venv", with_hvdlite=True)
    proc = _pip_install(python, "./alias")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (site / "horovod" / "_hvdlite_alias.py").is_file()
    return python, site


@pytest.mark.timeout(240)
def test_horovod_names_are_hvdlites_modules(installed: tuple[Path, Path]) -> None:
    python, site = installed
    proc = _python(python, """
        import json, sys
        import horovod, hvdlite
        import horovod.torch as hvd
        import horovod.tensorflow as hvd_tf
        import horovod.tensorflow.keras as hvd_tfk
        import horovod.keras as hvd_k
        import hvdlite.torch, hvdlite.tensorflow, hvdlite.tensorflow.keras, hvdlite.keras
        from horovod.torch.mpi_ops import synchronize
        from horovod.torch import Compression
        from horovod.torch.compression import Compression as Compression2
        from horovod.tensorflow.util import _executing_eagerly
        from horovod.keras.callbacks import BroadcastGlobalVariablesCallback
        from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
        from horovod.common.process_sets import ProcessSet
        from horovod.common.util import env, gloo_built, mpi_built
        from horovod.runner.common.util.env import get_env_rank_and_size
        from horovod.runner.util.threads import in_thread
        import horovod.runner
        errors = {}
        for name in ("horovod.spark.keras", "horovod.ray.elastic", "horovod.mxnet", "horovod.runner.launch",
                     "horovod.tensorflow.data.compute_service", "horovod.torch.no_such_module"):
            try:
                __import__(name)
            except ModuleNotFoundError as exc:
                errors[name] = str(exc)
        try:
            from horovod.runner.common.util import config_parser
        except ModuleNotFoundError as exc:
            errors["from horovod.runner.common.util import config_parser"] = str(exc)
        print(json.dumps({
            "modules": [hvd is hvdlite.torch, hvd_tf is hvdlite.tensorflow,
                        hvd_tfk is hvdlite.tensorflow.keras, hvd_k is hvdlite.keras,
                        sys.modules["horovod.torch.mpi_ops"] is hvdlite.torch.mpi_ops,
                        sys.modules["horovod.common.util"] is sys.modules["hvdlite.common.util"]],
            "names": [hvd.__name__, hvd.allreduce.__module__],
            "objects": [synchronize is hvdlite.torch.mpi_ops.synchronize, Compression is Compression2,
                        _executing_eagerly is hvdlite.tensorflow.util._executing_eagerly,
                        BroadcastGlobalVariablesCallback is hvdlite.keras.callbacks.BroadcastGlobalVariablesCallback,
                        HorovodInternalError is hvdlite.HvdliteError,
                        horovod.run is hvdlite.run, horovod.runner.run is hvdlite.run,
                        ProcessSet is hvdlite.torch.ProcessSet,
                        __import__("horovod.ray.runner").ray.runner.RayExecutor is
                        __import__("hvdlite.ray").ray.RayExecutor,
                        __import__("horovod.spark").spark.run is __import__("hvdlite.spark").spark.run],
            "version": horovod.__version__, "hvdlite_version": hvdlite.__version__,
            "file": horovod.__file__, "built": [mpi_built(), gloo_built()],
            "errors": errors}))
    """)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["modules"] == [True] * 6
    assert got["names"] == ["hvdlite.torch", "hvdlite.torch.mpi_ops"]
    assert got["objects"] == [True] * 10
    assert got["version"] == got["hvdlite_version"]
    assert got["file"] == str(site / "horovod" / "__init__.py")
    assert got["built"] == [True, False]
    errors = got["errors"]
    fromlist = errors.pop("from horovod.runner.common.util import config_parser")
    assert fromlist.startswith("No module named 'horovod.runner.common.util.config_parser' in hvdlite's "
                               "horovod alias: Horovod's launcher internals are not part of hvdlite")
    errors["horovod.tensorflow.data"] = errors.pop("horovod.tensorflow.data.compute_service")  # its parent fails
    assert set(errors) == {"horovod.spark.keras", "horovod.ray.elastic", "horovod.mxnet", "horovod.runner.launch",
                           "horovod.tensorflow.data", "horovod.torch.no_such_module"}
    assert all(text.startswith(f"No module named {name!r} in hvdlite's horovod alias: ")
               for name, text in errors.items())
    assert "estimators" in errors["horovod.spark.keras"]
    assert "hvdlite-run -np N" in errors["horovod.spark.keras"]
    assert "RayExecutor" in errors["horovod.ray.elastic"]
    assert "no MXNet front end" in errors["horovod.mxnet"] and "horovod.torch" in errors["horovod.mxnet"]
    assert "launcher internals" in errors["horovod.runner.launch"]
    assert "get_env_rank_and_size" in errors["horovod.runner.launch"]
    assert "tf.data service" in errors["horovod.tensorflow.data"]
    assert "no counterpart" in errors["horovod.torch.no_such_module"]
    assert "horovod.torch.mpi_ops" in errors["horovod.torch.no_such_module"]


JOB = """
import json

import numpy as np
import torch

import horovod
import horovod.torch as hvd
from horovod.runner.common.util.env import get_env_rank_and_size

hvd.init()
rank, size = hvd.rank(), hvd.size()
assert hvd.__name__ == "hvdlite.torch", hvd.__name__
assert get_env_rank_and_size() == (rank, size), (get_env_rank_and_size(), rank, size)
x = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (rank + 1) - rank
summed = hvd.allreduce(x, op=hvd.Sum, name="x")
mean = hvd.allreduce(x, name="x.mean")
gathered = hvd.allgather(torch.full((rank + 1, 2), float(rank)), name="g")
print("RESULT", json.dumps([rank, size, horovod.__version__, summed.tolist(), mean.tolist(), gathered.tolist()]),
      flush=True)
hvd.shutdown()
"""


@pytest.mark.timeout(240)
def test_a_two_rank_job_with_horovod_imports_runs_hvdlite(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, site = installed
    script = tmp_path / "horovod_job.py"
    script.write_text(JOB)
    out = run_ok(2, script, env={"PYTHONPATH": f"{site}{os.pathsep}{REPO}"}, timeout=200)
    results = sorted(json.loads(line.split(" ", 1)[1]) for line in out.splitlines() if line.startswith("RESULT "))
    assert len(results) == 2, out
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    per_rank = [base * (r + 1) - r for r in range(2)]
    want_gather = np.concatenate([np.full((r + 1, 2), float(r)) for r in range(2)])
    for r, (rank, size, version, summed, mean, gathered) in enumerate(results):
        assert (rank, size, version) == (r, 2, hvdlite.__version__)
        np.testing.assert_allclose(summed, per_rank[0] + per_rank[1])
        np.testing.assert_allclose(mean, (per_rank[0] + per_rank[1]) / 2)
        np.testing.assert_array_equal(gathered, want_gather)


@pytest.mark.timeout(240)
def test_the_alias_refuses_to_run_beside_a_real_horovod(installed: tuple[Path, Path]) -> None:
    python, site = installed
    importing = "import horovod.torch"
    fake = site / "horovod-0.28.1.dist-info"
    fake.mkdir()
    try:
        (fake / "METADATA").write_text(FAKE_HOROVOD_METADATA)
        proc = _python(python, importing)
    finally:
        shutil.rmtree(fake)
    assert proc.returncode != 0
    assert "ImportError: hvdlite's horovod alias" in proc.stderr and "refuses to run" in proc.stderr
    assert "a real Horovod is installed" in proc.stderr and "horovod 0.28.1" in proc.stderr

    # Horovod's files mixed into the alias's folder, without Horovod's metadata.
    stray = site / "horovod" / "torch"
    stray.mkdir()
    try:
        (stray / "__init__.py").write_text("")
        proc = _python(python, importing)
    finally:
        shutil.rmtree(stray)
    assert proc.returncode != 0 and "files of another Horovod installation (torch/__init__.py)" in proc.stderr

    # Both gone again: the alias runs (and the checks above did not refuse for nothing).
    proc = _python(python, "import horovod, hvdlite; print(horovod.run is hvdlite.run)")
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr


@pytest.mark.timeout(240)
def test_install_is_refused_over_a_real_horovod(tmp_path: Path) -> None:
    python, site = _venv(tmp_path / "with_horovod", with_hvdlite=True)
    fake = site / "horovod-0.28.1.dist-info"
    fake.mkdir()
    (fake / "METADATA").write_text(FAKE_HOROVOD_METADATA)
    proc = _pip_install(python, "./alias")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "hvdlite-horovod-alias refuses to install into the environment of" in out
    assert f"a real Horovod is installed there (horovod 0.28.1, {fake})" in out
    assert not (site / "horovod").exists()

    # The same venv without the fake Horovod: the build's check passes, in an editable
    # install too, and the alias imports from this checkout.
    shutil.rmtree(fake)
    proc = _pip_install(python, "-e", "./alias")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _python(python, "import horovod; print(horovod.__file__)")
    assert proc.returncode == 0 and proc.stdout.strip() == str(ALIAS / "src" / "horovod" / "__init__.py")

    # Without hvdlite the alias installs (hvdlite is no declared dependency, so no index is
    # asked for it) and says at import what is missing.
    python, site = _venv(tmp_path / "without_hvdlite", with_hvdlite=False)
    proc = _pip_install(python, "./alias")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _python(python, "import horovod")
    assert proc.returncode != 0
    assert "ImportError: this horovod package is hvdlite's horovod alias, and hvdlite is not installed" in proc.stderr
