"""Whether a call puts a tensor (or a module) on the GPU: the one test of "a move to the
device" that the rules share (data_loading: a dataset whose samples are device tensors, and
GD205's copy of a pinned batch; device_data: a DataLoader over a tensor already on the GPU;
moved_later: a value the step moves to the GPU afterwards was host memory before; host_sync:
a `.to(device)` of host memory is back on the GPU; host_batch: `batch.to(device)` moves a
PyG batch in place). Its companion `cuda_index` says whether a value is an integer CUDA
device index (`.to(local_rank)`, `device=self.gpu_id`): the file uses CUDA (context), a
device is placed by index (ddp_setup).

It replaces seven tests that disagreed on the edge cases (`_moves_to_device` of
data_loading, `_is_move` of moved_later, `_MOVE` of device_data; then host_sync's
`_names_device`, GD205's `.to` / `.cuda` filter, host_batch's in-place move and
`conditions.is_device_index`; fourteenth session).
Static code never says where a variable device points, so a device slot filled with a
variable is taken for the GPU in the training jobs the linter reads, unless the name says
CPU; a positional `.to(x)` is a move only when `x` looks like a device, because `.to()`
also takes a dtype (`.to(torch.float16)`) or another tensor.
"""

from __future__ import annotations

import ast
import re

from gpudiag.lint.lint_names import keyword, terminal_name

# a name that holds a device: `device`, `self.device`, `x.device`, `accelerator.device`,
# `get_device()`, `dist_util.dev()`, `device_type`
_DEVICE_NAME = re.compile(r"device|cuda|gpu|(^|_)dev($|_)", re.I)
# a name that holds an integer CUDA index: `local_rank`, `rank`, `self.gpu_id`, `args.gpu`,
# `device_id`, `LOCAL_RANK` (of `os.environ`), `ddp_local_rank`, `gpu_index`
_INDEX_NAME = re.compile(
    r"rank(_?(id|idx|index))?$|^(local_)?(gpu|dev|device)_?(id|idx|index)$|^(local_)?gpu$"
    r"|^local_device$",
    re.I,
)
# a name that says the device is not a GPU (`cpu_device`, `args.cpu`), or names a dtype
_NOT_GPU_NAME = re.compile(r"cpu|dtype", re.I)
# helpers named for the move: `to_cuda(x, y)` (XLM), `self.batch_to_gpu(b)`
_MOVE_HELPER = re.compile(r"(^|_)to_?(cuda|gpu)$", re.I)
# helpers that move to the device they are given: `utils.batch_to_device(batch, self._device)`
_DEVICE_HELPER = re.compile(r"(^|_)to_?device$", re.I)


def moves_to_gpu(node: ast.AST, qualified: str | None = None) -> bool:
    """Whether `node` is a call whose result is on a CUDA device, copied there or made there.

    A move:
    - `x.cuda()`, with any arguments (`.cuda(rank)`, `.cuda(non_blocking=True)`);
    - `x.to(d)` / `x.to(d, dtype=...)` / `x.to(device=d)` where `d` is a GPU device: a
      `"cuda"` / `"cuda:N"` string (also `f"cuda:{rank}"`, `"cuda:" + str(rank)`), an
      integer (`.to(0)`, `.to(local_rank)`: an integer device is a CUDA index),
      `torch.device("cuda", i)`, or a variable named for a device or a CUDA index
      (`device`, `self.device`, `x.device`, `accelerator.device`, `dist_util.dev()`,
      `self.gpu_id`, `int(os.environ["LOCAL_RANK"])`); a `device=` keyword holds a device
      whatever its name, so any value there counts unless it names the CPU or is `None`;
      one branch of `d if cond else "cpu"` is enough (the job runs on the GPU in that mode);
    - `x.type(torch.cuda.FloatTensor)` / `x.type("torch.cuda.HalfTensor")`;
    - a helper named for the move, `to_cuda(x)`, `batch_to_gpu(b)`, or `*to_device(b, d)`
      given a GPU device as above;
    - with `qualified` (the call's resolved name, `ModuleContext.call_names`): a torch
      function given a GPU device (`torch.tensor(data, device=device)`,
      `torch.randint(..., device=device)`; not a class such as `torch.amp.GradScaler` or
      `torch.Generator` given a device: no tensor), or a `torch.cuda.*Tensor(data)`.

    Not a move: `.to(dtype)` / `.to(torch.float16)` / `.to(x.dtype)` (a cast on the same
    device), `.to(memory_format=...)` (a layout change), `.pin_memory()` (page-locked host
    memory: it makes the later copy asynchronous, it copies nothing to the GPU),
    `.to("cpu")` / `.cpu()` / `.to(cpu_device)` (a move away from the GPU), `.to(other)`
    of a tensor not named for a device (the device of a tensor the linter cannot place),
    and helpers that only mention CUDA (`_sync_cuda()`, `have_cuda()`).
    """
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = terminal_name(func)
    if isinstance(func, ast.Attribute) and name == "cuda":
        return True
    device = keyword(node, "device")
    if isinstance(func, ast.Attribute) and name == "to":
        if device is not None:
            return _gpu_device(device, slot=True)
        return bool(node.args) and _gpu_device(node.args[0], slot=False)
    if isinstance(func, ast.Attribute) and name == "type" and node.args:
        text = ast.unparse(node.args[0])
        return "cuda" in text and "Tensor" in text
    if _MOVE_HELPER.search(name):
        return True
    if _DEVICE_HELPER.search(name):
        given = [device] if device is not None else node.args[1:]
        return any(_gpu_device(arg, slot=True) for arg in given)
    qualified = qualified or ""
    if qualified.startswith("torch.cuda.") and qualified.endswith("Tensor"):
        return True
    function = qualified.rsplit(".", 1)[-1]
    return (
        qualified.startswith("torch.")
        and function[:1].islower()  # a function, not a class (`torch.amp.GradScaler(device=)`)
        and device is not None
        and _gpu_device(device, slot=True)
    )


