"""The rule registry: stable codes, what each costs and the concrete fix.

Codes never change meaning once released; scripts, pyproject configs and the analysis
(which links a lint finding to a measured cost by code + path + line) key on them.
`relates_to` names the `gpudiag analyze` finding kind that measures the same cost.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: str  # high | medium | low
    message: str
    why: str
    fix: str
    relates_to: str | None = None
    # off by default (opt-in): run only when `--select` / `select = [...]` names it (a
    # prefix such as `GD7` or `GD` / `ALL` does); see docs/lint.md "Severities after the
    # held-out parts"
    default: bool = True


_RULES = [
    Rule(
        "GD101",
        "dataparallel",
        "high",
        "nn.DataParallel used: single-process multi-GPU work pays scatter/replicate/gather every forward",
        "Every forward, DataParallel scatters the batch from GPU 0, replicates the whole model to "
        "every GPU (broadcast_coalesced), runs one Python thread per GPU under the GIL, gathers the "
        "outputs back to GPU 0 and reduces gradients there in backward; GPU 0 also holds more memory.",
        "Use DistributedDataParallel with one process per GPU: launch with torchrun, "
        "dist.init_process_group('nccl'), torch.cuda.set_device(local_rank), "
        "DDP(model.to(local_rank), device_ids=[local_rank]) and, for training, a DistributedSampler "
        "(`gpudiag lint --diff` writes this for the simple pattern). For inference no gradients are "
        "reduced: run one process per GPU on its own shard of the inputs (or one model copy per "
        "GPU), without DDP.",
        "dataparallel_overhead",
    ),
    Rule(
        "GD102",
        "replicate-on-every-rank",
        "low",
        "nn.parallel.replicate in DDP code: every rank copies the model onto all the GPUs it lists",
        "A hand-written DataParallel (nn.parallel.replicate, then parallel_apply or one thread "
        "per GPU) run by every rank of a DDP job: with N ranks over N GPUs that is N x N model "
        "replicas and CUDA contexts, each GPU shared by every rank's threads, and the work is "
        "repeated on every rank unless its inputs are split by rank. Usually evaluation code "
        "(no training step is slowed), hence low.",
        "Let each rank run its own model on its own GPU over its share of the inputs (split by "
        "rank, e.g. DistributedSampler(dataset, shuffle=False)) and gather the results "
        "(dist.all_gather / all_gather_object); or run the replicated evaluation on one rank only.",
    ),
    Rule(
        "GD201",
        "ddp-without-distributed-sampler",
        "medium",
        "DataLoader in DDP code without a sampler: every rank iterates the same data",
        "Without a DistributedSampler each rank reads the whole dataset, so N GPUs compute the "
        "same batches (or the same data in a different order): an epoch costs N times the work "
        "for the same number of distinct samples.",
        "Pass sampler=DistributedSampler(dataset) (drop shuffle=True; the sampler shuffles) and call "
        "sampler.set_epoch(epoch) at the start of every epoch.",
    ),
    Rule(
        "GD202",
        "sampler-without-set-epoch",
        "medium",
        "DistributedSampler without sampler.set_epoch(epoch) in the epoch loop: same order every epoch",
        "DistributedSampler seeds its shuffle with seed + epoch; without set_epoch the epoch stays 0, "
        "so every epoch sees the same permutation, which hurts convergence.",
        "Call sampler.set_epoch(epoch) at the top of the epoch loop, before iterating the DataLoader.",
    ),
    Rule(
        "GD203",
        "dataloader-num-workers-zero",
        "low",
        "DataLoader with num_workers=0 in a GPU job: batches load in the main process, between GPU steps",
        "With num_workers=0 decoding, augmentation and collation run in the main process between "
        "steps, while the GPU waits for the next batch.",
        "Set num_workers to a few workers per GPU (e.g. 4-8, at most the CPU cores per rank) and "
        "persistent_workers=True; measure with `gpudiag analyze` (dataloader_stall).",
        "dataloader_stall",
    ),
    Rule(
        "GD204",
        "dataloader-no-pin-memory",
        "low",
        "DataLoader without pin_memory=True in a GPU job: host-to-device copies are synchronous",
        "Copies from pageable memory are staged through a pinned bounce buffer and cannot overlap "
        "compute; non_blocking=True has no effect without pinned memory.",
        "Set pin_memory=True on the DataLoader and copy batches with .to(device, non_blocking=True).",
        "dataloader_stall",
    ),
    Rule(
        "GD205",
        "copy-without-non-blocking",
        "low",
        "batch copied to the device without non_blocking=True although the DataLoader pins memory",
        "A blocking host-to-device copy makes the CPU wait for the copy, so the next kernels are "
        "launched late; with pinned memory the copy could overlap compute.",
        "Use batch.to(device, non_blocking=True).",
        "host_sync",
    ),
    Rule(
        "GD206",
        "sampler-with-shuffle",
        "high",
        "DataLoader with both sampler= and shuffle=True: raises ValueError at start-up",
        "DataLoader refuses shuffle=True together with a sampler; the job dies before the first step "
        "on every rank (after the GPUs were allocated).",
        "Drop shuffle=True; DistributedSampler(shuffle=True) already shuffles.",
    ),
    Rule(
        "GD207",
        "hard-coded-sampler-rank",
        "high",
        "DistributedSampler with a hard-coded rank/num_replicas: every rank reads the same shard",
        "With rank=<constant> (or num_replicas=1) all ranks get identical indices: the data order "
        "is the same on every rank and N-1 GPUs do redundant work.",
        "Let DistributedSampler read rank and world size from the process group "
        "(DistributedSampler(dataset)) or pass rank=dist.get_rank(), num_replicas=dist.get_world_size().",
    ),
    Rule(
        "GD301",
        "host-sync-in-step-loop",
        "low",
        "host synchronisation inside the step loop",
        "`.item()`, `.cpu()`, `.numpy()`, `.tolist()`, `print(tensor)` and torch.cuda.synchronize() "
        "make the CPU wait until the GPU has finished all queued work, every step: the launch queue "
        "drains and the GPU idles while Python catches up.",
        "Keep metrics on the GPU (accumulate loss.detach() in a tensor) and read them every N steps "
        "(`if step % log_every == 0:`) or once per epoch.",
        "host_sync",
    ),
    Rule(
        "GD302",
        "empty-cache-in-step-loop",
        "medium",
        "torch.cuda.empty_cache() inside the step loop",
        "empty_cache synchronises the device and returns cached blocks to the driver; the next step "
        "pays cudaMalloc again.",
        "Remove it from the loop; if memory is fragmented, set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True instead.",
        "host_sync",
    ),
    Rule(
        "GD303",
        "host-sync-in-eval-loop",
        "low",
        "host synchronisation inside an evaluation loop",
        "`.item()`, `.cpu()`, `.numpy()`, `.tolist()` or torch.cuda.synchronize() in a loop that "
        "only evaluates (no backward or optimizer step per batch) makes the CPU wait for each batch "
        "before it launches the next one: no backward is stalled, but the GPU idles between "
        "batches while Python reads the value.",
        "Accumulate the metric in a GPU tensor (`correct += (pred == target).sum()`) and read it "
        "once after the loop.",
        "host_sync",
        default=False,
    ),
    Rule(
        "GD401",
        "find-unused-parameters",
        "medium",
        "DDP(find_unused_parameters=True): an extra autograd-graph traversal every iteration",
        "DDP then walks the autograd graph after every forward to mark unused parameters, and "
        "buckets cannot be reduced until that is known.",
        "Remove find_unused_parameters=True if every parameter gets a gradient every step; if only "
        "the same parameters are unused every step, use static_graph=True.",
    ),
    Rule(
        "GD402",
        "model-changed-after-ddp",
        "high",
        "model moved or modified after it was wrapped in DDP",
        "DDP broadcasts the parameters and builds its gradient buckets and hooks at construction; "
        "parameters moved, cast or replaced afterwards are not the ones DDP reduces (silently wrong "
        "gradients or a crash).",
        "Move, cast and modify the model before DDP(...): model = DDP(model.to(local_rank), "
        "device_ids=[local_rank]).",
    ),
    Rule(
        "GD403",
        "ddp-without-set-device",
        "low",
        "DDP on GPU without torch.cuda.set_device(local_rank) before it",
        "Without set_device every rank's current CUDA device is GPU 0: each rank creates a CUDA "
        "context there, NCCL uses it as its default device (barrier(), communicators), and "
        ".cuda() / torch.device('cuda') tensors without an index land there too; GPU 0 runs out "
        "of memory or becomes every rank's bottleneck.",
        "Call torch.cuda.set_device(local_rank) first thing after reading LOCAL_RANK, before "
        "init_process_group and DDP.",
        "gpu0_imbalance",
    ),
    Rule(
        "GD404",
        "ddp-without-device-ids",
        "low",
        "DDP on GPU without device_ids=[local_rank]",
        "Without device_ids DDP neither moves the inputs to the module's device nor picks the "
        "output device: that is right only when the module and every input are already on this "
        "rank's GPU (always so when each process sees one GPU); where a process sees several "
        "GPUs, a model or batch left on another one trains there or fails at the first step.",
        "DDP(model, device_ids=[local_rank], output_device=local_rank).",
    ),
    Rule(
        "GD405",
        "ddp-without-manual-seed",
        "low",
        "DDP code without torch.manual_seed before the model is built",
        "Unseeded, PyTorch's CPU generator starts from a different random seed in every "
        "process (DDP's broadcast at construction hides that for the weights), so what is drawn "
        "from it later (parameters created after wrapping, CPU augmentation, the DataLoader's "
        "shuffle order) differs between runs: a run cannot be repeated. The CUDA generators "
        "instead start from the same fixed seed in every process, so GPU dropout masks and "
        "`torch.rand(..., device='cuda')` draw identical streams on every rank.",
        "Call torch.manual_seed(seed) on every rank before building the model (seed + rank only "
        "for augmentation RNGs that should differ).",
    ),
    Rule(
        "GD406",
        "ddp-forward-bypassed",
        "high",
        "the training step calls the DDP-wrapped model through .module: gradients are not averaged",
        "DDP arms its gradient hooks in its own forward; a step that calls `ddp_model.module(...)` "
        "or `ddp_model.module.train_step(...)` instead runs no DDP forward, so the backward "
        "all-reduces nothing and each rank trains its own copy of the model (and "
        "find_unused_parameters costs nothing there, since it never runs).",
        "Call the DDP object itself (`ddp_model(batch)`); to run a method other than forward, "
        "route it through forward (a `mode=` argument) or wrap that method's module in DDP.",
    ),
    Rule(
        "GD501",
        "gloo-for-cuda",
        "high",
        "backend='gloo' in a CUDA job: gradients go through host memory",
        "gloo all-reduces CUDA tensors by copying them to the host and over TCP; NCCL uses NVLink / "
        "PCIe / InfiniBand directly and is typically 10x or more faster.",
        "Use backend='nccl' for CUDA tensors (or 'cpu:gloo,cuda:nccl' when CPU collectives are "
        "also needed).",
        "exposed_communication",
    ),
    Rule(
        "GD502",
        "nccl-on-cpu",
        "high",
        "backend='nccl' but no CUDA device is used: NCCL cannot reduce CPU tensors",
        "NCCL only handles CUDA tensors; collectives on CPU tensors raise at the first all-reduce.",
        "Use backend='gloo' for CPU training, or move the model and batches to cuda:local_rank.",
    ),
    Rule(
        "GD503",
        "init-without-destroy",
        "low",
        "init_process_group without destroy_process_group",
        "Without destroy_process_group the communicators are left to interpreter exit: recent "
        "PyTorch warns there that the process group was not destroyed, and older releases or "
        "other backends may leak resources or delay the exit; a clean teardown is explicit.",
        "Call dist.destroy_process_group() once training is finished (in a finally: block).",
    ),
    Rule(
        "GD601",
        "no-autocast",
        "medium",
        "GPU training without autocast (mixed precision)",
        "fp32 matmuls and convolutions do not use the tensor cores at full rate and move twice the "
        "bytes; bf16/fp16 autocast typically speeds a step up 1.5-3x on recent GPUs.",
        "On GPUs with bf16 tensor cores (A100, H100, L4, RTX 30xx and later: "
        "torch.cuda.is_bf16_supported()) wrap forward and loss in `with torch.autocast('cuda', "
        "dtype=torch.bfloat16):`; on V100, T4 and older GPUs (no bf16 tensor cores) use "
        "`dtype=torch.float16` with torch.amp.GradScaler('cuda') scaling the loss. On another "
        "accelerator pass its device type (`torch.autocast('xpu', ...)`).",
        "no_amp",
    ),
    Rule(
        "GD602",
        "grad-accumulation-without-no-sync",
        "low",
        "gradient accumulation under DDP without model.no_sync(): gradients are all-reduced every micro-step",
        "DDP all-reduces in every backward; with accumulation only the last micro-batch's "
        "reduction is needed, so the others are pure communication cost.",
        "Run the non-final micro-steps, forward and backward, inside `with model.no_sync():` (DDP decides in its forward whether the backward syncs) and the last one outside it.",
        "exposed_communication",
    ),
    Rule(
        "GD701",
        "save-on-every-rank",
        "low",
        "checkpoint saved from every rank",
        "Every rank writes the same file at the same time: N times the I/O, races that can "
        "corrupt the checkpoint, and slow ranks that hold the others up at the next collective.",
        "Save only on rank 0 (`if dist.get_rank() == 0:`) and dist.barrier() afterwards if the "
        "others read it.",
        default=False,
    ),
    Rule(
        "GD702",
        "log-on-every-rank",
        "low",
        "logging from every rank inside the training loop",
        "Every rank prints or logs the same metrics: N times the output, and loggers such as wandb or "
        "TensorBoard writers on every rank add per-step host work and duplicate runs.",
        "Log on rank 0 only (`if rank == 0:`), every N steps.",
        default=False,
    ),
    Rule(
        "GD703",
        "barrier-in-step-loop",
        "high",
        "dist.barrier() inside the step loop",
        "A barrier every training step makes every rank wait for the slowest one with nothing to "
        "overlap, every step; the step's own collectives (DDP's gradient all-reduce, where the "
        "job uses DDP) already keep the ranks together.",
        "Remove the barrier from the step loop; keep barriers for checkpoints or epoch ends.",
        "exposed_communication",
    ),
    Rule(
        "GD704",
        "collective-in-step-loop",
        "low",
        "explicit collective inside the step loop",
        "A collective called from the training loop (loss averaging, manual gradient all-reduce) "
        "blocks the step and is not overlapped with backward the way DDP's bucketed all-reduce is.",
        "Let DDP reduce gradients; reduce metrics every N steps or once per epoch "
        "(`if step % log_every == 0:`).",
        "exposed_communication",
    ),
]

RULES: dict[str, Rule] = {rule.code: rule for rule in _RULES}
