"""The replay's table leads with what a user reads first, beside the prediction."""

from __future__ import annotations

from solaris.replay.report import headline


def rep(**kw):
    base = {"dataset": "synthetic", "requests": 10, "labelled_pairs": 60,
            "coverage": {"pair": 0.4, "effective": 0.7}, "tr_online": 0.45,
            "tr_online_ci": [0.3, 0.6], "tr_online_raw": 0.5, "fm_evals_per_1k_requests": 2000.0,
            "candidate_recurrence_6h": 0.7, "candidate_recurrence": 0.65}
    return {**base, **kw}


def test_headline_puts_each_figure_beside_its_prediction():
    pred = {"coverage_predicted": {"pair": 0.38, "effective": 0.69}, "tr_predicted": 0.41,
            "tr_predicted_raw": 0.47, "fm_evals_per_1k_requests_predicted": 2100.0}
    lines = headline(rep(prediction=pred))
    assert lines[0] == "SOLARIS on synthetic: 10 requests, 60 labelled pairs"
    row = {ln[:28].strip(): ln[28:].split() for ln in lines[2:]}
    assert row["pair coverage"] == ["0.400", "0.380"]
    assert row["effective coverage"] == ["0.700", "0.690"]
    assert row["TR online (calibrated)"][:2] == ["0.450", "0.410"]
    assert "95% CI [0.300, 0.600]" in lines[4]
    assert row["FM evals / 1k requests"] == ["2000", "2100"]
    assert row["candidate recurrence, 6 h"][0] == "0.700"


def test_headline_without_a_prediction_shows_the_online_figures_alone():
    lines = headline(rep(tr_online_ci=None))
    assert "predicted" not in "\n".join(lines)
    tr = next(ln for ln in lines if "TR online (calibrated)" in ln)
    assert tr.split()[-1] == "0.450" and "CI" not in tr
