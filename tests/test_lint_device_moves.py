"""The one "does this call put a tensor on the GPU?" test of the linter
(`gpudiag.lint.device_moves.moves_to_gpu`), over the edge cases on which the three tests it
replaced disagreed (data_loading's `_moves_to_device`, moved_later's `_is_move`,
device_data's `_MOVE`; fourteenth session). Each row: the expression, the call's resolved
name where it matters (a torch function), the answer, and why."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpudiag.lint import lint_paths
from gpudiag.lint.device_moves import moves_to_gpu

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
    path = tmp_path / "train.py"
    path.write_text(_DATASET.format(value=value))
    found = {f.line for f in lint_paths([path], select=["GD203"]).findings}
    assert (found == {7}) is fires, found
