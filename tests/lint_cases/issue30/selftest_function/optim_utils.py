# dragon (fifteenth judge): a library module's CPU self-test, reached only from its own
# `if __name__ == "__main__":` block; the job imports the module for MyAdam (was GD301).
import torch


class MyAdam(torch.optim.Adam):
    pass


def run_test():
    model = torch.nn.Linear(10, 2)
    x = torch.randn(100, 10)
    y = torch.randint(0, 2, (100,))
    opt = MyAdam(model.parameters())
    for a in range(0, 100, 10):
        loss = torch.nn.functional.cross_entropy(model(x[a : a + 10]), y[a : a + 10])
        loss.backward()
        opt.step()
        print(loss.item())


if __name__ == "__main__":
    run_test()
