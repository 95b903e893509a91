"""The balance of a multimodal job's vision encoder and LLM, each against naive per-rank loading: the per-step
numbers over families of generated steps with images and clips, the report's rows, plots and `top`'s table,
and (against the broker) `mixflow run`'s summary and `mixflow report` on a small job, recomputed from its
batches."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.image import imread
from rich.console import Console
from tokenizers import AddedToken, ByteLevelBPETokenizer, Tokenizer

from pipeline.planning.scheduler.part_bound import largest_rank_bound
from pipeline.planning.shape import StepShape
from pipeline.spec import load_spec
from pipeline.spec.cost import CostModel, VisionCostModel
from pipeline.tools.observe.frame import JobFacts, build_frame, render_frame
from pipeline.tools.observe.naive import first_fit, naive_loading
from pipeline.tools.observe.plots import write_plots
from pipeline.tools.observe.rank_topics import StepBalance, read_steps
from pipeline.tools.observe.series import report_series
from pipeline.tools.observe.step_stats import imbalance, step_stats
from pipeline.tools.observe.summary import summary_markdown
from pipeline.tools.observe.timeline import JobTimeline
from pipeline.tools.observe.vision_parts import PATCHES, EncoderWeighing
from tests.loader_support import REPO
from tests.media_support import image_bytes, text_image
from tests.sink_media_support import media_sample
from topics.formats.batch import Batch
from topics.formats.sample import Sample

SOURCES = ("vl", "text")
LLM = CostModel(alpha=1.0, beta=100.0)
WEIGHINGS = st.sampled_from(
    [
        EncoderWeighing(VisionCostModel(alpha=2.0, beta=50.0), in_total=True),
        EncoderWeighing(VisionCostModel(alpha=0.0, beta=1.0, gamma=30.0), in_total=True),
        EncoderWeighing(PATCHES, in_total=False),
    ]
)


# -- steps with media, and naive loading recomputed item by item ----------------------------------------


def _sample(rng: np.random.Generator, sample_id: str) -> Sample:
    """Text alone (a third of them), or 1-3 images and clips of random grids, with text around them."""
    items = int(rng.choice([0, 1, 1, 2, 3]))
    specs = []
    for _ in range(items):
        h, w = (2 * rng.integers(1, 4, 2)).tolist()
        specs.append(("video", (int(rng.integers(1, 3)), h, w)) if rng.random() < 0.2 else ("image", (1, h, w)))
    source = "vl" if specs else "text"
    return media_sample(rng, sample_id, specs, source=source, text=(1, 40))


def _pack(samples: list[Sample], micro_batches: int, capacity: int, budget: int | None) -> list[list[Sample]]:
    """First-fit by tokens and patches; what fits nowhere is dropped."""
    groups: list[list[Sample]] = [[] for _ in range(micro_batches)]
    room, patch_room = [capacity] * micro_batches, [budget or 10**9] * micro_batches
    for sample in samples:
        for m in range(micro_batches):
            if sample.length <= room[m] and sample.patches <= patch_room[m]:
                groups[m].append(sample)
                room[m] -= sample.length
                patch_room[m] -= sample.patches
                break
    return groups


@st.composite
def multimodal_steps(draw: st.DrawFn, max_steps: int = 4) -> list[list[Batch]]:
    """Steps of a job with media: per step the batch of every rank, the media column on every batch."""
    ranks = draw(st.integers(1, 4))
    micro_batches = draw(st.integers(1, 3))
    capacity = draw(st.sampled_from([96, 160, 512]))
    budget = draw(st.sampled_from([None, 24, 64, 400]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    steps = []
    for step in range(draw(st.integers(1, max_steps))):
        batches = []
        for rank in range(ranks):
            samples = [_sample(rng, f"s/{step}-{rank}-{i}") for i in range(int(rng.integers(0, 7)))]
            batches.append(
                Batch.from_samples(
                    step=step,
                    rank=rank,
                    ranks=ranks,
                    capacity=capacity,
                    micro_batches=_pack(samples, micro_batches, capacity, budget),
                    with_media=True,
                    patches_per_micro_batch=budget,
                )
            )
        steps.append(batches)
    return steps


def encoder_cost(sample: Sample, model: VisionCostModel) -> float:
    return sum(float(model.costs(np.array([item.patches]))[0]) for item in sample.media)


def naive_by_hand(samples: list[Sample], ranks: int, micro_batches: int, capacity: int, budget: int | None) -> dict:
    """Sample i to rank i mod R, each rank filling its micro-batches first-fit by tokens and patches: the
    samples each rank holds, and how many fit nowhere."""
    held: list[list[Sample]] = [[] for _ in range(ranks)]
    left_out = 0
    for r in range(ranks):
        groups = _pack(samples[r::ranks], micro_batches, capacity, budget)
        held[r] = [s for g in groups for s in g]
        left_out += len(samples[r::ranks]) - len(held[r])
    return {"held": held, "left_out": left_out}


class NaiveRunByHand:
    """Naive loading as one run over a job's steps, by hand: sample i of the job to rank i mod R; each step a rank
    packs first-fit what waits from before, then its new samples; what fits no micro-batch waits for its next."""

    def __init__(self, ranks: int) -> None:
        self.waiting: list[list[Sample]] = [[] for _ in range(ranks)]
        self.dealt = 0

    def step(self, samples: list[Sample], micro_batches: int, capacity: int, budget: int | None) -> list[list[Sample]]:
        for sample in samples:
            self.waiting[self.dealt % len(self.waiting)].append(sample)
            self.dealt += 1
        held = []
        for r, waiting in enumerate(self.waiting):
            mine = [s for g in _pack(waiting, micro_batches, capacity, budget) for s in g]
            taken = {id(s) for s in mine}
            held.append([s for s in waiting if id(s) in taken])  # in the order they waited
            self.waiting[r] = [s for s in waiting if id(s) not in taken]
        return held

    def drain(self, micro_batches: int, capacity: int, budget: int | None) -> list[list[list[Sample]]]:
        steps = []
        while any(self.waiting):
            steps.append(self.step([], micro_batches, capacity, budget))
        return steps


def part_costs(held: list[list[Sample]], weighing: EncoderWeighing) -> tuple[np.ndarray, np.ndarray]:
    encoder = np.array([sum(encoder_cost(s, weighing.model) for s in mine) for mine in held])
    llm = np.array([float(LLM.costs(np.array([s.length for s in mine], dtype=np.int64)).sum()) for mine in held])
    return encoder, llm


@given(
    sizes=st.lists(st.tuples(st.integers(1, 60), st.integers(0, 50)), max_size=40),
    bins=st.integers(1, 5),
    capacity=st.sampled_from([16, 64, 200]),
    budget=st.sampled_from([None, 10, 64]),
)
def test_first_fit_with_patches_needs_room_for_both(
    sizes: list[tuple[int, int]], bins: int, capacity: int, budget: int | None
) -> None:
    lengths = np.array([n for n, _ in sizes], dtype=np.int64)
    patches = np.array([p for _, p in sizes], dtype=np.int64)
    placed = first_fit(lengths, bins, capacity, patches, budget)
    room, patch_room = np.full(bins, capacity), np.full(bins, budget if budget is not None else 10**9)
    for length, n, b in zip(lengths.tolist(), patches.tolist(), placed.tolist(), strict=True):
        with_room = np.flatnonzero((room >= length) & (patch_room >= n))
        if b < 0:
            assert with_room.size == 0, "a sample was left out although a micro-batch had room for it"
        else:
            assert b == with_room[0], "a sample went past a micro-batch with room"
            room[b] -= length
            patch_room[b] -= n
    if budget is None:  # no patch budget: the text packing exactly
        np.testing.assert_array_equal(placed, first_fit(lengths, bins, capacity))


@settings(max_examples=25, deadline=None)
@given(job=multimodal_steps(), weighing=WEIGHINGS)
def test_step_parts_add_up_to_the_batches_and_naive_keeps_both_capacities(job, weighing: EncoderWeighing) -> None:
    for batches in job:
        stats = step_stats(batches, SOURCES, LLM, weighing)
        first = batches[0]
        encoder, llm = part_costs([b.samples() for b in batches], weighing)
        assert stats.parts is not None and stats.naive.parts is not None
        np.testing.assert_allclose(stats.parts.encoder, encoder, rtol=1e-12)
        np.testing.assert_allclose(stats.parts.llm, llm, rtol=1e-12)
        np.testing.assert_allclose(stats.rank_costs, llm + encoder if weighing.in_total else llm, rtol=1e-12)
        assert stats.encoder_imbalance == pytest.approx(float(imbalance(encoder)))
        assert stats.llm_imbalance == pytest.approx(float(imbalance(llm)))
        # The batches are one plan of their samples: the bound of each part is never above it, nor below 1.
        for bound, written in (
            (stats.encoder_bound_imbalance, stats.encoder_imbalance),
            (stats.llm_bound_imbalance, stats.llm_imbalance),
            (stats.bound_imbalance, stats.imbalance),
        ):
            assert 1.0 <= bound <= written * (1 + 1e-9) + 1e-9, (bound, written)

        samples = [s for b in batches for s in b.samples()]
        naive = naive_by_hand(samples, first.ranks, first.micro_batches, first.capacity, first.patches_per_micro_batch)
        naive_encoder, naive_llm = part_costs(naive["held"], weighing)
        np.testing.assert_allclose(stats.naive.parts.encoder, naive_encoder, rtol=1e-12)
        np.testing.assert_allclose(stats.naive.parts.llm, naive_llm, rtol=1e-12)
        assert stats.naive.left_out == naive["left_out"]
        assert stats.naive.tokens == sum(s.length for mine in naive["held"] for s in mine)
        total = naive_llm + naive_encoder if weighing.in_total else naive_llm
        np.testing.assert_allclose(stats.naive.rank_costs, total, rtol=1e-12)
        # The same step read as text: the LLM's part alone, as the text report computes it.
        text = step_stats(batches, SOURCES, LLM)
        assert text.parts is None and text.naive.parts is None
        np.testing.assert_allclose(text.rank_costs, llm, rtol=1e-12)


@settings(max_examples=15, deadline=None)
@given(job=multimodal_steps(), weighing=WEIGHINGS, seed=st.integers(0, 2**32 - 1))
def test_run_summary_deals_the_shuffled_samples_under_both_capacities(job, weighing: EncoderWeighing, seed) -> None:
    """The run summary's naive loading: each step's samples shuffled, then dealt and packed as one run over the
    job (what fits no micro-batch waits for its rank's next step), its last steps for what still waits."""
    balance = StepBalance(LLM, weighing, seed)
    rng = np.random.default_rng(seed)
    by_hand = NaiveRunByHand(job[0][0].ranks)
    naive_steps: list[list[list[Sample]]] = []
    first = job[0][0]
    shape = (first.micro_batches, first.capacity, first.patches_per_micro_batch)
    for batches in job:
        balance.add(batches)
        samples = [s for b in batches for s in b.samples()]
        order = rng.permutation(len(samples))
        naive_steps.append(by_hand.step([samples[i] for i in order], *shape))
        encoder, llm = part_costs([b.samples() for b in batches], weighing)
        assert balance.by_part[-1][:2] == pytest.approx([float(imbalance(encoder)), float(imbalance(llm))])
        stats = step_stats(batches, SOURCES, LLM, weighing)  # the report's bounds, the same
        bounds = (stats.encoder_bound_imbalance, stats.llm_bound_imbalance, stats.bound_imbalance)
        assert balance.by_part[-1][2:] == pytest.approx(bounds)
        total = llm + encoder if weighing.in_total else llm
        assert balance.balanced[-1] == pytest.approx(float(imbalance(total)))
    balance.finish()
    assert len(balance.naive) == len(balance.naive_parts) == len(naive_steps) == len(job)
    naive_time = 0.0
    for k, held in enumerate(naive_steps + by_hand.drain(*shape)):  # the steps after the job's count in its time
        naive_encoder, naive_llm = part_costs(held, weighing)
        naive_total = naive_llm + naive_encoder if weighing.in_total else naive_llm
        if k < len(job):
            assert balance.naive_parts[k] == pytest.approx([float(imbalance(x)) for x in (naive_encoder, naive_llm)])
            assert balance.naive[k] == pytest.approx(float(imbalance(naive_total)))
        naive_time += float(naive_total.max())
    assert balance.naive_time == pytest.approx(naive_time)
    parts = balance.parts()
    assert parts is not None and len(parts.encoder) == len(parts.naive_encoder) == len(job)
    lines = parts.lines()
    assert lines[0].startswith(f"  {weighing.label}: ") and lines[1].startswith("  LLM: ")
    assert all(re.search(r"; bound [\d.]+, 95th percentile [\d.]+$", line) for line in lines), lines


def test_naive_loading_without_vision_is_the_text_packing() -> None:
    lengths = np.array([50, 10, 90, 30, 30, 70, 5], dtype=np.int64)
    naive = naive_loading(lengths, 2, 2, 100, LLM)
    assert naive.parts is None and naive.left_out == 0 and naive.tokens == int(lengths.sum())
    rank_0, rank_1 = LLM.costs(np.array([50, 90, 30, 5])).sum(), LLM.costs(np.array([10, 30, 70])).sum()
    np.testing.assert_allclose(naive.rank_costs, [rank_0, rank_1])


# -- the report's rows, its plot, top's table ---------------------------------------------------------


def timeline_of(job, weighing: EncoderWeighing | None) -> JobTimeline:
    stats = [step_stats(batches, SOURCES, LLM, weighing) for batches in job]
    k = len(stats)
    return JobTimeline(
        job="mm",
        sources=list(SOURCES),
        stats=stats,
        step_times=1_700_000_000 + np.arange(k, dtype=np.float64),
        weights=np.tile([0.6, 0.4], (k, 1)),
        steps_with_all_sources=k,
        backlog_times=1_700_000_000 + np.arange(k, dtype=np.float64),
        backlog=np.zeros((k, 2)),
        encoder=weighing,
    )


ROW = re.compile(
    r"^\| (?P<label>[^|]+): largest / mean rank cost, median \(p95\) \| (?P<m>[\d.]+) \((?P<h>[\d.]+)\); "
    r"bound (?P<bm>[\d.]+) \((?P<bh>[\d.]+)\), planned over it (?P<om>[\d.]+) \((?P<oh>[\d.]+)\); "
    r"naive per-rank loading (?P<nm>[\d.]+) \((?P<nh>[\d.]+)\) \|$",
    re.MULTILINE,
)
FIGURES = ("m", "h", "nm", "nh", "bm", "bh", "om", "oh")
"""A part's row: as written, naive, the bound and written over the bound; each median and 95th percentile."""


def part_rows_of(summary: str) -> dict[str, tuple[float, ...]]:
    return {m["label"]: tuple(float(m[k]) for k in FIGURES) for m in ROW.finditer(summary)}


def spread(values) -> tuple[float, float]:
    return float(np.median(values)), float(np.percentile(values, 95))


def assert_row(row: tuple[float, ...], balanced, naive, bound) -> None:
    balanced, bound = np.asarray(balanced), np.asarray(bound)
    expected = (*spread(balanced), *spread(naive), *spread(bound), *spread(balanced / bound))
    assert row == pytest.approx(expected, abs=5e-4 + 1e-9), (row, expected)
    assert (bound <= balanced * (1 + 1e-9)).all() and (bound >= 1).all(), (balanced, bound)


@settings(max_examples=4, deadline=None)
@given(job=multimodal_steps(max_steps=6), weighing=WEIGHINGS)
def test_report_rows_plot_and_top_show_each_part(tmp_path_factory, job, weighing: EncoderWeighing) -> None:
    timeline = timeline_of(job, weighing)
    series = report_series(timeline)
    out: Path = tmp_path_factory.mktemp("report")
    images = write_plots(series, timeline, out)
    summary = summary_markdown(series, timeline, images)
    rows = part_rows_of(summary)
    assert list(rows) == [weighing.label, "LLM", weighing.total_label], summary
    stats = timeline.stats
    for label, balanced, naive, bound in (
        (weighing.label, "encoder_imbalance", "naive_encoder_imbalance", "encoder_bound_imbalance"),
        ("LLM", "llm_imbalance", "naive_llm_imbalance", "llm_bound_imbalance"),
        (weighing.total_label, "imbalance", "naive_imbalance", "bound_imbalance"),
    ):
        assert_row(rows[label], *([getattr(s, name) for s in stats] for name in (balanced, naive, bound)))
    assert "naive loading fills each micro-batch under its patch budget" in summary
    assert "A part's bound is, per step, the least largest rank cost" in summary
    # Three panels, one above the other: total, encoder, LLM.
    assert imread(images["imbalance"]).shape[0] > 2 * imread(images["shares"]).shape[0]

    text = summary_markdown(report_series(timeline_of(job, None)), timeline_of(job, None), {})
    assert not part_rows_of(text) and "patch budget" not in text

    facts = JobFacts("mm", 10.0, [], {}, len(job), 0, True, stats, None)
    frame = build_frame(facts)
    assert [p.part for p in frame.parts] == [weighing.total_label, weighing.label, "LLM"]
    assert frame.parts[1].imbalance_median == pytest.approx(np.median([s.encoder_imbalance for s in stats]))
    assert frame.parts[2].naive_imbalance_median == pytest.approx(np.median([s.naive_llm_imbalance for s in stats]))
    assert frame.parts[1].bound_median == pytest.approx(np.median([s.encoder_bound_imbalance for s in stats]))
    assert frame.parts[2].bound_max == pytest.approx(max(s.llm_bound_imbalance for s in stats))
    as_json = frame.to_dict()["parts"][0]
    assert as_json["part"] == weighing.total_label
    assert as_json["bound_median"] == pytest.approx(np.median([s.bound_imbalance for s in stats]))
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render_frame(frame))
    shown = console.export_text()
    assert f"rank cost by part: the last {len(stats)} steps" in shown
    header = r"\s*┃\s*".join(("part", "imbalance", "worst", "bound", "bound worst", "naive"))
    assert re.search(header, shown), shown
    text_frame = build_frame(JobFacts("t", 10.0, [], {}, len(job), 0, True, timeline_of(job, None).stats, None))
    assert text_frame.parts == [] and "parts" not in text_frame.to_dict()


