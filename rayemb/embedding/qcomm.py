"""Exchange precision: the embedding exchanges and the gradient all-reduce sent in 16 bits.

``train.comm_precision: {forward: fp32|bf16|fp16, backward: fp32|bf16|fp16}`` sets the element type on the
wire of what a step exchanges as floats, per direction:

* sharded tables: TorchRec's quantized-comm codecs (``QCommsConfig``, one
  ``QuantizedCommCodecs`` per collective, handed to the sharders as ``qcomm_codecs_registry``) encode the
  pooled all-to-all (table-, column-wise, and the node-crossing step of table-row-wise), the row-wise
  reduce-scatter and the sequence all-to-all that moves a hybrid table's cold rows, and decode on arrival:
  ``forward`` is the looked-up rows' precision, ``backward`` their gradients';
* replicated parameters (hybrid hot rows, data-parallel tables, the dense layers): their gradients'
  all-reduce through DDP's ``bf16_compress_hook`` / ``fp16_compress_hook`` when ``backward`` is 16-bit
  (on a torch without CUDA, where DDP refuses its bf16 hook, :func:`bf16_allreduce_hook`: the same cast).
  An all-reduce has no forward: ``forward`` does not apply to it.

Ids, lengths and split sizes stay integers. The tables, the optimizers and the arithmetic on either side
stay fp32: only the wire tensor is 16-bit (:class:`~rayemb.embedding.comm.CommCounter` counts it so).

CPU and GPU run the same codecs: FBGEMM's fp16/bf16 encoders are a clamp and a cast in plain torch
(``fbgemm_gpu.quantize_utils``), and gloo (torch 2.13) all-to-alls, reduce-scatters and all-reduces
bf16 and fp16 tensors. TorchRec's ``get_qcomm_codecs_registry`` nevertheless swaps bf16 for fp16 on a
CPU device (written for an older gloo), so :func:`qcomm_codecs_registry` builds the registry from
``get_qcomm_codecs`` itself and a bf16 job sends bf16 on gloo as it does on NCCL.

Example::

    >>> p = CommPrecision.of({"forward": "bf16", "backward": "bf16"})
    >>> sharders = cpu_capable_sharders(p)             # codecs on the sharded tables' exchanges
    >>> wrapper = OneDataParallelWrapper(allreduce_comm_precision=p.allreduce)   # the DDP's hook
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Union

from rayemb.errors import ConfigError

#: bytes per element on the wire
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: the values each direction of ``train.comm_precision`` takes
COMM_PRECISIONS = tuple(ELEMENT_BYTES)
#: the directions of ``train.comm_precision``
DIRECTIONS = ("forward", "backward")


@dataclass(frozen=True)
class CommPrecision:
    """The wire precision of each direction (``train.comm_precision``); fp32 both ways changes nothing."""

    forward: str = "fp32"
    backward: str = "fp32"

    def __post_init__(self) -> None:
        for direction in DIRECTIONS:
            value = getattr(self, direction)
            if value not in COMM_PRECISIONS:
                raise ConfigError(f"Invalid config value train.comm_precision.{direction}: {value!r} is unknown. "
                                  f"Use one of {COMM_PRECISIONS}.")

    @classmethod
    def of(cls, value: Union[None, "CommPrecision", Mapping[str, str]]) -> "CommPrecision":
        """From ``train.comm_precision`` (a mapping; a direction left out is fp32), or as it is."""
        if value is None:
            return cls()
        if isinstance(value, CommPrecision):
            return value
        return cls(**{d: str(value[d]) for d in DIRECTIONS if d in value})

    @property
    def is_fp32(self) -> bool:
        return self.forward == self.backward == "fp32"

    @property
    def forward_bytes(self) -> int:
        """Bytes per element of the looked-up rows on the wire."""
        return ELEMENT_BYTES[self.forward]

    @property
    def backward_bytes(self) -> int:
        """Bytes per element of their gradients (and of the all-reduced gradients) on the wire."""
        return ELEMENT_BYTES[self.backward]

    @property
    def allreduce(self) -> Optional[str]:
        """The gradient all-reduce's precision as TorchRec's ``DefaultDataParallelWrapper`` takes it (None: fp32)."""
        return None if self.backward == "fp32" else self.backward


def qcomm_codecs_registry(precision: Union[None, CommPrecision, Mapping[str, str]]) -> Optional[Dict[str, Any]]:
    """TorchRec's ``qcomm_codecs_registry`` for the sharders: the pooled all-to-all, the row-wise reduce-scatter and
    the sequence all-to-all encoded at ``precision`` (None at fp32 both ways: TorchRec's plain exchanges)."""
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs
    from torchrec.distributed.types import CommOp

    p = CommPrecision.of(precision)
    if p.is_fp32:
        return None
    config = QCommsConfig(forward_precision=CommType(p.forward), backward_precision=CommType(p.backward))
    ops = (CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL, CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER,
           CommOp.SEQUENCE_EMBEDDINGS_ALL_TO_ALL)
    return {op.name: get_qcomm_codecs(config) for op in ops}


# No annotations: DDP's _check_comm_hook compares them to real types, and postponed (string) ones fail it.
def bf16_allreduce_hook(process_group, bucket):  # type: ignore[no-untyped-def]
    """``bf16_compress_hook`` for torch builds without CUDA: the bucket cast to bf16, divided by the group size,
    all-reduced, copied back.

    DDP refuses its own ``bf16_compress_hook`` (by name) unless torch was built with CUDA and NCCL 2.10+,
    although gloo all-reduces bf16 tensors; this is the same hook under another name.
    """
    import torch
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    wire = buffer.to(torch.bfloat16).div_(group.size())

    def decompress(fut):  # type: ignore[no-untyped-def]
        buffer.copy_(fut.value()[0])
        return buffer

    return dist.all_reduce(wire, group=group, async_op=True).get_future().then(decompress)


def compress_hooks() -> Dict[str, Callable[..., Any]]:
    """``allreduce_comm_precision`` -> the DDP comm hook that all-reduces gradients in it: DDP's
    ``bf16_compress_hook`` / ``fp16_compress_hook``, or :func:`bf16_allreduce_hook` where torch has no CUDA."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    cuda_build = torch.version.cuda is not None or torch.version.hip is not None
    return {"bf16": default_hooks.bf16_compress_hook if cuda_build else bf16_allreduce_hook,
            "fp16": default_hooks.fp16_compress_hook}


def compress_hook(allreduce_comm_precision: Optional[str]) -> Optional[Callable[..., Any]]:
    """The DDP comm hook that all-reduces gradients as ``bf16`` / ``fp16`` (None: fp32, DDP's own all-reduce)."""
    if allreduce_comm_precision in (None, "fp32"):
        return None
    hooks = compress_hooks()
    if allreduce_comm_precision not in hooks:
        raise ValueError(f"allreduce_comm_precision {allreduce_comm_precision!r}: use None, 'bf16' or 'fp16'")
    return hooks[allreduce_comm_precision]


__all__ = ["COMM_PRECISIONS", "CommPrecision", "DIRECTIONS", "ELEMENT_BYTES", "bf16_allreduce_hook", "compress_hook",
           "compress_hooks", "qcomm_codecs_registry"]
