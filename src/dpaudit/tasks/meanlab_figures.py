"""Hydra task callables reproducing seed 000/001 Figure 2 and Figure 6, and seed 004's sweep.

Each task builds the lab, runs seeded games, writes ``results.json`` (every number) and PNG
plots (empirical solid, theory dotted) into ``output_dir``, and returns the results dict.
Presets: ``conf/experiment/meanlab_*.yaml``; run e.g. ``dpaudit experiment=meanlab_roc``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpaudit.meanlab import linreg
from dpaudit.meanlab import scores as sc
from dpaudit.meanlab import theory as th
from dpaudit.meanlab.distributions import (
    bernoulli_product,
    gaussian_product,
    make_target,
)
from dpaudit.meanlab.games import fixed_target_game, oracle_score
from dpaudit.meanlab.mechanisms import ExactMean, NoisyMean, SubsampledMean
from dpaudit.report.meanlab_plots import (
    FPR_GRID,
    histogram_figure,
    line_figure,
    roc_figure,
    write_json,
)
from dpaudit.seeds import as_generator
from dpaudit.stats import auc, roc_curve, tpr_at_fpr
from dpaudit.tasks.arguments import in_unit_interval, non_empty, positive

FPRS = (0.01, 0.05, 0.1, 0.3)


def _check_lab(n, d, a, rounds) -> None:
    """The lab's sizes, refused by their ``task.`` names before any draw."""
    for key, value in (("n", n), ("d", d), ("rounds", rounds)):
        positive(key, value, integer=True)
    in_unit_interval("a", a)


def _lab(seed: int, d: int, a: float):
    rng = as_generator(seed)
    return rng, bernoulli_product(d, a, rng)


def _empirical(s_in, s_out, fprs=FPRS) -> dict:
    """ROC summary of one score: AUC, TPR at the fixed FPRs, and the curve on a grid."""
    fpr, tpr, _ = roc_curve(s_in, s_out)
    return {
        "auc": auc(s_in, s_out),
        "tpr_at_fpr": dict(
            zip(map(str, fprs), np.atleast_1d(tpr_at_fpr(s_in, s_out, fprs)), strict=True)
        ),
        "roc_grid_tpr": tpr_at_fpr(s_in, s_out, FPR_GRID),
        "n_in": int(np.size(s_in)),
        "n_out": int(np.size(s_out)),
        "_curve": (fpr, tpr),
    }


def _curve(label, emp, theories) -> dict:
    fpr, tpr = emp.pop("_curve")
    return {"label": label, "fpr": fpr, "tpr": tpr, "theory": theories}


def _theory_line(label, fn, style=":") -> dict:
    return {"label": label, "fpr": FPR_GRID, "tpr": fn(FPR_GRID), "style": style}


def lr_histograms(
    output_dir: str | Path,
    seed: int = 0,
    n: int = 1000,
    d: int = 5000,
    a: float = 0.25,
    rounds: int = 2000,
    targets=("easy", "hard"),
) -> dict:
    """Figure 2 (a, b): the Eq. 5 LR score under H0 / H1 against N(-+m*/2, m*)."""
    _check_lab(n, d, a, rounds)
    rng, dist = _lab(seed, d, a)
    res, panels = {"n": n, "d": d, "a": a, "rounds": rounds, "targets": {}}, []
    for name in targets:
        z = make_target(dist, name, rng)
        m = th.leakage_score(dist.mean, dist.var, z, n)
        g = fixed_target_game(dist, ExactMean(n), z, rounds, seed=rng, balanced=True)
        s_in, s_out = g.split("lr")
        res["targets"][name] = {
            "m_star": m,
            "theory": th.lr_moments(m),
            "empirical": {
                "mean_out": s_out.mean(),
                "var_out": s_out.var(ddof=1),
                "mean_in": s_in.mean(),
                "var_in": s_in.var(ddof=1),
            },
        }
        panels.append({"title": f"{name} target", "m": m, "in": s_in, "out": s_out})
    histogram_figure(Path(output_dir) / "lr_histograms.png", panels)
    write_json(output_dir, res, task="meanlab.lr_histograms")
    return res


