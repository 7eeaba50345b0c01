"""The published measured runs: loading, parsing into planner inputs, and pricing.

`load_runs()` reads the shipped table (planner/calibration/published/measured_runs.csv) and, when they are
there, `../shared/calibration/measured_runs.csv`, `measured_runs_new.csv` and `measured_runs_routing.csv` beside
the repository (rows there replace shipped rows with the same id; new ids are appended).  `cases()` turns each row into a
`CalibrationCase`: the parsed `MegatronRun`, the cluster, the plan Megatron runs for those flags, the
measurement, and the row's source key (`source_key`: rows of one publication and software stack share one,
so that validation can leave a whole source out).  `load_unfitted_runs()` reads the published runs the fit does
not see (planner/calibration/published/unfitted_runs.csv, each with its `why_not_fitted`): the report prices them
with the shipped corrections and ranges, as it would a run from a source it never saw.
"""

from __future__ import annotations

import csv
import shlex
from dataclasses import dataclass
from pathlib import Path

from planner.cost.estimate import plan_from_run
from planner.cost.flops import model_flop_per_iteration
from planner.cost.model import CostModel, PlanCost
from planner.inputs.cluster import parse_cluster
from planner.inputs.megatron_flags import parse_megatron_flags
from planner.schemas.cluster import ClusterSpec
from planner.schemas.device import Provenance
from planner.schemas.parallel import MegatronRun
from planner.schemas.plan import Plan

PUBLISHED_DIR = Path(__file__).resolve().parent / "published"
SHIPPED_RUNS_CSV = PUBLISHED_DIR / "measured_runs.csv"
ANNOTATIONS_CSV = PUBLISHED_DIR / "annotations.csv"
UNFITTED_RUNS_CSV = PUBLISHED_DIR / "unfitted_runs.csv"
"""Published measured runs priced but kept out of the fit, each with `why_not_fitted` (published/README.md)."""
SHARED_DIR = Path(__file__).resolve().parents[3] / "shared" / "calibration"
SHARED_RUNS_CSV = SHARED_DIR / "measured_runs.csv"
"""../shared/calibration/measured_runs.csv next to the repository root (read when present)."""
SHARED_NEW_RUNS_CSV = SHARED_DIR / "measured_runs_new.csv"
"""../shared/calibration/measured_runs_new.csv (read when present, after measured_runs.csv)."""
SHARED_ROUTING_RUNS_CSV = SHARED_DIR / "measured_runs_routing.csv"
"""../shared/calibration/measured_runs_routing.csv: real-routing runs (read when present, last)."""

SOURCE_KEYS: tuple[tuple[str, str], ...] = (
    ("awsome-distributed", "aws-awsome-distributed"),  # AWS's repositories: first, their sources cite Bridge recipes
    ("ROCm Megatron-LM docs", "rocm-megatron-lm-docs"),  # AMD's docs: first, before any pattern naming Megatron-LM
    ("arXiv 2504.14960", "moe-parallel-folding-paper"),  # before "Megatron-MoE-ModelZoo", which its notes cite
    ("FlagPerf", "flagperf"),  # before "Pai-Megatron-Patch": FlagPerf runs one MoE case under Pai's launcher
    ("arXiv 2104.04473", "megatron-lm-sc21"),
    ("Pai-Megatron-Patch issue #", "pai-megatron-patch-issues"),  # before "Pai-Megatron-Patch", its repository
    ("ms-swift Megatron-SWIFT", "ms-swift-megatron-swift"),
    ("NVIDIA/Megatron-LM tests/functional_tests", "megatron-lm-ci"),
    ("NVIDIA/skills", "nvidia-skills-megatron-bridge"),
    ("performance-summary", "megatron-bridge-performance-summary"),
    ("xtuner", "xtuner-pai-megatron-patch"),
    ("Pai-Megatron-Patch", "xtuner-pai-megatron-patch"),
    ("dgxc-benchmarking", "nvidia-dgxc-benchmarking"),
    ("MindSpeed", "mindspeed-llm"),
    ("Megatron MoE Model Zoo", "megatron-moe-model-zoo"),
    ("Megatron-MoE-ModelZoo", "megatron-moe-model-zoo"),
    ("Megatron-LM MoE README", "megatron-core-moe-readme"),
    ("megatron-core weak scaling", "megatron-core-weak-scaling"),
    ("NeMo-Megatron 2022", "nemo-megatron-2022"),
    ("Megatron-LM 2020", "megatron-lm-2020"),
)
"""(text in the row's `source` column, source key), first match wins: rows of one publication and software
stack share a key (planner/calibration/published/README.md, "Sources").  A row may also carry its own key in
a `source_key` column."""

