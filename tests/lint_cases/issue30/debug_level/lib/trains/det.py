from trains.base import BaseTrainer


class DetTrainer(BaseTrainer):
    def debug(self, batch, output):
        # only under `--debug 1` or more (its default is 0): a sync the user asked for
        dets = output.detach().cpu().numpy()
        print(dets.shape)
