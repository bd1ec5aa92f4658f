"""Judge 17's open case (CodeT5's run_multi_gen.py), fixed after the eighteenth judge: the
TensorDatasets of a dict of tasks that a project function returns (built with
`TensorDataset(...)`, or `torch.load` of the cached dict), read by subscript, through a
local cache of the dict, in a loop over a list of its values, or handed to a helper: in
memory, no GD203 (GD204 still applies). A dict of file-reading datasets is reported (the
control). Since the twentieth judge (D1) an evaluation-only loader (`eval_loader` of
`eval_bleu`) gets no GD204 either."""

import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler
from utils import load_and_cache_multi_data, load_files


def eval_bleu(args, eval_data, model):
    eval_loader = DataLoader(eval_data, sampler=SequentialSampler(eval_data))
    for batch in eval_loader:
        model(batch[0].cuda())


def main(args, model):
    model = model.cuda()
    opt = torch.optim.AdamW(model.parameters())
    train_dict = load_and_cache_multi_data(args, "train")
    train_data_list = [v[1] for k, v in train_dict.items()]
    all_tasks = [k for k, v in train_dict.items()]
    loaders = {}
    for train_data, cur_task in zip(train_data_list, all_tasks, strict=True):
        sampler = RandomSampler(train_data)
        loaders[cur_task] = DataLoader(train_data, sampler=sampler)  # expect: GD204
    for cur_task in all_tasks:
        for batch in loaders[cur_task]:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(batch[0].cuda()).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    dev_dataset = {}
    if "dev_loss" in dev_dataset:
        eval_dict = dev_dataset["dev_loss"]
    else:
        eval_dict = load_and_cache_multi_data(args, "dev")
        dev_dataset["dev_loss"] = eval_dict
    for cur_task in eval_dict:
        eval_examples, eval_data = eval_dict[cur_task]
        loader = DataLoader(eval_data, sampler=SequentialSampler(eval_data))  # expect: GD204
        for batch in loader:
            model(batch[0].cuda())
        eval_bleu(args, eval_data, model)
    files = load_files(args, "dev")
    for cur_task in files:
        _, file_data = files[cur_task]
        file_loader = DataLoader(file_data, batch_size=8)  # expect: GD203 GD204
        for batch in file_loader:
            model(batch.cuda())
