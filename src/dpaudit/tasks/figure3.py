"""Figure 3 of seed 001: easy / medium / hard targets, covariance attack vs scalar product.

The fixed-target game of seed 001 (Sec. 6.2) on any registered dataset and model. At theta_0,
Algorithm 3 ranks the training candidates by their Mahalanobis score under the estimator of
``n_references`` held-out training points (restricted to the parameters ``params``: all of
them for the FMNIST logistic regression, the last layer for the CIFAR10 CNN) and picks
``canaries_per_class`` easy (highest), medium and hard (lowest) targets. Each of ``runs``
trainings draws a fresh ``subsample`` of the remaining pool (the game redraws the dataset
around the fixed targets), includes every target independently with probability 1/2 and trains
with ``train_audited`` (one epoch of shuffled batches, as in the paper) while the hook streams
the covariance score of Algorithm 4 (the same (mu_0, C_0), shifted by the noise) and the scalar
product. Per-class pooled in / out scores give AUC and TPR at low FPR, next to the Gaussian
prediction of ``predicted_leakage`` for the epoch-summed covariance score.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import socket
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from torch.utils.data import TensorDataset

from dpaudit import seeds
from dpaudit._validate import require_choice
from dpaudit.attacks import CovarianceScore, ScalarProduct
from dpaudit.canaries import predicted_leakage, rank_candidates, select_canaries
from dpaudit.capture import InputCanaries
from dpaudit.covariance import noise_aware
from dpaudit.experiment.plan import poisson_sample_rate, resolve_device, total_steps
from dpaudit.experiment.settings import AuditSettings
from dpaudit.experiment.trainings.engine import (
    RUNS_DIR,
    ManyTrainings,
    WorkerDone,
    run_all,
    run_number,
    run_path,
)
from dpaudit.experiment.trainings.multirun import checksum, quarantine
from dpaudit.experiment.trainings.training import SAMPLINGS, shuffle_sample_rate, train_audited
from dpaudit.gradients import per_sample_clipped_grads, resolve_parameter_names
from dpaudit.models import LOSS, build_model
from dpaudit.names import COORDINATIONS
from dpaudit.papers import PAPERS
from dpaudit.report import format_table, write_json, write_new
from dpaudit.report.canary_plots import (
    plot_canary_grid,
    plot_roc_by_class,
    plot_score_distribution,
)
from dpaudit.report.provenance import stamped
from dpaudit.stats.roc import TPR_KEY_PREFIX, roc_summary

CLASSES = ("easy", "medium", "hard")
HELDOUT_POINTS = 2000  # at most this many held-out gradients measure the attack's variance
ATTACKS = ("covariance", "scalar")
# The audit settings this experiment reads (it has its own canaries, attacks and game, so the
# canary / attack / audit groups are not written into its JSON).
SETTINGS_USED = ("data", "model", "dp", "seed", "device", "progress")


def figure3(
    output_dir: str | Path | None = None,
    *,
    data: Mapping | None = None,
    model: Mapping | None = None,
    dp: Mapping | None = None,
    params: list[str] | None = None,
    runs: int = 100,
    canaries_per_class: int = 10,
    n_references: int = 400,
    candidates: int | None = None,
    estimator: str = "ledoit_wolf",
    subsample: float = 0.5,
    standardise: bool = True,
    sampling: str = "shuffle",
    fprs: tuple[float, ...] = (0.01, 0.1),
    seed: int = 0,
    device: str | None = None,
    progress: bool = True,
    worker: int = 0,
    workers: int = 1,
    coordination: str = "locks",
) -> dict:
    """Run the experiment; returns (and, with ``output_dir``, writes) every number as a dict.

    The runs go through the many-trainings engine (``experiment.trainings.engine``): each is
    a file under ``output_dir/runs/`` (checksummed, with the experiment's fingerprint), a rerun
    resumes, and several workers may share ``output_dir`` (``worker`` of ``workers`` only says where
    each starts; a sweep over ``task.worker`` spreads the runs over a launcher's jobs). A
    worker that leaves the evaluation to another returns a short summary instead.
    ``coordination``: "locks" (per-run claims, the default) or "static" (worker k of n trains
    runs r with r mod n == k, for shared directories without working locks; see the engine). Without
    ``output_dir`` the runs go to a temporary directory.

    ``data`` / ``model`` / ``dp`` are the audit's config groups (``dpaudit.experiment``
    settings). ``candidates`` caps the ranked pool (None: every training point that is not a
    reference, as in the paper). ``standardise`` centres each target's scores by their median
    over runs and scales them by their median absolute deviation before pooling a class
    (label-free: membership is balanced), so one threshold fits targets whose scores have
    different offsets; with ``canaries_per_class=1`` it changes nothing. ``sampling`` is
    "shuffle" (the paper's one pass over the data) or "poisson" (DP-SGD's sampler, under which
    a member is missed by a whole epoch with probability about 1/e).
    """
    settings = AuditSettings.from_mappings(
        data=dict(data or {}),
        model=dict(model or {}),
        dp=dict(dp or {}),
        seed=seed,
        device=device,
        progress=progress,
    )
    _check(runs, canaries_per_class, n_references, candidates, subsample, sampling)
    if not (isinstance(workers, int) and workers >= 1 and isinstance(worker, int)
            and 0 <= worker < workers):
        raise ValueError(f"worker must be an integer in [0, workers), workers >= 1; got "
                         f"worker={worker!r}, workers={workers!r}")
    require_choice("task.coordination", coordination, COORDINATIONS)
    t0 = time.perf_counter()
    dev = resolve_device(settings.device)
    d, m, dps = settings.data, settings.model, settings.dp
    train, test, info = d.load(seed)
    x_all, y_all = train.tensors
    rng = seeds.stream(seed, seeds.FIGURE3_GAME)
    perm = rng.permutation(x_all.shape[0])
    ref_idx, rest = perm[:n_references], perm[n_references:]
    cand_idx = rest if candidates is None else rest[:candidates]
    k = int(canaries_per_class)
    if 3 * k > cand_idx.size:
        raise ValueError(
            f"canaries_per_class={k} needs {3 * k} candidates, the pool has {cand_idx.size}"
        )
    model0 = build_model(m.name, info.input_shape, info.num_classes, m.width, seed=seed).to(dev)
    names = resolve_parameter_names(model0, params)
    ranking = rank_candidates(
        model0,
        (x_all[ref_idx].to(dev), y_all[ref_idx].to(dev)),
        (x_all[cand_idx].to(dev), y_all[cand_idx].to(dev)),
        LOSS,
        dps.max_grad_norm,
        method=estimator,
        param_names=names,
    )
    sel = select_canaries(ranking.scores, "easy_medium_hard", k=k)
    canary_pos = cand_idx[sel.indices]  # positions in the training split
    canaries = InputCanaries(x_all[canary_pos].to(dev), y_all[canary_pos].to(dev), LOSS)
    pool = np.setdiff1d(rest, canary_pos)
    n_pool = max(1, round(float(subsample) * pool.size))
    # held-out points for the second prediction: the first of the (random) non-references
    # that are not targets; no draw, so the game's stream is unchanged
    at = np.flatnonzero(~np.isin(rest, canary_pos))[:HELDOUT_POINTS]  # positions in rest
    heldout = rest[at]
    if heldout.size < 2:  # a variance needs two points (the JSON then says None)
        heldout_grads = None
    elif at[-1] < cand_idx.size:  # ranked already (always with candidates=None)
        heldout_grads = ranking.candidate_grads[at]
    else:
        heldout_grads = per_sample_clipped_grads(
            model0, x_all[heldout].to(dev), y_all[heldout].to(dev), LOSS, dps.max_grad_norm, names
        )
    b = float(dps.batch_size)
    precision = noise_aware(ranking.precision, dps.noise_multiplier, dps.max_grad_norm, b)
    q = poisson_sample_rate(dps.batch_size, n_pool)
    membership = rng.random((int(runs), canary_pos.size)) < 0.5
    for cls in CLASSES:  # refused here, before any training, rather than after all of it
        mem = membership[:, np.asarray(sel.labels) == cls]
        if mem.all() or not mem.any():
            raise ValueError(
                f"task.runs={runs}: the membership drawn for the {cls} targets has no "
                f"{'non-member' if mem.all() else 'member'} run to compare with; raise "
                "task.runs or task.canaries_per_class"
            )
    keeps = [  # every run's training set, drawn in run order from the game's stream
        np.concatenate([rng.choice(pool, size=n_pool, replace=False), canary_pos[membership[r]]])
        for r in range(int(runs))
    ]
    config = {
        "params": names, "runs": int(runs), "canaries_per_class": k,
        "n_references": int(n_references), "candidates": candidates, "estimator": estimator,
        "subsample": float(subsample), "standardise": bool(standardise), "sampling": sampling,
    }
    used = {k_: v for k_, v in settings.to_dict().items() if k_ in SETTINGS_USED
            and k_ not in ("device", "progress")}
    fp = hashlib.sha256(json.dumps({"settings": used, "config": config}, sort_keys=True,
                                   default=str).encode()).hexdigest()[:16]

    def train_run(r: int) -> Path:
        start = time.perf_counter()
        data = TensorDataset(x_all[keeps[r]], y_all[keeps[r]])
        # "shuffle" makes one pass over the data per epoch; Poisson samples at q
        rate = shuffle_sample_rate(len(data), dps.batch_size) if sampling == "shuffle" else q
        outcome = train_audited(
            copy.deepcopy(model0),
            data,
            test,
            dps,
            sample_rate=q,
            canaries=canaries,
            scores=[CovarianceScore(precision), ScalarProduct()],
            params=names,
            seed=seeds.run_seed(seed, r),
            steps=total_steps(dps, rate),
            progress=False,
            sampling=sampling,
        )
        payload = {
            "run": r, "fingerprint": fp, "membership": membership[r].astype(int).tolist(),
            "scores": {a: np.asarray(outcome.scores[a], dtype=float).tolist() for a in ATTACKS},
            "test_accuracy": float(outcome.test_accuracy), "steps": int(outcome.steps),
            "seconds": time.perf_counter() - start,
            "worker": {"index": worker, "pid": os.getpid(), "host": socket.gethostname()},
        }
        payload["checksum"] = checksum(payload)
        return write_new(run_path(out, r), payload)  # never over another worker's file

    with contextlib.ExitStack() as stack:
        out = Path(output_dir) if output_dir is not None else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="figure3_")))
        job = ManyTrainings(
            out=out, runs=int(runs), setup=lambda: _check_directory(out, fp), train=train_run,
            tidy=lambda only: set(_valid_runs(out, fp, membership, only)), worker=worker,
            workers=workers, coordination=coordination, setting="task.coordination",
            result="figure3.json", progress=progress, desc="figure 3 runs",
        )
        done = run_all(job)
        if isinstance(done, WorkerDone):
            message = f"figure 3 worker {worker}: trained {done.trained} of {runs} runs; " + (
                f"{done.waiting} runs of other workers' shares are not done yet: the last "
                f"worker to finish writes {out / 'figure3.json'}" if done.waiting else
                f"every run is done and another worker writes {out / 'figure3.json'}") + (
                f" ({done.note})" if done.note else "")
            print(message)
            return {"task": "figure3_worker", "runs_trained": done.trained, "message": message}
        evaluation = done
        records = _valid_runs(out, fp, membership)
    with evaluation:  # the evaluation's claim, held until figure3.json is written
        table = {a: np.array([records[r]["scores"][a] for r in range(int(runs))]) for a in ATTACKS}
        accuracy = [records[r]["test_accuracy"] for r in range(int(runs))]
        steps = records[0]["steps"]
        seconds_runs = float(sum(records[r]["seconds"] for r in range(int(runs))))
        pred = predicted_leakage(
            ranking.candidate_grads[sel.indices],
            ranking.precision,
            dps.noise_multiplier,
            dps.max_grad_norm,
            b,
            inclusions=max(1, round(dps.epochs)),
            total_steps=int(steps),
            heldout_grads=heldout_grads,
        )
        if standardise:
            table = {a: standardise_columns(v) for a, v in table.items()}
        labels = np.asarray(sel.labels)
        results, split = {}, {c: {} for c in CLASSES}
        for cls in CLASSES:
            cols = np.flatnonzero(labels == cls)
            entry = {
                "mahalanobis": sel.scores[cols].tolist(),
                "predicted_auc_covariance": float(np.mean(pred.auc_summed_score[cols])),
                "predicted_mu_covariance": pred.mu_summed_score[cols].tolist(),
                "predicted_auc_covariance_heldout": None,
                "predicted_mu_covariance_heldout": None,
            }
            if pred.heldout_ratio is not None:
                entry["predicted_auc_covariance_heldout"] = float(
                    np.mean(pred.auc_summed_score_heldout[cols])
                )
                entry["predicted_mu_covariance_heldout"] = (
                    pred.mu_summed_score[cols] * pred.heldout_ratio[cols]
                ).tolist()
            for a in ATTACKS:
                mem = membership[:, cols]
                s_in, s_out = table[a][:, cols][mem], table[a][:, cols][~mem]
                split[cls][a] = (s_in, s_out)
                entry[a] = roc_summary(s_in, s_out, fprs)
            results[cls] = entry
        report = {
            "settings": {k: v for k, v in settings.to_dict().items() if k in SETTINGS_USED},
            "config": {
                "params": names,
                "dim": int(ranking.precision.dim),
                "runs": int(runs),
                "canaries_per_class": k,
                "n_references": int(n_references),
                "candidates": int(cand_idx.size),
                "estimator": estimator,
                "subsample": float(subsample),
                "standardise": bool(standardise),
                "sampling": sampling,
                "steps_per_run": int(steps),
                "heldout_points": int(heldout.size),
                "device": str(dev),
            },
            "results": results,
            "test_accuracy": float(np.mean(accuracy)),
            "seconds": time.perf_counter() - t0,
            # the runs' own training times (summed over workers; on disk from earlier sessions
            # too); set-up (data, model, Algorithm 3's ranking) is measured in this process
            "seconds_runs": seconds_runs,
            "seconds_per_run": seconds_runs / int(runs),
        }
        if output_dir is not None:
            _write(report, split, ranking, sel, x_all[cand_idx], y_all[cand_idx], Path(output_dir))
        return report


def standardise_columns(s: np.ndarray) -> np.ndarray:
    """(runs, K) scores -> per-column (s - median) / MAD (MAD 0 -> scale 1)."""
    med = np.median(s, axis=0)
    mad = np.median(np.abs(s - med), axis=0)
    return (s - med) / np.where(mad > 0, mad, 1.0)


def console_table(report: dict) -> str:
    """AUC and TPR at the first FPR per class and attack, with the Gaussian prediction."""
    rows = []
    for cls, e in report["results"].items():
        row = {"target": cls, "mahalanobis": float(np.mean(e["mahalanobis"]))}
        for a in ATTACKS:
            tpr = next(k for k in e[a] if k.startswith(TPR_KEY_PREFIX))
            row[f"auc {a}"] = e[a]["auc"]
            row[f"{tpr.replace(TPR_KEY_PREFIX, 'tpr@')} {a}"] = e[a][tpr]
        row["predicted auc"] = e["predicted_auc_covariance"]
        row["held-out predicted"] = e["predicted_auc_covariance_heldout"]
        rows.append(row)
    return format_table(rows)


def _check_directory(out: Path, fingerprint: str) -> None:
    """Save the experiment's fingerprint in ``out/runs/.fingerprint.json``, or refuse a
    directory whose runs belong to another Figure 3 configuration."""
    path = out / RUNS_DIR / ".fingerprint.json"
    if path.exists():
        try:
            saved = json.loads(path.read_text()).get("fingerprint")
        except (OSError, ValueError, AttributeError):
            saved = None
        if saved != fingerprint:
            raise ValueError(f"{out} holds Figure 3 runs of another configuration "
                             f"(fingerprint {saved}, this one {fingerprint}): use a fresh one")
        return
    try:
        write_new(path, {"fingerprint": fingerprint})
    except FileExistsError:  # a peer started at the same moment (static coordination)
        _check_directory(out, fingerprint)


def _valid_runs(out: Path, fingerprint: str, membership: np.ndarray,
                only: set[int] | None = None) -> dict[int, dict]:
    """The valid run files by run number; an invalid one (checksum, fingerprint, run number
    or membership row wrong, unreadable) is moved to ``runs/quarantine/`` and its run redone
    (``only``: only the files of these runs, a static worker's share)."""
    good = {}
    for f in sorted((out / RUNS_DIR).glob("run_*.json")):
        try:
            d = json.loads(f.read_bytes().decode("utf-8"))
            ok = (isinstance(d, dict) and d.get("checksum") == checksum(d)
                  and isinstance(d["run"], int) and 0 <= d["run"] < len(membership)
                  and d.get("fingerprint") == fingerprint and f.name == run_path(out, d["run"]).name
                  and d["membership"] == membership[d["run"]].astype(int).tolist())
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError):
            ok = False
        if ok:
            good[d["run"]] = d
        elif only is None or run_number(f) in only:
            quarantine(f)
    return good


def _check(runs, canaries_per_class, n_references, candidates, subsample, sampling) -> None:
    for name, v in (
        ("runs", runs),
        ("canaries_per_class", canaries_per_class),
        ("n_references", n_references),
    ):
        if isinstance(v, bool) or int(v) != v or v < (2 if name == "runs" else 1):
            raise ValueError(
                f"{name} must be an integer >= {2 if name == 'runs' else 1}, got {v!r}"
            )
    if candidates is not None and (isinstance(candidates, bool) or int(candidates) < 3):
        raise ValueError(f"candidates must be None or an integer >= 3, got {candidates!r}")
    if not 0.0 < float(subsample) <= 1.0:
        raise ValueError(f"subsample must lie in (0, 1], got {subsample!r}")
    require_choice("sampling", sampling, SAMPLINGS)


def _write(report, split, ranking, sel, cand_x, cand_y, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    s = report["settings"]
    title = f"{PAPERS['001'][0]}, Figure 3: {s['model']['name']} on {s['data']['name']}"
    res = report["results"]
    predicted = {
        "predicted": {c: res[c]["predicted_mu_covariance"] for c in CLASSES},
        "predicted, held-out variance": {
            c: res[c]["predicted_mu_covariance_heldout"] for c in CLASSES
        },
    }
    plot_roc_by_class(split, out / "figure3_roc.png", predicted, title=title)
    plot_score_distribution(ranking.scores, sel, out / "mahalanobis_candidates.png")
    groups = sel.by_label()
    plot_canary_grid(
        {c: cand_x[v] for c, v in groups.items()},
        out / "canaries_easy_medium_hard.png",
        targets_by_label={c: cand_y[v] for c, v in groups.items()},
        scores_by_label={c: ranking.scores[v] for c, v in groups.items()},
    )
    report.update(stamped(report))
    write_json(out / "figure3.json", report)
    print("\n" + console_table(report))
    c = report["config"]
    print(
        f"{c['runs']} runs of {c['steps_per_run']} steps in {report['seconds_runs']:.1f} s "
        f"({report['seconds_per_run']:.3f} s per run) after "
        f"{report['seconds'] - report['seconds_runs']:.1f} s of set-up (d = {c['dim']})"
    )
    print(f"results: {out / 'figure3.json'}")
