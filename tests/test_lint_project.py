"""The classes of lint false positive from issue 10, each on a small project of its own:
names resolved across the files of one run, platform and device branches, "in a loop"
only when a loop runs the code, what makes a script a GPU job."""

from __future__ import annotations

import textwrap
from pathlib import Path

from gpudiag.lint import lint_paths, lint_source
from gpudiag.lint.config import Selection

# every rule, the opt-in ones (GD701, GD702: off by default) included
ALL = ["GD"]


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def hits(*paths: Path) -> set[tuple[str, str, int]]:
    result = lint_paths(list(paths), select=ALL)
    assert result.errors == []
    return {(Path(f.path).name, f.code, f.line) for f in result.findings}


def codes_of(source: str) -> set[str]:
    return {
        f.code for f in lint_source(textwrap.dedent(source), selection=Selection(select=tuple(ALL)))
    }


MAIN = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from utils import train


def main(model, dataset, optimizer):
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(0)
    model = DDP(model.to(local_rank), device_ids=[local_rank])
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, sampler=sampler, num_workers=4, pin_memory=True)
    for epoch in range(10):
        train(model, loader, optimizer, sampler, epoch, local_rank)
    dist.destroy_process_group()
"""

UTILS = """\
import torch


def setup_device(local_rank):
    torch.cuda.set_device(local_rank)


def train(model, loader, optimizer, sampler, epoch, local_rank):
    sampler.set_epoch(epoch)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        for batch in loader:
            loss = model(batch.to(local_rank, non_blocking=True)).mean()
            loss.backward()
            optimizer.step()