def _lr_summary(m: float, emp: dict, deltas) -> dict:
    """Empirical numbers next to the Gaussian LR theory for leakage score m (Thm 3.1 / 4.1)."""
    return {
        "empirical": emp,
        "leakage": th.leakage(m),
        "theory_tpr_at_fpr": {str(f): th.power(f, m) for f in FPRS},
        "gdp": th.gdp_view(np.sqrt(m), deltas),
    }


def _lr_curve(label: str, emp: dict, m: float) -> dict:
    """An empirical ROC with its theory line Phi(z_a + sqrt(m)) for the figure."""
    return _curve(label, emp, [_theory_line("theory", lambda x: th.power(x, m))])


def roc_targets(
    output_dir: str | Path,
    seed: int = 0,
    n: int = 1000,
    d: int = 5000,
    a: float = 0.25,
    rounds: int = 2000,
    targets=("easy", "medium", "hard"),
    deltas=(1e-5,),
) -> dict:
    """Figure 2 (c, d): ROC of the LR attack on the exact mean vs Phi(z_a + sqrt(m*))."""
    _check_lab(n, d, a, rounds)
    rng, dist = _lab(seed, d, a)
    res, curves = {"n": n, "d": d, "a": a, "rounds": rounds, "targets": {}}, []
    for name in targets:
        z = make_target(dist, name, rng)
        m = th.leakage_score(dist.mean, dist.var, z, n)
        g = fixed_target_game(dist, ExactMean(n), z, rounds, seed=rng)
        emp = _empirical(*g.split("lr"))
        res["targets"][name] = {"m_star": m, **_lr_summary(m, emp, deltas)}
        curves.append(_lr_curve(f"{name} (m*={m:.2f})", emp, m))
    roc_figure(Path(output_dir) / "roc_targets.png", [{"title": "exact mean", "curves": curves}])
    write_json(output_dir, res, task="meanlab.roc_targets")
    return res


def roc_noise(
    output_dir: str | Path,
    seed: int = 0,
    n: int = 1000,
    d: int = 5000,
    a: float = 0.25,
    rounds: int = 2000,
    target="easy",
    gammas=(0.0, 0.5, 1.0, 2.0),
    scaling: str = "paper",
    deltas=(1e-5,),
) -> dict:
    """Figure 2 (e): noisy mean, power Phi(z_a + sqrt(m~_gamma)) (Thm 4.1)."""
    _check_lab(n, d, a, rounds)
    rng, dist = _lab(seed, d, a)
    z = make_target(dist, target, rng)
    res = {"n": n, "d": d, "rounds": rounds, "target": target, "scaling": scaling, "gammas": {}}
    curves = []
    for gamma in gammas:
        mech = NoisyMean(n, float(gamma), scaling)
        m = th.leakage_score(dist.mean, dist.var, z, n, mech.noise_var(dist))
        g = fixed_target_game(dist, mech, z, rounds, seed=rng)
        emp = _empirical(*g.split("lr"))
        res["gammas"][str(gamma)] = {"m_tilde": m, **_lr_summary(m, emp, deltas)}
        curves.append(_lr_curve(f"gamma={gamma} (m~={m:.2f})", emp, m))
    roc_figure(
        Path(output_dir) / "roc_noise.png",
        [{"title": f"noisy mean ({scaling} scaling), {target} target", "curves": curves}],
    )
    write_json(output_dir, res, task="meanlab.roc_noise")
    return res


