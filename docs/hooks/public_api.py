"""Which public names of hvdlite lack a docstring, as the API reference sees them.

The reference pages (``docs/reference/*.md``) render whole modules with mkdocstrings
(``::: hvdlite.torch``), which reads the sources statically with Griffe: nothing is
imported, so neither PyTorch nor TensorFlow is needed. mkdocstrings renders a name
without a docstring as a bare signature and says nothing; :func:`undocumented` finds
such names, so that the strict build (``docs/hooks/hvdlite_docs.py``) and
``tests/test_docs.py`` fail on them.

Used by the build hook and by the test; needs ``griffe`` (the ``docs`` extra brings it).
"""
from __future__ import annotations

import re
from pathlib import Path

import griffe

#: The modules the reference renders, each on one of the pages in docs/reference/.
REFERENCE_MODULES: tuple[str, ...] = (
    "hvdlite",
    "hvdlite.mpi_ops",
    "hvdlite.runner.function",
    "hvdlite.torch",
    "hvdlite.torch.elastic",
    "hvdlite.tensorflow",
    "hvdlite.tensorflow.elastic",
    "hvdlite.tensorflow.keras",
    "hvdlite.tensorflow.keras.callbacks",
    "hvdlite.tensorflow.keras.elastic",
)

#: Names in a module's ``__all__`` that it loads lazily from other modules, as (the
#: tuple of their names that its ``__all__`` spreads, the module they come from):
#: ``hvdlite`` imports its NumPy collectives from ``hvdlite.mpi_ops`` and ``run`` from
#: ``hvdlite.runner.function`` on first use.
LAZY_EXPORTS: dict[str, tuple[tuple[str, str], ...]] = {
    "hvdlite": (("_NUMPY_OPS", "hvdlite.mpi_ops"), ("_LAUNCHER_API", "hvdlite.runner.function")),
}

_DIRECTIVE = re.compile(r"^:::\s+([\w.]+)\s*$", re.M)


def load(repo: Path) -> griffe.GriffeLoader:
    """Load the ``hvdlite`` package from the sources under ``repo``, as mkdocstrings does."""
    loader = griffe.GriffeLoader(search_paths=[str(repo)])
    loader.load("hvdlite", try_relative_path=False)
    loader.resolve_aliases(implicit=False, external=False)
    return loader


def _exports(module: griffe.Module) -> list[str]:
    return [e if isinstance(e, str) else str(e) for e in (module.exports or [])]


def undocumented(repo: Path, reference_modules: tuple[str, ...] = REFERENCE_MODULES) -> list[str]:
    """Every name in the ``__all__`` of a reference module whose object has no
    docstring (or cannot be found), as ``module.name (where it is defined)``; also
    each such module without a docstring or an ``__all__``."""
    loader = load(repo)
    modules = loader.modules_collection
    problems: list[str] = []
    for path in reference_modules:
        module = modules[path]
        if not (module.docstring and module.docstring.value.strip()):
            problems.append(f"{path} (the module itself)")
        names = _exports(module)
        if not names:
            problems.append(f"{path} has no __all__")
        lazy = LAZY_EXPORTS.get(path, ())
        for name in names:
            if any(name == spread for spread, _ in lazy):
                continue  # the names of the lazy module, checked there
            try:
                obj = module[name]
                target = obj.final_target if obj.is_alias else obj
            except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                if any(name in _exports(modules[source]) for _, source in lazy):
                    continue
                problems.append(f"{path}.{name} (not found)")
                continue
            if not (target.docstring and target.docstring.value.strip()):
                problems.append(f"{path}.{name} (defined as {target.path})")
    return problems


def rendered_modules(reference_dir: Path) -> set[str]:
    """The objects the pages in ``reference_dir`` render with ``::: path``."""
    found: set[str] = set()
    for page in reference_dir.glob("*.md"):
        found.update(_DIRECTIVE.findall(page.read_text()))
    return found
