"""`make bench-serve` in small: its forms section on the real export (one request each, no server started:
the servers' own tests start them), and the ratios its JSON line reports. About 20-30 s on 2 cores, most of it
the export."""

from __future__ import annotations

import json

import pytest

from d2ops.bench import serve


def test_the_forms_section_ends_with_one_json_line_of_ratios_to_the_eager_model(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation caught: a ratio taken against another form than the eager baseline, or a form the artifact
    holds left out of the figures."""
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the bench sets it for its servers; restored after the test
    threads = torch.get_num_threads()
    try:
        assert serve.main(["--skip-servers", "--requests", "1", "--no-aoti"]) == 0
    finally:
        torch.set_num_threads(threads)  # the rest of the suite runs in this process
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert result["bench"] == "serve" and result["baseline_form"] == "eager" and result["servers"] == {}
    assert result["cpu"] and result["threads"] == 1
    forms, eager = result["forms"], result["eager"]
    assert set(forms) == {"torchscript", "exported", "aoti"} and forms["torchscript"]["available"]
    assert not forms["aoti"]["available"] and forms["aoti"]["problem"]  # --no-aoti: said, not invented
    assert all(f["problem"] for f in forms.values() if not f["available"])  # a missing form says why
    backbone = result["backbone"]  # the part of the R-CNN that does export: its own eager run is the baseline
    assert backbone["exported"]["p50_ratio"] == pytest.approx(
        backbone["exported"]["p50_ms"] / backbone["eager"]["p50_ms"], rel=1e-2, abs=1e-3)
    for figures in (f for f in forms.values() if f["available"]):
        assert figures["export_s"] > 0
        assert figures["p50_ratio"] == pytest.approx(figures["p50_ms"] / eager["p50_ms"], rel=1e-2, abs=1e-3)


def test_server_ratios_are_each_configuration_over_torchservess_same_one() -> None:
    def figures(p50: float, rps: float) -> dict[str, float]:
        return {"requests": 8, "p50_ms": p50, "p99_ms": 2 * p50, "throughput_rps": rps}

    on, off = figures(100.0, 20.0), figures(50.0, 10.0)
    assert serve.ratios(on, off) == {"p50_ratio": 2.0, "p99_ratio": 2.0, "throughput_ratio": 2.0}
    assert serve.batching_gain({"batching_on_c8": on, "batching_off_c8": off}) == 2.0
    assert serve.batching_gain({"batching_on_c8": on}) is None  # not measured: no figure invented


def test_an_unknown_server_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        serve.main(["--servers", "triton"])
    assert refused.value.code == 2 and "unknown ['triton']" in capsys.readouterr().err