def roc_subsampling(
    output_dir: str | Path,
    seed: int = 0,
    n: int = 1000,
    d: int = 5000,
    a: float = 0.25,
    rounds: int = 2000,
    target="easy",
    rhos=(0.25, 0.5, 0.75),
    modes=("shared", "independent"),
) -> dict:
    """Figure 2 (f): sub-sampled mean; both formulas against both inclusion models.

    Dotted: the formula that describes the mode (mixture for "shared", rho m* for
    "independent"); dashed: the other one, for contrast.
    """
    _check_lab(n, d, a, rounds)
    rng, dist = _lab(seed, d, a)
    z = make_target(dist, target, rng)
    m = th.leakage_score(dist.mean, dist.var, z, n)
    res = {"n": n, "d": d, "rounds": rounds, "target": target, "m_star": m, "modes": {}}
    panels = []
    for mode in modes:
        curves, res["modes"][mode] = [], {}
        for rho in rhos:
            mech = SubsampledMean(n, float(rho), mode)
            r = mech.rate
            g = fixed_target_game(dist, mech, z, rounds, seed=rng)
            emp = _empirical(*g.split("lr"))
            paper = _theory_line("paper rho m*", lambda x, r=r: th.subsampled_power_paper(x, m, r))
            mix = _theory_line("mixture", lambda x, r=r: th.subsampled_power_mixture(x, m, r))
            match, other = (mix, paper) if mode == "shared" else (paper, mix)
            other["style"] = "--"
            res["modes"][mode][str(rho)] = {
                "k": mech.k,
                "rate": r,
                "empirical": emp,
                "paper_tpr_at_fpr": {str(f): th.subsampled_power_paper(f, m, r) for f in FPRS},
                "mixture_tpr_at_fpr": {str(f): th.subsampled_power_mixture(f, m, r) for f in FPRS},
                "paper_leakage": th.subsampled_leakage_paper(m, r),
                "mixture_leakage": th.subsampled_leakage_mixture(m, r),
            }
            curves.append(_curve(f"rho={rho}", emp, [match, other]))
        panels.append({"title": f"{mode} inclusion event", "curves": curves})
    roc_figure(
        Path(output_dir) / "roc_subsampling.png",
        panels,
        title=f"sub-sampled mean, {target} target, m*={m:.2f}",
    )
    write_json(output_dir, res, task="meanlab.roc_subsampling")
    return res


def reference_points(
    output_dir: str | Path,
    seed: int = 0,
    n: int = 1000,
    d: int = 5000,
    a: float = 0.25,
    rounds: int = 2000,
    target="easy",
    n0s=(50, 200, 1000, 5000, 20000),
    centred: bool = True,
    family: str = "bernoulli",
    var_spread: float = 10.0,
    radius: float = 1.2,
) -> dict:
    """Figure 6: the plug-in covariance score with n_0 references vs the oracle and the
    scalar product. family="gaussian" uses log-uniform variances in [1/spread, spread] and
    the target mu + radius * sigma (where the geometry correction matters)."""
    _check_lab(n, d, a, rounds)
    non_empty("n0s", n0s, lambda k, v: positive(k, v, integer=True))
    if family not in ("bernoulli", "gaussian"):
        raise ValueError(f"task.family must be 'bernoulli' or 'gaussian', got {family!r}")
    rng = as_generator(seed)
    if family == "bernoulli":
        dist = bernoulli_product(d, a, rng)
        z = make_target(dist, target, rng)
    elif family == "gaussian":
        var = np.exp(rng.uniform(-np.log(var_spread), np.log(var_spread), d))
        dist = gaussian_product(np.zeros(d), var)
        z = radius * np.sqrt(var)
    else:
        raise ValueError(f"family must be 'bernoulli' or 'gaussian', got {family!r}")
    m = th.leakage_score(dist.mean, dist.var, z, n)
    z_ref = dist.sample(rng, 1)[0]
    mech = ExactMean(n)
    scores = {
        "oracle": oracle_score(dist, mech),
        "scalar": lambda o, zz: sc.scalar_product(o, zz, z_ref),
    }
    ests = {}
    for n0 in n0s:
        est = sc.reference_estimate(dist=dist, n0=int(n0), rng=rng, centred=centred)
        ests[int(n0)] = est
        scores[f"plugin_{int(n0)}"] = lambda o, zz, e=est: sc.plugin_lr(o, zz, e, n)
    g = fixed_target_game(dist, mech, z, rounds, scores, seed=rng)
    res = {"n": n, "d": d, "family": family, "centred": centred, "m_star": m, "scores": {}}
    curves = []
    for name in scores:
        emp = _empirical(*g.split(name))
        if name == "oracle":
            mu = np.sqrt(m)
        elif name == "scalar":
            mu = th.linear_score_mu(z - z_ref, dist.mean, dist.var, z, n)
        else:
            mu = th.linear_score_mu(
                ests[int(name.split("_")[1])].weights(z), dist.mean, dist.var, z, n
            )
        res["scores"][name] = {
            "empirical": emp,
            "mu_theory": mu,
            "theory_tpr_at_fpr": {str(f): th.roc_of_mu(f, mu) for f in FPRS},
        }
        curves.append(
            _curve(name, emp, [_theory_line("theory", lambda x, mu=mu: th.roc_of_mu(x, mu))])
        )
    roc_figure(
        Path(output_dir) / "roc_reference_points.png",
        [{"title": f"plug-in score vs n0 ({family}, m*={m:.2f})", "curves": curves}],
    )
    x = [int(k) for k in n0s]
    line_figure(
        Path(output_dir) / "power_vs_n0.png",
        [
            {
                "x": x,
                "y": [res["scores"][f"plugin_{k}"]["empirical"]["tpr_at_fpr"]["0.05"] for k in x],
                "label": "plug-in, empirical",
                "style": "-o",
            },
            {
                "x": x,
                "y": [res["scores"][f"plugin_{k}"]["theory_tpr_at_fpr"]["0.05"] for k in x],
                "label": "plug-in, theory given the estimates",
                "style": ":",
                "color": "C0",
            },
            {"x": x, "y": [th.power(0.05, m)] * len(x), "label": "oracle LR theory", "style": ":"},
            {
                "x": x,
                "y": [res["scores"]["scalar"]["empirical"]["tpr_at_fpr"]["0.05"]] * len(x),
                "label": "scalar product, empirical",
                "style": "-",
            },
        ],
        "n0 (reference points)",
        "TPR at FPR 0.05",
        logx=True,
    )
    write_json(output_dir, res, task="meanlab.reference_points")
    return res


