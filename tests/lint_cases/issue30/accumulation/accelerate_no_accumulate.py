# accelerate's nlp_example: gradient_accumulation_steps without accelerator.accumulate().
import torch
from accelerate import Accelerator


def train(model, optimizer, train_dataloader, gradient_accumulation_steps):
    accelerator = Accelerator(mixed_precision="bf16")
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    for step, batch in enumerate(train_dataloader):
        batch.to(accelerator.device)
        loss = model(**batch).loss / gradient_accumulation_steps
        accelerator.backward(loss)  # expect: GD602
        if step % gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    return torch.zeros(1)
