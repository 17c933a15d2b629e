"""hvdlite under Horovod's name: ``import horovod.torch as hvd`` runs hvdlite.

This package comes from hvdlite's ``hvdlite-horovod-alias`` distribution (``pip install
./alias`` in hvdlite's repository), not from Horovod. ``horovod.torch``,
``horovod.tensorflow``, ``horovod.tensorflow.keras``, ``horovod.keras`` and
``horovod.common`` are hvdlite's modules themselves (``horovod.torch is hvdlite.torch``);
``horovod.run`` is :func:`hvdlite.run` and ``horovod.__version__`` is hvdlite's version.
Parts of Horovod that hvdlite does not have (Spark, Ray, MXNet, the launcher's
internals) raise ``ModuleNotFoundError`` saying what to use instead. See
``docs/horovod_alias.md`` in hvdlite's repository.

The alias refuses to load beside a real Horovod installation (``ImportError``): the two
would shadow or overwrite each other.
"""
from horovod import _hvdlite_alias

_hvdlite_alias.check_environment(__path__)
_hvdlite_alias.install_finder()

try:
    from hvdlite import __version__
except ModuleNotFoundError as exc:
    if exc.name != "hvdlite":
        raise
    raise ImportError("this horovod package is hvdlite's horovod alias, and hvdlite is not installed: "
                      "install it (pip install -e . in hvdlite's repository)") from exc
from hvdlite.runner.function import run  # noqa: E402

__all__ = ["run", "__version__"]
