"""The audit's evaluation passes the design's inclusion probability to the one-run methods: the
CLI's audit.inclusion, and audit_report(inclusion=) for your own loop."""

import functools

import numpy as np
import pytest

from dpaudit.experiment import audit_report
from dpaudit.experiment.audit import evaluate_audit
from dpaudit.experiment.judging.evaluation import bound_rows
from dpaudit.experiment.plan import plan_audit
from dpaudit.experiment.settings import AuditSettings
from dpaudit.threat_model import ThreatModel

THREAT = ThreatModel(noise_multiplier=6.0, max_grad_norm=1.0, sample_rate=1.0, steps=100,
                     delta=1e-5, canary_kind="gradient")


def _null(n_in, n_out, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n_in), rng.standard_normal(n_out)


def test_one_run_rows_take_the_inclusion_and_refuse_implausible_splits():
    split = {"scalar": _null(200, 5000)}
    rows = bound_rows(split, ["one_run", "fdp_one_run", "clopper_pearson"], 1e-5, 0.99)
    by = {r.method: r for r in rows}
    for m in ("one_run", "fdp_one_run"):  # told 1/2: the split is refused, named
        assert by[m].kind == "not applicable" and "inclusion" in by[m].error
    assert by["clopper_pearson"].kind == "certified"  # threshold bounds condition on n
    rows = bound_rows(split, ["one_run"], 1e-5, 0.99, inclusion=200 / 5200)
    assert rows[0].kind == "certified" and rows[0].epsilon == 0.0
    assert rows[0].result["details"]["inclusion"] == pytest.approx(200 / 5200)


def test_evaluate_audit_reads_audit_inclusion():
    s = AuditSettings.from_mappings(audit={"inclusion": 0.3, "methods": ["one_run"]})
    rng = np.random.default_rng(1)
    member = rng.random(2000) < 0.3
    scores = {"scalar": rng.standard_normal(2000) + 3.0 * member}
    split = {k: (v[member], v[~member]) for k, v in scores.items()}
    out = evaluate_audit(plan_audit(s).judging, split, member, THREAT, independent=True)
    row = out.bounds[0]
    assert row.kind == "certified" and row.epsilon > 1.0
    assert row.result["details"]["inclusion"] == 0.3


def test_audit_report_takes_and_checks_inclusion():
    rng = np.random.default_rng(2)
    member = rng.random(600) < 0.2
    scores = rng.standard_normal(600)
    kw = {"scores": scores, "membership": member, "threat_model": THREAT, "methods": ["one_run"]}
    ok = audit_report(inclusion=0.2, **kw)
    assert ok["bounds"][0]["kind"] == "certified"
    refused = audit_report(**kw)  # told 1/2 for a 20% design
    assert refused["bounds"][0]["kind"] == "not applicable"
    for bad in (0.0, "0.2", None):
        with pytest.raises(ValueError, match="inclusion"):
            audit_report(inclusion=bad, **kw)


@pytest.mark.slow
def test_effective_noise_search_builds_few_claimed_curves(monkeypatch):
    # the evaluation's cost on subsampled claims is the privacy profiles it builds (one per
    # sigma tried, about 1 s each at q = 1/2): the claim and a 1% bracket of sigma_upper
    # need at most 12 of them (counted, not timed)
    import dpaudit.threat_model as tm
    from dpaudit.experiment.judging.evaluation import claim_evidence

    built = []
    original = tm._subsampled_profile.__wrapped__

    def counting(sigma, q, steps):
        built.append(sigma)
        return original(sigma, q, steps)

    monkeypatch.setattr(tm, "_subsampled_profile", functools.lru_cache(maxsize=64)(counting))
    threat = ThreatModel(noise_multiplier=10.0, max_grad_norm=1.0, sample_rate=0.5, steps=100,
                         delta=1e-5)
    rng = np.random.default_rng(0)
    c = claim_evidence(rng.normal(3.0, 1, 50), rng.normal(0, 1, 50), threat, 0.99)
    assert 0 < c.sigma_upper < 10.0 and c.rejected
    assert len(built) <= 12, built
