"""CodeT5-style data helpers: pre-tokenised ids cached as a TensorDataset."""

import json
import os

import torch
from torch.utils.data import Dataset, TensorDataset


def read_examples(filename, data_num):
    with open(filename) as f:
        examples = [json.loads(line) for line in f]
    return examples[:data_num] if data_num > 0 else examples


def load_and_cache_gen_data(args, filename, split_tag, only_src=False):
    examples = read_examples(filename, args.data_num)
    cache_fn = os.path.join(args.cache_path, f"{split_tag}.pt")
    if os.path.exists(cache_fn):
        data = torch.load(cache_fn)
    else:
        all_source_ids = torch.tensor([e["source_ids"] for e in examples], dtype=torch.long)
        if split_tag == "test" or only_src:
            data = TensorDataset(all_source_ids)
        else:
            all_target_ids = torch.tensor([e["target_ids"] for e in examples], dtype=torch.long)
            data = TensorDataset(all_source_ids, all_target_ids)
        torch.save(data, cache_fn)
    return examples, data


class JsonlDataset(Dataset):
    """Reads and tokenises one line of a file per item: work for loader workers."""

    def __init__(self, filename):
        with open(filename) as f:
            self.offsets = [0] + [len(line) for line in f]
        self.filename = filename

    def __len__(self):
        return len(self.offsets)

    def __getitem__(self, i):
        with open(self.filename) as f:
            f.seek(self.offsets[i])
            return torch.tensor(json.loads(f.readline())["source_ids"])


def load_raw_data(filename):
    return JsonlDataset(filename)
