"""Opacus DPDDP + ``DistributedDPOptimizer`` with two real CPU processes (gloo).

Each rank runs the same seeded training three times: without the hook, with Dirac gradient
canaries on weights of input features that are zero in every example (they never change the
forward pass), and with input canaries. The independent instrument is a pre-hook on the
optimizer Opacus wraps, recording the gradient really applied (after the all-reduce) and the
parameters it is applied to. Checked: canaries enter the applied gradient exactly once
(C / (B_exp x world size) per inclusion, not once per rank), every rank scores the applied
gradient, inclusions and scores agree across ranks, input canaries leave training unchanged and
their gradients equal a per-example autograd reference clipped at C. The noise the hook
records is the released one, summed over the ranks after the all-reduce: the same on every
rank, the claimed scale for Opacus' own noise, and nothing where two ranks' noises cancel.
The release is checked against the sum of the ranks' noised sums (``normalisation``, through a
sketch summed over the ranks): on a correct run the training data's upper side is verified,
and two planted DDP bugs (every rank dividing by its realised batch size; every other step not
all-reduced) are refuted by it on every rank.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ddp_support import WORLD  # the shared run's world size
from torch import nn

from dpaudit.attacks import StepScore

SIGMA, CLIP, BATCH = 1.0, 1.0, 32


class Keep(StepScore):
    """Test score: keeps the released gradient and canary gradients the hook scores."""

    name = "keep"

    def __init__(self):
        self.released: list[torch.Tensor] = []
        self.canaries: list[torch.Tensor] = []

    def step(self, canary_grads, released, ctx):
        self.released.append(released.clone())
        self.canaries.append(canary_grads.clone())
        return canary_grads @ released


def _cancel_noise(opt, rank):
    """A DDP bug: rank 1 adds minus the noise rank 0 adds (one shared seed, the sign flipped
    for 'antithetic' ranks): every rank's update looks noisy, the all-reduced one is not."""
    from opacus.optimizers import DPOptimizer

    from dpaudit.capture.patching import InstancePatch

    def add_noise():
        if rank == 0:
            DPOptimizer.add_noise(opt)
            return
        DPOptimizer.add_noise(opt)  # the same generator state as rank 0: the same noise
        for p in opt.params:
            p.grad = (2 * p.summed_grad - p.grad.view_as(p.summed_grad)).view_as(p)

    InstancePatch(opt, "add_noise", add_noise, owner="test").apply()


def _unreduced_steps(opt):
    """A DDP bug: every other step is not all-reduced (a ``no_sync`` left open around the
    step): each rank applies its own sum divided as if it were the average, rank 1 its clipped
    sum without noise."""
    from dpaudit.capture.patching import InstancePatch

    steps = [0]

    def reduce_gradients():
        steps[0] += 1
        if steps[0] % 2:
            type(opt).reduce_gradients(opt)
            return
        for p in opt.params:
            p.grad /= opt.world_size

    InstancePatch(opt, "reduce_gradients", reduce_gradients, owner="test").apply()


def _realised_batch_size(opt):
    """The zoo's ``realised_batch_size`` on every rank: each divides by its own batch."""
    from dpaudit.bugs import plant_bug

    plant_bug(opt, "realised_batch_size")


