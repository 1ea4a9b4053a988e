"""The bench: scenario clusters round-trip through Node YAML, metrics, and a tiny end-to-end report."""

from __future__ import annotations

import argparse
import dataclasses
import re
import tempfile
from pathlib import Path
from typing import cast

import numpy as np
import orjson
import pytest
import yaml

from gpupack.bench import bench_report as report
from gpupack.bench import openb_report, plots
from gpupack.bench import paired as paired_mod
from gpupack.bench.bench_report import run_report, tiny_config
from gpupack.bench.jobs import Job, prefix_to_arrived
from gpupack.bench.markdown import README_END, README_START, Table, update_readme
from gpupack.cli import build_parser, main
from gpupack.kube.node_facts import facts_from_node
from gpupack.scoring.engine import Decision
from gpupack.scoring.facts import GpuSlot, MigMode, NodeFacts, Placement
from gpupack.scoring.request import Kind, PodRequest
from gpupack.sim import packing_metrics as metrics
from gpupack.sim.scenarios import (
    BALANCED_80GB,
    BALANCED_A30,
    DGX1_LINKS,
    STATIC_BALANCED,
    cost_cluster,
    link_matrix,
    mig_cluster,
    nvlink_cluster,
    to_node_yaml,
)
from gpupack.sim.simulate import build_inventory
from gpupack.sim.workload import TracePod
from tests.conftest import OPENB, needs_openb

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


# ----------------------------------------------------------------------------- scenarios
@pytest.mark.parametrize(
    "spec",
    [
        mig_cluster(),
        mig_cluster().with_mig(MigMode.STATIC, STATIC_BALANCED),
        nvlink_cluster(),
        cost_cluster(),
    ],
    ids=["mig-dynamic", "mig-static", "nvlink", "cost"],
)
def test_node_yaml_round_trips_to_equal_facts(spec, tmp_path: Path) -> None:
    nodes = spec.scaled(0.03).build()
    items = yaml.safe_load(to_node_yaml(nodes))["items"]
    assert [facts_from_node(item) for item in items] == nodes
    path = tmp_path / "nodes.yaml"
    path.write_text(to_node_yaml(nodes))
    from gpupack.sim.load import load_nodes

    assert load_nodes(path) == nodes  # what `gpupack simulate --nodes` reads


def test_full_clusters_have_the_specified_sizes() -> None:
    mig = mig_cluster()
    assert 760 <= mig.node_count <= 800
    assert {g.mig for g in mig.groups} == {MigMode.DYNAMIC}
    build_inventory(mig.with_mig(MigMode.STATIC, STATIC_BALANCED).build())  # layouts are valid
    prices = {(g.product, g.spot): g.hourly_cost for g in cost_cluster().groups}
    for (product, spot), price in prices.items():
        on_demand = prices[(product, False)]
        if spot:
            assert price is not None and on_demand is not None and 0.3 <= price / on_demand <= 0.4


def test_balanced_layouts_fill_every_compute_slice() -> None:
    assert sum(int(p[0]) for p, _ in BALANCED_80GB) == 7
    assert sorted(p for p, _ in BALANCED_80GB) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    assert sorted(p for p, _ in BALANCED_A30) == ["1g.6gb", "1g.6gb", "2g.12gb"]


def test_dgx1_matrix_is_symmetric_with_four_links_per_gpu() -> None:
    matrix = link_matrix(8, DGX1_LINKS)
    assert all(matrix[a][b] == matrix[b][a] for a in range(8) for b in range(8))
    assert all(sum(1 for x in row if x) == 4 for row in matrix)


# ----------------------------------------------------------------------------- metrics
def _mig_node(mode: MigMode, layout: dict[int, tuple[tuple[str, int], ...]] | None = None) -> NodeFacts:
    return NodeFacts("m", 64_000, 1 << 40, 110, "NVIDIA-H100-80GB-HBM3", 2, mig_mode=mode, mig_layout=layout or {})


