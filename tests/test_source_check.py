"""`spec check --files` holds each source's settings to its files and tokenizer before a sample is read: the
settings that would make every document they touch a dead letter are refused in one line naming the source and
the field; a good spec says what was read of each source."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.tokenizer import TextTokenizer
from pipeline.cli import main
from pipeline.roles.loader.record_sample import FILES_SAMPLED, sampled_files

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
USAGE = 2


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The multimodal example's data at a small size: captions in tar shards, interleaved documents, clips, and
    the text sources, with the example's tokenizer and its vision tokens added as special tokens."""
    sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location("build_multimodal_data", EXAMPLES / "build_multimodal_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path_factory.mktemp("mm") / "data"
    module.build(out, pairs=8, documents=3, clips=2, limit=3)
    return out


@pytest.fixture(scope="module")
def tokenizer(data: Path) -> TextTokenizer:
    return TextTokenizer.from_file(data / "mm-tokenizer.json")


def _spec(folder: Path, data: Path, change: str = "") -> Path:
    body = yaml.safe_load((EXAMPLES / "multimodal.yaml").read_text())
    body["tokenizer"] = str(data / "mm-tokenizer.json")
    for source in body["sources"]:
        source["path"] = str(data / Path(source["path"]).name)
    body["sources"].append({"name": "docstrings", "reader": "jsonl", "path": str(data / "docstrings")})
    body["mixture"]["schedule"][0]["weights"]["docstrings"] = 0.1
    body["step"].update(tokens_per_micro_batch=512, patches_per_micro_batch=1024)
    exec(change, {"body": body})
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def _check(spec: Path, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    code = main(["spec", "check", "--files", str(spec)])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_good_spec_says_what_was_read_of_each_source(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    code, out, err = _check(_spec(tmp_path, data), capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1] == f"settings held to the first 16 records of up to {FILES_SAMPLED} files of each source:", out
    assert re.fullmatch(r"  captions: \d+ records of 1 of 1 file; largest image \d+ patches, \d+ tokens", lines[2])
    assert re.fullmatch(r"  clips: \d+ records of 1 of 1 file; largest clip \d+ patches, \d+ tokens", lines[4])
    assert re.fullmatch(r"  topics: (\d+) records of \1 of \d+ files", lines[5]), out  # a record a file
    assert re.fullmatch(r"  docstrings: \d+ records of 1 of 1 file", lines[6]), out


VISION = 'body["sources"][{k}]["vision"]'
MISTAKES = [
    # vision ids that text gives: the end-of-document token, then ids of the tokenizer's text vocabulary
    (f'{VISION.format(k=0)}["vision_start_id"] = 0', "sources[0].vision.vision_start_id",
     r"is the source's eod_token_id: every document ends with it"),
    (f'{VISION.format(k=1)}.update(vision_start_id=100, vision_end_id=101, image_token_id=102, video_token_id=103)',
     "sources[1].vision.image_token_id", r"is '.', a text token of mm-tokenizer.json: every document whose text "
     r"tokenizes to it is a dead letter; .* past its vocabulary of \d+ \(got 102\)"),
    # a patch budget below an image or a clip read
    ('body["step"]["patches_per_micro_batch"] = 8', "step.patches_per_micro_batch",
     r"below the largest image read of source captions: captions-000000.tar:key=\d+.png has \d+ patches; every "
     r"image or clip over the budget is a dead letter \(got 8\)"),
    ('body["step"]["patches_per_micro_batch"] = 100', "step.patches_per_micro_batch",
     r"below the largest clip read of source clips: clips-0000.jsonl:row=\d+:video=0 has \d+ patches"),
    # a max_sample_length below an image's block of tokens
    ('body["sources"][1]["max_sample_length"] = 40', "sources[1].max_sample_length",
     r"below the longest image read: interleaved-0000.jsonl:row=\d+:image=\d takes \d+ tokens .* \(got 40\)"),
    # fields the records lack
    ('body["sources"][1]["media_fields"] = {"segments": "segs"}', "sources[1].media_fields",
     r"every record read is a dead letter \(\d+ records of 1 file; media_fields looks for .*segments in segs, .*\), .*"
     r"interleaved-0000.jsonl:row=0: no image or video; the record's keys: segments$"),
    ('body["sources"][2]["media_fields"] = {"text": "caption"}', "sources[2].media_fields",
     r"media_fields looks for text in caption, .*: no text; the record's keys: video, text$"),
    ('body["sources"][4]["field"] = "body"', "sources[4].field",
     r"read from field 'body'\), .*: field 'body' is missing or null; the record's keys: path, qualname, text$"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "field", "says"), MISTAKES, ids=[m[1] for m in MISTAKES])
def test_a_setting_that_would_dead_letter_what_it_touches_is_refused_naming_the_source_and_field(
    change: str, field: str, says: str, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    code, out, err = _check(_spec(tmp_path, data, change), capsys)
    assert code == USAGE and not out, err
    mine = [line for line in err.splitlines() if f": {field}: " in line]
    assert any(re.search(says, line) for line in mine), err
    assert "Traceback" not in err


def test_the_tokenizers_own_vision_tokens_and_ids_past_its_vocabulary_pass(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    size = TextTokenizer.from_file(data / "mm-tokenizer.json").vocab_size
    past = f"{VISION.format(k=2)}.update(vision_start_id={size}, vision_end_id={size + 1}, image_token_id={size + 7}, "
    past += f"video_token_id={10**6})"
    code, _, err = _check(_spec(tmp_path, data, past), capsys)
    assert code == 0, err


def test_a_vision_id_that_is_the_tokenizers_padding_token_is_refused(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from tokenizers import Tokenizer

    padded = Tokenizer.from_file(str(data / "mm-tokenizer.json"))
    padded.enable_padding(pad_id=0, pad_token="<|endoftext|>")
    padded.save(str(tmp_path / "padded.json"))
    change = f'body["tokenizer"] = "{tmp_path / "padded.json"}"; del body["sources"][0]["eod_token_id"]; '
    change += f'{VISION.format(k=0)}["video_token_id"] = 0'
    code, _, err = _check(_spec(tmp_path, data, change), capsys)
    assert code == USAGE and "sources[0].vision.video_token_id: is the padding token of padded.json (got 0)" in err


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=60))
def test_every_id_text_tokenizes_to_is_a_text_token_and_special_ones_are_not(
    text: str, tokenizer: TextTokenizer
) -> None:
    for token_id in tokenizer.encode_batch([text])[0].tolist():
        assert tokenizer.text_token(token_id) is not None, (text, token_id)
    special = [tokenizer.token_id(t) for t in ("<|endoftext|>", "<|vision_start|>", "<|image_pad|>")]
    assert all(tokenizer.text_token(token_id) is None for token_id in special)
    assert tokenizer.text_token(tokenizer.vocab_size) is None


@given(count=st.integers(0, 50), wanted=st.integers(1, 8))
def test_the_files_read_are_the_first_the_last_and_some_between(count: int, wanted: int) -> None:
    files = [f"f{k:03d}" for k in range(count)]
    picked = sampled_files(files, wanted)
    assert picked == sorted(set(picked)) and set(picked) <= set(files)
    assert len(picked) == min(count, wanted)
    if count > wanted > 1:
        assert picked[0] == files[0] and picked[-1] == files[-1]


@pytest.mark.object_store
def test_sources_in_an_object_store_are_read_and_held_to_their_settings_the_same_way(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.s3_support import running_server, storage_section, upload

    with running_server(tmp_path / "s3") as server:
        monkeypatch.setenv("MIXFLOW_TEST_S3_KEY", server.access_key)
        monkeypatch.setenv("MIXFLOW_TEST_S3_SECRET", server.secret_key)
        for name in ("captions", "interleaved", "clips"):
            upload(server, data / name, f"mm/{name}")  # media named by path are objects beside their records
        change = "body['sources'] = body['sources'][:3]; body['storage'] = STORAGE; "
        change += "[s.update(path=f's3://corpus/mm/{s[\"name\"]}') for s in body['sources']]; "
        change += "body['mixture']['schedule'][0]['weights'] = {'captions': 1, 'interleaved': 1, 'clips': 1}"
        spec = _spec(tmp_path, data, change.replace("STORAGE", repr(storage_section(server, retry_deadline_s=10))))
        code, out, err = _check(spec, capsys)
        assert code == 0, err
        local_code, local_out, _ = _check(_spec(tmp_path, data), capsys)
        assert local_code == 0 and out.splitlines()[2:5] == local_out.splitlines()[2:5]  # the same records read
        body = yaml.safe_load(spec.read_text())
        body["step"]["patches_per_micro_batch"] = 100
        spec.write_text(yaml.safe_dump(body))
        code, _, err = _check(spec, capsys)
        assert code == USAGE and "below the largest clip read of source clips: clips-0000.jsonl:row=" in err, err
