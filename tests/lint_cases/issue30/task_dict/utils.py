import os

import torch
from torch.utils.data import TensorDataset


def load_and_cache_multi_data(args, split_tag):
    cache_fn = os.path.join(args.cache_path, split_tag)
    if os.path.exists(cache_fn):
        examples_data_dict = torch.load(cache_fn)
    else:
        examples_data_dict = {}
        for task in ["summarize", "translate"]:
            examples = read_examples(args.data_dir, task, split_tag)
            source_ids = torch.tensor([e.source_ids for e in examples], dtype=torch.long)
            data = TensorDataset(source_ids)
            examples_data_dict[task] = (examples, data)
    return examples_data_dict


def load_files(args, split_tag):
    files = {}
    for task in ["summarize", "translate"]:
        files[task] = (task, FileDataset(os.path.join(args.data_dir, task, split_tag)))
    return files


class FileDataset(torch.utils.data.Dataset):
    def __init__(self, folder):
        self.paths = sorted(os.listdir(folder))

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return torch.load(self.paths[i])


def read_examples(data_dir, task, split_tag):
    return []
