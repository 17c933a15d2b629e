"""``hvd.elastic`` for TensorFlow 2: Horovod's elastic-training API.

``hvd.elastic.run`` and the state objects work as in Horovod; launched elastic
(``hvdlite-run --min-np ...``), training survives a lost worker (see
:mod:`hvdlite.common.elastic`). For ``model.fit`` see :mod:`hvdlite.tensorflow.keras.elastic`.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from hvdlite.common.basics import rank
from hvdlite.common.elastic import ObjectState, State, run_fn, sync_root
from hvdlite.tensorflow.functions import broadcast_object, broadcast_variables

__all__ = ["run", "State", "ObjectState", "TensorFlowState", "TensorFlowKerasState"]


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate the training function ``func(state, ...)``: every rank first takes rank
    0's ``state``, then runs ``func``; after a lost worker, the survivors restore the last
    commit, rebuild the world and call ``func`` again (:mod:`hvdlite.common.elastic`)."""
    return run_fn(func)


def _bcast(obj: Any) -> Any:
    return broadcast_object(obj, root_rank=sync_root())


class _VariablesState(ObjectState):
    """An ObjectState that also keeps values of TensorFlow/Keras variables: saved as
    NumPy copies, restored by assignment, synced by broadcasting the sync root's values."""

    def __init__(self, **kwargs: Any) -> None:
        self._save_variables()
        super().__init__(bcast_object=_bcast, get_rank=rank, **kwargs)

    def _tracked(self) -> list[Any]:
        raise NotImplementedError

    def _save_variables(self) -> None:
        # Pairs, not a list matched by position: an optimizer creates its variables at
        # its first step, so the list can grow between a save and a restore.
        self._saved_values = [(v, v.numpy().copy()) for v in self._tracked()]

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for var, value in self._saved_values:
            var.assign(value)
        super().restore()

    def sync(self) -> None:
        broadcast_variables(self._tracked(), root_rank=sync_root())
        self._save_variables()
        super().sync()


class TensorFlowState(_VariablesState):
    """State of a training loop over ``tf.Variable`` s (``variables``), plus plain Python
    values given as keyword arguments (exposed as attributes). ``session`` is TensorFlow
    1's and must be None."""

    def __init__(self, variables: Sequence[Any] | None = None, session: Any = None,
                 **kwargs: Any) -> None:
        if variables is None:
            raise ValueError("TensorFlowState needs the variables to track: TensorFlow 2 has "
                             "no global variable collection")
        if session is not None:
            raise ValueError("TensorFlowState: sessions are TensorFlow 1's; hvdlite supports "
                             "TensorFlow 2 (eager execution and tf.function) only")
        self.variables = list(variables)
        self.session = None
        super().__init__(**kwargs)

    def _tracked(self) -> list[Any]:
        return self.variables


class TensorFlowKerasState(_VariablesState):
    """State of a Keras model and its optimizer (``optimizer``, or the one the model was
    compiled with), plus plain Python values given as keyword arguments."""

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None,
                 **kwargs: Any) -> None:
        if not getattr(model, "built", True):
            raise ValueError("the model must be built first: call model.build(input_shape) "
                             "or run it once on data")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self.backend = backend
        super().__init__(**kwargs)

    def _tracked(self) -> list[Any]:
        opt_vars = list(self.optimizer.variables) if self.optimizer is not None else []
        return list(self.model.variables) + opt_vars

