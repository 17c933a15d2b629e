"""How hvdlite's horovod alias maps Horovod's module names onto hvdlite's modules.

Each name in :data:`ALIASES` is the hvdlite module itself, not a copy: importing
``horovod.torch.mpi_ops`` puts ``hvdlite.torch.mpi_ops`` into ``sys.modules`` under both
names, so state, ``isinstance`` checks and ``mock.patch("horovod.torch.mpi_ops.X")`` act on
the one module hvdlite runs. A finder placed first on ``sys.meta_path`` answers every
``horovod.*`` import: an alias, one of this package's own modules (:data:`OWN_MODULES`),
or ``ModuleNotFoundError`` with a message that says what hvdlite offers instead.

This file also marks a ``horovod`` folder as the alias (the install-time check looks
for it) and holds the check that refuses to run beside a real Horovod.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
from typing import Iterable, Sequence

# Horovod's module -> hvdlite's module of the same API (the same module object).
ALIASES = {
    "horovod.common": "hvdlite.common",
    "horovod.common.basics": "hvdlite.common.basics",
    "horovod.common.elastic": "hvdlite.common.elastic",
    "horovod.common.exceptions": "hvdlite.common.exceptions",
    "horovod.common.process_sets": "hvdlite.common.process_sets",
    "horovod.common.util": "hvdlite.common.util",
    "horovod.torch": "hvdlite.torch",
    "horovod.torch.compression": "hvdlite.torch.compression",
    "horovod.torch.elastic": "hvdlite.torch.elastic",
    "horovod.torch.functions": "hvdlite.torch.functions",
    "horovod.torch.mpi_ops": "hvdlite.torch.mpi_ops",
    "horovod.torch.optimizer": "hvdlite.torch.optimizer",
    "horovod.torch.sync_batch_norm": "hvdlite.torch.sync_batch_norm",
    "horovod.tensorflow": "hvdlite.tensorflow",
    "horovod.tensorflow.compression": "hvdlite.tensorflow.compression",
    "horovod.tensorflow.elastic": "hvdlite.tensorflow.elastic",
    "horovod.tensorflow.functions": "hvdlite.tensorflow.functions",
    "horovod.tensorflow.mpi_ops": "hvdlite.tensorflow.mpi_ops",
    "horovod.tensorflow.sync_batch_norm": "hvdlite.tensorflow.sync_batch_norm",
    "horovod.tensorflow.util": "hvdlite.tensorflow.util",
    "horovod.tensorflow.keras": "hvdlite.tensorflow.keras",
    "horovod.tensorflow.keras.callbacks": "hvdlite.tensorflow.keras.callbacks",
    "horovod.tensorflow.keras.elastic": "hvdlite.tensorflow.keras.elastic",
    # Keras 3 is the only Keras: horovod.keras and horovod.tensorflow.keras are one module
    # under two names in hvdlite (hvdlite.keras).
    "horovod.keras": "hvdlite.keras",
    "horovod.keras.callbacks": "hvdlite.tensorflow.keras.callbacks",
    "horovod.keras.elastic": "hvdlite.tensorflow.keras.elastic",
    "horovod.ray": "hvdlite.ray",
    "horovod.ray.runner": "hvdlite.ray.runner",
    "horovod.ray.strategy": "hvdlite.ray.strategy",
    "horovod.ray.worker": "hvdlite.ray.worker",
    "horovod.spark": "hvdlite.spark",
    "horovod.spark.runner": "hvdlite.spark.runner",
    "horovod.runner.common.util.env": "hvdlite.runner.rank_env",
    "horovod.runner.util.threads": "hvdlite.runner.threads",
}

# Modules of this package's own (files beside this one).
OWN_MODULES = frozenset({
    "horovod._hvdlite_alias",
    "horovod.runner",
    "horovod.runner.common",
    "horovod.runner.common.util",
    "horovod.runner.util",
})

# The files of this package; anything else in its folder came from another installation.
OWN_FILES = frozenset({
    "__init__.py",
    "_hvdlite_alias.py",
    "runner/__init__.py",
    "runner/common/__init__.py",
    "runner/common/util/__init__.py",
    "runner/util/__init__.py",
})

_LAUNCH = ("launch a script with hvdlite's launcher, `hvdlite-run -np N python train.py` (also "
           "installed as `horovodrun`, with horovodrun's options), or run a function on N ranks "
           "from Python with horovod.run(func, num_proc=N) (hvdlite.run)")

# Parts of Horovod that hvdlite does not have: (module prefix, what to say). The longest
# matching prefix applies.
UNSUPPORTED = (
    ("horovod.spark", "Of Horovod's Spark integration, hvdlite has horovod.spark.run "
                      "(hvdlite.spark.run); the estimators, stores and Gloo-based run_elastic are "
                      f"not part of hvdlite; {_LAUNCH}."),
    ("horovod.ray", "Of Horovod's Ray integration, hvdlite has horovod.ray.RayExecutor and "
                    "its runner, strategy and worker modules (hvdlite.ray); "
                    "the others are not part of hvdlite."),
    ("horovod.mxnet", "hvdlite has no MXNet front end; it has PyTorch (horovod.torch), TensorFlow "
                      "(horovod.tensorflow), Keras 3 (horovod.tensorflow.keras, horovod.keras) and "
                      "NumPy arrays (import hvdlite)."),
    ("horovod.data", "Horovod's tf.data service is not part of hvdlite; let each rank read its own "
                     "shard of the data (dataset.shard(hvd.size(), hvd.rank()))."),
    ("horovod.tensorflow.data", "Horovod's tf.data service is not part of hvdlite; let each rank read "
                                "its own shard of the data (dataset.shard(hvd.size(), hvd.rank()))."),
    ("horovod.tensorflow.gradient_aggregation",
     "Horovod's private gradient-aggregation helpers are not part of hvdlite; "
     "hvd.DistributedOptimizer and hvd.DistributedGradientTape take backward_passes_per_step "
     "as in Horovod."),
    ("horovod._keras", "horovod._keras is Horovod's private implementation of its Keras modules; "
                       "import horovod.tensorflow.keras or horovod.keras."),
    ("horovod.runner", "Horovod's launcher internals are not part of hvdlite; " + _LAUNCH + ". Of "
                       "horovod.runner, hvdlite provides run, common.util.env.get_env_rank_and_size "
                       "and util.threads (in_thread, on_event)."),
)


def unsupported_message(name: str) -> str:
    """Why ``name`` cannot be imported here, and what to use instead."""
    matches = [(prefix, text) for prefix, text in UNSUPPORTED if name == prefix or name.startswith(prefix + ".")]
    if matches:
        _, text = max(matches, key=lambda m: len(m[0]))
        return f"No module named {name!r} in hvdlite's horovod alias: {text}"
    provided = ", ".join(sorted({"horovod", *ALIASES, *(m for m in OWN_MODULES if not m.endswith("_alias"))}))
    return (f"No module named {name!r} in hvdlite's horovod alias: hvdlite has no counterpart of it. "
            f"The alias provides {provided}.")


class _AliasLoader(importlib.abc.Loader):
    """Loads a Horovod name as the hvdlite module it stands for."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder, replaced in sys.modules by exec_module

    def exec_module(self, module: object) -> None:
        # The import system returns whatever sys.modules holds under the name once this
        # returns: hvdlite's module itself, whose own __name__ and __spec__ stay as they are.
        sys.modules[module.__name__] = importlib.import_module(self.target)  # type: ignore[attr-defined]


