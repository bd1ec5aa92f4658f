# lit-llama's finetune scripts (fourteenth judge): Lightning Fabric accumulates gradients
# with `fabric.no_backward_sync(model, enabled=is_accumulating)`, Fabric's no_sync():
# GD602 reported each of the five trainers.
import lightning as L
import torch

micro_batches = 4
log_interval = 100


def main():
    fabric = L.Fabric(accelerator="cuda", devices=4, strategy="ddp", precision="bf16-mixed")
    fabric.launch()
    fabric.seed_everything(1337 + fabric.global_rank)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model, optimizer = fabric.setup(model, optimizer)
    for iter_num in range(1000):
        x = torch.randn(8, 64, device=fabric.device)
        is_accumulating = (iter_num + 1) % micro_batches != 0
        with fabric.no_backward_sync(model, enabled=is_accumulating):
            loss = model(x).pow(2).mean()
            fabric.backward(loss / micro_batches)
        if not is_accumulating:
            optimizer.step()
            optimizer.zero_grad()
        if iter_num % log_interval == 0:
            fabric.print(f"iter {iter_num}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
