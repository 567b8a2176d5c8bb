"""GLiR (Leemann et al. 2023; seed 001 Appendix D.3): a non-central chi-square test per step.

Under "canary not in the batch" and Gaussian gradients, g_t ~ N(mu, Sigma / b) with
Sigma = C (+ the DP noise shift), so S = b (g_t - g*)^T P (g_t - g*) with P = Sigma^{-1} is
chi2_d(b K^2), K^2 = ||g* - mu||_P^2. A member pulls g_t towards g*, so S falls in the lower
tail; the score is -log F_{chi2_d(b K^2)}(S) (higher = member; summed over steps it is Fisher's
combination). Seed 001 writes (|B| - 1) in S, the non-centrality as |B| K with K a norm, and
F^{-1} for F; we use the H0-exact calibration above. The lower tail is evaluated with scipy's
``ncx2.logcdf`` and, where that underflows, Sankaran's normal approximation in log space.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.special import log_ndtr
from scipy.stats import ncx2

from dpaudit.attacks.base import StepContext
from dpaudit.attacks.covariance import FixedPrecisionScore


def sankaran_logcdf(x: np.ndarray, df: float, nc: np.ndarray) -> np.ndarray:
    """Sankaran's (1959) normal approximation of log P(chi2_df(nc) <= x), x > 0, in log space."""
    x = np.asarray(x, dtype=np.float64)
    lam = np.asarray(nc, dtype=np.float64)
    k = float(df)
    h = 1.0 - 2.0 / 3.0 * (k + lam) * (k + 3 * lam) / (k + 2 * lam) ** 2
    p = (k + 2 * lam) / (k + lam) ** 2
    m = (h - 1.0) * (1.0 - 3.0 * h)
    mean = 1.0 + h * p * (h - 1.0 - 0.5 * (2.0 - h) * m * p)
    sd = h * np.sqrt(2.0 * p) * (1.0 + 0.5 * m * p)
    return log_ndtr(((x / (k + lam)) ** h - mean) / sd)


def ncx2_logcdf(x: np.ndarray, df: float, nc: np.ndarray) -> np.ndarray:
    """log P(chi2_df(nc) <= x): scipy, with Sankaran's approximation where scipy underflows."""
    x = np.asarray(x, dtype=np.float64)
    nc = np.broadcast_to(np.asarray(nc, dtype=np.float64), x.shape)
    out = np.array(ncx2.logcdf(x, df, nc), dtype=np.float64, ndmin=1).reshape(x.shape)
    bad = ~np.isfinite(out) & (x > 0)
    if np.any(bad):
        out[bad] = sankaran_logcdf(x[bad], df, nc[bad])
    return out


class GLiRScore(FixedPrecisionScore):
    """Per-step GLiR score -log F_{chi2_d(b K^2)}(S) with a fixed (mu_0, P), summed.

    S and K^2 come from ``FixedPrecisionScore.forms``: one projection per vector per step.
    """

    name = "glir"
    aggregate = "sum"

    def step(
        self, canary_grads: torch.Tensor, released: torch.Tensor, ctx: StepContext
    ) -> torch.Tensor:
        b = self.step_batch_size(ctx)
        op = self.precision
        # S = b ||c - a||_P^2 = b (c'Pc - 2 a'Pc + a'Pa), a = g* - mu, c = g - mu: the same
        # one projection per vector as the covariance score (shared cache for fixed canaries)
        apc, apa, cpc = self.forms(canary_grads, released)
        s = b * (cpc - 2.0 * apc + apa).clamp_min(0.0)
        x = s.detach().cpu().numpy()
        nc = b * apa.detach().clamp_min(0.0).cpu().numpy()
        logcdf = ncx2_logcdf(x, float(op.dim), nc)
        return torch.as_tensor(-logcdf, device=canary_grads.device).to(canary_grads.dtype)
