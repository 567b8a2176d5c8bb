"""A worst-case initial model: pre-training on records the audit does not train on.

DP-SGD's accountant holds whatever the initial parameters are, so an auditor may choose them.
Annamalai & De Cristofaro (NeurIPS 2024, "Nearly tight black-box auditing of differentially
private machine learning") pre-train the model, without privacy, on data disjoint from the
audited set: the data's gradients are then small and steady while the canary's stands out,
and the final model's loss on the canary becomes an almost linear read-out of the canary's
summed contribution plus noise, nearly as informative as the white-box view. ``pretrain``
does that with plain SGD (shuffled mini-batches, seeded, the caller's random streams
untouched) on the data set's ``unused_train`` records (``data._split_standardised``: the
training split's records outside ``data.n_train``, standardised like the audited ones).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from dpaudit.models import LOSS


def pretrain(model: nn.Module, data: Dataset, *, epochs: int, lr: float, batch_size: int,
             seed: int) -> dict:
    """Train ``model`` in place with plain SGD (not private) on ``data``; returns what the
    report shows: the records, epochs, the first and last epoch's mean loss and the final
    accuracy on ``data``."""
    if len(data) == 0:
        raise ValueError("model.init=pretrained: no records to pre-train on (every training "
                         "record is audited: lower data.n_train)")
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(int(seed))
    loader = DataLoader(data, batch_size=int(batch_size), shuffle=True, generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=float(lr))
    losses = []
    model.train()
    with torch.random.fork_rng(devices=[]):  # every draw below stays off the caller's stream
        torch.manual_seed(int(seed))
        for _ in range(int(epochs)):
            total, n = 0.0, 0
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                opt.zero_grad(set_to_none=True)
                loss = LOSS(model(x), y)
                loss.backward()
                opt.step()
                total, n = total + loss.item() * len(x), n + len(x)
            losses.append(total / n)
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            x, y = next(iter(DataLoader(data, batch_size=len(data), generator=gen)))
            acc = float((model(x.to(device)).argmax(1) == y.to(device)).double().mean())
    return {"records": len(data), "epochs": int(epochs), "lr": float(lr),
            "batch_size": int(batch_size), "loss_first_epoch": float(losses[0]),
            "loss_last_epoch": float(losses[-1]), "accuracy": acc,
            "loss_decreased": bool(np.isfinite(losses[-1]) and losses[-1] < losses[0])}