# -- a multimodal job through the broker ------------------------------------------------------------------

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
CAPTIONS = ["a chart of sin(x)", "the photo of a cat", "two lines of code", "a red square", "mixflow"]
ENCODER = VisionCostModel(alpha=2.0, beta=50.0)


def write_tokenizer(path: Path) -> int:
    """A small byte-level BPE with the four vision tokens after its vocabulary; the first vision id."""
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(CAPTIONS * 20, vocab_size=300, special_tokens=["<eod>"], show_progress=False)
    trainer.save(str(path))
    tokenizer = Tokenizer.from_file(str(path))
    first = tokenizer.get_vocab_size(with_added_tokens=True)
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in VISION_TOKENS])
    tokenizer.save(str(path))
    return first


def write_shard(path: Path, pairs: int, seed: int) -> None:
    """A WebDataset shard of ``pairs`` PNG images of random sizes, each with its caption."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for k in range(pairs):
            width, height = (int(x) for x in rng.integers(28, 260, 2))
            caption = " ".join(rng.choice(CAPTIONS, int(rng.integers(1, 8))).tolist())
            for name, data in (
                (f"{k:06d}.png", image_bytes(text_image(width, height, str(k)))),
                (f"{k:06d}.txt", caption.encode()),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def write_job(folder: Path, job: str, bootstrap: str) -> Path:
    first = write_tokenizer(folder / "tokenizer.json")
    write_shard(folder / "captions" / "shard-000000.tar", 40, seed=3)
    texts = folder / "topics"
    texts.mkdir()
    rng = np.random.default_rng(4)
    for k in range(16):
        (texts / f"{k:02d}.txt").write_text(" ".join(rng.choice(CAPTIONS, int(rng.integers(2, 40))).tolist()))
    names = ("vision_start_id", "vision_end_id", "image_token_id", "video_token_id")
    vision = dict(zip(names, range(first, first + 4), strict=True))
    spec = {
        "job": job,
        "kafka": {"bootstrap_servers": bootstrap},
        "tokenizer": str(folder / "tokenizer.json"),
        "sources": [
            {
                "name": "captions",
                "reader": "webdataset",
                "path": str(folder / "captions"),
                "eod_token_id": 0,
                "vision": {**vision, "min_pixels": 3136, "max_pixels": 50176, "encoding": "jpeg"},
            },
            {"name": "topics", "reader": "text", "path": str(texts), "eod_token_id": 0},
        ],
        "mixture": {"weights": {"captions": 3, "topics": 1}},
        "step": {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 256, "patches_per_micro_batch": 400},
        "cost": {"alpha": LLM.alpha, "beta": LLM.beta, "vision": {"alpha": ENCODER.alpha, "beta": ENCODER.beta}},
        "on_exhausted": "renormalize",
        "seed": 7,
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def mixflow(*args: str, timeout_s: float = 240) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout_s
    )
    assert result.returncode == 0, f"mixflow {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}"
    return result.stdout


NUMBER = r"(\d+\.\d+)"


def summary_line(stdout: str, label: str) -> tuple[float, ...]:
    """The median, naive median, high percentile, naive high percentile, bound median and bound high percentile
    of one part's line."""
    pattern = (
        rf"^  {re.escape(label)}: {NUMBER} balanced, {NUMBER} with naive per-rank loading; "
        rf"95th percentile {NUMBER} balanced, {NUMBER} naive; bound {NUMBER}, 95th percentile {NUMBER}$"
    )
    found = re.search(pattern, stdout, re.MULTILINE)
    assert found, f"no line for {label!r} in:\n{stdout}"
    return tuple(float(x) for x in found.groups())


