"""Steps in which not every rank has data of its own, and what its gradient weighs.

``ElasticSampler`` gives each rank an exact share of the samples an epoch has left, so
the shares differ by at most one sample and no sample is seen twice. Sometimes that
one sample gives some ranks one batch more than the others (the others' shares fill
whole batches). Every rank must still run the same steps -- the same gradient
allreduces, commits and metric allreduces -- so the short ranks get one padding batch
to run through their model, and this module tells ``DistributedOptimizer`` which step
that is: the padding ranks send zeros, and the average is taken over the ranks that
had real data. The padding sample moves no parameter and is never recorded as
processed.

A step is identified by counting the optimizer steps taken since the sampler last
resharded (a new epoch, a restore, a sync): one batch per step, as in a training loop.
"""
from __future__ import annotations

import weakref
from typing import Protocol


class StepWeights(Protocol):
    def step_weight(self, steps_taken: int) -> tuple[float, int] | None: ...


_steps = 0
_sources: "weakref.WeakSet[StepWeights]" = weakref.WeakSet()


def step_taken() -> None:
    """A distributed optimizer finished a step."""
    global _steps
    _steps += 1


def steps() -> int:
    """Optimizer steps taken in this process so far."""
    return _steps


def register(source: StepWeights) -> None:
    """``source.step_weight(steps())`` is asked for every step from now on (weakly held)."""
    _sources.add(source)


def weight() -> tuple[float, int] | None:
    """For the step now running: (this rank's weight, 0 or 1; how many ranks have real
    data), or None when every rank's data counts."""
    for source in list(_sources):
        w = source.step_weight(_steps)
        if w is not None:
            return w
    return None
