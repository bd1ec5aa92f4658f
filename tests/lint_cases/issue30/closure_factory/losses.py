import torch


def init_loss(tau=0.1):
    def loss(anchor, target):
        probs = torch.softmax(anchor / tau, dim=1)
        out = torch.mean(torch.sum(-target * torch.log(probs), dim=1))
        with torch.no_grad():
            num_ps = float(len(set(target.argmax(dim=1).tolist())))  # expect: GD301
        return out, {"np": num_ps}

    return loss