def linreg_sweep(
    output_dir: str | Path,
    seed: int = 0,
    n: int = 30,
    D: int = 600,
    rounds: int = 1000,
    gammas=(1.2, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0),
    noise_std: float = 1.0,
    ridges=(0.0,),
) -> dict:
    """Seed 004: membership advantage vs gamma = p/n for min-norm (and ridge) regression."""
    for key, value in (("n", n), ("D", D), ("rounds", rounds)):
        positive(key, value, integer=True)
    non_empty("gammas", gammas, positive)
    non_empty("ridges", ridges)
    rng = as_generator(seed)
    res = {"n": n, "D": D, "rounds": rounds, "noise_std": noise_std, "ridge": {}}
    series = []
    for i, lam in enumerate(ridges):
        rows = linreg.advantage_sweep(gammas, n, D, rounds, rng, noise_std, float(lam))
        res["ridge"][str(lam)] = rows
        xs = [r["gamma"] for r in rows]
        if float(lam) == 0.0:
            series.append(
                {
                    "x": xs,
                    "y": [r["adv_sim"] for r in rows],
                    "style": "-o",
                    "label": "min-norm, simulated (y^2 test)",
                    "color": f"C{i}",
                }
            )
            series.append(
                {
                    "x": xs,
                    "y": [r["adv_theory"] for r in rows],
                    "style": ":",
                    "label": "min-norm, Theorem 3.2",
                    "color": f"C{i}",
                }
            )
        else:
            series.append(
                {
                    "x": xs,
                    "y": [r["adv_gauss_fit"] for r in rows],
                    "style": "-s",
                    "label": f"ridge lam={lam}, simulated",
                    "color": f"C{i}",
                }
            )
    line_figure(
        Path(output_dir) / "linreg_advantage.png",
        series,
        "gamma = p / n",
        "membership advantage",
        title=f"n={n}, D={D}",
        logx=True,
    )
    write_json(output_dir, res, task="meanlab.linreg_sweep")
    return res
