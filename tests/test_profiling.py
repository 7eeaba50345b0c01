"""Profiling: fits and table conversion (no torch needed) and `profile --quick` on CPU end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cost.communication import volume_factor as bus_factor
from planner.cost.curves import interpolate_points as interpolate
from planner.profiling.collectives import CollectiveSample, fit_latency_bandwidth
from planner.profiling.kernels import KernelResult
from planner.profiling.tables import build_device_profile

ROOT = Path(__file__).resolve().parent.parent


def test_bus_factors_follow_nccl_tests():
    """nccl-tests bus bandwidth factors: all-reduce 2(n-1)/n, gather/scatter/all-to-all (n-1)/n, p2p 1."""
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 2) == pytest.approx(0.5)
    assert bus_factor("p2p", 2) == 1.0
    with pytest.raises(ValueError):
        bus_factor("broadcast", 2)


def test_fit_recovers_latency_and_bandwidth():
    """Samples made as 20 us + bus_bytes / 5 GB/s fit back to exactly those numbers."""
    samples = [CollectiveSample("all_reduce", size, 20e-6 + size * 1.0 / 5e9, 2, "native")
               for size in (1 << 12, 1 << 16, 1 << 20, 1 << 24)]  # bus factor 1 for n=2 all-reduce
    fit = fit_latency_bandwidth(samples)
    assert fit.latency_us == pytest.approx(20.0, rel=1e-6)
    assert fit.bandwidth_gb_per_s == pytest.approx(5.0, rel=1e-6)


def test_interpolate_log_linear_and_clamped():
    """Midpoint in log space between (10, 0.2) and (1000, 0.6) is 100 -> 0.4; ends clamp."""
    pts = [(10.0, 0.2), (1000.0, 0.6)]
    assert interpolate(pts, 100.0) == pytest.approx(0.4)
    assert interpolate(pts, 1.0) == 0.2 and interpolate(pts, 1e6) == 0.6


def test_build_profile_from_synthetic_results():
    """With no reference the peak is the best GEMM rate (4 TFLOP/s here), so a 2 TFLOP/s GEMM has
    efficiency 0.5; attention efficiency = 3.5 x fwd FLOP / (fwd+bwd time x peak); a grouped GEMM
    at 1 TFLOP/s (0.25 of peak) over a dense curve of 0.5 at the whole call's FLOP, with 64 tokens per
    expert padded to a 128-row tile (0.5), gives multiplier 0.25 / (0.5 x 0.5) = 1.0."""
    k = [
        KernelResult("gemm", "a", 1.0, flop=2e12, flop_per_call=2e12),
        KernelResult("gemm", "b", 1.0, flop=4e12, flop_per_call=4e12),
        KernelResult("attention_fwd_bwd", "att", 1.0, flop=0.4e12, flop_per_call=0.4e12),
        KernelResult("grouped_gemm", "g", 1.0, flop=1e12, tokens_per_expert=64, flop_per_call=1e9),
        KernelResult("elementwise", "e", 1.0, bytes_moved=10e9),
        KernelResult("copy", "c", 1.0, bytes_moved=40e9),
    ]
    coll = [CollectiveSample(c, s, 1e-5 * (2 if c == "all_reduce" else 1) + s / 2e9, 2, "native")
            for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p") for s in (1 << 16, 1 << 22)]
    prof = build_device_profile(name="CPU-test", vendor="cpu", memory_gib=8, memory_overhead_gib=0.2,
                                gpus_per_node=2, dtype="fp32", kernels=k, collectives=coll, source="unit test",
                                link_kind="host-memory")
    assert prof.peak_tflops == {"fp32": 4.0, "bf16": 4.0}
    assert [(p.size, p.efficiency) for p in prof.gemm_efficiency.points] == [(2e12, 0.5), (4e12, 1.0)]
    assert prof.attention_efficiency.points[0].efficiency == pytest.approx(3.5 * 0.4 / 4.0)
    assert prof.grouped_gemm_efficiency.points[0].efficiency == pytest.approx(0.25 / (0.5 * 0.5))
    assert prof.hbm_bandwidth_tb_per_s == pytest.approx(0.04) and prof.hbm_efficiency == pytest.approx(0.25)
    assert prof.gemm_efficiency.provenance.kind == "measured"
    assert prof.intra_node.latency_us == pytest.approx(10.0, rel=0.05)
    p2p = prof.intra_node.efficiency["p2p"].points
    # bus bandwidth after removing latency is 2 GB/s for p2p at every size: efficiency = 2 / link bandwidth
    assert all(pt.efficiency == pytest.approx(2.0 / prof.intra_node.bandwidth_gb_per_s, rel=0.05) for pt in p2p)


@pytest.mark.parametrize("device,domain", [("GB200", 72), ("B200", None)])
def test_a_measured_tray_keeps_its_racks_nvlink_domain(device, domain):
    """A profile measured on one host of a shipped device keeps what one host cannot measure from the shipped
    profile: the NVLink domain beyond the host (GB200: 72 GPUs over trays of 4), as it keeps the inter-node link."""
    from planner.profile_tables import ProfileSet

    ref = ProfileSet.load().device(device)
    k = [KernelResult("gemm", "a", 1.0, flop=2e12, flop_per_call=2e12), KernelResult("copy", "c", 1.0, bytes_moved=4e9),
         KernelResult("attention_fwd_bwd", "att", 1.0, flop=0.4e12, flop_per_call=0.4e12)]
    prof = build_device_profile(name=device, vendor="NVIDIA", memory_gib=180, memory_overhead_gib=1.0,
                                gpus_per_node=ref.gpus_per_node, dtype="bf16", kernels=k, collectives=[],
                                source="unit test", link_kind="nvlink", reference=ref)
    assert prof.scale_up_domain_gpus == domain and prof.inter_node == ref.inter_node


def test_profile_without_torch_exits_2(monkeypatch):
    """Without torch the command exits 2 and names the extra to install."""
    import cli

    monkeypatch.setitem(sys.modules, "torch", None)
    result = CliRunner().invoke(cli.main, ["profile", "--model", "mixtral-s", "--device", "cpu", "--out", "x"])
    assert result.exit_code == 2
    assert "pip install -e '.[profile]'" in result.output


def _profile_cli_with(monkeypatch, tmp_path, prof):
    """`cli.py profile` with the measurement replaced by `prof` (no torch run): the lines it prints."""
    import shlex
    import types

    import cli
    from planner.commands import profile as profile_command
    from planner.profiling.runner import ProfileOutcome

    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or types.ModuleType("torch"))
    monkeypatch.setattr(profile_command, "run_profile", lambda opts, progress: ProfileOutcome(prof, {}))
    out = tmp_path / "my prof"
    res = CliRunner().invoke(cli.main, ["profile", "--model", "mixtral-s", "--device", "cpu", "--quick",
                                        "--out", str(out)])
    assert res.exit_code == 0, res.output
    return res.output, out, shlex


def _synthetic_kernels():
    return [KernelResult("gemm", "a", 1.0, flop=2e12, flop_per_call=2e12),
            KernelResult("copy", "c", 1.0, bytes_moved=4e9),
            KernelResult("attention_fwd_bwd", "att", 1.0, flop=0.4e12, flop_per_call=0.4e12)]


def test_profile_suggests_a_command_that_works_on_a_cpu_profile(monkeypatch, tmp_path):
    """A CPU profile is a smoke test of the profiler: no runtime runs a CPU, so `--cluster CPU-x:2` alone (the
    old suggestion) exits 2 in estimate and solve; the printed command, estimate --allow-invalid, runs."""
    import cli

    coll = [CollectiveSample(c, s, 1e-5 + s / 2e9, 2, "native")
            for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p") for s in (1 << 16, 1 << 22)]
    prof = build_device_profile(name="CPU-test", vendor="cpu", memory_gib=8, memory_overhead_gib=0.2,
                                gpus_per_node=2, dtype="fp32", kernels=_synthetic_kernels(), collectives=coll,
                                source="unit test", link_kind="host-memory")
    output, out, shlex = _profile_cli_with(monkeypatch, tmp_path, prof)
    assert "use it:" not in output and "smoke test of the profiler, not a plannable device" in output
    (line,) = [ln for ln in output.splitlines() if ln.strip().startswith("python cli.py estimate")]
    argv = shlex.split(line)[2:]
    assert argv[argv.index("--cluster") + 1] == "CPU-test:2" and argv[argv.index("--profiles") + 1] == str(out)
    assert "--allow-invalid" in argv
    res = CliRunner().invoke(cli.main, [*argv, "--json"])
    assert res.exit_code == 0, res.output
    for refused in (["estimate", *[a for a in argv[1:] if a != "--allow-invalid"]],
                    ["solve", "--model", "mixtral-s", "--cluster", "CPU-test:2", "--profiles", str(out)]):
        res = CliRunner().invoke(cli.main, refused)
        assert res.exit_code == 2 and "Traceback" not in res.output


def test_profile_suggestion_for_a_gpu_is_unchanged(monkeypatch, tmp_path):
    """A GPU profile (a shipped device's name, NVIDIA) keeps `use it: --cluster NAME:N --profiles DIR`."""
    from planner.profile_tables import ProfileSet

    ref = ProfileSet.load().device("H100")
    prof = build_device_profile(name="H100", vendor="NVIDIA", memory_gib=80, memory_overhead_gib=1.0,
                                gpus_per_node=ref.gpus_per_node, dtype="bf16", kernels=_synthetic_kernels(),
                                collectives=[], source="unit test", link_kind="nvlink", reference=ref)
    output, out, _ = _profile_cli_with(monkeypatch, tmp_path, prof)
    assert f"use it: --cluster H100:{ref.gpus_per_node} --profiles {out}" in output
    assert "--allow-invalid" not in output



@pytest.mark.parametrize("extra, flag, says", [
    (["--tp-list", "3"], "--tp-list", "num_attention_heads (32) must be a multiple"),  # measured, then a pydantic error
    (["--tp-list", "16", "--quick"], "--tp-list", "8 attention heads"),  # --quick shrinks 32 heads to 8
    (["--ep-list", "3"], "--ep-list", "num_experts 8 is not a multiple of EP 3"),  # was "dense model: no expert GEMMs"
    (["--skip-collectives", "--quick"], "--skip-collectives", "drop --skip-collectives"),  # refused after measuring
])
def test_profile_refuses_splits_it_cannot_time_before_measuring(monkeypatch, tmp_path, extra, flag, says):
    """A --tp-list or --ep-list Megatron refuses for the model, a TP that leaves no attention shape, and
    --skip-collectives on a CPU (no shipped links) exit 2 naming the flag, before anything is measured."""
    import types

    import cli
    from planner.commands import profile as profile_command

    def measured(opts, progress):
        raise AssertionError("measured before the options were checked")

    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or types.ModuleType("torch"))
    monkeypatch.setattr(profile_command, "run_profile", measured)
    res = CliRunner().invoke(cli.main, ["profile", "--model", "mixtral-s", "--device", "cpu", *extra,
                                        "--out", str(tmp_path / "prof")])
    assert res.exit_code == 2 and f"error: {flag}: " in res.output and says in res.output, res.output
    assert not (tmp_path / "prof").exists()

