"""Seed 001 Figure 3 in miniature: easy / medium / hard canaries, covariance vs scalar attack.

Real Opacus DP-SGD on digits (logistic regression or a small MLP), CPU-sized. At theta_0
(fixed init), Algorithm 3 ranks the training candidates by their Mahalanobis score under an
estimator from ``n_references`` held-out training points and picks ``canaries_per_class``
easy / medium / hard canaries. Each of ``runs`` trainings includes every canary independently
with probability 1/2, trains ``epochs`` epoch(s) with the ``AuditHook`` streaming the covariance
score of Algorithm 4 (fixed noise-aware (mu_0, P)) and the scalar product, and the pooled
in / out scores per class give AUC and TPR at low FPR, next to the Gaussian prediction of
``predicted_leakage`` for the epoch-summed covariance score.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit.attacks import CovarianceScore, ScalarProduct
from dpaudit.canaries.leakage import predicted_leakage
from dpaudit.canaries.plots import _pyplot, plot_canary_grid, plot_score_distribution
from dpaudit.canaries.ranking import rank_candidates, select_canaries
from dpaudit.covariance import noise_aware
from dpaudit.stats.roc import auc, roc_curve, tpr_at_fpr

CLASSES = ("easy", "medium", "hard")
ATTACKS = ("covariance", "scalar")


def _train_once(
    model_fn,
    x: torch.Tensor,
    y: torch.Tensor,
    canary_x: torch.Tensor,
    canary_y: torch.Tensor,
    scores,
    cfg: dict,
    run_seed: int,
) -> tuple[dict[str, np.ndarray], int]:
    """One audited Opacus training: each attack's (K,) epoch-summed scores, and the steps."""
    from opacus import PrivacyEngine

    from dpaudit.capture import AuditHook, InputCanaries

    model = model_fn()
    loader = DataLoader(
        TensorDataset(x, y),
        batch_size=cfg["batch_size"],
        shuffle=True,
        generator=torch.Generator().manual_seed(run_seed),
    )
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    engine = PrivacyEngine(accountant="rdp")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(run_seed)  # Opacus' Poisson sampler draws from the global generator
        model, opt, loader = engine.make_private(
            module=model,
            optimizer=opt,
            data_loader=loader,
            noise_multiplier=cfg["noise_multiplier"],
            max_grad_norm=cfg["max_grad_norm"],
            poisson_sampling=cfg["poisson_sampling"],
            noise_generator=torch.Generator().manual_seed(run_seed + 1),
        )
        hook = AuditHook(opt, model, InputCanaries(canary_x, canary_y), scores=scores)
        with hook:
            for _ in range(cfg["epochs"]):
                for xb, yb in loader:
                    opt.zero_grad()
                    nn.functional.cross_entropy(model(xb), yb).backward()
                    opt.step()
    out = hook.scores()
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}, hook.steps


