"""Canary independence, watched by the hook: the data's clipped sum on the gradient canaries'
coordinates, against a known answer (a zero input feature that the loop switches on from a
given step: exactly the canaries on its weights come alive, at exactly that step)."""

from __future__ import annotations

import numpy as np
from capture_support import digits_flat, dirac_coords, logreg, private_run

from dpaudit import audit_report
from dpaudit.capture import AuditHook, GradientCanaries, InputCanaries

DATA, ZERO = digits_flat(pad=8, n_train=400)
NF = 72
D = NF * 10 + 10
PAD = list(range(64, 72))  # the padded features, zero in every example
COORDS = dirac_coords(PAD, NF)  # weights W[c, j] of the padded features: dead by structure
LIVE_FROM = 3  # the step from which the loop puts 1.0 on feature 64


def _run(switch_on: bool):
    policy = ["every_step" if i % 2 else "never" for i in range(len(COORDS))]

    def hook_fn(opt, model):
        x, y = DATA.tensors
        return AuditHook(opt, model, [InputCanaries(x[:4], y[:4]),
                                      GradientCanaries.dirac(COORDS, norm=1.0, dim=D,
                                                             policy=policy)])

    def on_batch(i, xb):
        if switch_on and i >= LIVE_FROM:
            xb = xb.clone()
            xb[:, 64] = 1.0
        return xb

    return private_run(DATA, logreg(NF), hook_fn, sigma=1.0, lr=0.3, on_batch=on_batch)


def test_structurally_dead_canaries_stay_independent():
    run = _run(switch_on=False)
    rec = run.hook.white_box_records().independence
    assert rec.steps == run.hook.steps
    inputs, grads = rec.sets
    assert not inputs["watched"] and inputs["canaries"] == 4
    assert grads["watched"] and grads["live_canaries"] == 0 and grads["first_step"] == -1
    assert grads["coordinates"] == len(COORDS) and grads["largest"] == 0.0


def test_canaries_the_data_reach_are_named_with_their_first_step():
    run = _run(switch_on=True)
    grads = run.hook.white_box_records().independence.of_set(1)
    on = {c * NF + 64 for c in range(10)}  # the weights of feature 64, and only those
    live = {COORDS[k] for k in grads["live_rows"]}
    assert live == on and grads["live_canaries"] == 10 and grads["live_coordinates"] == 10
    assert grads["first_step"] == LIVE_FROM
    first = grads["first_live"][0]
    assert first["parameter"].endswith("weight") and first["position"][1] == 64
    assert first["step"] == LIVE_FROM and 0 < first["largest"] <= 1.0 + 1e-6  # in units of C
    # the audit withdraws what assumed independent canaries, and says so
    res = audit_report(run.hook, privacy_engine=run.engine, canaries=1,
                       independent_canaries=True)
    assert res["independent_canaries"] is False
    assert res["white_box"]["canary_independence"]["withdrawn"]
    assert any("canary independence" in w and f"step {LIVE_FROM}" in w
               for w in res["verdict"]["warnings"])
    cp = [b for b in res["bounds"] if b["method"] == "clopper_pearson"]
    assert cp and all(b["kind"] != "certified" for b in cp)
    assert np.isfinite(res["verdict"]["claimed_epsilon"])
