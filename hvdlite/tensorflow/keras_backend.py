"""The one Keras backend hvdlite's TensorFlow adapter works with, and what hvdlite adds
to Keras 3 for scripts written for Keras 2 (see ``docs/keras3.md``)."""
from __future__ import annotations


def wrong_keras_backend(what: str) -> str | None:
    """Why ``what`` cannot be used with the Keras backend now running, or None when Keras
    runs on TensorFlow. Keras 3 picks its backend (``KERAS_BACKEND``) once per process;
    on another backend, variables and gradients are not TensorFlow tensors."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        return None
    return (f"{what} works with Keras's TensorFlow backend, but Keras is running on its "
            f"{backend!r} backend (KERAS_BACKEND). Set KERAS_BACKEND=tensorflow before "
            f"importing keras, or train a PyTorch model with hvdlite.torch.")


class CallableList(list):
    """A list that also answers a call with itself: Keras 3 made ``optimizer.variables``
    a property (a list), where Keras 2's was a method, and Horovod's own examples call
    ``opt.variables()``; Horovod's Keras optimizer returns such a list for that reason."""

    def __call__(self):
        return self


def make_optimizer_variables_callable() -> None:
    """Make every Keras 3 optimizer's ``variables`` a :class:`CallableList`, so that
    ``hvd.broadcast_variables(opt.variables(), root_rank=0)`` in scripts written for
    Keras 2 (Horovod's ``tensorflow2_mnist.py``, ``tensorflow2_synthetic_benchmark.py``)
    works with any optimizer, not only a distributed one; ``opt.variables`` stays the
    list it is. Applied once, to the classes that define the property, and only while
    Keras runs on TensorFlow."""
    import keras
    if wrong_keras_backend("") is not None:
        return
    try:
        from keras.src.optimizers.base_optimizer import BaseOptimizer
    except ImportError:  # pragma: no cover - another Keras layout: nothing is changed
        return
    for cls in (BaseOptimizer, keras.optimizers.LossScaleOptimizer):
        prop = cls.__dict__.get("variables")
        if not isinstance(prop, property) or getattr(prop.fget, "_hvdlite_callable", False):
            continue
        original = prop.fget

        def variables(self, _original=original):
            return CallableList(_original(self))

        variables._hvdlite_callable = True
        variables.__doc__ = original.__doc__
        setattr(cls, "variables", property(variables, prop.fset, prop.fdel, prop.__doc__))
