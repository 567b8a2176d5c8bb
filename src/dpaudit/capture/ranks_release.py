"""Under DPDDP, the release against the ranks' noised sums: what the normalisation check reads.

Opacus' distributed optimizers add the noise on rank 0 only (the other ranks' "noised" sum is
their clipped sum), divide every rank's sum by the expected batch size (``scale_grad``) and
all-reduce the results, averaged over the ranks under ``loss_reduction="mean"``. The release
each rank applies, times the hook's divisor (B_exp x accumulated iterations x world size),
must then be S, the sum over the ranks of their noised clipped sums n_r, up to one factor
constant over the run (a learning rate). No rank holds S, only its own n_r, and sending the
n_r to each other would double the traffic of the training's own all-reduce.

A linear sketch commutes with the sum: P(S) = sum_r P(n_r). P folds every tensor to K
buckets (coordinate i to bucket i mod K, K = ``BUCKETS``, prime, so that no tensor's shape
lines up with it). Each rank sketches its n_r right after its ``add_noise``, with the sketch of
|n_r| beside it (what bounds the float rounding of the division and the all-reduce), and one
all-reduce of 2 x sum_j K_j numbers gives both sums on every rank. After the training's
all-reduce, each rank sketches what it applies, P(release x divisor), and keeps three inner
products and the rounding's bound (``records.RanksRelease``): O(1) numbers per step, O(J K)
across the ranks.

It sees a divisor that changes between steps (a rank dividing by its realised batch size), a
release that is not the ranks' sum (a step that is not all-reduced, a rank counted twice, a
sum of other tensors): any difference between release x divisor / c and S that does not
cancel exactly within every bucket. Deviations that cancel within every bucket are not seen.
"""

from __future__ import annotations

import math

import torch

from dpaudit.capture.noise_record import _fold
from dpaudit.capture.records import RanksRelease

BUCKETS = 61  # buckets per tensor (prime: i mod 61 lines up with no power-of-two shape)


def _exchange_device(device: torch.device) -> torch.device:
    """Where an all-reduce buffer lives: the parameters' device under NCCL, else the CPU."""
    return device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")


class RanksReleaseRecorder:
    """The ranks' noised sums against the release, per step (module doc).

    Args:
        params: the optimizer's parameters, in its order.
    """

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = list(params)
        self.buckets = [max(1, min(int(p.numel()), BUCKETS)) for p in self.params]
        self._width = sum(self.buckets)
        # float64 rounding of the folds: at most ceil(d / K) terms per bucket, and the product
        # of the release with the divisor
        self._fold_eps = (max(math.ceil(int(p.numel()) / k) for p, k in
                              zip(self.params, self.buckets, strict=True)) + 2) * 2.0**-53
        self._pending: torch.Tensor | None = None

    def _sketch(self, tensors, scale: float = 1.0, absolute: bool = False) -> torch.Tensor:
        """P of the tensors (flattened, float64, times ``scale``), concatenated; with
        ``absolute`` also P of their absolute values after it."""
        parts, absolutes = [], []
        for t, k in zip(tensors, self.buckets, strict=True):
            x = t.detach().reshape(-1).to(torch.float64) * scale
            parts.append(_fold(x, k).reshape(-1))
            if absolute:
                absolutes.append(_fold(x.abs(), k).reshape(-1))
        return torch.cat(parts + absolutes)

    @torch.no_grad()
    def noised(self, opt) -> None:
        """Right after this rank's ``add_noise``: its noised sum (``p.grad``), sketched and
        summed over the ranks (one all-reduce every rank takes part in)."""
        buf = self._sketch([p.grad for p in opt.params], absolute=True)
        buf = buf.to(_exchange_device(buf.device))
        torch.distributed.all_reduce(buf)
        self._pending = buf

    @torch.no_grad()
    def released(self, opt, divisor: float) -> RanksRelease | None:
        """After the all-reduce: the release times ``divisor`` against the ranks' sum (None
        when no noised sum is pending: a step whose ``add_noise`` the hook did not see)."""
        buf, self._pending = self._pending, None
        if buf is None:
            return None
        summed, absolute = buf[: self._width], buf[self._width:]
        release = self._sketch([p.grad for p in opt.params], scale=float(divisor))
        release = release.to(summed.device)
        ranks = int(torch.distributed.get_world_size())
        eps = max(float(torch.finfo(p.grad.dtype).eps) for p in opt.params)
        # release x divisor = S + E with |E_i| <= ((ranks + 1) u + O(u^2)) sum_r |n_r,i|
        # (u = eps / 2: the division, the all-reduce's ranks - 1 additions, the mean's
        # division), so ||P(E)|| <= gamma ||P(sum_r |n_r|)||
        gamma = ((ranks + 2) * eps / 2.0 + self._fold_eps) * (1.0 + 1e-6)
        stats = torch.stack([release @ release, summed @ summed, release @ summed,
                             torch.linalg.vector_norm(absolute)]).cpu().tolist()
        return RanksRelease(released=stats[0], noised=stats[1], cross=stats[2],
                            error=gamma * stats[3], ranks=ranks)
