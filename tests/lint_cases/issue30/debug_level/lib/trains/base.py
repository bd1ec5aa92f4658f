import torch


class BaseTrainer:
    def __init__(self, opt):
        self.opt = opt
        self.model = torch.nn.DataParallel(torch.nn.Linear(8, 8)).cuda()  # expect: GD101
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.loader = torch.utils.data.DataLoader(torch.randn(64, 8), batch_size=8)  # expect: GD204

    def run_epoch(self, epoch):
        for batch in self.loader:
            output = self.model(batch.cuda())
            loss = output.mean()
            self.optimizer.zero_grad()
            loss.backward()  # expect: GD601
            self.optimizer.step()
            print(loss.item())  # expect: GD301
            if self.opt.debug > 0:
                self.debug(batch, output)

    def debug(self, batch, output):
        raise NotImplementedError