"""


def test_set_epoch_and_set_device_in_a_sibling_module(tmp_path: Path) -> None:
    main = write(tmp_path, "main.py", MAIN)
    write(tmp_path, "utils.py", UTILS)
    # the folder, and main.py alone (utils.py is read, not reported)
    for paths in ([tmp_path], [main]):
        found = hits(*paths)
        assert not {code for _, code, _ in found} & {"GD202", "GD403", "GD601"}, found
    assert lint_paths([main], select=ALL).files == [str(main)]


def test_unrelated_scripts_of_one_run_do_not_vouch_for_each_other(tmp_path: Path) -> None:
    """Only files connected by imports share facts: a set_epoch in another script of the
    folder does not silence GD202 here."""
    alone = MAIN.replace("from utils import train\n", "").replace(
        "        train(model, loader, optimizer, sampler, epoch, local_rank)\n",
        "        for batch in loader:\n            model(batch).mean().backward()\n",
    )
    write(tmp_path, "a.py", alone)
    write(tmp_path, "b.py", UTILS)
    assert ("a.py", "GD202", 16) in hits(tmp_path)


def test_validation_sampler_needs_no_set_epoch() -> None:
    source = """\
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    def run(train_set, val_dataset, datasets):
        train_sampler = DistributedSampler(train_set)
        sampler2 = DistributedSampler(val_dataset)
        eval_sampler = DistributedSampler(datasets["validation"])
        val_loader = DataLoader(val_dataset, sampler=DistributedSampler(val_dataset))
        for epoch in range(3):
            train_sampler.set_epoch(epoch)
        return sampler2, eval_sampler, val_loader
    """
    assert "GD202" not in codes_of(source)
    assert "GD202" in codes_of(source.replace("train_sampler.set_epoch(epoch)", "pass"))


def test_gloo_in_a_windows_branch() -> None:
    source = """\
    import sys
    import platform
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    if sys.platform == "win32":
        dist.init_process_group(backend="gloo")
    elif platform.system() == "Darwin":
        dist.init_process_group("gloo")
    else:
        dist.init_process_group(backend="nccl")
    dist.destroy_process_group()
    """
    assert "GD501" not in codes_of(source)
    assert "GD501" in codes_of(source.replace('sys.platform == "win32"', "True"))


def test_nccl_with_integer_devices_is_cuda_code() -> None:
    for move in ("model.to(local_rank)", "model.to(self.gpu_id)", "model.to(0)"):
        source = f"""\
        import torch.distributed as dist

        def setup(model, local_rank):
            dist.init_process_group("nccl")
            return {move}

        def cleanup():
            dist.destroy_process_group()
        """
        assert "GD502" not in codes_of(source), move
    assert "GD502" in codes_of(
        "import torch.distributed as dist\ndist.init_process_group('nccl')\n"
        "dist.destroy_process_group()\n"
    )


def test_nccl_helper_of_a_cuda_script(tmp_path: Path) -> None:
    write(
        tmp_path,
        "dist_utils.py",
        """\
        import torch.distributed as dist

        def setup():
            dist.init_process_group("nccl")

        def cleanup():
            dist.destroy_process_group()
        """,
    )
    write(
        tmp_path,
        "train.py",
        "import torch\nimport dist_utils\n\ndist_utils.setup()\nx = torch.ones(1).cuda()\n",
    )
    assert not any(code == "GD502" for _, code, _ in hits(tmp_path))


def test_unused_cuda_string_does_not_make_a_gpu_job() -> None:
    source = """\
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    def main(rank, dataset):
        dist.init_process_group("gloo")
        name = f"cuda:{rank}"
        f"cuda:{rank}"
        if str(dataset) == "cuda":
            pass
        loader = DataLoader(dataset)
        dist.destroy_process_group()
        return loader
    """
    assert not codes_of(source) & {"GD501", "GD203", "GD204"}
    used = source.replace("return loader", "return loader, torch.device(name)")
    assert {"GD501", "GD203", "GD204"} <= codes_of(used)


def test_a_training_step_in_no_loop_is_not_per_step() -> None:
    """pytorch/examples distributed/ddp/example.py: one demo step in a function that no
    loop calls; prints there are not 'inside the training loop', no autocast advice."""
    source = """\
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def demo_basic(rank, model, optimizer):
        print(f"rank = {dist.get_rank()}")
        ddp_model = DDP(model.to(rank), device_ids=[rank])
        ddp_model(torch.randn(20, 10)).sum().backward()
        optimizer.step()
        print("done")

    def main():
        print("starting")
        demo_basic(0, None, None)
    """
    assert not codes_of(source) & {"GD702", "GD601", "GD301"}
    looped = source.replace(
        "\n        demo_basic(0, None, None)",
        "\n        for _ in range(9):\n            demo_basic(0, None, None)",
    )
    assert {"GD702", "GD601"} <= codes_of(looped)


def test_code_that_ends_the_loop_runs_once() -> None:
    source = """\
    import logging
    import torch.distributed as dist

    logger = logging.getLogger()

    def fit(model, loader, optimizer, step):
        dist.init_process_group("gloo")
        for batch in loader:
            try:
                model(batch).backward()
            except StopIteration:
                logger.warning("out of data")
                break
            optimizer.step()
            if step == 1:
                dist.barrier()
            if should_sync(step):
                dist.barrier()
            if done(step):
                logger.info("finished")
                break
        dist.destroy_process_group()
    """
    assert not codes_of(source) & {"GD702", "GD703"}


def test_logger_only_made_on_rank_zero() -> None:
    source = """\
    import torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter

    def train(model, loader, optimizer, rank):
        dist.init_process_group("gloo")
        logger = None
        if rank == 0:
            logger = SummaryWriter()
        writer = SummaryWriter() if rank == 0 else None
        for step, batch in enumerate(loader):
            model(batch).backward()
            optimizer.step()
            if logger is not None:
                logger.add_scalar("loss", 1.0, step)
            if writer:
                writer.add_scalar("loss", 1.0, step)
        dist.destroy_process_group()
    """
    assert "GD702" not in codes_of(source)
    assert "GD702" in codes_of(source.replace("if logger is not None:", "if True:"))


def test_step_function_in_another_file_called_from_a_loop(tmp_path: Path) -> None:
    write(
        tmp_path,
        "steps.py",
        """\
        import torch

        def train_step(model, batch, optimizer):
            loss = model(batch.cuda())
            loss.backward()
            optimizer.step()
            print(loss.item())
        """,
    )
    write(
        tmp_path,
        "run.py",
        """\
        from steps import train_step

        def fit(model, batches, optimizer):
            for batch in batches:
                train_step(model, batch, optimizer)
        """,
    )
    assert ("steps.py", "GD301", 7) in hits(tmp_path)
    # steps.py linted alone still sees run.py next to it, which imports it
    assert ("steps.py", "GD301", 7) in hits(tmp_path / "steps.py")
    (tmp_path / "run.py").unlink()
    assert ("steps.py", "GD301", 7) not in hits(tmp_path / "steps.py")  # called from no loop


def test_fabric_and_accelerate_prepared_loaders_get_a_sampler() -> None:
    source = """\
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    def main(fabric, accelerator, dataset):
        dist.barrier()
        loader = DataLoader(dataset, batch_size=8)
        loader = fabric.setup_dataloaders(loader)
        other = accelerator.prepare(DataLoader(dataset, batch_size=8))
        return loader, other
    """
    assert "GD201" not in codes_of(source)
    assert "GD201" in codes_of(source.replace("fabric.setup_dataloaders(loader)", "loader"))


def test_rpc_dispatch_is_not_a_rank_guard() -> None:
    """pytorch/examples distributed/rpc/ddp_rpc: rank 2 sends the training function to the
    trainers; it runs on every trainer rank."""
    source = """\
    import torch.distributed as dist
    import torch.distributed.rpc as rpc
    from torch.nn.parallel import DistributedDataParallel as DDP

    def _run_trainer(model, batches, opt):
        ddp = DDP(model)
        for epoch in range(100):
            for batch in batches:
                ddp(batch).sum().backward()
                opt.step()
            print("epoch done")

    def run_worker(rank):
        if rank == 2:
            rpc.rpc_async("trainer0", _run_trainer, args=(None, None, None))
    """
    assert "GD702" in codes_of(source)
    local = source.replace(
        'rpc.rpc_async("trainer0", _run_trainer, args=(None, None, None))',
        "_run_trainer(None, None, None)",
    )
    assert "GD702" not in codes_of(local)


def test_code_after_a_skip_on_most_steps_is_occasional() -> None:
    """torchtitan's train_step: `if not should_log: return` before the metric syncs."""
    source = """\
    import torch

    class Trainer:
        def train_step(self, batch, should_log):
            loss = self.model(batch.cuda())
            loss.backward()
            self.optimizer.step()
            if not should_log:
                return
            print(float(loss.item()))

        def fit(self, batches):
            for step, batch in enumerate(batches):
                self.train_step(batch, self.metrics.should_log(step))
    """
    assert "GD301" not in codes_of(source)
    assert "GD301" in codes_of(source.replace("if not should_log:", "if should_log:"))


def test_a_file_of_its_own_per_rank_is_not_a_duplicate_save() -> None:
    source = """\
    import os
    import torch
    import torch.distributed as dist

    def dump(logits, out):
        rank = dist.get_rank()
        torch.save(logits, os.path.join(out, f"logits_rank{rank}.pt"))
        torch.save(logits, "checkpoint.pt")
    """
    found = [
        (f.code, f.line)
        for f in lint_source(textwrap.dedent(source), selection=Selection(select=tuple(ALL)))
    ]
    assert [hit for hit in found if hit[0] == "GD701"] == [("GD701", 8)]


def test_method_of_an_instance_of_a_project_class() -> None:
    """pytorch/examples rpc/batch/reinforce.py: `agent = Agent(...)`, then
    `agent.run_episode()` in the episode loop does the training step."""
    source = """\
    import torch

    class Agent:
        def run_episode(self):
            loss = self.policy(torch.ones(1).cuda()).sum()
            loss.backward()
            self.optimizer.step()

    def run_worker(episodes):
        agent = Agent()
        for _ in range(episodes):
            agent.run_episode()
    """
    assert "GD601" in codes_of(source)
    assert "GD601" not in codes_of(source.replace("for _ in range(episodes):", "if episodes:"))
