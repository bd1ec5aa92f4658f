# accelerate's by_feature/gradient_accumulation.py: accumulate() skips the sync.
from accelerate import Accelerator


def train(model, optimizer, train_dataloader):
    accelerator = Accelerator(gradient_accumulation_steps=4, mixed_precision="bf16")
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    for step, batch in enumerate(train_dataloader):
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            if step % 4 == 0:
                optimizer.step()
