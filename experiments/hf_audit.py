"""Audit a tiny Hugging Face BERT classifier fine-tuned with Opacus (issue 11; example).

A BERT-style sequence classifier is built from a ``transformers.BertConfig`` (no weights are
downloaded), fine-tuned with Opacus DP-SGD on synthetic token ids with attention masks, and
audited from inside the unchanged training loop with an ``AuditHook``:

* gradient canaries: Dirac vectors of norm C on the word-embedding rows of token ids that never
  occur in the data (those rows receive no data gradient), half inserted at every step
  ("members"), half never; each is an independent experiment;
* token input canaries (``--input-canaries``): K sequences with their own attention masks and
  random labels, half of them added to the training data; the hook computes their clipped
  gradients at every step.

What Opacus needs from a Hugging Face model (found while writing this example): BERT's
embeddings default to ``position_ids`` of shape (1, seq) (a buffer broadcast over the batch),
so Opacus' per-sample gradient of ``position_embeddings`` gets batch size 1 and clipping fails
with ``stack expects each tensor to be equal size, but got [B] ... and [1]`` (hooks and
functorch; ``ew`` fails with "Expected ExpandedWeights to have batch size matching input").
Passing batch-shaped ``position_ids`` in the forward fixes it for every grad_sample_mode;
nothing needs to be frozen. ``TinyBertClassifier`` does that and returns the logits.

Run: ``python experiments/hf_audit.py`` (about a minute on one CPU core; ``--help`` for
options). Prints the audit report of the gradient canaries (and of the input canaries), with
the white-box checks of the noise, the clipping, the sampling and the accountant that
``audit_report`` runs on the hook's records.
"""

from __future__ import annotations

import argparse
import warnings
from types import SimpleNamespace

import numpy as np
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit import audit_report
from dpaudit.capture import AuditHook, GradientCanaries, InputCanaries
from dpaudit.gradients.persample import trainable_parameter_names

warnings.filterwarnings("ignore", module="opacus")

VOCAB = 100
UNUSED = 10  # token ids VOCAB - UNUSED .. VOCAB - 1 never occur in the data
SEQ = 12
HIDDEN = 32
WORD_EMBEDDINGS = "bert.bert.embeddings.word_embeddings.weight"


class TinyBertClassifier(nn.Module):
    """``BertForSequenceClassification`` from a small config; forward returns the logits.

    ``forward(input_ids, attention_mask=None)`` passes batch-shaped ``position_ids`` (see the
    module doc: Opacus needs every embedding lookup to have the batch as first axis).
    """

    def __init__(self, num_labels: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        from transformers import BertConfig, BertForSequenceClassification

        config = BertConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=SEQ,
            num_labels=num_labels,
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
        )
        self.bert = BertForSequenceClassification(config)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.bert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions.expand_as(input_ids),
        ).logits