def test_stranded_counts_gpus_whose_free_slices_fit_no_failed_profile() -> None:
    inventory = build_inventory([_mig_node(MigMode.DYNAMIC)])
    # GPU 0: a 4g at 0 leaves slices 4-7 and 3 compute slices: a 3g.40gb fits, a 4g.40gb does not
    inventory.commit(Placement("m", (GpuSlot(0, mig="4g.40gb", start=0),)))
    assert metrics.stranded_gpus(inventory, {"mig-4g.40gb": 2}).stranded == 1  # GPU 1 is untouched: fits
    assert metrics.stranded_gpus(inventory, {"mig-3g.40gb": 1}).stranded == 0
    inventory.commit(Placement("m", (GpuSlot(1, mig="1g.10gb", start=6),)))
    result = metrics.stranded_gpus(inventory, {"mig-7g.80gb": 1, "gpu-1": 3})
    assert (result.gpus, result.with_free, result.stranded) == (2, 2, 2)


def test_stranded_on_static_layouts_reads_free_instances() -> None:
    layout = {0: BALANCED_80GB, 1: BALANCED_80GB}
    inventory = build_inventory([_mig_node(MigMode.STATIC, layout)])
    assert metrics.stranded_gpus(inventory, {"mig-1g.10gb": 1}).stranded == 0
    assert metrics.stranded_gpus(inventory, {"mig-4g.40gb": 1}).stranded == 2


def test_occupancy_grid_labels_slices() -> None:
    inventory = build_inventory([_mig_node(MigMode.DYNAMIC)])
    placements = [
        Placement("m", (GpuSlot(0, mig="3g.40gb", start=4),)),
        Placement("m", (GpuSlot(0, mig="1g.10gb", start=0),)),
        Placement("m", (GpuSlot(1),)),  # whole: not a partitioned GPU, left out
    ]
    for p in placements:
        inventory.commit(p)
    grid = metrics.occupancy_grid(inventory, placements, sample=8)
    assert grid == [["1g.10gb", "free", "free", "free", "3g.40gb", "3g.40gb", "3g.40gb", "3g.40gb"]]


def test_link_tracker_compares_with_the_best_free_set() -> None:
    node = NodeFacts("v", 64_000, 1 << 40, 110, "Tesla-V100-SXM2-32GB", 8, nvlink=link_matrix(8, DGX1_LINKS))
    inventory = build_inventory([node])
    tracker = metrics.LinkTracker()
    pod = TracePod("p", PodRequest(1000, 1 << 30, Kind.WHOLE, gpus=2))
    nothing = np.zeros(0)
    for gpus in ((0, 3), (0, 1)):  # 2 links (the best pair) then 1 link
        decision = Decision(Placement("v", tuple(GpuSlot(j) for j in gpus)), nothing, nothing, nothing, [])
        tracker(pod, decision, inventory)
    result = tracker.to_json()
    assert result["multi_gpu_pods"] == 2
    assert result["all_nvlinked_pct"] == 100.0
    assert result["mean_link_score_vs_best_pct"] == round(100 * (1 + 120 / 220) / 2, 2)


def test_cost_metrics_count_busy_nodes_and_spot_use() -> None:
    nodes = cost_cluster().scaled(0.01).build()[:2]  # one H100 on-demand, one H100 spot
    inventory = build_inventory(nodes)
    firm = TracePod("firm", PodRequest(1000, 1 << 30, Kind.WHOLE, gpus=1))
    flexible = TracePod("flex", PodRequest(1000, 1 << 30, Kind.WHOLE, gpus=2, interruptible=True))
    placements = {
        "firm": Placement(nodes[1].name, (GpuSlot(0),), 1000, 1 << 30),
        "flex": Placement(nodes[1].name, (GpuSlot(1), GpuSlot(2)), 1000, 1 << 30),
    }
    for p in placements.values():
        inventory.commit(p)
    out = metrics.cost_metrics(inventory, placements, {"firm": firm, "flex": flexible})
    assert out["busy_nodes"] == 1
    assert out["busy_node_cost_per_hour"] == nodes[1].hourly_cost
    assert out["non_interruptible_pods_on_spot_pct"] == 100.0
    assert out["interruptible_gpu_demand_on_spot_pct"] == 100.0


