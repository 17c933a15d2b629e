"""MkDocs hook of hvdlite's documentation site (``hooks:`` in mkdocs.yml).

* Before the build, every public name of the modules the API reference renders must
  have a docstring (``docs/hooks/public_api.py``), and every such module must be
  rendered by a page; a miss is a warning, which ``mkdocs build --strict`` turns into a
  failed build.
* ``<!-- generated: hvdlite-run --help -->`` in a page becomes the launcher's own
  ``--help`` text, produced by running it from this source tree at build time.
* ``<!-- generated: environment variables -->`` becomes the tables of every environment
  variable hvdlite reads (``hvdlite/common/variables.py``) and of every Horovod variable
  with what hvdlite does with it (``hvdlite/common/horovod_env.py``).
"""
from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from mkdocs.exceptions import PluginError

log = logging.getLogger("mkdocs.hooks.hvdlite")

CLI_MARKER = "<!-- generated: hvdlite-run --help -->"
ENV_MARKER = "<!-- generated: environment variables -->"


def _repo(config: Any) -> Path:
    return Path(config.config_file_path).resolve().parent


def _load(path: Path, name: str) -> ModuleType:
    """A module of this tree loaded from its file, without importing its package."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def on_pre_build(config: Any, **kwargs: Any) -> None:
    repo = _repo(config)
    api = _load(repo / "docs" / "hooks" / "public_api.py", "_hvdlite_docs_public_api")
    for problem in api.undocumented(repo):
        log.warning("public name without a docstring: %s", problem)
    rendered = api.rendered_modules(Path(config.docs_dir) / "reference")
    for module in sorted(set(api.REFERENCE_MODULES) - rendered):
        log.warning("reference module %s is rendered by no page in docs/reference/", module)


def _cli_help(repo: Path) -> str:
    env = dict(os.environ, COLUMNS="80", PYTHONPATH=os.pathsep.join(
        [str(repo), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.run([sys.executable, "-m", "hvdlite.runner", "--help"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or not proc.stdout.startswith("usage: hvdlite-run"):
        raise PluginError(f"hvdlite-run --help failed (exit {proc.returncode}):\n{proc.stderr}")
    return proc.stdout


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _env_tables(repo: Path) -> str:
    common = repo / "hvdlite" / "common"
    ours = _load(common / "variables.py", "_hvdlite_docs_variables")
    horovod = _load(common / "horovod_env.py", "_hvdlite_docs_horovod_env")
    user = [v for v in ours.VARIABLES if not v.internal]
    internal = [v for v in ours.VARIABLES if v.internal]
    aliases = {v.horovod_name: v.name for v in ours.VARIABLES if v.horovod_name}
    lines = ["## hvdlite's variables", "",
             "Grouped by the part of hvdlite that reads them. Where two names are given, the "
             "first wins when both are set.", ""]
    for reader in dict.fromkeys(v.read_by for v in user):
        lines += [f"### Read by {reader}", "", "| variable | default | what it does |",
                  "| --- | --- | --- |"]
        for v in (v for v in user if v.read_by == reader):
            names = f"`{v.name}`" + (f"<br>`{v.horovod_name}`" if v.horovod_name else "")
            lines.append(f"| {names} | {_cell(v.default)} | {_cell(v.meaning)} |")
        lines.append("")
    lines += ["## Horovod's variables", "",
              "Every `HOROVOD_*` variable Horovod 0.28.1 documents, and what hvdlite does with "
              "it. *honoured*: read with Horovod's meaning; *ignored*: no effect in hvdlite, "
              "and `hvd.init()` warns when it is set to a value hvdlite does not honour; "
              "*not yet*: a feature hvdlite does not have yet (warned about likewise); *build*: read "
              "by Horovod's installer only.", "",
              "| variable | in hvdlite | what hvdlite does |", "| --- | --- | --- |"]
    for v in sorted(horovod.VARIABLES, key=lambda v: v.name):
        note = v.note
        if v.name in aliases:
            note = f"the same as `{aliases[v.name]}` (used when that is unset): {note}"
        lines.append(f"| `{v.name}` | {v.status} | {_cell(note)} |")
    lines += ["", "## Set by hvdlite for its own processes", "",
              "hvdlite sets these for the processes it starts and reads them there; they are "
              "listed so that nothing is read unannounced, not to be set by hand.", "",
              "| variable | read by | what it carries |", "| --- | --- | --- |"]
    for v in internal:
        lines.append(f"| `{v.name}` | {_cell(v.read_by)} | {_cell(v.meaning)} |")
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    repo = _repo(config)
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, f"```text\n{_cli_help(repo)}```")
    if ENV_MARKER in markdown:
        markdown = markdown.replace(ENV_MARKER, _env_tables(repo))
    return markdown
