"""What a newcomer installs: the extras keep a user's own framework build, and the
README's commands are the ones CI runs with extras that exist."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib

from tests.launch import REPO, job_env

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
FRAMEWORKS = {"torch", "tensorflow", "tensorflow-cpu"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip().lower()


def test_extras_state_ranges_never_one_version() -> None:
    for extra, requirements in EXTRAS.items():
        for req in requirements:
            assert "==" not in req and "===" not in req, (extra, req)
            if _name(req) in FRAMEWORKS:
                assert ">=" in req, (extra, req)  # a lower bound, no pin


def test_each_tensorflow_extra_names_one_tensorflow_package() -> None:
    """tensorflow and tensorflow-cpu install the same module; an extra that pulled the
    other package would overwrite the user's."""
    assert {_name(r) for r in EXTRAS["tensorflow"]} & {"tensorflow", "tensorflow-cpu"} == {"tensorflow"}
    assert {_name(r) for r in EXTRAS["tensorflow-cpu"]} & {"tensorflow", "tensorflow-cpu"} == {"tensorflow-cpu"}
    for extra in set(EXTRAS) - {"tensorflow", "tensorflow-cpu"}:
        assert not {_name(r) for r in EXTRAS[extra]} & {"tensorflow", "tensorflow-cpu"}, extra


def test_readme_commands_are_cis_and_use_existing_extras() -> None:
    readme = (REPO / "README.md").read_text()
    commands = re.findall(r"^python3 -m venv \.venv && .*$", readme, flags=re.M)
    assert len(commands) >= 2, commands
    ci = (REPO / ".ci" / "run").read_text()
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in ci.splitlines(), "the README's test command is not .ci/run's"
    for command in commands:
        for group in re.findall(r"'\.\[([^\]]*)\]'", command):
            for extra in group.split(","):
                assert extra in EXTRAS, (extra, command)
    constraints = (REPO / "constraints-cpu.txt").read_text()
    pinned = {_name(line) for line in constraints.splitlines()
              if line.strip() and not line.startswith("#")}
    assert pinned <= {_name(r) for reqs in EXTRAS.values() for r in reqs}, pinned


def test_horovodrun_is_the_launcher_under_horovods_name() -> None:
    """``horovodrun`` is declared as the same entry point as ``hvdlite-run``; loaded the
    way the console script loads it, it runs a job and names itself in its usage."""
    scripts = PYPROJECT["project"]["scripts"]
    assert scripts["horovodrun"] == scripts["hvdlite-run"] == "hvdlite.runner.cli:main"
    entry = ("import sys; from importlib.metadata import EntryPoint; sys.argv[0] = 'horovodrun'; "
             f"sys.exit(EntryPoint('horovodrun', {scripts['horovodrun']!r}, 'console_scripts').load()())")
    rank = "import os; print('rank', os.environ['OMPI_COMM_WORLD_RANK'], flush=True)"
    proc = subprocess.run([sys.executable, "-c", entry, "-np", "2", sys.executable, "-c", rank],
                          capture_output=True, text=True, timeout=120, env=job_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert sorted(l for l in proc.stdout.splitlines() if l.startswith("rank ")) == ["rank 0", "rank 1"]
    usage = subprocess.run([sys.executable, "-c", entry, "-np", "2"], capture_output=True,
                           text=True, timeout=120, env=job_env(), cwd=REPO)
    assert usage.returncode == 2 and "usage: horovodrun" in usage.stderr, usage.stderr
    assert "horovodrun: error: no command given" in usage.stderr, usage.stderr