def _run(rank, data, hook_fn, ghost=False, cancel=False, with_loader=False, alike=False,
         bug=None):
    from opacus import PrivacyEngine
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
    from torch.utils.data import DataLoader

    torch.manual_seed(rank)
    nf = data.tensors[0].shape[1]
    model = DPDDP(nn.Linear(nf, 10))
    extra = {"criterion": nn.CrossEntropyLoss(), "grad_sample_mode": "ghost"} if ghost else {}
    engine = PrivacyEngine()
    made = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(data, batch_size=BATCH),
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        noise_generator=torch.Generator().manual_seed(7),
        **extra,
    )
    if ghost:
        model, opt, crit, loader = made
    else:
        (model, opt, loader), crit = made, nn.CrossEntropyLoss()
    applied, params = [], []

    def pre(o, a, k):
        ps = [p for g in o.param_groups for p in g["params"]]
        applied.append(torch.cat([p.grad.reshape(-1).clone() for p in ps]))
        params.append([p.detach().clone() for p in ps])

    opt.original_optimizer.register_step_pre_hook(pre)
    if cancel:
        _cancel_noise(opt, rank)
    if bug is not None:
        bug(opt)
    hook = (hook_fn(opt, model, loader) if with_loader else hook_fn(opt, model)) if hook_fn \
        else None
    if hook:
        hook.attach()
    # Poisson sampling: the same draws with and without hook; ``alike``: every rank seeded
    # alike (a common set-up), so the ranks' samplers draw the same masks
    torch.manual_seed(100 if alike else 100 + rank)
    local_sizes = []
    for _ in range(2):
        for xb, yb in loader:
            local_sizes.append(len(xb))
            opt.zero_grad()
            crit(model(xb), yb).backward()
            opt.step()
    if hook:
        hook.detach()
    out = {"applied": torch.stack(applied), "params": params, "type": type(opt).__name__}
    out["b_exp"] = opt.expected_batch_size
    if hook:
        keep = hook.score_fns[0]
        out.update(
            released=torch.stack(keep.released),
            canary_grads=torch.stack(keep.canaries),
            inclusions=hook.inclusions(),
            scores=hook.scores()["keep"],
            folded=hook.folded_steps,
        )
        from dpaudit.experiment.judging.premises import training_data_block
        from dpaudit.experiment.judging.white_box import (
            describe,
            not_checked,
            white_box_evidence,
        )

        rec = hook.white_box_records(accountant_history=engine.accountant.history,
                                     accountant=engine.accountant.mechanism())
        checks = white_box_evidence(rec, 1e-7, 0.05)
        out["white_box"] = {k: (c.rejected, c.p_value) for k, c in checks.items()}
        out["described"] = {k: describe(c) for k, c in checks.items() if c.rejected}
        if "normalisation" in checks:
            out["normalisation"] = checks["normalisation"].details
        from dpaudit.experiment.judging.user_claim import claim_of_run

        claim = claim_of_run(None, delta=1e-5, accountant=rec.accountant,
                             history=engine.accountant.history)
        block = training_data_block(rec, checks, claim, unchecked=not_checked(rec, True))
        # what a multi-run audit's run file would keep of them, through JSON
        import json

        from dpaudit._jsonable import to_jsonable
        from dpaudit.capture.records_io import compact, records_from_dict, records_to_dict

        back = records_from_dict(json.loads(json.dumps(to_jsonable(records_to_dict(
            compact(rec))))))
        out["round_trip"] = {k: (c.rejected, c.details) for k, c in
                             white_box_evidence(back, 1e-7, 0.05).items()
                             if k == "normalisation"}
        out["upper"] = (block["upper_status"], block["upper_reasons"], block["epsilon_upper"])
        out["ranks_release"] = [s.ranks_release for s in rec.steps]
        out["noise_sq"] = np.stack([s.sq for s in rec.noise_steps])
        out["noise_dims"] = rec.noise.dims
        out["noise_source"] = rec.noise.source
        out["not_checked"] = not_checked(rec, True)
        out["local_sizes"] = local_sizes
        if rec.by_example is not None:
            out["by_example"] = {"counts": rec.by_example.counts, "sizes": rec.by_example.sizes,
                                 "ranks": rec.by_example.ranks, "n": rec.by_example.n,
                                 "rank_sizes": rec.by_example.rank_sizes}
            from dpaudit.experiment.judging.doors import sampling_check

            check = sampling_check(rec, 1e-7, 1e-5)
            out["sampling_seen"] = check.details["sampling_seen"]["kind"]
        probe = rec.noise_source
        out["probe"] = (probe.steps_probed, probe.conclusive, int(probe.data_dependent.sum()),
                        int(probe.stale.sum()))
    return out