METRICS = ("iteration_time_s", "tflops_per_gpu")
LEGACY_SOFTWARE = "legacy"
"""annotations.csv `software` of a row run with software older than the runtime the planner plans for (its dense
GEMMs are priced with the fitted `gemm_legacy_software` factor on top; published/README.md, 'Legacy software')."""
SOFTWARE_VALUES = ("", LEGACY_SOFTWARE)
REQUIRED_COLUMNS = ("id", "source", "cluster", "megatron_args", "metric", "value")


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
        return [dict(r) for r in reader]


def source_key(row: dict[str, str]) -> str:
    """The row's source key: its own `source_key` column, else the first SOURCE_KEYS pattern its `source`
    contains (case-insensitive), else the source text up to its first comma or parenthesis."""
    own = (row.get("source_key") or "").strip()
    if own:
        return own
    text = row.get("source", "")
    for pattern, key in SOURCE_KEYS:
        if pattern.lower() in text.lower():
            return key
    head = text.split("(")[0].split(",")[0].strip().lower()
    return "-".join(head.split()) or "unknown"


def load_runs(*, shared: Path | None = SHARED_RUNS_CSV, shipped: Path = SHIPPED_RUNS_CSV,
              shared_new: Path | None = SHARED_NEW_RUNS_CSV,
              shared_routing: Path | None = SHARED_ROUTING_RUNS_CSV) -> list[dict[str, str]]:
    """Every measured run, shipped rows first (in file order), each carrying `origin` (the file it came from).  A
    shared row whose id the shipped file has is left out: the shipped row is the curated one (its flags corrected
    from the run's recipe, e.g. the Moonlight rows' --grad-reduce-in-bf16), and the fit must not depend on whether
    ../shared sits beside the clone (before, it replaced the shipped row, and a clean clone fitted other figures)."""
    rows: dict[str, dict[str, str]] = {}
    for path in (shipped, shared, shared_new, shared_routing):
        if path is None or not path.is_file():
            continue
        for row in _read_csv(path):
            rows.setdefault(row["id"], {**row, "origin": str(path)})
    return list(rows.values())


def load_unfitted_runs(path: Path = UNFITTED_RUNS_CSV) -> list[dict[str, str]]:
    """The runs the fit does not see, in file order, each with its `why_not_fitted`."""
    rows = _read_csv(path)
    for r in rows:
        if not (r.get("why_not_fitted") or "").strip():
            raise ValueError(f"{path}: row {r['id']} has no why_not_fitted")
    return rows


