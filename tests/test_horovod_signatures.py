"""Horovod 0.28.1's functions and classes, called with positional arguments, bind the
same way under hvdlite: each hvdlite signature starts with Horovod's positional
parameters, in Horovod's order (hvdlite may add parameters after them).

The table lists Horovod 0.28.1's parameter names, read from its source distribution
on PyPI (``horovod-0.28.1.tar.gz``). Each module is imported in its own process, so
PyTorch and TensorFlow never share one."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

HOROVOD_0_28_1 = {
    "hvdlite.runner": {
        "run": 'func args kwargs num_proc min_num_proc max_num_proc slots reset_limit cooldown_range hosts hostfile host_discovery_script start_timeout ssh_port ssh_identity_file disable_cache output_filename verbose use_gloo use_mpi mpi_args network_interface network_interfaces executable np min_np max_np',
    },
    "hvdlite.torch": {
        "DistributedOptimizer": 'optimizer named_parameters compression backward_passes_per_step op gradient_predivide_factor num_groups groups sparse_as_dense process_set',
        "SyncBatchNorm": 'num_features eps momentum affine track_running_stats',
        "allgather": 'tensor name process_set',
        "allgather_async": 'tensor name process_set',
        "allgather_object": 'obj name',
        "allreduce": 'tensor average name compression op prescale_factor postscale_factor process_set',
        "allreduce_": 'tensor average name op prescale_factor postscale_factor process_set',
        "allreduce_async": 'tensor average name op prescale_factor postscale_factor process_set',
        "allreduce_async_": 'tensor average name op prescale_factor postscale_factor process_set',
        "alltoall": 'tensor splits name process_set',
        "alltoall_async": 'tensor splits name process_set',
        "barrier": 'process_set',
        "broadcast": 'tensor root_rank name process_set',
        "broadcast_": 'tensor root_rank name process_set',
        "broadcast_async": 'tensor root_rank name process_set',
        "broadcast_async_": 'tensor root_rank name process_set',
        "broadcast_object": 'obj root_rank name process_set',
        "broadcast_optimizer_state": 'optimizer root_rank model',
        "broadcast_parameters": 'params root_rank',
        "grouped_allgather": 'tensors name process_set',
        "grouped_allgather_async": 'tensors name process_set',
        "grouped_allreduce": 'tensors average name compression op prescale_factor postscale_factor process_set',
        "grouped_allreduce_": 'tensors average name op prescale_factor postscale_factor process_set',
        "grouped_allreduce_async": 'tensors average name op prescale_factor postscale_factor process_set',
        "grouped_allreduce_async_": 'tensors average name op prescale_factor postscale_factor process_set',
        "grouped_reducescatter": 'tensors name compression op process_set prescale_factor postscale_factor',
        "grouped_reducescatter_async": 'tensors name op process_set prescale_factor postscale_factor',
        "init": '',
        "join": 'device',
        "poll": 'handle',
        "reducescatter": 'tensor name compression op process_set prescale_factor postscale_factor',
        "reducescatter_async": 'tensor name op process_set prescale_factor postscale_factor',
        "shutdown": '',
        "sparse_allreduce_async": 'tensor name op process_set',
        "synchronize": 'handle',
    },
    "hvdlite.tensorflow": {
        "DistributedGradientTape": 'gradtape device_dense device_sparse compression sparse_as_dense op gradient_predivide_factor num_groups groups process_set scale_local_gradients',
        "DistributedOptimizer": 'optimizer name use_locking device_dense device_sparse compression sparse_as_dense backward_passes_per_step op gradient_predivide_factor average_aggregated_gradients num_groups groups process_set scale_local_gradients',
        "PartialDistributedGradientTape": 'gradtape device_dense device_sparse compression sparse_as_dense op gradient_predivide_factor num_groups groups process_set local_layers scale_local_gradients',
        "SyncBatchNormalization": 'fused',
        "allgather": 'tensor name ignore_name_scope process_set',
        "allgather_object": 'obj session name process_set',
        "allreduce": 'tensor average device_dense device_sparse compression op prescale_factor postscale_factor name process_set ignore_name_scope',
        "alltoall": 'tensor splits name ignore_name_scope process_set',
        "broadcast": 'tensor root_rank name ignore_name_scope process_set',
        "broadcast_": 'variables root_rank name process_set',
        "broadcast_global_variables": 'root_rank',
        "broadcast_object": 'obj root_rank session name process_set',
        "broadcast_object_fn": 'root_rank session name process_set',
        "broadcast_variables": 'variables root_rank process_set inplace',
        "grouped_allgather": 'tensors name ignore_name_scope process_set',
        "grouped_allreduce": 'tensors average device_dense device_sparse compression op prescale_factor postscale_factor process_set ignore_name_scope name',
        "grouped_reducescatter": 'tensors device_dense compression op process_set prescale_factor postscale_factor',
        "init": '',
        "join": '',
        "local_rank_op": 'name',
        "local_size_op": 'name',
        "process_set_included_op": 'process_set_id name',
        "rank_op": 'name',
        "reducescatter": 'tensor device_dense compression op name process_set ignore_name_scope prescale_factor postscale_factor',
        "size_op": 'process_set_id name',
    },
    "hvdlite.tensorflow.keras": {
        "BestModelCheckpoint": 'monitor verbose save_weights_only mode save_freq',
        "BroadcastGlobalVariablesCallback": 'root_rank device local_variables',
        "DistributedOptimizer": 'optimizer name device_dense device_sparse compression sparse_as_dense gradient_predivide_factor op backward_passes_per_step average_aggregated_gradients num_groups groups process_set scale_local_gradients',
        "LearningRateScheduleCallback": 'initial_lr multiplier start_epoch end_epoch staircase momentum_correction steps_per_epoch',
        "LearningRateWarmupCallback": 'initial_lr warmup_epochs momentum_correction steps_per_epoch verbose',
        "MetricAverageCallback": 'device',
        "allgather": 'value name',
        "allreduce": 'value name average prescale_factor postscale_factor op compression',
        "broadcast": 'value root_rank name',
        "broadcast_global_variables": 'root_rank',
        "load_model": 'filepath custom_optimizers custom_objects compression legacy_opts',
        "reducescatter": 'value name op',
    },
}

_PROBE = """
import inspect, json, sys, importlib
mod = importlib.import_module(sys.argv[1])
out = {}
for name in json.loads(sys.argv[2]):
    obj = getattr(mod, name, None)
    if obj is None:
        out[name] = None
        continue
    sig = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    out[name] = [p.name for p in sig.parameters.values() if p.name != "self" and p.kind in
                 (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
print(json.dumps(out))
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("module", sorted(HOROVOD_0_28_1))
def test_positional_parameters_follow_horovod(module: str) -> None:
    framework = module.split(".")[1]
    if framework in ("torch", "tensorflow") and importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed (pip install hvdlite[{framework}])")
    want = {name: params.split() for name, params in HOROVOD_0_28_1[module].items()}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", _PROBE, module, json.dumps(sorted(want))],
                          capture_output=True, text=True, timeout=280, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    wrong = {name: {"horovod": params, "hvdlite": got[name]} for name, params in want.items()
             if got[name] is None or got[name][:len(params)] != params}
    assert not wrong, f"{module}: positional parameters differ from Horovod 0.28.1: {wrong}"


_TF_ARGUMENTS = """
import keras, pytest
import hvdlite.tensorflow as hvd
import hvdlite.tensorflow.keras as hvdk
hvd.init()
# horovod.tensorflow.DistributedOptimizer positionally: name, use_locking, device_dense,
# device_sparse, compression, sparse_as_dense, backward_passes_per_step, op.
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), "dist_sgd", False, "", "",
                               hvd.Compression.fp16, True, 3, hvd.Sum)
o = opt._hvd_options
assert opt.name == "dist_sgd", opt.name
assert (o["compression"], o["sparse_as_dense"], o["backward_passes_per_step"], o["op"]) == \\
    (hvd.Compression.fp16, True, 3, hvd.Sum), o
layer = hvd.SyncBatchNormalization(False, axis=1, momentum=0.5)
assert (layer.axis, layer.momentum) == (1, 0.5), (layer.axis, layer.momentum)
for fused in (True, None):
    with pytest.raises(ValueError, match="does not support fused"):
        hvd.SyncBatchNormalization(fused)
with pytest.raises(ValueError, match="no legacy optimizers"):
    hvdk.load_model("never-read.keras", None, None, hvd.Compression.none, True)
assert hvd.ProcessSet(ranks_or_comm=[0, 1]).ranks == [0, 1]
print("checked")
"""


@pytest.mark.timeout(300)
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                    reason="tensorflow is not installed (pip install hvdlite[tensorflow])")
def test_tensorflow_accepts_horovod_only_arguments() -> None:
    """Arguments Horovod takes that mean nothing under Keras 3 are accepted where Horovod
    accepts them, and refused with a clear error where Horovod refuses them (``fused``)
    or where Keras 3 has no counterpart (``legacy_opts=True``); positional arguments of
    ``hvd.DistributedOptimizer`` reach the Keras wrapper."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", _TF_ARGUMENTS], capture_output=True,
                          text=True, timeout=280, env=env)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("checked"), proc.stderr[-3000:]
