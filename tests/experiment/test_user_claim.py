"""One verdict, about the user's claim (``experiment.judging.user_claim`` and ``verdict``): the
status, title and exit code answer the user's epsilon, read exactly as they made it (their
accountant, its history, their delta), the cause of a finding first, the every-step canaries
reported apart as the mechanism's stress test."""

from __future__ import annotations

import numpy as np
import pytest
from claim_loops import train

from dpaudit import audit_report
from dpaudit.accounting import history_epsilon
from dpaudit.experiment.judging.outputs import _verdict_line, verdict_title
from dpaudit.experiment.judging.user_claim import resolve_user_claim
from dpaudit.report.numbers import lower, point, upper
from dpaudit.threat_model import ThreatModel


@pytest.fixture(scope="module")
def rdp_loop():
    return train(accountant="rdp", target_epsilon=2.0, target_delta=1e-6, epochs=2)


def test_a_correct_loop_is_verified_and_consistent_in_the_users_numbers(rdp_loop):
    res = audit_report(rdp_loop.hook, privacy_engine=rdp_loop.engine, delta=1e-6)
    v = res["verdict"]
    td = v["training_data"]
    assert v["status"] == "consistent" and v["verified"] is True, v["message"]
    # the user's accountant (RDP) and their delta: the epsilon they read, not PRV's
    claimed = history_epsilon(rdp_loop.engine.accountant.history, 1e-6, "rdp").epsilon
    assert td["accountant"] == "rdp" and td["epsilon_claimed"] == pytest.approx(claimed)
    assert claimed <= 2.0 + 1e-9
    assert v["message"].startswith(f"Your epsilon {point(claimed)} (RDP accountant, delta 1e-06)")
    assert "default" not in v["message"] and len(v["message"]) <= 400
    # the canaries' own claim (every step, q = 1) is not in the user's paragraph
    stress = v["stress_test"]
    assert stress and f"{stress['claimed_epsilon']:.3f}" not in v["message"]
    assert "Dirac" not in v["message"] and "mu_lower" not in v["message"]
    assert verdict_title(v) == "verdict: VERIFIED, CONSISTENT"


def test_without_the_engine_the_claim_is_not_verified_and_said_so(rdp_loop):
    v = audit_report(rdp_loop.hook, delta=1e-6)["verdict"]
    assert v["status"] == "not_verified" and v["verified"] is False
    assert "NOT VERIFIED, not seen: the steps (no PrivacyEngine given" in v["message"]
    assert "(PRV accountant (Opacus' default: no engine given), delta 1e-06)" in v["message"]
    assert "privacy_engine=engine" in v["message"]
    assert "NOT VERIFIED" in verdict_title(v) and _verdict_line(v).startswith("NOT VERIFIED")


def test_the_users_accountant_survives_without_the_white_box_records(rdp_loop):
    on = audit_report(rdp_loop.hook, privacy_engine=rdp_loop.engine, delta=1e-6)
    off = audit_report(rdp_loop.hook, privacy_engine=rdp_loop.engine, delta=1e-6,
                       white_box=False)
    a, b = on["verdict"]["training_data"], off["verdict"]["training_data"]
    assert b["accountant"] == "rdp" and b["epsilon_claimed"] == pytest.approx(
        a["epsilon_claimed"])
    assert off["theory"]["training_data"]["accountant"] == "rdp"
    assert off["theory"]["training_data"]["opacus_epsilon"] == pytest.approx(
        a["epsilon_claimed"])
    assert off["verdict"]["status"] == "not_verified"  # nothing measured: not verified


def test_the_delta_is_the_users_or_said_not_to_be(rdp_loop):
    mine = audit_report(rdp_loop.hook, privacy_engine=rdp_loop.engine)["verdict"]
    assert "at dpaudit's default delta 1e-05, not yours: pass delta=" in mine["message"]
    assert mine["claim"]["delta_given"] is False
    # delta >= 1/n is named, with n
    big = audit_report(rdp_loop.hook, privacy_engine=rdp_loop.engine, delta=1e-3)["verdict"]
    assert f"at least 1/n = 1/{rdp_loop.n:,}" in big["message"]
    assert "does not protect individuals" in big["message"]


