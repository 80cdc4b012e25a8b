"""planlang probe: the written module is valid planlang, and the command measures a real gloo job."""
import subprocess
import sys

import pytest

from planlang.cost.probe import AxisMeasurement, parse_mesh, render_module
from planlang.plan.checker import check_text


def test_parse_mesh():
    assert parse_mesh("dp=2,tp=4") == [("dp", 2), ("tp", 4)]
    with pytest.raises(ValueError):
        parse_mesh("dp=two")


def test_rendered_module_checks_clean_and_round_trips_the_figures(tmp_path):
    res = [AxisMeasurement("dp", 2, 2.5e-3, 1.5e9, ((4, 2.5e-3),)), AxisMeasurement("tp", 2, 40e-6, 7.25e9, ())]
    text = render_module(res, device="hardware.cpu", backend="gloo")
    out = tmp_path / "probe.plan"
    out.write_text(text)
    result = check_text(text, str(out))
    assert result.diagnostics == ()
    links = {l.name: l for l in result.plan.links}
    assert links["probe_dp"].bandwidth == pytest.approx(1.5e9) and links["probe_dp"].latency == pytest.approx(2.5e-3)
    assert links["probe_tp"].bandwidth == pytest.approx(7.25e9) and links["probe_tp"].latency == pytest.approx(40e-6)


def test_probe_command_on_two_gloo_ranks(tmp_path):
    out = tmp_path / "probe.plan"
    proc = subprocess.run(
        [sys.executable, "-m", "planlang.cli", "probe", "--nproc", "2", "--mesh", "tp=2", "--max-bytes", "65536",
         "-o", str(out)], capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = check_text(out.read_text(), str(out))
    assert result.diagnostics == ()
    (link,) = [l for l in result.plan.links if l.name == "probe_tp"]
    assert link.bandwidth > 0 and link.latency > 0
    assert result.plan.links and "mesh probed of 2 x hardware.cpu" in out.read_text()