def synthetic_tokens(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids (n, SEQ), attention_mask (n, SEQ) 0/1, labels (n,)): ids in [1, VOCAB - UNUSED),
    random lengths >= 3 padded with id 0; label 1 when the first token is below the middle of
    the used vocabulary (a rule the classifier learns within a few dozen DP steps)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB - UNUSED, (n, SEQ), generator=g)
    lengths = torch.randint(3, SEQ + 1, (n,), generator=g)
    mask = (torch.arange(SEQ).unsqueeze(0) < lengths.unsqueeze(1)).long()
    ids = ids * mask
    labels = (ids[:, 0] < (VOCAB - UNUSED) // 2).long()
    return ids, mask, labels


def dead_coordinates(model: nn.Module) -> list[int]:
    """Flat indices (in the trainable-parameter vector) of the word-embedding rows of the
    UNUSED token ids: no example's gradient reaches them."""
    named = dict(model.named_parameters())
    offset = 0
    for name in trainable_parameter_names(model):
        if name == WORD_EMBEDDINGS:
            rows = range(VOCAB - UNUSED, VOCAB)
            return [offset + r * HIDDEN + c for r in rows for c in range(HIDDEN)]
        offset += named[name].numel()
    raise KeyError(WORD_EMBEDDINGS)


def run(
    steps: int = 80,
    n_train: int = 512,
    batch_size: int = 32,
    sigma: float = 1.0,
    clip: float = 1.0,
    lr: float = 0.2,
    input_canaries: int = 0,
    seed: int = 0,
    audit: bool = True,
    grad_sample_mode: str = "hooks",
) -> SimpleNamespace:
    """Fine-tune with Opacus for ``steps`` optimizer steps (Poisson batches), with the audit
    hook when ``audit``; returns model, engine, hook, the applied gradients (a step pre-hook on
    the base optimizer) and the canaries' memberships.

    Args:
        steps: optimizer steps. n_train: training sequences (before member input canaries).
        batch_size: expected batch size (sample rate batch_size / dataset size).
        sigma, clip: noise multiplier and clip norm C. lr: SGD learning rate.
        input_canaries: K token input canaries (0: none); the even-indexed half are added to
            the training data.
        seed: seeds the model, data, sampler and noise (never the global RNG after setup).
        audit: attach the AuditHook (False: the same run without it, for comparisons).
        grad_sample_mode: Opacus' per-sample gradient mode ("hooks", "functorch", "ew").
    """
    torch.manual_seed(seed)
    model = TinyBertClassifier()
    ids, mask, labels = synthetic_tokens(n_train, seed)
    canary_member = None
    if input_canaries:
        c_ids, c_mask, _ = synthetic_tokens(input_canaries, seed + 1000)
        c_labels = torch.randint(
            0, 2, (input_canaries,), generator=torch.Generator().manual_seed(seed + 2000)
        )
        canary_member = np.arange(input_canaries) % 2 == 0
        keep = torch.from_numpy(canary_member)
        ids = torch.cat([ids, c_ids[keep]])
        mask = torch.cat([mask, c_mask[keep]])
        labels = torch.cat([labels, c_labels[keep]])
    loader = DataLoader(
        TensorDataset(ids, mask, labels),
        batch_size=batch_size,
        generator=torch.Generator().manual_seed(seed),
    )
    engine = PrivacyEngine()
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=lr),
        data_loader=loader,
        noise_multiplier=sigma,
        max_grad_norm=clip,
        grad_sample_mode=grad_sample_mode,
        noise_generator=torch.Generator().manual_seed(seed + 1),
    )
    dead = dead_coordinates(model._module)
    dim = sum(p.numel() for p in model._module.parameters() if p.requires_grad)
    gradient_member = np.arange(len(dead)) % 2 == 0
    sets = [
        GradientCanaries.dirac(
            dead,
            norm=clip,
            dim=dim,
            policy=["every_step" if m else "never" for m in gradient_member],
        )
    ]
    if input_canaries:
        sets.append(InputCanaries(c_ids, c_labels, kwargs={"attention_mask": c_mask}))
    hook = AuditHook(optimizer, model, sets, keep_per_step=True) if audit else None

    params = [p for p in model._module.parameters() if p.requires_grad]
    applied = []
    handle = optimizer.original_optimizer.register_step_pre_hook(
        lambda *_: applied.append(torch.cat([p.grad.reshape(-1).clone() for p in params]))
    )
    model.train()
    losses = []
    try:
        if hook is not None:
            hook.attach()
        it = iter(loader)
        while len(applied) < steps:
            try:
                b_ids, b_mask, b_labels = next(it)
            except StopIteration:
                it = iter(loader)
                continue
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(b_ids, attention_mask=b_mask), b_labels)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    finally:
        handle.remove()
        if hook is not None:
            hook.detach()
    return SimpleNamespace(
        model=model,
        engine=engine,
        hook=hook,
        dataset_size=len(ids),
        applied=torch.stack(applied),
        params=torch.cat([p.detach().reshape(-1) for p in params]),
        dead=dead,
        gradient_member=gradient_member,
        input_member=canary_member,
        losses=losses,
    )


def main(argv: list[str] | None = None) -> dict:
    """Train, audit and print the reports; returns {"gradient": report[, "input": report]}."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--input-canaries", type=int, default=64)
    parser.add_argument("--grad-sample-mode", default="hooks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default=None, help="write results.json and plots here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    r = run(
        steps=args.steps,
        sigma=args.sigma,
        input_canaries=args.input_canaries,
        seed=args.seed,
        grad_sample_mode=args.grad_sample_mode,
    )
    print(f"trained {args.steps} steps, loss {r.losses[0]:.3f} -> {np.mean(r.losses[-10:]):.3f}")
    out = {
        "gradient": audit_report(
            r.hook,
            canaries=0,
            privacy_engine=r.engine,
            dataset_size=r.dataset_size,
            independent_canaries=True,
            output_dir=None if args.output_dir is None else f"{args.output_dir}/gradient",
        )
    }
    print("gradient canaries:", out["gradient"]["verdict"]["message"])
    if args.input_canaries:
        out["input"] = audit_report(
            r.hook,
            canaries=1,
            membership=r.input_member,
            privacy_engine=r.engine,
            dataset_size=r.dataset_size,
            output_dir=None if args.output_dir is None else f"{args.output_dir}/input",
        )
        print("input canaries:", out["input"]["verdict"]["message"])
    return out


if __name__ == "__main__":
    main()