def figure3_miniature(
    model: str = "logreg",
    runs: int = 60,
    canaries_per_class: int = 3,
    n_references: int = 400,
    noise_multiplier: float = 0.5,
    max_grad_norm: float = 1.0,
    batch_size: int = 64,
    lr: float = 0.5,
    epochs: int = 1,
    method: str = "ledoit_wolf",
    poisson_sampling: bool = False,
    width: int = 16,
    fprs: tuple[float, ...] = (0.01, 0.1),
    seed: int = 0,
    subsample: float = 0.5,
    standardise: bool = True,
    output_dir: str | Path | None = None,
) -> dict:
    """Run the experiment; returns (and, with ``output_dir``, writes) all numbers as a dict.

    ``subsample`` is the fraction of the non-canary pool drawn afresh for each run: the
    fixed-target game (seed 001 Algorithm 2) resamples the dataset around the fixed target, and
    without it the epoch sum of a fixed, shuffled pool carries no sampling noise at all.
    ``standardise`` centres each canary's scores by their median over runs and scales by their
    median absolute deviation before pooling the canaries of a class (label-free: membership
    is balanced), so that one threshold fits canaries with different score offsets.
    """
    from dpaudit.data import load_dataset
    from dpaudit.models import build_model

    if int(runs) < 2:
        raise ValueError(f"runs must be >= 2, got {runs!r}")
    t0 = time.perf_counter()
    train, _, info = load_dataset("digits", seed=seed)
    x_all, y_all = train.tensors
    rng = np.random.default_rng(seed)
    perm = rng.permutation(x_all.shape[0])
    ref_idx, cand_idx = perm[:n_references], perm[n_references:]

    def model_fn():
        return build_model(model, info.input_shape, info.num_classes, width=width, seed=seed)

    theta0 = model_fn()
    loss = nn.functional.cross_entropy
    ranking = rank_candidates(
        theta0,
        (x_all[ref_idx], y_all[ref_idx]),
        (x_all[cand_idx], y_all[cand_idx]),
        loss,
        max_grad_norm,
        method=method,
    )
    sel = select_canaries(ranking.scores, "easy_medium_hard", k=canaries_per_class)
    canary_pos = cand_idx[sel.indices]  # positions in the training split
    canary_x, canary_y = x_all[canary_pos], y_all[canary_pos]
    pool = np.setdiff1d(cand_idx, canary_pos)
    k_total = canary_pos.size

    cfg = {
        "batch_size": int(batch_size),
        "lr": float(lr),
        "noise_multiplier": float(noise_multiplier),
        "max_grad_norm": float(max_grad_norm),
        "poisson_sampling": bool(poisson_sampling),
        "epochs": int(epochs),
    }
    b_exp = float(batch_size)
    op = noise_aware(ranking.precision, noise_multiplier, max_grad_norm, b_exp)
    scores = (CovarianceScore(op), ScalarProduct())
    if not 0.0 < float(subsample) <= 1.0:
        raise ValueError(f"subsample must lie in (0, 1], got {subsample!r}")
    n_pool = max(1, round(float(subsample) * pool.size))
    membership = rng.random((int(runs), k_total)) < 0.5
    table = {a: np.zeros((int(runs), k_total)) for a in ATTACKS}
    steps = None
    for r in range(int(runs)):
        drawn = rng.choice(pool, size=n_pool, replace=False)
        keep = np.concatenate([drawn, canary_pos[membership[r]]])
        out, steps = _train_once(
            model_fn, x_all[keep], y_all[keep], canary_x, canary_y, scores, cfg, seed * 7919 + r
        )
        for a in ATTACKS:
            table[a][r] = out[a]
    total_steps = int(steps)
    pred = predicted_leakage(
        ranking.candidate_grads[sel.indices],
        ranking.precision,
        noise_multiplier,
        max_grad_norm,
        b_exp,
        inclusions=int(epochs),
        total_steps=total_steps,
    )
    if standardise:
        table = {a: _standardise_columns(v) for a, v in table.items()}
    results: dict = {}
    labels = np.asarray(sel.labels)
    for cls in CLASSES:
        cols = np.flatnonzero(labels == cls)
        entry = {
            "mahalanobis": sel.scores[cols].tolist(),
            "predicted_auc_covariance": float(np.mean(pred.auc_summed_score[cols])),
            "predicted_mu_step": pred.mu_step[cols].tolist(),
        }
        for a in ATTACKS:
            s = table[a][:, cols]
            m = membership[:, cols]
            s_in, s_out = s[m], s[~m]
            entry[a] = {
                "auc": auc(s_in, s_out),
                **{f"tpr_at_fpr_{f:g}": float(tpr_at_fpr(s_in, s_out, f)) for f in fprs},
                "n_in": int(s_in.size),
                "n_out": int(s_out.size),
            }
        results[cls] = entry
    report = {
        "config": {
            "model": model,
            "runs": int(runs),
            "canaries_per_class": int(canaries_per_class),
            "n_references": int(n_references),
            "method": method,
            "width": int(width),
            "seed": int(seed),
            "standardise": bool(standardise),
            "subsample": float(subsample),
            "dim": int(ranking.precision.dim),
            "steps_per_run": int(total_steps),
            **cfg,
        },
        "results": results,
        "seconds": time.perf_counter() - t0,
    }
    if output_dir is not None:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "figure3_miniature.json").write_text(json.dumps(report, indent=2))
        _plot_rocs(table, membership, labels, out / "figure3_roc.png", f"{model}, digits")
        plot_score_distribution(ranking.scores, sel, out / "mahalanobis_candidates.png")
        groups = sel.by_label()
        plot_canary_grid(
            {k: x_all[cand_idx[v]] for k, v in groups.items()},
            out / "canaries_easy_medium_hard.png",
            targets_by_label={k: y_all[cand_idx[v]] for k, v in groups.items()},
            scores_by_label={k: ranking.scores[v] for k, v in groups.items()},
        )
    return report


def _standardise_columns(s: np.ndarray) -> np.ndarray:
    """(runs, K) scores -> per-column (s - median) / MAD (MAD 0 -> scale 1)."""
    med = np.median(s, axis=0)
    mad = np.median(np.abs(s - med), axis=0)
    return (s - med) / np.where(mad > 0, mad, 1.0)


def _plot_rocs(table, membership, labels, path: Path, title: str) -> None:
    """ROC curves (log-log) per class and attack, as in seed 001 Figure 3."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 4.5))
    colours = {"easy": "tab:red", "medium": "tab:orange", "hard": "tab:blue"}
    for cls in CLASSES:
        cols = np.flatnonzero(labels == cls)
        for a, style in (("covariance", "-"), ("scalar", ":")):
            s, m = table[a][:, cols], membership[:, cols]
            fpr, tpr, _ = roc_curve(s[m], s[~m])
            ax.plot(fpr, tpr, style, color=colours[cls], label=f"{cls} / {a}")
    ax.plot([1e-3, 1], [1e-3, 1], color="0.6", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(1e-2, 1)
    ax.set_ylim(1e-2, 1.02)
    ax.set_xlabel("FPR")
    ax.set_ylabel("TPR")
    ax.set_title(title)
    ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
