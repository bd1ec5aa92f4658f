"""The one "does this call put a tensor on the GPU?" test of the linter
(`gpudiag.lint.device_moves.moves_to_gpu`) and its companion "is this an integer CUDA
index?" (`cuda_index`), over the edge cases on which the tests they replaced disagreed
(data_loading's `_moves_to_device` and GD205 filter, moved_later's `_is_move`,
device_data's `_MOVE`, host_sync's `_names_device`, host_batch's in-place move,
`conditions.is_device_index`; fourteenth session). Each row: the expression, the call's
resolved name where it matters (a torch function), the answer, and why."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpudiag.lint import lint_paths
from gpudiag.lint.device_moves import cuda_index, moves_to_gpu

CASES: list[tuple[str, str | None, bool, str]] = [
    # .cuda(), whatever its arguments
    ("x.cuda()", None, True, "the move itself"),
    ("x.cuda(non_blocking=True)", None, True, "asynchronous, still a move"),
    ("tensor.cuda(rank)", None, True, "to the rank's GPU"),
    ("x.cuda(args.gpu, non_blocking=True)", None, True, "an index and a flag"),
    ("model.cuda(device=cur_device)", None, True, "a module moves too"),
    # .to(<string>)
    ('x.to("cuda")', None, True, "the current CUDA device"),
    ('x.to("cuda:1")', None, True, "a CUDA device by index"),
    ('x.to(f"cuda:{rank}")', None, True, "an f-string naming a CUDA device"),
    ('x.to(f"cuda:{local_rank}", non_blocking=True)', None, True, "the same, asynchronous"),
    ('x.to("cuda:" + str(rank))', None, True, "a concatenated CUDA device string"),
    ('x.to(f"{device}")', None, True, "an f-string of a device variable"),
    ('x.to("cpu")', None, False, "a move away from the GPU"),
    ('x.to("cpu", dtype=torch.float32)', None, False, "away, and a cast"),
    ('x.to(f"cpu:{i}")', None, False, "a CPU device string"),
    ('x.to("mps")', None, False, "Apple's GPU, not CUDA"),
    ('x.to("meta")', None, False, "no memory at all"),
    # .to(<variable>)
    ("x.to(device)", None, True, "a device variable: the GPU in a training job"),
    ("x.to(device, non_blocking=True)", None, True, "the same, asynchronous"),
    ("batch.to(self.device)", None, True, "an attribute holding the device"),
    ("x.to(args.device)", None, True, "an option holding the device"),
    ("x.to(accelerator.device)", None, True, "accelerate's device: the rank's GPU"),
    ("x.to(x.device)", None, True, "another tensor's device (the step's GPU)"),
    ("x.to(next(self.parameters()).device)", None, True, "the model's device"),
    ("x.to(device_type)", None, True, "nanoGPT's 'cuda' / 'cpu' string"),
    ("x.to(local_rank)", None, True, "an integer device is a CUDA index"),
    ("x.to(self.gpu_id)", None, True, "a CUDA index"),
    ("x.to(args.gpu)", None, True, "a CUDA index"),
    ("x.to(rank)", None, True, "a CUDA index"),
    ("x.to(0)", None, True, "an integer device is a CUDA index"),
    ('x.to(int(os.environ["LOCAL_RANK"]))', None, True, "the launcher's local rank"),
    ("x.to(int(args.which))", None, True, "an int in a device slot is a CUDA index"),
    ("x.to(dist.get_rank())", None, True, "the rank as a CUDA index"),
    ("x.to(args.gpu_index)", None, True, "a CUDA index"),
    ("x.to(ddp_local_rank)", None, True, "nanoGPT's local rank"),
    ('x.to(cfg["local_rank"])', None, True, "a CUDA index from a config"),
    ("x.to(True)", None, False, "a bool is no device"),
    ("x.to(devices[rank])", None, True, "one device of a list of them"),
    ('x.to(cfg["device"])', None, True, "a device from a config"),
    ('x.to(cfg["dtype"])', None, False, "a dtype from a config"),
    ('x.to(device=cfg["dev"])', None, True, "a device slot"),
    ('x.to(device=cfg["cpu"])', None, False, "a device slot named for the CPU"),
    ("x.to(dist_util.dev())", None, True, "a helper returning the device"),
    ("x.to(torch.cuda.current_device())", None, True, "the current CUDA index"),
    ("x.to(x.get_device())", None, True, "another tensor's CUDA index"),
    ('x.to(torch.device("cuda", local_rank))', None, True, "a CUDA torch.device"),
    ("x.to(torch.device(args.device))", None, True, "a torch.device of a device option"),
    ('x.to(torch.device("cpu"))', None, False, "a CPU torch.device"),
    ("x.to(cpu_device)", None, False, "a variable named for the CPU"),
    ('x.to(device if args.mode == "puregpu" else "cpu")', None, True, "the GPU in one mode"),
    # .to(device=...): any value there is a device
    ("x.to(device=device)", None, True, "the device keyword"),
    ("x.to(device=orig_device)", None, True, "whatever the name, a device, not the CPU"),
    ("x.to(device=c.device, dtype=c.dtype)", None, True, "device and dtype"),
    ('x.to(device="cpu")', None, False, "away from the GPU"),
    ("x.to(device=None)", None, False, "no device: the default (CPU)"),
    # .to() that is not a move
    ("x.to(dtype)", None, False, "a cast, same device"),
    ("x.to(torch.float16)", None, False, "a cast, same device"),
    ("x.to(torch.bfloat16)", None, False, "a cast, same device"),
    ("x.to(x.dtype)", None, False, "a cast to another tensor's dtype"),
    ("x.to(self.data_type)", None, False, "a cast"),
    ("x.to(parse_dtype(args.dtype))", None, False, "a cast"),
    ("x.to(dtype=torch.float32)", None, False, "a cast"),
    ("x.to(memory_format=torch.channels_last)", None, False, "a layout change"),
    ("x.to(scores)", None, False, "another tensor of unknown device"),
    ("x.to()", None, False, "nothing given"),
    ("x.to(*args)", None, False, "cannot be told"),
    # not moves: other methods
    ("x.pin_memory()", None, False, "page-locked host memory, no copy to the GPU"),
    ("x.cpu()", None, False, "away from the GPU"),
    ("x.float()", None, False, "a cast"),
    ("x.numpy()", None, False, "host memory"),
    # .type() with a CUDA tensor type
    ("x.type(torch.cuda.FloatTensor)", None, True, "a CUDA tensor type"),
    ('x.type("torch.cuda.HalfTensor")', None, True, "a CUDA tensor type by name"),
    ("x.type(torch.FloatTensor)", None, False, "a host tensor type"),
    ("x.type(dtype)", None, False, "a cast"),
    # helpers
    ("to_cuda(x, lengths)", None, True, "XLM's move helper"),
    ("self.to_cuda(batch)", None, True, "a move helper method"),
    ("batch_to_gpu(b)", None, True, "a move helper"),
    ("utils.batch_to_device(batch, self._device)", None, True, "torchtune's, to the device"),
    ('move_to_device(batch, "cpu")', None, False, "a device helper sent to the CPU"),
    ("_sync_cuda()", None, False, "only mentions CUDA"),
    ("have_cuda()", None, False, "only mentions CUDA"),
    ("wrap_with_cuda_graph(fn)", None, False, "only mentions CUDA"),
    ("torch.cuda.synchronize()", "torch.cuda.synchronize", False, "no tensor"),
    # torch functions given a device (with the resolved name)
    ("torch.tensor(data, device=device)", "torch.tensor", True, "copied to the GPU"),
    ("th.randint(0, 9, (4,), device=dev)", "torch.randint", True, "made on the device given"),
    ('torch.zeros(4, device="cuda")', "torch.zeros", True, "made on the GPU"),
    ('torch.zeros(4, device="cpu")', "torch.zeros", False, "made on the CPU"),
    ("torch.zeros(4, device=None)", "torch.zeros", False, "the default device"),
    ("torch.zeros(4)", "torch.zeros", False, "the default device"),
    ("torch.zeros(4, device=device)", None, False, "not known to be torch's"),
    ("torch.cuda.FloatTensor(data)", "torch.cuda.FloatTensor", True, "a CUDA tensor"),
    ("make(4, device=device)", "project.make", False, "not a torch function"),
    ("torch.amp.GradScaler(device=device)", "torch.amp.GradScaler", False, "not a tensor"),
    ('torch.Generator(device="cuda")', "torch.Generator", False, "not a tensor"),
    # not calls
    ("x.device", None, False, "not a call"),
    ("x", None, False, "not a call"),
]


# `cuda_index`: an integer CUDA device index (the file uses CUDA; a device placed by index)
INDEX_CASES: list[tuple[str, bool, str]] = [
    ("0", True, "`.to(0)` is cuda:0"),
    ("local_rank", True, "the launcher's local rank"),
    ("args.local_rank", True, "the same, an option"),
    ("rank", True, "a process's rank used as its GPU"),
    ("self.gpu_id", True, "a CUDA index"),
    ("args.gpu", True, "the ImageNet example's GPU index"),
    ("gpu_idx", True, "a CUDA index"),
    ("device_id", True, "a CUDA index"),
    ("device_index", True, "a CUDA index"),
    ("dev_id", True, "a CUDA index"),
    ("local_device", True, "a CUDA index"),
    ("ddp_local_rank", True, "nanoGPT's local rank"),
    ("global_rank", True, "an integer: cuda:<rank>"),
    ('int(os.environ["LOCAL_RANK"])', True, "the launcher's local rank"),
    ("int(x)", True, "any int in a device slot is a CUDA index"),
    ('cfg["local_rank"]', True, "a CUDA index from a config"),
    ("dist.get_rank()", True, "an int"),
    ("True", False, "a bool"),
    ('"cuda"', False, "a device string, not an index"),
    ("device", False, "a device variable: may hold the CPU"),
    ("self.device", False, "a device variable"),
    ("devices[rank]", False, "an element of a device list (ddp_setup's `_rank_indexed`)"),
    ("gpus", False, "a list or count of GPUs"),
    ("num_gpus", False, "a count"),
    ("cpu_rank", False, "named for the CPU"),
    ("torch.float16", False, "a dtype"),
]


@pytest.mark.parametrize(("source", "expected", "why"), INDEX_CASES)
def test_cuda_index(source: str, expected: bool, why: str) -> None:
    assert cuda_index(ast.parse(source, mode="eval").body) is expected, why


@pytest.mark.parametrize(("source", "qualified", "expected", "why"), CASES)
def test_moves_to_gpu(source: str, qualified: str | None, expected: bool, why: str) -> None:
    node = ast.parse(source, mode="eval").body
    assert moves_to_gpu(node, qualified) is expected, why


def test_the_table_has_no_duplicate_rows() -> None:
    sources = [source for source, qualified, _, _ in CASES if qualified is None]
    assert len(sources) == len(set(sources))


_DATASET = """\
import os, torch
from utils import dist_util, to_cuda
model = torch.nn.Linear(4, 4).cuda()
class Samples(torch.utils.data.Dataset):
    def __getitem__(self, i):
        return {value}
