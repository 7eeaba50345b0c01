"""Warm-up instrumentation hooks on a toy torch MoE (no Megatron needed)."""

from __future__ import annotations

import datetime
import json
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from planner.calibration.router_stats import load_router_stats  # noqa: E402
from planner.instrument.hooks import InstrumentSession, RouterRecorder, find_routers  # noqa: E402
from planner.instrument.megatron_wrapper import main as wrapper_main  # noqa: E402
from planner.instrument.megatron_wrapper import wrap_train_step  # noqa: E402


class ToyTopKRouter(torch.nn.Module):
    """Returns (probs, routing_map) like Megatron core >= 0.10."""

    def __init__(self, hidden: int, experts: int, topk: int, layer_number: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.eye(experts, hidden))
        self.topk = topk
        self.layer_number = layer_number

    def forward(self, x):
        logits = x @ self.weight.t()
        top = torch.topk(logits, self.topk, dim=-1).indices
        routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top, True)
        return torch.softmax(logits, -1) * routing_map, routing_map


class IndexRouter(torch.nn.Module):
    """Older style: returns (scores, indices)."""

    def __init__(self, hidden: int, experts: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.eye(experts, hidden))
        self.num_experts = experts

    def forward(self, x):
        scores, idx = torch.topk(x @ self.weight.t(), 1, dim=-1)
        return scores, idx


class ToyMoE(torch.nn.Module):
    def __init__(self, hidden=4, experts=4):
        super().__init__()
        self.router = ToyTopKRouter(hidden, experts, topk=1, layer_number=1)
        self.router2 = IndexRouter(hidden, experts)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(experts))

    def forward(self, x):
        probs, routing_map = self.router(x)
        out = sum(self.experts[e](x) * probs[:, e : e + 1] for e in range(len(self.experts)))
        self.router2(out.detach() * 0 + x)  # same routing decision, second "layer"
        return out


def _tokens():
    """8 one-hot tokens: 6 go to expert 0, 2 to expert 1 (hand-set)."""
    x = torch.zeros(8, 4)
    x[:6, 0] = 1.0
    x[6:, 1] = 1.0
    return x


def test_router_recorder_counts_and_detaches():
    """Both router output styles are counted per expert: [6, 2, 0, 0]; detach leaves no hook."""
    model = ToyMoE()
    assert [n for n, _ in find_routers(model)] == ["router", "router2"]  # both class names end with Router
    rec = RouterRecorder(model, suffixes=("Router",))
    assert rec.attach() == 2
    model(_tokens())
    # router2 has no layer_number, so both fall back to discovery order 0, 1
    assert rec.counts == {(0, 0): [6, 2, 0, 0], (0, 1): [6, 2, 0, 0]}
    rec.detach()
    assert not model.router._forward_hooks and not model.router2._forward_hooks
    model(_tokens())
    assert rec.counts[(0, 0)] == [6, 2, 0, 0]


def test_session_records_n_iterations_then_removes_itself(tmp_path):
    """After skip=1 and iters=2 the session writes its files, removes the hooks, and the CSV gives
    imbalance 6/2 = 3 (mean over 4 experts of 8 tokens is 2)."""
    model = ToyMoE()
    session = InstrumentSession(out_dir=tmp_path, iters=2, skip=1)
    assert session.attach(model) == 2
    done = []
    for _ in range(5):
        session.begin_iteration()
        with session.phase("forward_backward"):
            model(_tokens()).sum().backward()
        done.append(session.end_iteration())
    assert done == [False, False, True, True, True]
    assert not model.router._forward_hooks
    summary = json.loads((tmp_path / "instrument_rank0.json").read_text())
    assert [r["iteration"] for r in summary["iterations"]] == [1, 2]
    assert all(r["forward_backward_s"] <= r["time_s"] for r in summary["iterations"])
    # the run's date, for calibrate's provenance (it wrote today's date instead: walk53b item 8)
    assert datetime.datetime.fromisoformat(summary["recorded_utc"]).tzinfo is not None
    assert summary["max_memory_allocated_bytes"] is None  # CPU: not available, said so
    stats = load_router_stats(tmp_path)
    assert sorted({it for it, _ in stats.counts}) == [1, 2]
    assert stats.imbalance_factor() == pytest.approx(3.0)


def test_wrap_train_step_finds_model_and_restores():
    """A Megatron-like train_step(forward_step_func, data_iterator, model, ..., forward_backward_func)
    is instrumented: the model list is found, forward_backward is timed, restore runs at the end."""
    model = ToyMoE()
    calls = {"restored": 0}

    def forward_backward_no_pipelining(model_chunks):
        return model_chunks[0](_tokens()).sum().backward()

    def train_step(forward_step_func, data_iterator, model_chunks, optimizer, sched, config, forward_backward_func):
        forward_backward_func(model_chunks)
        return 0.0

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        session = InstrumentSession(out_dir=d, iters=2, skip=0)
        wrapped = wrap_train_step(train_step, session, stop=False,
                                  restore=lambda: calls.__setitem__("restored", calls["restored"] + 1))
        for _ in range(3):
            wrapped(None, None, [model], None, None, None, forward_backward_no_pipelining)
        assert calls["restored"] == 1
        assert session.finished and all("forward_backward_s" in r for r in session.records)


def test_wrapper_entry_point_with_fake_megatron(tmp_path, monkeypatch):
    """`python -m planner.instrument.megatron_wrapper --iters 2 --out DIR script.py` patches a
    (fake) megatron.training.training.train_step that the script's training loop calls."""
    pkg = tmp_path / "megatron" / "training"
    pkg.mkdir(parents=True)
    (tmp_path / "megatron" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "training.py").write_text(textwrap.dedent("""
        def train_step(forward_step_func, data_iterator, model, forward_backward_func):
            forward_backward_func(model)

        def train(model, iters, fb):
            for _ in range(iters):
                train_step(None, None, model, fb)
    """))
    script = tmp_path / "pretrain_fake.py"
    script.write_text(textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(tmp_path)!r})
        from tests_toy_model import build
        from megatron.training import training
        model = build()
        x = torch.zeros(8, 4); x[:6, 0] = 1; x[6:, 1] = 1
        def forward_backward_func(m):
            m[0](x).sum().backward()
        assert sys.argv[1:] == ["--num-layers", "2"]
        training.train([model], 4, forward_backward_func)
    """))
    (tmp_path / "tests_toy_model.py").write_text(textwrap.dedent("""
        import sys
        def build():
            return sys.modules["__toy_moe_factory__"]()
    """))
    monkeypatch.setitem(sys.modules, "__toy_moe_factory__", ToyMoE)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "megatron" or m.startswith("megatron.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    out = tmp_path / "instr"
    rc = wrapper_main(["--iters", "2", "--skip", "1", "--out", str(out), str(script), "--num-layers", "2"])
    assert rc == 0
    summary = json.loads((out / "instrument_rank0.json").read_text())
    assert len(summary["iterations"]) == 2 and summary["routers"]
    assert load_router_stats(out).imbalance_factor() == pytest.approx(3.0)
    for name in [m for m in sys.modules if m == "megatron" or m.startswith("megatron.")]:
        del sys.modules[name]
