"""A step's time on a GPU this machine need not have: PyTorch's ``RuntimeEstimator`` roofline with the
chosen GPU's published peaks. Per operator the larger of its compute time (FLOPs at 75% of peak) and
its bytes at the HBM bandwidth. Unlike it: a DTensor is priced by its local shard, collectives are
left to ``planning.timing``, CPU flash attention is priced as CUDA's.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only
from torch.utils._runtime_estimation import _FLOAT_TYPES, _IGNORE_OPS, get_num_bytes
from torch.utils.flop_counter import flop_registry

from .figures import GPU

aten = torch.ops.aten
FLOPS = {
    **flop_registry,
    aten._scaled_dot_product_flash_attention_for_cpu: flop_registry[aten._scaled_dot_product_flash_attention],
    aten._scaled_dot_product_flash_attention_for_cpu_backward: flop_registry[
        aten._scaled_dot_product_flash_attention_backward
    ],
}
COLLECTIVES = ("c10d", "_c10d_functional", "_c10d_functional_autograd", "_dtensor")
COMPUTE_SHARE = 0.75
"""``torch.utils._runtime_estimation.flops_to_ns``: the share of peak a roofline operator reaches."""


class Roofline(TorchDispatchMode):
    """Sums ``seconds``, the roofline time of every operator run under it, on ``gpu``."""

    def __init__(self, gpu: GPU) -> None:
        super().__init__()
        self.gpu = gpu
        self.seconds = 0.0

    def _peak(self, dtype: torch.dtype) -> float:
        return self.gpu.bf16_flops if dtype in (torch.bfloat16, torch.float16) else self.gpu.fp32_flops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in _IGNORE_OPS or func.namespace in COLLECTIVES:
            return out
        args, kwargs, local_out = tree_map_only(DTensor, DTensor.to_local, (args, kwargs, out))
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_flatten(local_out)[0] if isinstance(t, torch.Tensor)]
        if not outputs:  # a query (prim.device, sym sizes) moves no data
            return out
        transfer = sum(get_num_bytes(t) for t in inputs + outputs) / self.gpu.hbm_bytes_per_s
        compute = 0.0
        dtypes = {t.dtype for t in outputs if t.dtype in _FLOAT_TYPES}
        if packet in FLOPS and len(dtypes) == 1:
            flops = FLOPS[packet](*args, **kwargs, out_val=local_out)
            compute = flops / 2 / (COMPUTE_SHARE * self._peak(dtypes.pop()))
        self.seconds += max(transfer, compute)
        return out