def test_prefix_to_arrived_stops_at_the_first_pod_reaching_the_target() -> None:
    node = NodeFacts("n", 64_000, 1 << 40, 110, "G2", 4)
    pods = [TracePod(f"p{i}", PodRequest(1000, 1 << 30, Kind.WHOLE, gpus=1)) for i in range(8)]
    assert len(prefix_to_arrived(pods, [node], 100.0)) == 4
    assert len(prefix_to_arrived(pods[:2], [node], 100.0)) == 2


# ----------------------------------------------------------------------------- markdown
def test_update_readme_replaces_only_the_marked_block(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{README_START}\nold\n{README_END}\nafter\n")
    assert update_readme(readme, "new table")
    assert readme.read_text() == f"before\n{README_START}\nnew table\n{README_END}\nafter\n"
    (tmp_path / "other.md").write_text("no markers")
    assert not update_readme(tmp_path / "other.md", "x")


def test_table_rejects_ragged_rows() -> None:
    table = Table(["a", "b"])
    with pytest.raises(ValueError):
        table.add(1)


# ----------------------------------------------------------------------------- the report
def _json_numbers(value: object, out: set[float]) -> set[float]:
    if isinstance(value, bool):
        return out
    if isinstance(value, int | float):
        out.add(round(float(value), 6))
    elif isinstance(value, dict):
        for item in value.values():
            _json_numbers(item, out)
    elif isinstance(value, list):
        for item in value:
            _json_numbers(item, out)
    return out


def _table_numbers(markdown: str) -> list[float]:
    numbers = []
    for line in markdown.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        numbers += [float(c) for c in cells if NUMBER.fullmatch(c)]
    return numbers


@pytest.mark.slow
@needs_openb
def test_tiny_report_writes_every_file_and_every_table_number_is_in_the_json(tmp_path: Path) -> None:
    report = run_report(tiny_config(OPENB), tmp_path)
    text = (tmp_path / "REPORT.md").read_text()
    saved = orjson.loads((tmp_path / "results.json").read_bytes())
    config = report["config"]
    assert isinstance(config, dict) and saved["config"]["label"] == config["label"] == "tiny"
    images = [name for section in saved["sections"].values() for name in section["plots"]]
    assert {"openb_unallocated.png", "mig_occupancy.png", "nvlink_links.png", "cost_busy.png", "speed_kernel.png",
            "speed_http.png", "mig_curves.png", "nvlink_curves.png", "openb_curves.png",
            "openb_gpupack_minus_fgd.png", "churn_over_time.png"} <= set(images)  # fmt: skip
    assert {"openb_vs_fgd", "openb_spread", "openb_paper"} <= set(saved["sections"]["openb"]["tables"])
    limit_rows = saved["sections"]["openb"]["tables"]["openb_limit_seeds"]["rows"]
    assert len(limit_rows) == 4  # two traces x two seeds
    for _, _, bound, packing, gpupack, _, fgd, _ in limit_rows:  # no placement beats the bound
        assert bound <= min(v for v in (packing, gpupack, fgd) if v is not None)
    assert {"churn", "churn_per_seed", "churn_rejected_by_profile"} <= set(saved["sections"]["churn"]["tables"])
    assert "sign test" in text and "## 2. MIG with churn" in text
    for name in images:
        assert (tmp_path / name).stat().st_size > 1000, name
        assert f"]({name})" in text
    numbers = _table_numbers(text)
    assert len(numbers) > 100
    known = _json_numbers(saved, set())
    missing = sorted({n for n in numbers if round(n, 6) not in known})
    assert not missing, f"table numbers not in results.json: {missing[:10]}"
    for key in ("cpu", "cores", "ram_gib", "date", "commit"):
        assert str(saved["machine"][key]) in text
    assert "## Where gpupack is not better than a baseline" in text


def test_quick_without_out_writes_a_temporary_folder_and_leaves_bench_results_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#17 item 5: `gpupack bench --quick` never overwrites the committed full-run report; the full run does."""
    repo, temporary = tmp_path / "repo", tmp_path / "tmp"
    results = repo / "bench" / "results"
    results.mkdir(parents=True)
    temporary.mkdir()
    (results / "REPORT.md").write_text("the committed full run")
    traces = tmp_path / "openb"
    traces.mkdir()
    (traces / "openb_node_list_gpu_node.csv").write_text("")
    monkeypatch.chdir(repo)  # bench/results, the default, is relative to the working folder
    monkeypatch.setenv(report.TRACES_ENV, str(traces))
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    runs: list[tuple[str, Path]] = []

    def fake_run_report(config: report.BenchConfig, out: Path, log: object = None) -> dict[str, object]:
        runs.append((config.label, out))
        out.mkdir(parents=True, exist_ok=True)
        (out / "REPORT.md").write_text(config.label)
        return {}

    monkeypatch.setattr(report, "run_report", fake_run_report)  # the slow part
    assert build_parser().parse_args(["bench"]).out is None
    assert main(["bench", "--quick"]) == 0
    ((label, out),) = runs
    assert label == "quick" and out.parent == temporary
    assert (out / "REPORT.md").read_text() == "quick"
    assert [p.name for p in results.iterdir()] == ["REPORT.md"]
    assert (results / "REPORT.md").read_text() == "the committed full run"
    assert main(["bench", "--quick", "--out", str(tmp_path / "mine")]) == 0
    assert runs[-1] == ("quick", tmp_path / "mine")
    assert main(["bench"]) == 0  # the full run keeps bench/results as its default
    assert runs[-1] == ("full", Path("bench/results"))
    assert (results / "REPORT.md").read_text() == "full"
    throughput_quick = argparse.Namespace(out=None, quick=True, throughput=True)
    assert report.output_folder(throughput_quick).parent == temporary  # --throughput --quick as well


# ----------------------------------------------------------------------------- paired comparisons (#15 item 2)
def test_sign_test_is_exact_and_two_sided() -> None:
    assert paired_mod.sign_test(10, 0) == pytest.approx(2 / 1024)
    assert paired_mod.sign_test(9, 1) == pytest.approx(2 * 11 / 1024)
    assert paired_mod.sign_test(8, 2) == pytest.approx(2 * 56 / 1024)
    assert paired_mod.sign_test(0, 0) == 1.0


def test_a_lead_inside_the_seed_noise_is_a_tie() -> None:
    """0.01 better on the median is a tie unless it holds on nearly every seed."""
    theirs = {seed: 5.0 for seed in range(10)}
    mostly = {seed: 5.0 - (0.3 if seed < 6 else -0.3) for seed in range(10)}  # better on 6, worse on 4
    result = paired_mod.paired(mostly, theirs, higher_is_better=False)
    assert (result.wins, result.losses, result.ties) == (6, 4, 0)
    assert result.verdict == "tie"
    always = {seed: 4.99 for seed in range(10)}
    assert paired_mod.paired(always, theirs, higher_is_better=False).verdict == "better"
    assert paired_mod.paired(always, theirs, higher_is_better=True).verdict == "worse"
    equal = paired_mod.paired(theirs, theirs, higher_is_better=False)
    assert (equal.ties, equal.verdict) == (10, "tie")
    one_seed = paired_mod.paired({42: 1.0}, {42: 9.0}, higher_is_better=False)
    assert one_seed.verdict == "tie"  # a single seed can never be told from noise


def test_paired_uses_only_the_seeds_both_ran_and_reports_the_spread() -> None:
    result = paired_mod.paired({1: 4.0, 2: 4.5, 3: 3.0}, {1: 5.0, 2: 4.0, 4: 1.0}, higher_is_better=False)
    assert result.diffs == (-1.0, 0.5)
    assert (result.low, result.high, result.counts()) == (-1.0, 0.5, "1/1/0")
    assert "range -1.00 to +0.50" in result.describe()
    assert paired_mod.spread([1.0, 2.0, 3.0, 4.0, 5.0]) == 2.0


def test_compare_files_every_finding_with_its_paired_evidence() -> None:
    from gpupack.bench.sections import Section, compare

    section = Section()
    values = {
        "gpupack": {s: 4.0 for s in range(10)},
        "fgd": {s: 4.0 + (0.1 if s % 2 else -0.1) for s in range(10)},  # 5 wins, 5 losses
        "best-fit": {s: 7.0 for s in range(10)},
    }
    compare(section, "openb x", values, higher_is_better=False)
    (better,) = section.better
    (not_better,) = section.not_better
    assert "best-fit" in better and "**better**" in better and "10" in better
    assert "fgd" in not_better and "**tie**" in not_better and "5" in not_better


def test_robustness_table_pairs_gpupack_with_fgd_and_the_paper() -> None:
    values = {
        "default": {"gpupack": {s: 4.5 for s in range(10)}, "fgd": {s: 4.8 for s in range(10)}},
        "gpushare100": {"gpupack": {s: 13.5 for s in range(10)}, "fgd": {s: 13.4 for s in range(10)}},
    }
    table = openb_report.robustness_table(values)
    rows = {row[0]: dict(zip(table.columns, row, strict=True)) for row in table.rows}
    assert rows["default"]["FGD paper"] == 4.77
    assert rows["default"]["verdict"] == "better" and rows["default"]["gpupack ≤ paper"] is True
    assert rows["gpushare100"]["verdict"] == "worse" and rows["gpushare100"]["gpupack ≤ fgd"] is False
    assert rows["gpushare100"]["gpupack − fgd (median paired)"] == 0.1
    assert set(openb_report.PUBLISHED_FGD) == set(report.OPENB_TRACES)  # a paper figure for every trace


# ----------------------------------------------------------------------------- plots (#18 item 4)
def test_gpupack_is_drawn_last_thick_and_in_its_own_colour() -> None:
    names = ["fgd", "gpupack", "best-fit", "gpupack, seed 43"]
    order = plots.highlight_last(names)
    assert [names[i] for i in order[-2:]] == ["gpupack", "gpupack, seed 43"]
    mine, other = plots.line_style("gpupack", 1, 100), plots.line_style("fgd", 0, 100)
    assert mine["zorder"] > other["zorder"] and mine["linewidth"] > other["linewidth"]
    others = {plots.line_style(n, i, 100)["color"] for i, n in enumerate(["a", "b", "c", "d", "e", "f"])}
    assert mine["color"] not in others and len(others) == 6
    assert len({plots.line_style(n, i, 100)["marker"] for i, n in enumerate(["a", "b", "c"])} | {"o"}) == 4
    variant = plots.line_style("gpupack[spot_avoid=0]", 2, 100)
    assert variant["linestyle"] == "--" and variant["marker"] != mine["marker"]  # told apart from gpupack
    assert variant["zorder"] < mine["zorder"]
    assert plots.line_style("gpupack, seed 43", 3, 100) == mine  # a seed of gpupack is gpupack


def test_allocation_curves_can_draw_every_seed(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    runs = [{"seed": s, "curve": [[0, 0], [50, 49 - s], [100, 90]]} for s in (42, 43, 44)]
    fig, ax = plt.subplots()
    plots._curve_lines(ax, [{"policy": "gpupack", "runs": runs}, {"policy": "fgd", "runs": runs}], every_seed=True)
    labels = [str(line.get_label()) for line in ax.get_lines()]
    assert sorted(labels) == sorted(f"{p}, seed {s}" for p in ("gpupack", "fgd") for s in (42, 43, 44))
    assert labels[-3:] == ["gpupack, seed 42", "gpupack, seed 43", "gpupack, seed 44"]  # on top
    plt.close(fig)
    path = plots.allocation_curves([{"policy": "gpupack", "runs": runs}], tmp_path / "c.png", every_seed=True)
    assert path.stat().st_size > 1000


# ----------------------------------------------------------------------------- report prose (#17 item 4)
def test_the_soak_section_names_its_source_commit_and_date(tmp_path: Path) -> None:
    from gpupack.bench.report_text import soak_text

    assert soak_text(tmp_path, tmp_path) == ""  # no soak report: no section
    (tmp_path / "soak.md").write_text("## Soak\n\n100 calls, verdict **pass**\n\n```json\n{}\n```\n")
    (tmp_path / "soak.json").write_text('{"calls": 100}')
    text = soak_text(tmp_path, tmp_path)  # not a git repository: says so
    assert "python -m gpupack.bench.soak" in text and "recorded no commit or date" in text
    assert "100 calls" in text and "```json" not in text
    (tmp_path / "soak.json").write_text('{"calls": 100, "commit": "abc123", "date": "2026-11-26 09:00 UTC"}')
    assert "run on commit `abc123` on 2026-11-26 09:00 UTC" in soak_text(tmp_path, tmp_path)


def test_cost_prose_reads_the_spot_discount_from_the_cluster() -> None:
    from gpupack.bench.report_text import spot_price_ratio

    assert spot_price_ratio(cost_cluster().describe()) == pytest.approx(0.35, abs=0.01)
    assert spot_price_ratio(mig_cluster().describe()) is None


def test_report_render_stays_short() -> None:
    import inspect

    from gpupack.bench.report_text import render

    assert len(inspect.getsource(render).splitlines()) <= 80


# ----------------------------------------------------------------------------- --only and --cache
CALLS: list[int] = []


@dataclasses.dataclass(frozen=True)
class _CountedJob:
    value: int
    scenario: str = "churn"
    policy: str = "x"

    def run(self) -> dict[str, object]:
        CALLS.append(self.value)
        return {"scenario": self.scenario, "value": self.value}


def test_only_runs_the_named_sections_and_the_cache_runs_each_job_once(tmp_path: Path) -> None:
    config = dataclasses.replace(tiny_config(tmp_path), sections=("churn",))
    jobs = report.build_jobs(config)
    assert jobs and {job.scenario for job in jobs} == {"churn"}
    CALLS.clear()
    # stand-ins for report.Job: run_jobs only calls run() and the cache keys on the dataclass fields
    first = cast(list[Job], [_CountedJob(i) for i in range(3)])
    assert report.run_jobs(first, 1, cache=tmp_path / "cache") == [{"scenario": "churn", "value": i} for i in range(3)]
    again = cast(list[Job], [_CountedJob(i) for i in range(4)])
    assert [r["value"] for r in report.run_jobs(again, 1, cache=tmp_path / "cache")] == [0, 1, 2, 3]
    assert CALLS == [0, 1, 2, 3]  # the first three came from the cache
    assert main(["bench", "--only", "churn,nope"]) == 2


def test_mean_per_profile_table_averages_each_labels_runs_smallest_profile_first() -> None:
    from gpupack.bench.sections import mean_per_profile_table

    counts = {"gpupack": [{"7g.80gb": 1, "1g.10gb": 4}, {"1g.10gb": 1}], "fgd": [{"3g.40gb": 3}]}
    table = mean_per_profile_table("failed pods (mean per seed)", counts)
    assert table.columns == ["failed pods (mean per seed)", "gpupack", "fgd"]
    assert table.rows == [["1g.10gb", 2.5, 0], ["3g.40gb", 0, 3.0], ["7g.80gb", 0.5, 0]]


def test_a_partial_run_writes_its_own_folder_never_the_full_report_or_the_readme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """#27: `gpupack bench --only …` rewrote bench/results/REPORT.md (titled a full run) and cut the README's table."""
    temporary, traces = tmp_path / "tmp", tmp_path / "openb"
    temporary.mkdir()
    traces.mkdir()
    (traces / "openb_node_list_gpu_node.csv").write_text("")
    monkeypatch.setenv(report.TRACES_ENV, str(traces))
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    runs: list[tuple[report.BenchConfig, Path]] = []

    def fake_run_report(config: report.BenchConfig, out: Path, log: object = None) -> dict[str, object]:
        runs.append((config, out))  # the slow part, not run
        return {}

    monkeypatch.setattr(report, "run_report", fake_run_report)
    for argv in (["--only", "openb,churn"], ["--policies", "gpupack,fgd,best-fit"], ["--quick", "--only", "speed"]):
        assert main(["bench", *argv]) == 0
        config, out = runs[-1]
        assert out.parent == temporary and out.name.startswith("gpupack-bench-partial-"), argv
        assert not config.update_readme and "partial" in config.label, argv
    assert main(["bench", "--only", "openb", "--out", "bench/results"]) == 2
    assert main(["bench", "--only", "openb", "--out", str(report.ROOT / "bench" / "results")]) == 2
    assert "never writes to bench/results" in capsys.readouterr().err
    assert len(runs) == 3
    assert main(["bench", "--only", ",".join(report.SECTIONS)]) == 0  # every section: the full run
    config, out = runs[-1]
    assert (config.label, config.update_readme, out) == ("full", True, Path("bench/results"))
