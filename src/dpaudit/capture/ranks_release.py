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
lines up with it). Each rank sketches its n_r right after its ``add_noise``, with the norm of
each of its tensors beside it (what bounds the float rounding of the division and the
all-reduce), and one all-reduce of sum_j K_j + J numbers sums both over the ranks. After the
training's all-reduce, each rank sketches what it applies, P(release x divisor), and keeps
three inner products and the rounding's bound (``records.RanksRelease``): O(1) numbers per
step, O(J K) across the ranks, two O(d) passes per step (a third for the norms), in float64
(numpy on the CPU, where its reduction is several times torch's).

It sees a divisor that changes between steps (a rank dividing by its realised batch size), a
release that is not the ranks' sum (a step that is not all-reduced, a rank counted twice, a
sum of other tensors): any difference between release x divisor / c and S that does not
cancel exactly within every bucket. Deviations that cancel within every bucket are not seen.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dpaudit.capture.records import RanksRelease

BUCKETS = 61  # buckets per tensor (prime: i mod 61 lines up with no power-of-two shape)


def _exchange_device(device: torch.device) -> torch.device:
    """Where an all-reduce buffer lives: the parameters' device under NCCL, else the CPU."""
    return device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")


def fold64(t: torch.Tensor, k: int) -> torch.Tensor:
    """``t`` flattened and folded to ``k`` buckets (coordinate i to bucket i mod k), summed in
    float64 (each term exact, the sum of m = ceil(d / k) terms within m 2^-53 of it); numpy's
    reduction on the CPU, torch's elsewhere."""
    x = t.detach().reshape(-1)
    n = x.numel()
    whole = n - n % k
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        a = x.numpy()
        out = np.add.reduce(a[:whole].reshape(-1, k), axis=0, dtype=np.float64)
        out[: n - whole] += a[whole:]
        return torch.from_numpy(out)
    out = x[:whole].reshape(-1, k).sum(0, dtype=torch.float64)
    out[: n - whole] += x[whole:].to(torch.float64)
    return out


class RanksReleaseRecorder:
    """The ranks' noised sums against the release, per step (module doc).

    Args:
        params: the optimizer's parameters, in its order.
    """

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = list(params)
        self.buckets = [max(1, min(int(p.numel()), BUCKETS)) for p in self.params]
        self._width = sum(self.buckets)
        # terms per bucket of each tensor: ||P(|y|)||^2 <= sum_j m_j ||y_j||^2 (Cauchy-Schwarz
        # in each bucket)
        self._terms = torch.tensor([math.ceil(int(p.numel()) / k) for p, k in
                                    zip(self.params, self.buckets, strict=True)],
                                   dtype=torch.float64)
        # float64 rounding of the folds (m terms a bucket) and of the product with the divisor
        self._fold_eps = (float(self._terms.max()) + 2.0) * 2.0**-53
        self._pending: torch.Tensor | None = None

    def _sketch(self, tensors) -> torch.Tensor:
        """P of the tensors, concatenated (float64)."""
        return torch.cat([fold64(t, k).to(torch.float64)
                          for t, k in zip(tensors, self.buckets, strict=True)])

    @torch.no_grad()
    def noised(self, opt) -> None:
        """Right after this rank's ``add_noise``: its noised sum (``p.grad``) sketched, with
        each tensor's norm, summed over the ranks (one all-reduce every rank takes part in)."""
        grads = [p.grad for p in opt.params]
        sketch = self._sketch(grads)
        device = _exchange_device(sketch.device)
        norms = torch.stack([torch.linalg.vector_norm(g.detach(), dtype=torch.float64)
                             for g in grads]).to(device)
        buf = torch.cat([sketch.to(device), norms])
        torch.distributed.all_reduce(buf)
        self._pending = buf

    @torch.no_grad()
    def released(self, opt, divisor: float) -> RanksRelease | None:
        """After the all-reduce: the release times ``divisor`` against the ranks' sum (None
        when no noised sum is pending: a step whose ``add_noise`` the hook did not see)."""
        buf, self._pending = self._pending, None
        if buf is None:
            return None
        summed, norms = buf[: self._width], buf[self._width:]
        release = self._sketch([p.grad for p in opt.params]).to(summed.device) * float(divisor)
        ranks = int(torch.distributed.get_world_size())
        eps = max(float(torch.finfo(p.grad.dtype).eps) for p in opt.params)
        # release x divisor = S + E with |E_i| <= ((ranks + 1) u + O(u^2)) sum_r |n_r,i|
        # (u = eps / 2: the division, the all-reduce's ranks - 1 additions, the mean's
        # division), so ||P(E)|| <= gamma ||P(sum_r |n_r|)||, and that is at most
        # gamma sqrt(sum_j m_j (sum_r ||n_r,j||)^2)
        gamma = ((ranks + 2) * eps / 2.0 + self._fold_eps) * (1.0 + 1e-6)
        bound = torch.sqrt((self._terms.to(norms.device) * norms * norms).sum())
        stats = torch.stack([release @ release, summed @ summed, release @ summed,
                             bound]).cpu().tolist()
        return RanksRelease(released=stats[0], noised=stats[1], cross=stats[2],
                            error=gamma * stats[3], ranks=ranks)