def load_annotations(path: Path = ANNOTATIONS_CSV) -> dict[str, dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return {r["id"]: r for r in csv.DictReader(fh)}


@dataclass(frozen=True)
class CalibrationCase:
    """One measured run, parsed: what Megatron ran and what was measured."""

    id: str
    metric: str
    measured: float
    run: MegatronRun
    cluster: ClusterSpec
    plan: Plan
    plan_notes: tuple[str, ...]
    memory_settings: str  # known | unknown | unclassified
    source: str
    source_key: str = ""  # rows of one publication and software stack share it (`source_key`)
    batch: str = ""  # annotations.csv: 1 = the first 26 rows, 2 = the rows added for issue 19 (fresh to the model)
    software: str = ""  # annotations.csv `software`: "" (a runtime the planner plans for) or LEGACY_SOFTWARE

    @property
    def device_types(self) -> tuple[str, ...]:
        return tuple(sorted({s.device_type for s in self.plan.stages}))

    @property
    def group(self) -> tuple:
        """Rows with the same group ran the same model and sequence on the same cluster: they differ only in
        plan (global batch included), dispatcher, routing or precision, so their order, in seconds per sample,
        matters."""
        m = self.run.model
        shape = m.model_dump(exclude={"name", "moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
                                      "moe_router_force_load_balancing", "moe_grouped_gemm",
                                      "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
                                      "moe_router_load_balancing_type", "moe_aux_loss_coeff",
                                      "max_position_embeddings",
                                      # numerics that change neither time nor memory (a run's flags may leave them
                                      # at Megatron's defaults where its neighbour states the model's values)
                                      "rotary_base", "rotary_percent", "norm_epsilon", "rope_scaling_factor",
                                      "rotary_scaling_factor", "mscale", "mscale_all_dim", "use_rope_scaling",
                                      "moe_router_topk_scaling_factor"})
        return (self.cluster.legacy_description(), tuple(sorted(shape.items())))

    def profiles_for(self, profiles):
        """The profiles this row is priced with: `profiles` itself, except for a row run with legacy software
        (`software` = LEGACY_SOFTWARE), whose dense GEMMs also carry its devices' `gemm_legacy_software` factor
        (planner/profile_tables.py LEGACY_SOFTWARE_KINDS): the kernels of its day, which no plan the planner
        writes runs.  A device without that factor (V100: no measured curve, its `gemm` is fitted on these rows
        itself) gets none."""
        if self.software != LEGACY_SOFTWARE:
            return profiles
        entries = {(d, "gemm"): profiles.correction(d, "gemm") * profiles.correction(d, "gemm_legacy_software")
                   for d in self.device_types}
        return profiles.with_corrections(entries, Provenance(kind="calibrated", source=(
            "gemm x gemm_legacy_software (profiles/corrections.yaml): a calibration row run with legacy software")))

    def price(self, profiles) -> PlanCost:
        return CostModel(self.run.model, self.run.training, self.cluster,
                         self.profiles_for(profiles)).evaluate(self.plan)

    def predicted(self, cost: PlanCost) -> float:
        """The prediction in the row's own metric."""
        return cost.iteration_time_s if self.metric == "iteration_time_s" else cost.tflops_per_gpu

    def seconds_per_iteration(self, cost: PlanCost | None = None) -> float:
        """Measured (cost None) or predicted seconds per iteration."""
        if cost is not None:
            return cost.iteration_time_s
        if self.metric == "iteration_time_s":
            return self.measured
        return self.model_flop / (self.measured * 1e12 * self.cluster.world_size)

    @property
    def model_flop(self) -> float:
        return model_flop_per_iteration(self.run.model, global_batch_size=self.run.training.global_batch_size,
                                        tp=self.plan.tp)


def priced_argv(row: dict[str, str], annotations: dict[str, dict[str, str]]) -> list[str]:
    """The row's Megatron flags as the calibration prices them: what the run's software did that today's flags spell
    differently (annotations.csv, each with its `extra_flags_why`), `extra_flags` appended to the row's own and
    `drop_flags` (switches) taken out, whichever file the row comes from."""
    ann = annotations.get(row["id"]) or {}
    drop = set(shlex.split(ann.get("drop_flags") or ""))
    return [t for t in shlex.split(row["megatron_args"]) if t not in drop] + shlex.split(ann.get("extra_flags") or "")


def case_from_row(row: dict[str, str], profiles, annotations: dict[str, dict[str, str]]) -> CalibrationCase:
    metric = row["metric"]
    if metric not in METRICS:
        raise ValueError(f"row {row['id']}: unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    cluster = parse_cluster(row["cluster"], profiles)
    ann = annotations.get(row["id"])
    run = parse_megatron_flags(priced_argv(row, annotations), world_size=cluster.world_size)
    plan, notes = plan_from_run(run, cluster, profiles)
    return CalibrationCase(
        id=row["id"], metric=metric, measured=float(row["value"]), run=run, cluster=cluster, plan=plan,
        plan_notes=tuple(notes), memory_settings=ann["memory_settings"] if ann else "unclassified",
        source=row.get("source", ""), source_key=source_key(row), batch=(ann or {}).get("batch", ""),
        software=_software(row, ann),
    )


def _software(row: dict[str, str], ann: dict[str, str] | None) -> str:
    """The row's `software`: its annotation's (fitted rows, annotations.csv), else its own column (unfitted_runs.csv)."""
    where = "annotations.csv" if ann and "software" in ann else "unfitted_runs.csv"
    value = ((ann or {}).get("software") or row.get("software") or "").strip()
    if value not in SOFTWARE_VALUES:
        raise ValueError(f"{where} row {row['id']}: software {value!r}; allowed: '' (current) or {LEGACY_SOFTWARE!r}")
    return value


def cases(profiles, rows: list[dict[str, str]] | None = None) -> list[CalibrationCase]:
    """Every measured run as a CalibrationCase (see `load_runs` for where rows come from)."""
    annotations = load_annotations()
    return [case_from_row(r, profiles, annotations) for r in (rows if rows is not None else load_runs())]
