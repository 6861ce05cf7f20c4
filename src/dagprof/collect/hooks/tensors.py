"""What the collector's hooks read off torch objects: the tensors in a module's output, the storage behind a wrapper
tensor, the bytes a forward returned, a process group's ranks. Duck-typed, so importing this imports no torch."""
from __future__ import annotations

from typing import Any


def output_tensors(output: Any):
    """Tensors in a module output (tensor, tuple/list, dict), shallow."""
    if hasattr(output, "register_hook"):
        yield output
    elif isinstance(output, (tuple, list)):
        for y in output:
            if hasattr(y, "register_hook"):
                yield y
    elif isinstance(output, dict):
        for y in output.values():
            if hasattr(y, "register_hook"):
                yield y


def local_tensor(tensor: Any) -> Any:
    """The tensor holding the data of a wrapper subclass (a DTensor's local shard, an async collective's result:
    the wrapper has no storage of its own), else the tensor itself."""
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is None:
        return tensor
    inner, _ = flatten()
    return local_tensor(getattr(tensor, inner[0])) if inner else tensor


def storage_ptr(p: Any) -> int:
    """Where a parameter's storage lives: a DTensor's local shard's; 0 for none."""
    try:
        return local_tensor(p).untyped_storage().data_ptr()
    except RuntimeError:
        return 0


def output_bytes(output: Any) -> int:
    """Bytes of the tensors a forward returned (nested in tuples, lists and dicts), each storage once."""
    return sum(output_storages(output).values())


def output_storages(output: Any) -> dict[int, int]:
    """Storage -> bytes of the tensors a forward returned (nested in tuples, lists and dicts)."""
    seen: dict[int, int] = {}
    stack = [output]
    while stack:
        x = stack.pop()
        if isinstance(x, (tuple, list)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif hasattr(x, "untyped_storage"):
            storage = local_tensor(x).untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return seen


def group_ranks(group: Any) -> list[int]:
    """Global ranks of a process group ([] when torch cannot say)."""
    try:
        import torch.distributed as dist

        return [int(r) for r in dist.get_process_group_ranks(group)]
    except Exception:  # noqa: BLE001  (an old torch or a custom group: the reader assumes every rank)
        return []