def _refusal(data, canaries):
    """The hook's error for a plain (non-distributed) DPOptimizer in a 2-process group."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader

    from dpaudit.capture import AuditHook

    model = nn.Linear(data.tensors[0].shape[1], 10)
    model, opt, _ = PrivacyEngine().make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(data, batch_size=BATCH),
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
    )
    try:
        AuditHook(opt, model, canaries)
    except ValueError as e:
        return f"{type(opt).__name__}: {e}"
    return None


def ddp_results(rank: int) -> dict:
    """What one rank of the shared two-process group records for this file's tests (called by
    ``ddp_support.both_files_worker`` inside the initialised gloo group)."""
    from capture_support import digits_flat, dirac_coords

    from dpaudit.capture import AuditHook, GradientCanaries, InputCanaries

    data, zero = digits_flat(pad=6, n_train=256)
    nf = data.tensors[0].shape[1]
    coords = dirac_coords(zero, nf)
    k = len(coords) - len(coords) % 3
    pols = ["every_step", "never", "bernoulli"] * (k // 3)
    grad = GradientCanaries.dirac(
        coords[:k], CLIP, nf * 10 + 10, policy=pols, inclusion_prob=0.5, seed=3
    )
    x, y = data.tensors
    results = {
        "plain": _run(rank, data, None),
        "grad": _run(rank, data, lambda o, m: AuditHook(o, m, grad, scores=(Keep(),))),
        "ghost_plain": _run(rank, data, None, ghost=True),
        "ghost": _run(
            rank, data, lambda o, m: AuditHook(o, m, grad, scores=(Keep(),)), ghost=True
        ),
        "input": _run(
            rank, data, lambda o, m: AuditHook(o, m, InputCanaries(x[:3], y[:3]), (Keep(),))
        ),
        "input_batch": _run(
            rank,
            data,
            lambda o, m: AuditHook(
                o, m, InputCanaries(x[:3], y[:3]), (Keep(),), input_pass="batch"
            ),
        ),
    }
    results["cancel"] = _run(rank, data, lambda o, m: AuditHook(o, m, grad, scores=(Keep(),)),
                             cancel=True)
    results["loader"] = _run(
        rank, data, lambda o, m, loader: AuditHook(o, m, grad, scores=(Keep(),),
                                                   data_loader=loader), with_loader=True)
    results["alike"] = _run(
        rank, data, lambda o, m, loader: AuditHook(o, m, grad, scores=(Keep(),),
                                                   data_loader=loader), with_loader=True,
        alike=True)
    for name, bug in (("divisor", _realised_batch_size), ("unreduced", _unreduced_steps)):
        results[name] = _run(
            rank, data, lambda o, m, loader: AuditHook(o, m, grad, scores=(Keep(),),
                                                       data_loader=loader),
            with_loader=True, bug=bug)
    results["coords"], results["x"], results["y"] = coords[:k], x[:3], y[:3]
    results["refusal"] = _refusal(data, grad)
    return results


@pytest.mark.slow
@pytest.mark.xdist_group("ddp")
def test_the_sampling_by_example_is_the_union_over_the_ranks_on_every_rank(ranks):
    a, b = (r["loader"] for r in ranks)
    assert a["by_example"]["ranks"] == b["by_example"]["ranks"] == WORLD
    for key in ("counts", "sizes"):  # every rank holds the same records: the union
        np.testing.assert_array_equal(a["by_example"][key], b["by_example"][key])
    # each recorded batch is the union of the ranks' local batches of that step
    union = np.asarray(a["local_sizes"]) + np.asarray(b["local_sizes"])
    np.testing.assert_array_equal(a["by_example"]["sizes"], union)
    assert a["by_example"]["counts"].sum() == union.sum()
    # and every check of the other doors runs on both ranks, none refuting Opacus' DPDDP
    for r in (a, b):
        for name in ("sampling_by_example", "sampling_duplicates", "model_integrity",
                     "noise_ignores_data"):
            assert name in r["white_box"] and not r["white_box"][name][0], (name, r["white_box"])
    # the noise probe runs on rank 0, where the noise is added; both ranks hold its outcome
    assert a["probe"] == b["probe"] and a["probe"][1] >= 1 and a["probe"][2:] == (0, 0)
    # each rank's own batch sizes are kept: they add up to the union's
    np.testing.assert_array_equal(a["by_example"]["rank_sizes"].sum(axis=1), union)


@pytest.mark.slow
@pytest.mark.xdist_group("ddp")
def test_ranks_seeded_alike_are_refuted_as_not_poisson(ranks):
    # every rank's sampler seeded alike draws the same mask over its shard: the examples at one
    # shard position are sampled together, and each rank's batch has the other's size
    a, b = (r["alike"] for r in ranks)
    sizes = a["by_example"]["rank_sizes"]
    assert np.array_equal(sizes[:, 0], sizes[:, 1])
    for r in (a, b):
        assert r["white_box"]["sampling_by_example"][0], r["white_box"]
        assert r["sampling_seen"] == "ranks drawing alike"
    assert a["sampling_seen"] == "ranks drawing alike"


@pytest.fixture(scope="module")
def ranks(ddp_group):
    """This file's part of the one two-process DDP run both DDP test files share."""
    return [r["ddp"] for r in ddp_group]


