import losses
import torch


def train(config, sde, model, train_ds, eval_ds):
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    state = dict(optimizer=optimizer, model=model, step=0)
    optimize_fn = losses.optimization_manager(config)
    train_step_fn = losses.get_step_fn(sde, train=True, optimize_fn=optimize_fn)
    eval_step_fn = losses.get_step_fn(sde, train=False, optimize_fn=optimize_fn)
    for step in range(config.n_iters):
        batch = next(train_ds).cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = train_step_fn(state, batch)
        print(f"training_loss: {loss.item():.5e}")  # expect: GD301
        if step % config.eval_freq == 0:
            eval_batch = next(eval_ds).cuda(non_blocking=True)
            eval_loss = eval_step_fn(state, eval_batch)
            print(f"eval_loss: {eval_loss.item():.5e}")


def evaluate(config, sde, model, eval_ds, scaler):
    state = dict(optimizer=None, model=model, step=0)
    eval_step = losses.get_step_fn(sde, train=False)
    all_losses = []
    with torch.autocast("cuda", dtype=torch.bfloat16):
        for i, batch in enumerate(iter(eval_ds)):
            eval_batch = scaler(batch.cuda(non_blocking=True))  # a data scaler, not a loss scaler
            eval_loss = eval_step(state, eval_batch)
            all_losses.append(eval_loss.item())  # expect: GD303
            if (i + 1) % 1000 == 0:
                print(f"Finished {i + 1}th step loss evaluation")
    return all_losses