@pytest.mark.kafka
def test_run_and_report_show_the_encoder_and_llm_balance_of_a_multimodal_job(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    spec_path = write_job(tmp_path, unique_name, kafka_bootstrap)
    stdout = mixflow("run", "--spec", str(spec_path), "--state-dir", str(tmp_path / "state"))
    out = tmp_path / "report"
    mixflow("report", "--spec", str(spec_path), "--out", str(out))
    summary = (out / "report.md").read_text()

    spec = load_spec(spec_path)
    steps = read_steps(spec.kafka.client_config(kafka_bootstrap), unique_name, spec.step.ranks)
    assert len(steps) >= 3, f"a job of a few steps: {len(steps)}"
    assert any(b.media.patches.size for batches in steps for b in batches), "the job's batches hold images"
    weighing = EncoderWeighing(ENCODER, in_total=True)

    # Recomputed from the batches' samples: as written, and under naive loading as one run over the job's
    # samples in the written order (the report) and in the order of the run summary's shuffle (seed 0, one
    # permutation per step), its step as each step is written.
    written, naive, shuffled, bounds = [], [], [], []
    naive_runs = {"report": NaiveRunByHand(2), "run summary": NaiveRunByHand(2)}
    rng = np.random.default_rng(0)
    step_shape = StepShape(ranks=2, micro_batches=2, tokens_per_micro_batch=256, patches_per_micro_batch=400)
    for batches in steps:
        held = [b.samples() for b in batches]
        samples = [s for mine in held for s in mine]
        first = batches[0]
        shape = (first.ranks, first.micro_batches, first.capacity, first.patches_per_micro_batch)
        assert shape == (2, 2, 256, 400)
        order = rng.permutation(len(samples))
        for out_list, dealt in (
            (written, held),
            (naive, naive_runs["report"].step(samples, *shape[1:])),
            (shuffled, naive_runs["run summary"].step([samples[i] for i in order], *shape[1:])),
        ):
            encoder, llm = part_costs(dealt, weighing)
            out_list.append([float(imbalance(x)) for x in (encoder, llm, encoder + llm)])
        # The least largest / mean rank cost any plan of the step's samples could reach, part by part.
        lengths = np.array([s.length for s in samples], dtype=np.int64)
        patches = np.array([s.patches for s in samples], dtype=np.int64)
        encoder_costs = np.array([encoder_cost(s, ENCODER) for s in samples])
        llm_costs = LLM.costs(lengths)
        bounds.append(
            [
                largest_rank_bound(costs, lengths, patches, step_shape) / (costs.sum() / 2)
                for costs in (encoder_costs, llm_costs, encoder_costs + llm_costs)
            ]
        )
    written_by_part, naive_by_part, shuffled_by_part = (np.array(x).T for x in (written, naive, shuffled))
    bound_by_part = np.array(bounds).T

    rows = part_rows_of(summary)
    assert list(rows) == ["vision encoder", "LLM", "encoder + LLM"], summary
    for i, label in enumerate(rows):
        assert_row(rows[label], written_by_part[i], naive_by_part[i], bound_by_part[i])
    assert "![imbalance](imbalance.png)" in summary

    for i, label in enumerate(("vision encoder", "LLM")):
        median, naive_median, high, naive_high, bound_median, bound_high = summary_line(stdout, label)
        expected = (*spread(written_by_part[i]), *spread(shuffled_by_part[i]), *spread(bound_by_part[i]))
        got = (median, high, naive_median, naive_high, bound_median, bound_high)
        assert got == pytest.approx(expected, abs=5e-4 + 1e-9), stdout
    total = re.search(
        rf"largest rank cost / mean, median over steps: {NUMBER} balanced, {NUMBER} with naive per-rank loading "
        rf"\(step-time speedup {NUMBER}x\); 95th percentile {NUMBER} balanced, {NUMBER} naive; "
        rf"bound {NUMBER}, 95th percentile {NUMBER}$",
        stdout,
        re.MULTILINE,
    )
    assert total, stdout
    median, naive_median, _, high, naive_high, bound_median, bound_high = (float(x) for x in total.groups())
    expected = (*spread(written_by_part[2]), *spread(shuffled_by_part[2]), *spread(bound_by_part[2]))
    got = (median, high, naive_median, naive_high, bound_median, bound_high)
    assert got == pytest.approx(expected, abs=5e-4 + 1e-9), stdout
    assert "each sample exactly once: yes" in stdout