@pytest.mark.slow
def test_profile_quick_cpu_end_to_end(tmp_path):
    """`profile --quick --device cpu` runs (two gloo processes), writes a measured DeviceProfile the
    ProfileSet loads and validates, and `estimate --profiles` prices a run on it."""
    pytest.importorskip("torch")
    from planner.profile_tables import ProfileSet

    out = tmp_path / "prof"
    proc = subprocess.run([sys.executable, "cli.py", "profile", "--model", "mixtral-s", "--device", "cpu", "--quick",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "collectives on 2 local processes (gloo)" in proc.stderr
    files = list((out / "devices").glob("CPU-*.yaml"))
    assert len(files) == 1
    name = files[0].stem
    prof = ProfileSet.load(extra_dirs=[out]).device(name)
    assert prof.gpus_per_node == 2
    assert prof.datasheet.kind == "measured" and "torch " in prof.datasheet.source
    assert set(prof.intra_node.efficiency) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"}
    report = json.loads((out / "profile_report.json").read_text())
    assert report["layer_memory"]["saved_activation_bytes_per_token"] > 0
    pytest.importorskip("planner.cost.estimate")
    est = subprocess.run([sys.executable, "cli.py", "estimate", "--model", "mixtral-s", "--cluster", f"{name}:2",
                          "--profiles", str(out), "--json", "--gbs", "2", "--seq", "256",
                          "--allow-invalid"],  # no runtime runs a CPU (profiles/runtimes.yaml): priced anyway
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert est.returncode == 0, est.stderr[-2000:]
    assert json.loads(est.stdout)["iteration_time_s"] > 0


class _StubGroupedLinear:
    """Stands in for transformer_engine.pytorch.GroupedLinear on CPU: records how it was built and called, and
    computes what the real module does (one [tokens, k] @ [k, n] per split)."""

    built: list = []
    splits: list = []

    def __init__(self, num_gemms, in_features, out_features, *, bias, params_dtype, device):
        import torch

        type(self).built.append((num_gemms, in_features, out_features, bias, params_dtype, device))
        self.w = [torch.randn(in_features, out_features, dtype=params_dtype) for _ in range(num_gemms)]

    def __call__(self, inp, m_splits):
        import torch

        sizes = m_splits.tolist() if hasattr(m_splits, "tolist") else list(m_splits)
        type(self).splits.append(sizes)
        return torch.cat([x @ w for x, w in zip(torch.split(inp, sizes), self.w)])


def test_grouped_gemms_are_timed_as_the_run_runs_them():
    """With --moe-grouped-gemm and Transformer Engine, the expert GEMMs are timed as TE's GroupedLinear over the local
    experts (Megatron's TEGroupedMLP), and the profile's provenance says so; without the flag (SequentialMLP), or
    where TE does not import, as one matmul per local expert."""
    pytest.importorskip("torch")
    import types

    from planner.profiling.kernels import SEQUENTIAL_EXPERTS, bench_grouped
    from planner.profiling.shapes import GroupedGemmShape
    from planner.profiling.tables import grouped_curve
    from planner.schemas.device import EfficiencyCurve, EfficiencyPoint, Provenance

    te = types.SimpleNamespace(GroupedLinear=_StubGroupedLinear, __version__="9.9")
    shape = GroupedGemmShape("g", local_experts=4, tokens_per_expert=32, hidden=64, ffn=48)
    (grouped,) = bench_grouped((shape,), "cpu", "fp32", 0, 1, lambda _: None, grouped_gemm=True, te=te)
    assert grouped.impl == "Transformer Engine GroupedLinear 9.9"
    assert _StubGroupedLinear.built[-1][:4] == (4, 64, 48, False)
    assert _StubGroupedLinear.splits and all(s == [32] * 4 for s in _StubGroupedLinear.splits)
    (sequential,) = bench_grouped((shape,), "cpu", "fp32", 0, 1, lambda _: None, grouped_gemm=False, te=te)
    (no_te,) = bench_grouped((shape,), "cpu", "fp32", 0, 1, lambda _: None, grouped_gemm=True)  # CPU: TE not tried
    assert sequential.impl == no_te.impl == SEQUENTIAL_EXPERTS
    dense = EfficiencyCurve(points=(EfficiencyPoint(size=1.0, efficiency=0.5),),
                            provenance=Provenance(kind="measured", source="unit test"))
    curve = grouped_curve([grouped], dense, 1e12, "unit test")
    assert curve.provenance.source.endswith("expert GEMMs timed as Transformer Engine GroupedLinear 9.9")
