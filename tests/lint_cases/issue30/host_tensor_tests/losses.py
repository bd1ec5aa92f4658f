# Judge 22, FP4 (DiffDock's utils/training.py): the loss is computed on `.cpu()` copies
# of the predictions. The copies are the syncs (GD301 on them); the loss they make is host
# memory, so testing it or copying it again waits for nothing.


def score_loss(tr_pred, tr_score, rot_pred, rot_score):
    tr_loss = ((tr_pred.cpu() - tr_score.cpu()) ** 2).mean()  # expect: GD301
    rot_loss = ((rot_pred.cpu() - rot_score.cpu()) ** 2).mean()  # expect: GD301
    loss = tr_loss + 0.5 * rot_loss
    return loss, tr_loss.detach(), rot_loss.detach()