loader = torch.utils.data.DataLoader(Samples(), batch_size=8)
"""


@pytest.mark.parametrize(
    ("value", "fires"),
    [
        # answers the old data_loading test got wrong: each now a move, GD203 not reported
        ("to_cuda(self.x[i])", False),
        ("self.x[i].to(dist_util.dev())", False),
        ('self.x[i].to(int(os.environ["LOCAL_RANK"]))', False),
        ("self.x[i].to(0)", False),
        ('self.x[i].to(f"cuda:{self.rank}")', False),
        # controls: no move, the samples are host memory and load in the main process
        ("self.x[i].pin_memory()", True),
        ("self.x[i].to(torch.float16)", True),
        ('self.x[i].to("cpu")', True),
    ],
)
def test_gd203_follows_the_merged_test(tmp_path: Path, value: str, fires: bool) -> None:
    """GD203 is not reported for a dataset whose `__getitem__` returns device tensors
    (forked workers cannot use CUDA): the move is what `moves_to_gpu` says it is."""
    found = _found_lines(tmp_path, _DATASET.format(value=value), "GD203")
    assert (found == {7}) is fires, found


def _found_lines(tmp_path: Path, source: str, rule: str) -> set[int]:
    """The lines `rule` reports in a train.py of `source`."""
    path = tmp_path / "train.py"
    path.write_text(source)
    return {f.line for f in lint_paths([path], select=[rule]).findings}


_PINNED_LOOP = """\
import torch
model = torch.nn.Linear(4, 4).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(range(8), batch_size=4, num_workers=2, pin_memory=True)
def train(dtype, cpu_device):
    for x, y in loader:
        b = {copy}
        loss = model(b.cuda(non_blocking=True)).sum()
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize(
    ("copy", "fires"),
    [
        ("x.to(dtype)", False),  # a cast: the old filter took it for a copy
        ("x.to(x.dtype)", False),
        ("x.to(cpu_device)", False),
        ('x.to(device="cpu")', False),
        ("x.to(torch.float16)", False),
        ("x.to(0)", True),
        ('x.to(f"cuda:{rank}")', True),
        ("x.float().cuda()", True),
    ],
)
def test_gd205_copies_only_moves(tmp_path: Path, copy: str, fires: bool) -> None:
    """GD205 (a blocking copy of a pinned batch) asks `moves_to_gpu`: a cast or a move to
    the CPU copies nothing to the GPU."""
    found = _found_lines(tmp_path, _PINNED_LOOP.format(copy=copy), "GD205")
    assert (found == {7}) is fires, found