@pytest.mark.slow
@pytest.mark.xdist_group("ddp")  # one worker: the two-process run is shared
@pytest.mark.parametrize(
    "plain_key,key,opt_type",
    [
        ("plain", "grad", "DistributedDPOptimizer"),
        ("ghost_plain", "ghost", "DistributedDPOptimizerFastGradientClipping"),
    ],
)
def test_gradient_canaries_enter_once_and_every_rank_scores_the_applied_gradient(
    ranks, plain_key, key, opt_type
):
    r0 = ranks[0]
    assert r0[key]["type"] == opt_type
    coords = r0["coords"]
    for r in ranks:
        plain, run = r[plain_key], r[key]
        inc = run["inclusions"]
        expected = plain["applied"].clone()
        for t in range(len(expected)):
            for j, c in enumerate(coords):
                expected[t, c] += float(inc[j, t]) * CLIP / (run["b_exp"] * WORLD)
        torch.testing.assert_close(run["applied"], expected, rtol=0, atol=1e-6)
        torch.testing.assert_close(run["released"], run["applied"], rtol=0, atol=0)
    # the ranks apply, draw and score the same
    torch.testing.assert_close(ranks[1][key]["applied"], r0[key]["applied"], rtol=0, atol=0)
    np.testing.assert_array_equal(ranks[1][key]["inclusions"], r0[key]["inclusions"])
    np.testing.assert_array_equal(ranks[1][key]["scores"], r0[key]["scores"])
    # closed form: per inclusion <C e_c, g_t> has mean C^2 / (B_exp W), sd sigma C^2 / (B_exp W)
    s, t_steps, k = r0[key]["scores"], len(r0[key]["applied"]), len(coords)
    unit = CLIP**2 / (r0[key]["b_exp"] * WORLD)
    shift = s[0::3].mean() - s[1::3].mean()
    sd = np.sqrt(t_steps * 2 / (k // 3)) * SIGMA * unit
    assert abs(shift - t_steps * unit) < 5 * sd, (shift, t_steps * unit, sd)


@pytest.mark.slow
@pytest.mark.xdist_group("ddp")  # one worker: the two-process run is shared
def test_input_canaries_leave_training_unchanged_and_match_autograd_on_every_rank(ranks):
    from dpaudit.gradients.persample import clip_factor

    for r, mode in [(r, mode) for r in ranks for mode in ("input", "input_batch")]:
        plain, run = r["plain"], r[mode]
        torch.testing.assert_close(run["applied"], plain["applied"], rtol=0, atol=0)
        torch.testing.assert_close(run["released"], run["applied"], rtol=0, atol=0)
        if mode == "input":  # input_pass="auto" takes the separate pass under DDP
            assert run["folded"] == 0
        else:  # "batch" folds (empty Poisson batches: separate pass); exact on this model
            assert run["folded"] >= len(run["applied"]) - 2
        for t, (w, b) in enumerate(run["params"]):
            rows = []
            for i in range(len(r["x"])):
                wi, bi = w.clone().requires_grad_(), b.clone().requires_grad_()
                loss = nn.functional.cross_entropy(r["x"][i : i + 1] @ wi.T + bi, r["y"][i : i + 1])
                gw, gb = torch.autograd.grad(loss, (wi, bi))
                rows.append(torch.cat([gw.reshape(-1), gb]))
            ref = torch.stack(rows)
            ref = ref * clip_factor(ref.norm(dim=1), CLIP)[:, None]
            torch.testing.assert_close(run["canary_grads"][t], ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        ranks[1]["input"]["canary_grads"], ranks[0]["input"]["canary_grads"], rtol=0, atol=1e-7
    )


@pytest.mark.slow
@pytest.mark.xdist_group("ddp")  # one worker: the two-process run is shared
def test_a_plain_dp_optimizer_in_a_two_process_group_is_refused(ranks):
    for r in ranks:
        msg = r["refusal"]
        assert msg is not None and msg.startswith("DPOptimizer:"), msg
        assert "2 processes" in msg and "DifferentiallyPrivateDistributedDataParallel" in msg


@pytest.mark.slow
@pytest.mark.xdist_group("ddp")
@pytest.mark.parametrize("key", ["grad", "ghost"])
def test_the_noise_is_read_after_the_all_reduce_on_every_rank(ranks, key):
    runs = [r[key] for r in ranks]
    for r in runs:
        assert "summed over the ranks" in r["noise_source"]
        # Opacus adds the noise on rank 0 only: the released noise has the claimed scale
        ratio = r["noise_sq"] / np.asarray(r["noise_dims"])[None, :]
        assert np.median(ratio[:, 0]) == pytest.approx(1.0, abs=0.15)
        assert not any(rejected for rejected, _ in r["white_box"].values()), r["white_box"]
        # the release against the ranks' noised sums: checked, no line says it was not
        assert "normalisation" in r["white_box"]
        assert not any(s.startswith("normalisation") for s in r["not_checked"])
    np.testing.assert_allclose(runs[0]["noise_sq"], runs[1]["noise_sq"], rtol=1e-10)


@pytest.mark.slow
@pytest.mark.xdist_group("ddp")
def test_noise_that_cancels_between_ranks_is_refuted(ranks):
    for r in ranks:
        assert r["cancel"]["white_box"]["noise_scale"][0]
        assert r["cancel"]["white_box"]["noise_scale"][1] < 1e-12


@pytest.mark.slow
@pytest.mark.xdist_group("ddp")
def test_the_release_is_the_ranks_sum_and_the_upper_side_is_verified(ranks):
    # a correct DPDDP run with the loader given: every premise of the training data's epsilon
    # is seen, the release against the sum of the two ranks' noised sums included
    for r in ranks:
        run = r["loader"]
        assert not any(rejected for rejected, _ in run["white_box"].values()), run["white_box"]
        status, reasons, upper = run["upper"]
        assert status == "verified" and reasons == [] and upper > 0, run["upper"]
        norm = run["normalisation"]
        assert norm["ranks"] == WORLD
        # Opacus' release x (B_exp x world size) is the ranks' sum itself, up to float32
        assert norm["median_ratio"] == pytest.approx(1.0, abs=1e-6)
        assert norm["spread"] < 1e-5 and norm["largest_residual"] < 1e-5
        # the records a run file keeps give the same check, exactly
        assert run["round_trip"]["normalisation"] == (False, norm)
    # the ranks hold the same record of every step (the sketch is summed over them)
    a, b = (r["loader"]["ranks_release"] for r in ranks)
    assert len(a) == len(ranks[0]["loader"]["applied"]) and all(x is not None for x in a)
    for x, y in zip(a, b, strict=True):
        assert x.noised == pytest.approx(y.noised, rel=1e-12) and x.ranks == WORLD


@pytest.mark.slow
@pytest.mark.xdist_group("ddp")
def test_planted_ddp_bugs_are_refuted_by_the_normalisation_on_every_rank(ranks):
    for r in ranks:
        # every rank divides by its own realised batch size: the ranks' sums are weighted
        # differently (the release is no multiple of their sum) and the ratio changes
        bug = r["divisor"]
        assert bug["white_box"]["normalisation"] == (True, 0.0), bug["white_box"]
        assert "divided differently or not all-reduced" in bug["described"]["normalisation"]
        norm = bug["normalisation"]
        assert norm["largest_residual"] > 1e-2 and norm["spread"] > 1e-2
        assert bug["upper"][0] == "refuted"
        # every other step not all-reduced: what each rank applies is not the ranks' sum
        bug = r["unreduced"]
        assert bug["white_box"]["normalisation"] == (True, 0.0), bug["white_box"]
        assert "not a multiple of the sum of the 2 ranks' noised sums" in (
            bug["described"]["normalisation"])
        assert bug["upper"][0] == "refuted"


@pytest.mark.slow
@pytest.mark.xdist_group("ddp")
def test_the_own_loops_audit_report_verifies_the_upper_side_under_dpddp():
    # the user's path: an own Opacus loop under DPDDP (2 gloo processes), audit_report on
    # every rank with the engine and the loader: every premise seen, none refuted
    from own_loop_models import own_loop_ddp_audit

    res = own_loop_ddp_audit(seed=0)
    td = res["verdict"]["training_data"]
    assert res["verdict"]["status"] == "consistent", res["verdict"]["message"]
    assert td["upper_status"] == "verified" and td["upper_reasons"] == [], td["upper_reasons"]
    norm = res["white_box"]["checks"]["normalisation"]
    assert not norm["rejected"] and "sum of the 2 ranks' noised sums" in norm["checked"][0]
    # the per-tensor noise bound (issue 65) pays for this small loop's 4-coordinate biases
    # (120 draws each: U / claimed 1.10-1.81 over the own loops, docs/evidence.md); the
    # figure that assumes one noise scale stays within 1.25x
    assert td["epsilon_claimed"] < td["epsilon_upper"] < 2.0 * td["epsilon_claimed"]
    assert td["epsilon_claimed"] < td["epsilon_upper_one_scale"] < 1.25 * td["epsilon_claimed"]
