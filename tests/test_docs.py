"""The documentation site cannot go stale.

* Every ``HVDLITE_*`` / ``HOROVOD_*`` environment variable the code reads is in a table
  (``hvdlite/common/variables.py`` or ``hvdlite/common/horovod_env.py``), from which the
  site's page of variables is generated; every entry of hvdlite's table is read
  somewhere; the engine's defaults in it are the ones its C++ sources set.
* Every public name of the modules the API reference renders has a docstring, as the
  reference reads them (statically, with Griffe), and each such module has a page.
* The README's command that builds the site is one that CI runs.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.launch import REPO

PACKAGE = REPO / "hvdlite"
CSRC = PACKAGE / "csrc"
NAME = re.compile(r"\b(?:HVDLITE|HOROVOD)_[A-Z0-9_]*[A-Z0-9]\b")
# Quoted literals in parameters.cc that are values, not the suffixes of variables.
ENGINE_VALUE_WORDS = {"DYNAMIC", "MPI", "NCCL"}


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


VARIABLES = _load(PACKAGE / "common" / "variables.py", "_test_docs_variables")
HOROVOD_ENV = _load(PACKAGE / "common" / "horovod_env.py", "_test_docs_horovod_env")


def engine_suffixes() -> set[str]:
    """The ``<NAME>`` of every ``HVDLITE_<NAME>``/``HOROVOD_<NAME>`` the engine reads."""
    source = (CSRC / "common" / "parameters.cc").read_text()
    words = set(re.findall(r'"([A-Z][A-Z0-9_]*)"', source))
    # A whole name (read as it is, not by suffix) is found by the scan of C++ sources.
    return {w for w in words if not w.endswith("_") and w not in ENGINE_VALUE_WORDS
            and not w.startswith(("HVDLITE_", "HOROVOD_"))}


def names_read() -> dict[str, str]:
    """Every variable name the package reads, with one file that names it: each name in
    its Python sources (the two tables aside), each quoted name in its C++ sources, and
    both names of each setting the engine reads by suffix."""
    found: dict[str, str] = {}
    tables = {PACKAGE / "common" / "variables.py", PACKAGE / "common" / "horovod_env.py"}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path not in tables:
            for name in NAME.findall(path.read_text()):
                found.setdefault(name, str(path.relative_to(REPO)))
    for path in sorted(p for p in PACKAGE.rglob("*") if p.suffix in (".cc", ".h")):
        for name in re.findall(r'"((?:HVDLITE|HOROVOD)_[A-Z0-9_]*[A-Z0-9])"', path.read_text()):
            found.setdefault(name, str(path.relative_to(REPO)))
    for suffix in engine_suffixes():
        found.setdefault(f"HVDLITE_{suffix}", "hvdlite/csrc/common/parameters.cc")
        found.setdefault(f"HOROVOD_{suffix}", "hvdlite/csrc/common/parameters.cc")
    return found


def test_the_scan_finds_reads_of_every_kind() -> None:
    """The scan is not vacuous: it finds a variable read by Python, one named in C++,
    and both names of an engine setting read by suffix."""
    read = names_read()
    assert read["HVDLITE_TF_OVERLAP"].startswith("hvdlite/tensorflow/")
    assert read["HVDLITE_NCCL_LIBRARY"]
    assert read["HOROVOD_HOST_CHUNK_BYTES"] == "hvdlite/csrc/common/parameters.cc"
    assert {"FUSION_THRESHOLD", "SPIN_MICROSECONDS", "GPU_ALLREDUCE"} <= engine_suffixes()


def test_every_variable_read_is_in_a_table() -> None:
    ours = {v.name for v in VARIABLES.VARIABLES} | {v.horovod_name for v in VARIABLES.VARIABLES
                                                    if v.horovod_name}
    horovods = {v.name for v in HOROVOD_ENV.VARIABLES}
    missing = {name: where for name, where in names_read().items()
               if name not in ours | horovods}
    assert not missing, f"add these to hvdlite/common/variables.py: {missing}"


def test_every_engine_setting_has_both_names() -> None:
    by_name = {v.name: v for v in VARIABLES.VARIABLES}
    for suffix in sorted(engine_suffixes()):
        entry = by_name.get(f"HVDLITE_{suffix}")
        assert entry is not None, suffix
        assert entry.horovod_name == f"HOROVOD_{suffix}", suffix
        assert entry.read_by == VARIABLES.ENGINE, suffix


def test_hvdlites_table_holds_no_stale_entry() -> None:
    read = names_read()
    names = [v.name for v in VARIABLES.VARIABLES]
    assert len(names) == len(set(names)), "an entry twice"
    for v in VARIABLES.VARIABLES:
        assert v.name.startswith("HVDLITE_"), v.name
        assert v.name in read, f"{v.name} is in the table but nothing reads it"
        assert v.default and v.meaning and v.read_by, v.name


def _cpp_default(header: str, field: str) -> float:
    match = re.search(rf"\b{field} = ([^;]+);", (CSRC / header).read_text())
    assert match, (header, field)
    expression = match.group(1).replace("LL", "")
    expression = {"true": "1", "false": "0"}.get(expression, expression)
    assert re.fullmatch(r"[0-9.* ]+", expression), expression
    return float(eval(expression))  # digits and products only (checked above)


# Engine setting -> (header, field) whose initializer is its default.
ENGINE_DEFAULTS = {
    "FUSION_THRESHOLD": ("common/parameters.h", "fusion_threshold_bytes"),
    "CYCLE_TIME": ("common/parameters.h", "cycle_time_ms"),
    "CACHE_CAPACITY": ("common/parameters.h", "cache_capacity"),
    "STALL_CHECK_TIME_SECONDS": ("common/parameters.h", "stall_check_seconds"),
    "STALL_SHUTDOWN_TIME_SECONDS": ("common/parameters.h", "stall_shutdown_seconds"),
    "HOST_CHUNK_BYTES": ("common/parameters.h", "host_chunk_bytes"),
    "FUSION_DIRECT_BYTES": ("common/parameters.h", "fusion_direct_bytes"),
    "RING_MIN_SEGMENT_BYTES": ("common/parameters.h", "ring_min_segment_bytes"),
    "SPIN_MICROSECONDS": ("common/parameters.h", "spin_us"),
    "HIERARCHICAL_CHUNK_BYTES": ("common/parameters.h", "hierarchical_chunk_bytes"),
    "MALLOC_TUNING": ("common/parameters.h", "malloc_tuning"),
    "HUGE_PAGES": ("common/parameters.h", "huge_pages"),
    "TIMELINE_MARK_CYCLES": ("common/parameters.h", "timeline_mark_cycles"),
    "AUTOTUNE": ("common/parameters.h", "autotune"),
    "ELASTIC": ("common/parameters.h", "elastic"),
    "AUTOTUNE_WARMUP_SAMPLES": ("common/tunables.h", "warmup_samples"),
    "AUTOTUNE_STEPS_PER_SAMPLE": ("common/tunables.h", "steps_per_sample"),
    "AUTOTUNE_BAYES_OPT_MAX_SAMPLES": ("common/tunables.h", "max_samples"),
}


@pytest.mark.parametrize("suffix", sorted(ENGINE_DEFAULTS))
def test_engine_defaults_are_the_engines(suffix: str) -> None:
    entry = next(v for v in VARIABLES.VARIABLES if v.name == f"HVDLITE_{suffix}")
    assert float(entry.default) == _cpp_default(*ENGINE_DEFAULTS[suffix]), suffix


def test_log_level_default_is_the_engines() -> None:
    level = int(_cpp_default("common/parameters.h", "log_level"))
    names = ["trace", "debug", "info", "warning", "error", "fatal"]
    entry = next(v for v in VARIABLES.VARIABLES if v.name == "HVDLITE_LOG_LEVEL")
    assert entry.default == names[level]


# ---------------------------------------------------------------- the API reference

def _public_api() -> ModuleType:
    pytest.importorskip("griffe", reason="griffe reads the sources as the reference does "
                                         "(the test and docs extras install it)")
    return _load(REPO / "docs" / "hooks" / "public_api.py", "_test_docs_public_api")


def test_every_public_name_has_a_docstring() -> None:
    api = _public_api()
    assert api.undocumented(REPO) == []


def test_every_reference_module_has_a_page() -> None:
    api = _public_api()
    rendered = api.rendered_modules(REPO / "docs" / "reference")
    assert set(api.REFERENCE_MODULES) <= rendered, set(api.REFERENCE_MODULES) - rendered


def test_the_docstring_check_finds_a_missing_one(tmp_path: Path) -> None:
    """The check itself, on a package of two names: the one without a docstring is
    reported, through an import and under the name the module exports."""
    api = _public_api()
    package = tmp_path / "hvdlite"
    package.mkdir()
    (package / "__init__.py").write_text(
        '"""A package."""\nfrom hvdlite.impl import bare, told\n__all__ = ["bare", "told"]\n')
    (package / "impl.py").write_text(
        '"""Its implementation."""\n\ndef bare():\n    pass\n\n'
        'def told():\n    """Has one."""\n')
    assert api.undocumented(tmp_path, ("hvdlite",)) == ["hvdlite.bare (defined as hvdlite.impl.bare)"]


def test_readme_builds_the_site_as_ci_does() -> None:
    readme = (REPO / "README.md").read_text()
    commands = [c for c in re.findall(r"^python3 -m venv \.venv && .*$", readme, flags=re.M)
                if "mkdocs build --strict" in c]
    assert len(commands) == 1, commands
    assert "'.[docs]'" in commands[0]
    assert commands[0] in (REPO / ".ci" / "run").read_text().splitlines()
