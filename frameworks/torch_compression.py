"""Gradient compression for the PyTorch adapters, and the bytes they send.

Every function here hands a buffer to a collective and, at that point,
reports the buffer's size to the phase recorder, so that ``comm_bytes`` is
what was handed to the network, measured, never assumed:
- DDP: one communication hook per run that compresses, exchanges and
  reports each gradient bucket (to ``collective``, which event tracers see);
- Horovod: a Compressor wrapper that reports the tensors Horovod's
  optimizer all-reduces, and an all-gather exchange for the int8 codecs.

fp16 and bf16 are torch's casts (round to nearest even, as
frameworks/compression.py states); the int8 codecs are the numpy ones of
frameworks/compression.py, run on the host: on a GPU each bucket is copied
to the host and back for them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from frameworks import compression

WIRE_DTYPES = {"none": None, "fp16": "float16", "bf16": "bfloat16"}


def _torch_dtype(name: str | None):
    import torch

    return getattr(torch, name) if name else None


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _payload(name: str, tensor):
    """A gather codec's payload of one tensor, as a uint8 tensor on its device."""
    import torch

    data = compression.encode(name, tensor.detach().float().cpu().numpy().ravel())
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(tensor.device)


# --- DDP ------------------------------------------------------------------


@dataclass
class HookState:
    name: str  # the compression
    phases: object  # the run's PhaseRecorder


def ddp_hook(name: str, phases):
    """``(state, hook)`` for DDP's register_comm_hook, for one compression."""
    hook = _gather_hook if compression.CODECS[name].gathers else _allreduce_hook
    return HookState(name, phases), hook


def _allreduce_hook(state: HookState, bucket):
    """DDP's default all-reduce when ``dtype`` is None; otherwise what torch's
    fp16_compress_hook / bf16_compress_hook do (cast, divide, all-reduce,
    cast back), written out so the tensor handed over is the one measured."""
    import torch.distributed as dist

    group, phases = dist.group.WORLD, state.phases
    dtype = _torch_dtype(WIRE_DTYPES[state.name])
    buffer = bucket.buffer()
    wire = buffer if dtype is None else buffer.to(dtype)
    wire.div_(dist.get_world_size(group))
    nbytes, start = _nbytes(wire), time.perf_counter_ns()
    future = dist.all_reduce(wire, group=group, async_op=True).get_future()

    def done(fut):
        phases.collective("allreduce", nbytes, start, time.perf_counter_ns())
        return buffer if wire is buffer else buffer.copy_(fut.value()[0])

    return future.then(done)


def _gather_hook(state: HookState, bucket):
    """int8 codecs: every rank's payload to every rank, each decodes them all
    and averages. The variable-length payloads (lossless) are padded to the
    longest after an all-gather of the lengths (gloo gathers equal sizes)."""
    import torch
    import torch.distributed as dist

    group, phases, name = dist.group.WORLD, state.phases, state.name
    buffer = bucket.buffer()
    payload = _payload(name, buffer)
    lengths = [payload.numel()] * dist.get_world_size(group)
    if name == "int8+lossless":
        lengths = _gather_lengths(payload, group, phases)
        padded = torch.zeros(max(lengths), dtype=torch.uint8, device=buffer.device)
        padded[: payload.numel()] = payload
        payload = padded
    outputs = [torch.empty_like(payload) for _ in lengths]
    nbytes, start = _nbytes(payload), time.perf_counter_ns()
    future = dist.all_gather(outputs, payload, group=group, async_op=True).get_future()

    def done(fut):
        phases.collective("allgather", nbytes, start, time.perf_counter_ns())
        received = [out.cpu().numpy()[:n] for out, n in zip(outputs, lengths)]
        mean = compression.average_payloads(name, received)
        return buffer.copy_(torch.from_numpy(mean))

    return future.then(done)


def _gather_lengths(payload, group, phases) -> list[int]:
    import torch
    import torch.distributed as dist

    mine = torch.tensor([payload.numel()], dtype=torch.int64, device=payload.device)
    everyone = [torch.empty_like(mine) for _ in range(group.size())]
    start = time.perf_counter_ns()
    dist.all_gather(everyone, mine, group=group)
    phases.collective("allgather", _nbytes(mine), start, time.perf_counter_ns())
    return [int(n) for n in everyone]


# --- Horovod --------------------------------------------------------------


def horovod_compressor(name: str, phases):
    """Horovod's own compressor for a cast codec, reporting the bytes of each
    tensor it hands to Horovod's all-reduce."""
    import horovod.torch as hvd

    inner = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[name]

    class Counting(hvd.compression.Compressor):
        @staticmethod
        def compress(tensor):
            compressed, ctx = inner.compress(tensor)
            phases.count_bytes(_nbytes(compressed))
            return compressed, ctx

        @staticmethod
        def decompress(tensor, ctx):
            return inner.decompress(tensor, ctx)

    return Counting


def horovod_gather_average(hvd, name: str, grads: list, phases) -> None:
    """int8 codecs on Horovod: one grouped all-gather of every gradient's
    payload (Horovod gathers different lengths itself; for the lossless
    variant each rank's lengths are gathered first), then every rank
    decodes and averages into the gradients in place."""
    import torch

    payloads = [_payload(name, g) for g in grads]
    mine = np.array([p.numel() for p in payloads], dtype=np.int64)
    start = time.perf_counter_ns()
    if name == "int8+lossless":
        sent = torch.from_numpy(mine)
        lengths = hvd.allgather(sent, name="grad.lengths").numpy().reshape(-1, len(grads))
        phases.collective("allgather", _nbytes(sent), start, time.perf_counter_ns())
    else:
        lengths = np.tile(mine, (hvd.size(), 1))
    start = time.perf_counter_ns()
    gathered = hvd.grouped_allgather(payloads, name="grad.payloads")
    phases.collective("allgather", sum(_nbytes(p) for p in payloads), start, time.perf_counter_ns())
    for i, (grad, joined) in enumerate(zip(grads, gathered)):
        bounds = np.concatenate([[0], np.cumsum(lengths[:, i])])
        flat = joined.cpu().numpy()
        received = [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        mean = compression.average_payloads(name, received)
        grad.copy_(torch.from_numpy(mean).view_as(grad))
