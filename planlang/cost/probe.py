"""Measure the links of a device mesh: latency and bandwidth per mesh axis (map §4.2, cluster detector).

Each rank of a torchrun job takes part in all-reduces over the process groups of one mesh axis at a
time (every group of that axis at once, as training would use them), with messages from a few bytes to
`max_bytes`. The latency alpha is the median time of the fastest small message; the bandwidth is the
bus bandwidth from the two largest messages, busbw = 2(n-1)/n * dSize / dTime — exactly the beta of the all-reduce
formula in `planlang.cost.comm`, so the model reproduces the measured times. Rank 0 writes a planlang
module with one `link` per axis and a `mesh` using them, which a plan can `use`.

Run: planlang probe --nproc 4 --mesh dp=2,tp=2 -o probe.plan   (launches torchrun)
  or: torchrun --nproc-per-node 4 -m planlang.cost.probe --mesh dp=2,tp=2 -o probe.plan
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class AxisMeasurement:
    axis: str
    size: int
    latency: float  # seconds
    bandwidth: float  # bytes/s (all-reduce bus bandwidth)
    points: tuple[tuple[int, float], ...]  # (bytes, median seconds)


def parse_mesh(text: str) -> list[tuple[str, int]]:
    """`dp=2,tp=2` -> [("dp", 2), ("tp", 2)]."""
    out = []
    for part in text.split(","):
        name, _, size = part.partition("=")
        if not name.strip().isidentifier() or not size.strip().isdigit() or int(size) < 1:
            raise ValueError(f"mesh must look like dp=2,tp=2 (got {text!r})")
        out.append((name.strip(), int(size)))
    return out


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= 4
    return out


def measure(mesh_axes: list[tuple[str, int]], max_bytes: int = 16 << 20, repeats: int = 5,
            warmup: int = 2) -> list[AxisMeasurement]:
    """Run inside an initialised process group whose world size is the product of the axis sizes."""
    # lazy: torch loads only when this runs
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    shape = tuple(s for _, s in mesh_axes)
    if math.prod(shape) != world:
        raise ValueError(f"mesh {shape} has {math.prod(shape)} devices but the job has {world} ranks")
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dmesh = init_device_mesh(device, shape, mesh_dim_names=tuple(n for n, _ in mesh_axes))
    results = []
    for name, n in mesh_axes:
        if n == 1:
            results.append(AxisMeasurement(name, 1, 0.0, math.inf, ()))
            continue
        pg = dmesh.get_group(name)
        points = []
        for nbytes in sizes(4, max_bytes):
            t = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
            times = []
            for i in range(warmup + repeats):
                dist.barrier()
                if device == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                dist.all_reduce(t, group=pg)
                if device == "cuda":
                    torch.cuda.synchronize()
                elapsed = time.perf_counter() - start
                if i >= warmup:
                    times.append(elapsed)
            # every rank must agree on the figure: take the slowest rank's median
            med = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
            dist.all_reduce(med, op=dist.ReduceOp.MAX)
            points.append((t.numel() * 4, float(med.item())))
        small = [t for s, t in points if s <= 1024] or [points[0][1]]
        latency = min(small)  # the least disturbed: ranks may share cores and be descheduled
        # bus bandwidth from the slope between the two largest messages (alpha-beta: t = alpha + 2(n-1)/n
        # S/beta); the slope does not depend on the latency estimate, which scheduling noise dominates
        (s1, t1), (s2, t2) = points[-2], points[-1]
        per_byte = (t2 - t1) / (s2 - s1) if t2 > t1 else t2 / s2
        results.append(AxisMeasurement(name, n, latency, 2 * (n - 1) / n / per_byte, tuple(points)))
    return results


def _gbps(bw: float) -> str:
    return f"{bw / 1e9:.3g} GB/s" if math.isfinite(bw) else "1000 GB/s"


def _us(sec: float) -> str:
    if sec >= 1e-3:
        return f"{sec * 1e3:.3g} ms"
    return f"{sec * 1e6:.3g} us"


def render_module(results: list[AxisMeasurement], *, device: str, backend: str, prefix: str = "probe",
                  mesh_name: str = "probed") -> str:
    """The measurements as a planlang module: one link per axis and a mesh over them."""
    world = math.prod(r.size for r in results)
    when = datetime.date.today().isoformat()
    lines = [
        f"# Measured by `planlang probe` on {platform.node() or 'this machine'} ({when}), backend {backend},",
        f"# {world} ranks. bandwidth = all-reduce bus bandwidth (slope of the two largest sizes); latency = time",
        "# of the fastest all-reduce of at most 1 KiB (median of repeats). `use` this file in a plan.",
    ]
    dev_module = device.split(".")[0] if "." in device else None
    if dev_module:
        lines.append(f"use {dev_module}")
    lines.append("")
    for r in results:
        lines += [
            f"link {prefix}_{r.axis} {{",
            f"    bandwidth = {_gbps(r.bandwidth)}",
            f"    latency = {_us(r.latency)}",
            "}",
            "",
        ]
    lines.append(f"mesh {mesh_name} of {world} x {device} {{")
    for r in results:
        lines.append(f"    {r.axis} = {r.size} over {prefix}_{r.axis}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_table(results: list[AxisMeasurement]) -> str:
    rows = [f"{'axis':8} {'ranks':>5} {'latency':>10} {'bus bandwidth':>14}   sizes measured"]
    for r in results:
        span = f"{r.points[0][0]} B - {r.points[-1][0] >> 20} MiB" if r.points else "-"
        rows.append(f"{r.axis:8} {r.size:5d} {_us(r.latency):>10} {_gbps(r.bandwidth):>14}   {span}")
        for s, t in r.points:
            rows.append(f"{'':8} {'':5} {s:>12} B  {t * 1e6:10.1f} us")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="planlang probe (worker)")
    ap.add_argument("--mesh", required=True)
    ap.add_argument("--device", default="hardware.cpu")
    ap.add_argument("--max-bytes", type=int, default=16 << 20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("-o", "--output", default="-")
    args = ap.parse_args(argv)
    # lazy: torch loads only when this runs
    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ:
        print("planlang probe: not under torchrun; run `planlang probe --nproc N ...`", file=sys.stderr)
        return 2
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    try:
        results = measure(parse_mesh(args.mesh), args.max_bytes, args.repeats)
        if dist.get_rank() == 0:
            text = render_module(results, device=args.device, backend=backend)
            sys.stderr.write(render_table(results))
            if args.output == "-":
                sys.stdout.write(text)
            else:
                with open(args.output, "w", encoding="utf-8") as f:
                    f.write(text)
                print(f"wrote {args.output}", file=sys.stderr)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