def test_a_target_above_the_accountant_is_named(rdp_loop):
    v = audit_report(rdp_loop.hook, privacy_engine=rdp_loop.engine, delta=1e-6,
                     target_epsilon=1.0)["verdict"]
    assert "above your target 1" in v["message"]


def test_bad_arguments_name_themselves(rdp_loop):
    with pytest.raises(ValueError, match="canaries must be the index"):
        audit_report(rdp_loop.hook, privacy_engine=rdp_loop.engine, canaries=3)
    tm = ThreatModel(canary_kind="gradient", noise_multiplier=1.0, max_grad_norm=1.0,
                     sample_rate=1.0, steps=10, delta=1e-5)
    with pytest.raises(ValueError, match=r"delta: 1e-06 conflicts with threat_model\.delta"):
        resolve_user_claim(delta=1e-6, threat_model=tm)
    assert resolve_user_claim(threat_model=tm).delta == 1e-5
    with pytest.raises(ValueError, match="target_epsilon must be a positive number"):
        resolve_user_claim(target_epsilon=-1.0)


@pytest.mark.parametrize("accountant", ["prv", "gdp"])
def test_every_engine_reads_its_own_accountant(accountant):
    t = train(accountant=accountant, target_epsilon=2.0, target_delta=1e-5, epochs=1)
    for white_box in (True, False):
        td = audit_report(t.hook, privacy_engine=t.engine, delta=1e-5,
                          white_box=white_box)["verdict"]["training_data"]
        assert td["accountant"] == accountant
        assert td["epsilon_claimed"] == pytest.approx(
            history_epsilon(t.engine.accountant.history, 1e-5, accountant).epsilon)


def test_a_plain_loader_under_bmm_without_a_loader_is_refuted_with_n_inferred():
    t = train(plain_loader=True, give_loader=False, epochs=3, seed=1)
    res = audit_report(t.hook, privacy_engine=t.engine, delta=1e-5)
    v = res["verdict"]
    assert v["status"] == "privacy_bug", v["message"]
    ps = res["white_box"]["checks"]["poisson_sampling"]
    lo, hi = ps["details"]["n_range"]
    assert lo <= t.n <= hi and hi - lo < 0.02 * t.n  # n from int(n q): within rounding
    assert ps["witness"]["failed"] != "rate"  # the law of the sizes, not the rate, fails
    rate = {p["name"]: p for p in v["training_data"]["premises"]}["sample_rate"]
    assert rate["status"] != "refuted"  # its own evidence holds; the law fails
    assert {p["name"]: p for p in v["training_data"]["premises"]}[
        "poisson_sampling"]["status"] == "refuted"


def test_the_newcomers_loop_names_the_loader_first():
    t = train(plain_loader=True, give_loader=True, epochs=3, seed=2)
    v = audit_report(t.hook, privacy_engine=t.engine, delta=1e-5)["verdict"]
    assert v["status"] == "privacy_bug", v["message"]
    cause = v["message"].split(" is refuted: ", 1)[1]
    assert cause.startswith("loader: the loader given to the hook"), v["message"]
    rate = {p["name"]: p for p in v["training_data"]["premises"]}["sample_rate"]
    lo, hi = rate["interval"]
    if lo <= rate["configured"] <= hi:
        assert rate["status"] != "refuted"


def test_a_head_in_the_clear_with_canaries_over_the_whole_model_is_a_privacy_bug():
    t = train(head=True, epochs=1)
    assert t.hook.dropped_canaries and t.hook.dropped_canaries[0]["parameters"] == [
        "head.bias"]
    v = audit_report(t.hook, privacy_engine=t.engine, delta=1e-5)["verdict"]
    assert v["status"] == "privacy_bug" and "model_integrity" in v["white_box_fired"]
    assert any("were dropped" in w and "head.bias" in w for w in v["warnings"])


def test_one_formatter_rounds_bounds_outward():
    assert upper(3.065) == "3.07" and lower(3.065) == "3.06" and point(3.065) == "3.06"
    assert upper(3.06) == "3.06" and lower(0.2999) == "0.299" and upper(45.201) == "45.3"
    rng = np.random.default_rng(0)
    for x in rng.lognormal(0, 2, 200):
        assert float(lower(x)) <= x <= float(upper(x))