def _gpu_device(value: ast.expr, slot: bool) -> bool:
    """Whether `value`, given where a device goes, is a GPU. `slot`: the place only takes a
    device (`device=`, `torch.device(...)`), so any value not known to be the CPU counts;
    otherwise (`.to(x)` positionally) the value must look like a device."""
    if cuda_index(value):
        return True
    if isinstance(value, ast.Constant):
        return isinstance(value.value, str) and value.value.startswith("cuda")
    if isinstance(value, ast.JoinedStr):  # f"cuda:{rank}", f"{device}"
        first = value.values[0] if value.values else None
        if isinstance(first, ast.FormattedValue):
            return _gpu_device(first.value, slot)
        return isinstance(first, ast.Constant) and str(first.value).startswith("cuda")
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):  # "cuda:" + str(rank)
        return _gpu_device(value.left, slot)
    if isinstance(value, ast.IfExp):  # `device if args.mode == "puregpu" else "cpu"`
        return _gpu_device(value.body, slot) or _gpu_device(value.orelse, slot)
    if isinstance(value, ast.Starred):
        return False
    if isinstance(value, ast.Call):
        name = terminal_name(value.func)
        if name == "device":  # torch.device("cuda", local_rank), torch.device(type="cpu")
            given = value.args[0] if value.args else keyword(value, "type")
            return given is not None and _gpu_device(given, slot=True)
    if isinstance(value, ast.Subscript):  # devices[rank], os.environ["LOCAL_RANK"]
        key = value.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return _named_gpu(key.value, slot)
        return _gpu_device(value.value, slot)
    return _named_gpu(terminal_name(value.func if isinstance(value, ast.Call) else value), slot)


def _named_gpu(name: str, slot: bool) -> bool:
    """A value known by its name: not one named for the CPU or a dtype; in a device slot
    anything else, otherwise a name that says device (a CUDA index is `cuda_index`'s)."""
    if _NOT_GPU_NAME.search(name):
        return False
    return slot or bool(_DEVICE_NAME.search(name))


def cuda_index(value: ast.AST) -> bool:
    """Whether `value` is an integer CUDA device index: `.to(0)`, `.to(local_rank)`,
    `device=self.gpu_id`, `torch.device(args.gpu)`, `int(os.environ["LOCAL_RANK"])`,
    `cfg["local_rank"]`, `dist.get_rank()`. PyTorch reads an integer in a device slot as
    `cuda:<n>`, so such a value names a GPU whatever the machine, unlike a device variable
    (`device`, which may hold the CPU). Not a bool (`.to(True)`), a name for the CPU, a
    device object or a list of devices (`device`, `devices[rank]`, `gpus`)."""
    if isinstance(value, ast.Constant):
        return type(value.value) is int
    if isinstance(value, ast.Call):
        name = terminal_name(value.func)  # dist.get_rank(), get_local_rank()
        if name == "int":  # int(os.environ["LOCAL_RANK"]): an int, whatever it converts
            return len(value.args) == 1
    elif isinstance(value, ast.Subscript):  # cfg["local_rank"], cfg["gpu_id"]
        key = value.slice
        name = key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else ""
    else:
        name = terminal_name(value)
    return bool(_INDEX_NAME.search(name)) and not _NOT_GPU_NAME.search(name)
