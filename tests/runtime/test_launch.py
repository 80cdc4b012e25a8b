"""torchrun's options for `planlang run` / `planlang verify`, checked against the plan's world size before
anything starts (no processes here: tests/runtime/test_launch_nodes.py launches two agents), and the
progress lines on stderr."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from planlang.runtime.launch import LaunchError, Progress, plan_launch

ROOT = Path(__file__).resolve().parents[2]
MLP_2D = "examples/mlp/mlp_2d.plan"  # mesh ranks (dp=2 × tp=2): 4 devices


def test_default_is_one_node_with_every_process_local():
    launch = plan_launch(4)
    assert (launch.nnodes, launch.nproc_per_node, launch.node_rank, launch.rdzv_backend) == (1, 4, 0, "static")
    host, port = launch.rdzv_endpoint.split(":")
    assert host == "127.0.0.1" and int(port) > 0
    assert launch.args() == ["--nnodes=1", "--nproc-per-node=4", "--node-rank=0", "--master-addr=127.0.0.1",
                             f"--master-port={port}"]
    assert str(launch).startswith("4 processes on this machine, static rendezvous at 127.0.0.1:")


def test_nproc_per_node_is_derived_from_nnodes():
    launch = plan_launch(4, nnodes="2", node_rank=1, master_addr="head", mesh="ranks (dp=2 × tp=2)")
    assert (launch.nnodes, launch.nproc_per_node, launch.node_rank) == (2, 2, 1)
    assert launch.args() == ["--nnodes=2", "--nproc-per-node=2", "--node-rank=1", "--master-addr=head",
                             "--master-port=29500"]
    assert str(launch) == "2 processes on node 1 of 2 (4 in all), static rendezvous at head:29500"
    # torchrun's `auto` (and a fixed range N:N) mean the same here: the plan fixes the count
    assert plan_launch(4, nnodes="4:4", nproc_per_node="auto", node_rank=3, master_addr="h").nproc_per_node == 1


def test_c10d_rendezvous_passes_endpoint_id_and_restarts():
    launch = plan_launch(8, nnodes=2, nproc_per_node=4, rdzv_backend="c10d", rdzv_endpoint="node0:29400",
                         rdzv_id="job7", max_restarts=3)
    assert launch.args() == ["--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                             "--rdzv-endpoint=node0:29400", "--rdzv-id=job7", "--max-restarts=3"]
    assert "c10d rendezvous at node0:29400, id job7" in str(launch)


def test_static_rendezvous_endpoint_is_the_master_address():
    launch = plan_launch(4, nnodes=2, node_rank=0, rdzv_endpoint="head:1234")
    assert launch.args()[2:] == ["--node-rank=0", "--master-addr=head", "--master-port=1234"]


@pytest.mark.parametrize("kwargs,message", [
    ({"nproc_per_node": 2}, "the plan's mesh ranks (dp=2 × tp=2) has 4 devices, but --nnodes 1 × --nproc-per-node 2 "
                            "= 2 processes; torchrun must start exactly one process per device: make nnodes × "
                            "nproc-per-node = 4, e.g. --nnodes 2 --nproc-per-node 2"),
    ({"nnodes": 2, "nproc_per_node": 1, "master_addr": "h", "node_rank": 0},
     "--nnodes 2 × --nproc-per-node 1 = 2 processes; torchrun must start exactly one process per device: make "
     "nnodes × nproc-per-node = 4, e.g. --nnodes 2 --nproc-per-node 2"),
    ({"nnodes": 3}, "has 4 devices, which --nnodes 3 cannot share evenly (every node runs the same number of "
                    "processes): give a node count that divides 4 (1, 2, 4)"),
    ({"nnodes": "1:2"}, "--nnodes 1:2 is an elastic range, and a plan's mesh fixes the world size (4 devices)"),
    ({"nnodes": 2}, "with --nnodes 2 every node must find node 0: give --master-addr HOST"),
    ({"nnodes": 2, "master_addr": "h"}, "each node needs its own --node-rank (0..1"),
    ({"nnodes": 2, "node_rank": 2, "master_addr": "h"}, "--node-rank 2 is outside 0..1"),
    ({"rdzv_backend": "c10d"}, "--rdzv-backend c10d needs --rdzv-endpoint HOST:PORT"),
    ({"rdzv_backend": "c10d", "rdzv_endpoint": "h:1", "master_addr": "h"}, "are for the static rendezvous"),
    ({"rdzv_endpoint": "h:1", "master_port": 2}, "give the static rendezvous once"),
    ({"rdzv_endpoint": "nohost"}, "is not HOST:PORT"),
    ({"nproc_per_node": "two"}, "--nproc-per-node takes a whole number, not 'two'"),
    ({"max_restarts": -1}, "--max-restarts must be 0 or more"),
])
def test_launches_that_cannot_run_the_plan_are_usage_errors(kwargs, message):
    with pytest.raises(LaunchError) as err:
        plan_launch(4, mesh="ranks (dp=2 × tp=2)", **kwargs)
    assert message in str(err.value)


def _planlang(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("PET_")} | (env or {})
    return subprocess.run([sys.executable, "-m", "planlang.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env=full, timeout=60)


@pytest.mark.parametrize("command", ["run", "verify"])
def test_cli_refuses_a_world_size_mismatch_before_launching(command):
    extra = ["--", "train.py"] if command == "run" else []
    res = _planlang(command, MLP_2D, "--nnodes", "2", "--nproc-per-node", "3", *extra)
    assert res.returncode == 2
    assert "planlang: error: the plan's mesh ranks (dp=2 × tp=2) has 4 devices, but --nnodes 2 × " \
           "--nproc-per-node 3 = 6 processes" in res.stderr
    assert "e.g. --nnodes 2 --nproc-per-node 2" in res.stderr
    assert f"planlang {command}: checking {MLP_2D}" in res.stderr  # progress before the error
    assert "launching" not in res.stderr and "Traceback" not in res.stderr and res.stdout == ""


def test_cli_reads_torchruns_environment_variables():
    """A Kubernetes operator sets PET_NNODES (here an elastic range, refused) for torchrun; planlang
    reads the same variables."""
    res = _planlang("run", MLP_2D, "-q", "--", "train.py", env={"PET_NNODES": "1:2"})
    assert res.returncode == 2 and "--nnodes 1:2 is an elastic range" in res.stderr
    assert "planlang run:" not in res.stderr  # --quiet


def test_progress_lines_go_to_stderr_with_the_elapsed_time(capsys, monkeypatch):
    monkeypatch.delenv("PLANLANG_QUIET", raising=False)
    monkeypatch.setenv("PLANLANG_T0", "100.0")
    monkeypatch.setattr("time.time", lambda: 102.5)
    say = Progress("verify")
    say("step 1/3: loss 1.0")
    Progress("verify", quiet=True)("nothing")
    out, err = capsys.readouterr()
    assert out == "" and err == "planlang verify: step 1/3: loss 1.0  [2.5 s]\n"
    assert say.env() == {"PLANLANG_T0": "100.0", "PLANLANG_QUIET": "0"}
    monkeypatch.setenv("PLANLANG_QUIET", "1")
    Progress("verify")("launched processes inherit --quiet")
    assert capsys.readouterr().err == ""