class AliasFinder(importlib.abc.MetaPathFinder):
    """Answers every import of a ``horovod.*`` module (see the module's docstring)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("horovod.") or fullname in OWN_MODULES:
            return None
        hvdlite_name = ALIASES.get(fullname)
        if hvdlite_name is None:
            # No `name=`: `from horovod.runner.common.util import secret` would otherwise lose
            # this message to Python's "cannot import name" (the import system drops a
            # ModuleNotFoundError named after the module a fromlist asked for).
            raise ModuleNotFoundError(unsupported_message(fullname))
        hvdlite_spec = importlib.util.find_spec(hvdlite_name)
        if hvdlite_spec is None:
            raise ModuleNotFoundError(f"{fullname} is hvdlite's {hvdlite_name}, which is not installed: "
                                      "install hvdlite (pip install -e . in its repository)", name=fullname)
        spec = importlib.machinery.ModuleSpec(fullname, _AliasLoader(hvdlite_name), origin=hvdlite_spec.origin,
                                              is_package=hvdlite_spec.submodule_search_locations is not None)
        if hvdlite_spec.submodule_search_locations is not None:
            spec.submodule_search_locations = list(hvdlite_spec.submodule_search_locations)
        return spec


def install_finder() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder())


_REMEDY = ("Keep one of them: `pip uninstall hvdlite-horovod-alias` to use Horovod, or "
           "`pip uninstall horovod` (then `pip install --force-reinstall ./alias` from hvdlite's "
           "repository) to run hvdlite under Horovod's name.")


def _foreign_files(folder: str) -> list[str]:
    """Files under ``folder`` that are not the alias's own (``__pycache__`` aside)."""
    foreign = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            if rel not in OWN_FILES:
                foreign.append(rel)
    return foreign


def _other_horovod_packages(own: Iterable[str]) -> list[str]:
    """``horovod`` packages on ``sys.path`` that are neither this one nor another copy of
    the alias."""
    own_real = {os.path.realpath(p) for p in own}
    found = []
    for entry in sys.path:
        if not isinstance(entry, str):
            continue
        candidate = os.path.join(entry or os.getcwd(), "horovod")
        if os.path.realpath(candidate) in own_real or candidate in found:
            continue
        if os.path.isfile(os.path.join(candidate, "__init__.py")) and \
                not os.path.isfile(os.path.join(candidate, "_hvdlite_alias.py")):
            found.append(candidate)
    return found


def check_environment(package_path: Iterable[str]) -> None:
    """Refuse (``ImportError``) to run where a real Horovod is installed too: its
    distribution is on ``sys.path``, its files are mixed into the alias's folder, or
    another ``horovod`` package is on ``sys.path``."""
    package_path = list(package_path)
    where = ", ".join(package_path)
    try:
        dist = importlib.metadata.distribution("horovod")
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        location = getattr(dist, "_path", None)
        raise ImportError(
            f"hvdlite's horovod alias ({where}) refuses to run: a real Horovod is installed in this "
            f"environment (distribution {dist.metadata['Name']} {dist.version}"
            f"{f', {location}' if location else ''}), and the two would shadow or overwrite each "
            f"other. {_REMEDY}")
    for folder in package_path:
        foreign = _foreign_files(folder)
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise ImportError(
                f"hvdlite's horovod alias refuses to run: its folder {folder} also holds files of "
                f"another Horovod installation ({shown}). {_REMEDY}")
    others = _other_horovod_packages(package_path)
    if others:
        raise ImportError(
            f"hvdlite's horovod alias ({where}) refuses to run: another horovod package is on the "
            f"module search path ({', '.join(others)}), and the two would shadow each other. {_REMEDY}")
