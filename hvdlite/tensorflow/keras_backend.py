"""The one Keras backend hvdlite's TensorFlow adapter works with."""
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