_HOST_READS = """\
import torch
model = torch.nn.Linear(4, 4).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(range(8), batch_size=4, num_workers=2, pin_memory=True)
def train(cpu_device):
    for batch in loader:
        loss = model(batch.x.cuda(non_blocking=True)).sum()
        loss.backward()
        opt.step()
        host = loss.detach().cpu()
        back = host.to(cpu_device)
        print(back.numpy())
        batch.to(torch.float16)
        print(batch.sid.tolist())
"""


def test_host_memory_stays_on_the_host(tmp_path: Path) -> None:
    """GD301: `.to(cpu_device)` of a host copy (host_sync) and a cast of the loader batch,
    `batch.to(torch.float16)` (host_batch: not an in-place move) leave host memory, whose
    reads sync nothing; the old tests took both for moves to the GPU. The `.cpu()` is the
    one sync."""
    assert _found_lines(tmp_path, _HOST_READS, "GD301") == {10}


@pytest.mark.parametrize(
    "device", ['int(os.environ["LOCAL_RANK"])', "dist.get_rank()", "args.gpu_index", "rank"]
)
def test_an_integer_device_makes_a_gpu_job(tmp_path: Path, device: str) -> None:
    """`.to(<CUDA index>)` is CUDA (context's GPU job, via `cuda_index`): GD203 applies."""
    source = (
        "import os, torch\nimport torch.distributed as dist\n"
        f"model = torch.nn.Linear(4, 4).to({device})\n"
        "loader = torch.utils.data.DataLoader(range(8), batch_size=4)\n"
    )
    assert _found_lines(tmp_path, source, "GD203") == {4}
