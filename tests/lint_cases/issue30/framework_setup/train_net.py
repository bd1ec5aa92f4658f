# detectron2's tools/plain_train_net.py: launch() sets each worker's device and
# default_setup() seeds it, inside the framework.
import torch
from detectron2.engine import default_setup, launch
from torch.nn.parallel import DistributedDataParallel


def main(args, cfg, model):
    default_setup(cfg, args)
    model = DistributedDataParallel(model.cuda(), device_ids=[args.local_rank])
    return model


def invoke_main(args):
    launch(main, args.num_gpus, dist_url=args.dist_url, args=(args,))
    torch.distributed.destroy_process_group()
