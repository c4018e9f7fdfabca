"""Operator datasets (issue 17): `aml dataset add` verifies a file, or every file of a bundle,
under the datasets root and writes its manifest; `aml dataset list` shows shipped and operator
datasets; loading checks the pinned sha256. Real files in temporary datasets roots."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from aml_devtools.cli import main
from aml_evaluation import registry
from aml_evaluation.registration import (
    DEFAULT_F1_VARIANT_OF_FORMAT,
    RegistrationError,
    register_dataset,
)
from aml_evaluation.registry import (
    MANIFESTS_DIR,
    DatasetFileError,
    DatasetManifest,
    FormatUnavailableError,
    ManifestFile,
    bundle_hash,
    list_manifests,
    load_dataset,
    manifest_path,
    parser_of,
    read_manifest,
    registered,
    unreadable_manifests,
)

# Computed before the manifest gained `track` and `question_counts`: jobs record these hashes,
# so a new field at its default must not change them.
SHIPPED_BUNDLE_HASHES = {
    "locomo": "bf66986e32f70cc1f079c9eefe701d8ddb5d6a729d277b810aa4a662666a5cd3",
    "locomo_refined": "9c11731bca5a19f57e538cd01aadfff5b19f3657b60e6809c536e4412db91bae",
    "synthetic": "bc308955288fff9f5b3c5414fbef4c0ac65ef70c408a372060e5f7e2522c19cd",
}
SYNTHETIC = MANIFESTS_DIR.parent / "synthetic" / "synthetic_v1.json"
SYNTHETIC_COUNTS = {1: 6, 2: 7, 3: 4, 4: 9, 5: 4}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A datasets root holding one LoCoMo-format file (the synthetic dataset's bytes)."""
    datasets = tmp_path / "datasets"
    (datasets / "mine").mkdir(parents=True)
    (datasets / "mine" / "convs.json").write_bytes(SYNTHETIC.read_bytes())
    return datasets


def add(root: Path, *args: str) -> int:
    return main(["dataset", "add", *args, "--datasets-root", str(root)])


def listed(root: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, Any]]:
    capsys.readouterr()
    assert main(["dataset", "list", "--json", "--datasets-root", str(root)]) == 0
    return {d["dataset_id"]: d for d in json.loads(capsys.readouterr().out)}


def test_shipped_bundle_hashes_are_unchanged() -> None:
    for dataset_id, expected in SHIPPED_BUNDLE_HASHES.items():
        item = registered(dataset_id, None)
        assert item.source == "shipped"
        assert (item.manifest.track, item.manifest.question_counts) == ("textual", None)
        assert bundle_hash(item.manifest) == expected


def test_new_fields_enter_the_hash_only_away_from_their_defaults() -> None:
    manifest = read_manifest(manifest_path("synthetic", None))
    assert bundle_hash(manifest.model_copy(update={"track": "textual"})) == bundle_hash(manifest)
    assert bundle_hash(manifest.model_copy(update={"track": "multimodal"})) != bundle_hash(manifest)
    counted = manifest.model_copy(update={"question_counts": SYNTHETIC_COUNTS})
    assert bundle_hash(counted) != bundle_hash(manifest)


def test_an_added_locomo_file_is_registered_listed_and_loadable(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = root / "mine" / "convs.json"
    assert add(root, str(path), "--format", "locomo", "--id", "mine", "--version", "v7") == 0
    out = capsys.readouterr().out
    assert out.startswith("added mine (locomo, textual, 30 questions)")
    written = root / "manifests" / "mine.json"
    raw = json.loads(written.read_text())
    assert raw["files"] == [
        {"path": "mine/convs.json", "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    ]
    manifest = read_manifest(written)
    assert (manifest.format, manifest.track, manifest.version) == ("locomo", "textual", "v7")
    assert (manifest.scorer, manifest.location) == ("llm_judge+token_f1", "datasets_root")
    assert manifest.categories == read_manifest(manifest_path("synthetic", None)).categories
    assert manifest.question_counts == SYNTHETIC_COUNTS
    assert manifest.excluded_from_overall == [5]
    assert [p.name for p in written.parent.iterdir()] == ["mine.json"]  # no temp file left

    dataset = load_dataset("mine", root)
    assert (dataset.dataset_id, dataset.version, len(dataset.questions)) == ("mine", "v7", 30)
    assert manifest_path("mine", root) == written
    assert manifest_path("synthetic", root).parent == MANIFESTS_DIR

    found = listed(root, capsys)
    assert list(found) == [
        "locomo",
        "locomo_refined",
        "synthetic-coding",
        "synthetic",
        "synthetic_atm",
        "synthetic_multimodal",
        "mine",
    ]
    mine = found["mine"]
    assert (mine["source"], mine["files"], mine["track"], mine["format"]) == (
        "operator",
        "verified",
        "textual",
        "locomo",
    )
    assert {c["number"]: c["questions"] for c in mine["categories"]} == SYNTHETIC_COUNTS
    assert mine["questions"] == 30 and mine["bundle_hash"] == bundle_hash(manifest)
    # Shipped: counted from the package file; licensed files absent from this root.
    assert found["synthetic"]["files"] == "verified" and found["synthetic"]["questions"] == 30
    assert "cannot be read" in found["locomo"]["files"] and found["locomo"]["questions"] is None
    multimodal = found["synthetic_multimodal"]
    assert (multimodal["files"], multimodal["track"], multimodal["format"]) == (
        "verified",
        "multimodal",
        "mem-gallery",
    )
    assert multimodal["questions"] == 11 and multimodal["scorer"] == "token_f1"
    atm = found["synthetic_atm"]
    assert (atm["files"], atm["track"], atm["format"], atm["scorer"], atm["questions"]) == (
        "verified",
        "multimodal",
        "atm-bench",
        "atm_qs",
        9,
    )

    assert main(["dataset", "list", "--datasets-root", str(root)]) == 0
    table = capsys.readouterr().out
    mine_row = next(line for line in table.splitlines() if line.startswith("mine "))
    assert "operator" in mine_row and "verified" in mine_row and "5 adversarial (4) *" in mine_row


def test_adding_the_same_content_again_is_a_no_op(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(root / "mine" / "convs.json")
    assert add(root, path, "--format", "locomo", "--id", "mine") == 0
    written = root / "manifests" / "mine.json"
    before = (written.read_bytes(), written.stat().st_mtime_ns)
    assert add(root, path, "--format", "locomo", "--id", "mine") == 0
    assert capsys.readouterr().out.splitlines()[-4].startswith("unchanged mine")
    assert (written.read_bytes(), written.stat().st_mtime_ns) == before


def test_other_content_under_a_registered_id_needs_replace(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = root / "mine" / "convs.json"
    assert add(root, str(path), "--format", "locomo", "--id", "mine") == 0
    first = (root / "manifests" / "mine.json").read_bytes()
    samples = json.loads(path.read_bytes())
    other = root / "mine" / "fewer.json"
    other.write_text(json.dumps(samples[:1]))
    capsys.readouterr()
    assert add(root, str(other), "--format", "locomo", "--id", "mine") == 2
    err = capsys.readouterr().err
    assert "already registered" in err and "--replace" in err
    assert (root / "manifests" / "mine.json").read_bytes() == first
    assert add(root, str(other), "--format", "locomo", "--id", "mine", "--replace") == 0
    assert capsys.readouterr().out.startswith("replaced mine")
    assert read_manifest(root / "manifests" / "mine.json").files[0].path == "mine/fewer.json"


def _refused(root: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert add(root, *args) == 2
    assert not (root / "manifests").exists(), "nothing is written when a file is refused"
    return capsys.readouterr().err


def test_a_path_outside_the_root_is_refused(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "outside.json"
    outside.write_bytes(SYNTHETIC.read_bytes())
    err = _refused(root, capsys, str(outside), "--format", "locomo", "--id", "x")
    assert "is not inside the datasets root" in err
    # Through '..' and through a symlink inside the root: the resolved path counts.
    dotted = root / "mine" / ".." / ".." / "outside.json"
    err = _refused(root, capsys, str(dotted), "--format", "locomo", "--id", "x")
    assert "is not inside the datasets root" in err
    (root / "link.json").symlink_to(outside)
    err = _refused(root, capsys, str(root / "link.json"), "--format", "locomo", "--id", "x")
    assert "is not inside the datasets root" in err
    err = _refused(root, capsys, str(root / "absent.json"), "--format", "locomo", "--id", "x")
    assert "not a regular file" in err


def test_an_unknown_format_a_shipped_id_and_an_unsafe_id_are_refused(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(root / "mine" / "convs.json")
    with pytest.raises(SystemExit) as exited:
        add(root, path, "--format", "csv", "--id", "x")
    assert exited.value.code == 2
    with pytest.raises(RegistrationError, match="unknown format 'csv'; known: locomo"):
        register_dataset(Path(path), "csv", "x", root)
    err = _refused(root, capsys, path, "--format", "locomo", "--id", "synthetic")
    assert "'synthetic' is a shipped dataset" in err
    err = _refused(root, capsys, path, "--format", "locomo", "--id", "../x")
    assert "invalid dataset id '../x'" in err


def test_a_broken_file_is_refused_with_the_parsers_error(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = root / "mine" / "broken.json"
    broken.write_text("[{")
    err = _refused(root, capsys, str(broken), "--format", "locomo", "--id", "x")
    assert "not JSON" in err
    samples = json.loads(SYNTHETIC.read_bytes())
    samples[0]["qa"][0]["category"] = 9
    broken.write_text(json.dumps(samples))
    err = _refused(root, capsys, str(broken), "--format", "locomo", "--id", "x")
    assert "qa[0]: unknown category 9" in err
    del samples[0]["conversation"]
    broken.write_text(json.dumps(samples))
    err = _refused(root, capsys, str(broken), "--format", "locomo", "--id", "x")
    assert "not a LoCoMo sample: KeyError: 'conversation'" in err
    broken.write_text("[]")
    err = _refused(root, capsys, str(broken), "--format", "locomo", "--id", "x")
    assert "holds no questions" in err


def test_a_file_altered_after_add_fails_to_load(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = root / "mine" / "convs.json"
    assert add(root, str(path), "--format", "locomo", "--id", "mine") == 0
    with path.open("ab") as handle:
        handle.write(b"\n")
    with pytest.raises(DatasetFileError, match=r"'mine/convs.json'.*manifest expects"):
        load_dataset("mine", root)
    assert listed(root, capsys)["mine"]["files"].startswith("dataset file 'mine/convs.json'")


def test_a_missing_parser_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parser_of("locomo").__name__ == "parse_locomo_bundle"
    monkeypatch.setitem(registry._PARSERS, "personamem", ("aml_evaluation.nosuch", "parse"))
    with pytest.raises(FormatUnavailableError, match="format 'personamem' is not available"):
        parser_of("personamem")
    with pytest.raises(FormatUnavailableError, match="format 'csv' is not available"):
        parser_of("csv")


def test_the_registry_lists_shipped_then_operator_and_names_unreadable_ones(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert add(root, str(root / "mine" / "convs.json"), "--format", "locomo", "--id", "b") == 0
    assert add(root, str(root / "mine" / "convs.json"), "--format", "locomo", "--id", "a") == 0
    manifests = root / "manifests"
    # A hand-written manifest with a shipped id is shadowed by the shipped one.
    (manifests / "synthetic.json").write_bytes((manifests / "a.json").read_bytes())
    (manifests / "bad.json").write_text("{}")
    found = [(item.dataset_id, item.source) for item in list_manifests(root)]
    assert found == [
        ("locomo", "shipped"),
        ("locomo_refined", "shipped"),
        ("synthetic-coding", "shipped"),
        ("synthetic", "shipped"),
        ("synthetic_atm", "shipped"),
        ("synthetic_multimodal", "shipped"),
        ("a", "operator"),
        ("b", "operator"),
    ]
    assert list(unreadable_manifests(root)) == [
        manifests / "bad.json",
        manifests / "synthetic.json",
    ]
    capsys.readouterr()
    assert main(["dataset", "list", "--datasets-root", str(root)]) == 2
    assert "unreadable manifest" in capsys.readouterr().err
    with pytest.raises(KeyError, match="unknown dataset 'nope'; known: a, b, bad, locomo"):
        manifest_path("nope", root)


def test_a_bundle_path_may_not_leave_its_root() -> None:
    for path in ("../x.json", "/etc/passwd", "a/../../x.json", ""):
        with pytest.raises(ValueError, match="relative, without"):
            ManifestFile(path=path, sha256="0" * 64)
    assert ManifestFile(path="a/b.json", sha256="0" * 64).path == "a/b.json"


def test_the_manifest_written_reads_back_and_the_model_knows_the_formats(root: Path) -> None:
    done = register_dataset(
        root / "mine" / "convs.json", "locomo", "mine", root, track="multimodal", scorer="s"
    )
    assert done.outcome == "added" and read_manifest(done.path) == done.manifest
    assert (done.manifest.track, done.manifest.scorer) == ("multimodal", "s")
    assert done.manifest.version.startswith("convs.json@sha256:")
    assert os.access(done.path, os.R_OK)
    for fmt in ("locomo", "longmemeval", "personamem"):
        raw = done.manifest.model_dump() | {"format": fmt}
        assert DatasetManifest.model_validate(raw).format == fmt


# --- bundles of several files -----------------------------------------------------------------

PERSONAMEM_CONTEXTS = {
    "ctx-a": [
        {"role": "system", "content": "persona card"},
        {"role": "user", "content": "I drink green tea every morning."},
        {"role": "assistant", "content": "A fine habit."},
    ],
    "ctx-b": [{"role": "user", "content": "I bake sourdough."}],
}
PERSONAMEM_ROWS = [
    ["p1", "q1", "recall_user_shared_facts", "What do I drink?", "(b)",
     json.dumps(["(a) Coffee", "(b) Green tea"]), "ctx-a", "3"],
    ["p2", "q2", "suggest_new_ideas", "What could I bake?", "(a)",
     json.dumps(["(a) Rye sourdough", "(b) Nothing"]), "ctx-b", "1"],
]  # fmt: skip
PERSONAMEM_HEADER = (
    "persona_id,question_id,question_type,user_question_or_message,correct_answer,"
    "all_options,shared_context_id,end_index_in_shared_context"
)


def _personamem(root: Path) -> tuple[Path, Path]:
    """(questions .csv, shared contexts .jsonl) of a small PersonaMem bundle under the root."""
    folder = root / "personamem"
    folder.mkdir()
    questions, contexts = folder / "questions_t.csv", folder / "shared_contexts_t.jsonl"
    rows = io.StringIO()
    csv.writer(rows).writerows(PERSONAMEM_ROWS)
    questions.write_text(f"{PERSONAMEM_HEADER}\n{rows.getvalue()}")
    contexts.write_text("".join(f"{json.dumps({k: v})}\n" for k, v in PERSONAMEM_CONTEXTS.items()))
    return questions, contexts


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_personamem_bundle_is_registered_from_its_two_files(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    questions, contexts = _personamem(root)
    # Named contexts first: the manifest lists the files in path order all the same.
    assert add(root, str(contexts), str(questions), "--format", "personamem", "--id", "pm") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("added pm (personamem, textual, 2 questions)")
    assert out[1:3] == [
        f"file personamem/questions_t.csv sha256 {_sha256(questions)}",
        f"file personamem/shared_contexts_t.jsonl sha256 {_sha256(contexts)}",
    ]
    written = root / "manifests" / "pm.json"
    assert json.loads(written.read_text())["files"] == [
        {"path": "personamem/questions_t.csv", "sha256": _sha256(questions)},
        {"path": "personamem/shared_contexts_t.jsonl", "sha256": _sha256(contexts)},
    ]
    manifest = read_manifest(written)
    assert (manifest.scorer, manifest.question_counts) == (
        "multiple_choice",
        {number: int(number in (1, 2)) for number in range(1, 8)},
    )
    combined = hashlib.sha256((_sha256(questions) + _sha256(contexts)).encode()).hexdigest()
    assert manifest.version == f"questions_t.csv+shared_contexts_t.jsonl@sha256:{combined[:12]}"
    dataset = load_dataset("pm", root)
    assert [q.options for q in dataset.questions] == [
        ["Coffee", "Green tea"],
        ["Rye sourdough", "Nothing"],
    ]
    assert listed(root, capsys)["pm"]["files"] == "verified"
    # The same files in the other order are the same registration.
    before = written.read_bytes()
    assert add(root, str(questions), str(contexts), "--format", "personamem", "--id", "pm") == 0
    assert capsys.readouterr().out.startswith("unchanged pm")
    assert written.read_bytes() == before
    # Either file changed after registration fails the load, naming the file.
    with contexts.open("a") as handle:
        handle.write("\n")
    with pytest.raises(DatasetFileError, match=r"'personamem/shared_contexts_t\.jsonl'"):
        load_dataset("pm", root)


def test_a_personamem_bundle_missing_a_file_or_broken_is_refused(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    questions, contexts = _personamem(root)
    err = _refused(root, capsys, str(questions), "--format", "personamem", "--id", "pm")
    assert f"{questions} is refused" in err
    assert "one questions .csv and one shared contexts .jsonl" in err
    err = _refused(
        root, capsys, str(questions), str(questions), "--format", "personamem", "--id", "pm"
    )
    assert "is given twice" in err
    contexts.write_text('{"ctx-a": [}\n')
    err = _refused(
        root, capsys, str(questions), str(contexts), "--format", "personamem", "--id", "pm"
    )
    assert f"{questions}, {contexts} are refused" in err and "line 1: not JSON" in err
    # A context a question names is absent: the files are checked against each other.
    contexts.write_text(json.dumps({"ctx-a": PERSONAMEM_CONTEXTS["ctx-a"]}) + "\n")
    err = _refused(
        root, capsys, str(questions), str(contexts), "--format", "personamem", "--id", "pm"
    )
    assert "row 2 (question_id q2): shared context 'ctx-b' is not in the contexts file" in err
    with pytest.raises(RegistrationError, match="no data file given"):
        register_dataset([], "personamem", "pm", root)
    assert not (root / "manifests").exists()


def test_a_file_of_several_outside_the_root_refuses_them_all(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    questions, contexts = _personamem(root)
    outside = tmp_path / "shared_contexts_t.jsonl"
    outside.write_bytes(contexts.read_bytes())
    err = _refused(
        root, capsys, str(questions), str(outside), "--format", "personamem", "--id", "pm"
    )
    assert f"{outside} is not inside the datasets root" in err


def test_a_mem_gallery_bundle_gets_its_own_f1_and_pins_the_images_of_every_dialog(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shipped = MANIFESTS_DIR.parent / "synthetic_multimodal"
    shutil.copytree(shipped / "dialog", root / "mg" / "dialog")
    shutil.copytree(shipped / "image", root / "mg" / "image")
    dialogs = sorted((root / "mg" / "dialog").glob("*.json"))
    assert len(dialogs) == 2
    done = register_dataset(dialogs, "mem-gallery", "mg", root, images=root / "mg" / "image")
    manifest = done.manifest
    assert (manifest.track, manifest.scorer) == ("multimodal", "token_f1")
    assert manifest.f1_variant == DEFAULT_F1_VARIANT_OF_FORMAT["mem-gallery"] == "f1-memgallery-v1"
    assert [entry.path for entry in done.data_files] == [
        f"mg/dialog/{path.name}" for path in dialogs
    ]
    images = sorted(path for path in (root / "mg" / "image").rglob("*.png"))
    assert sorted(entry.path for entry in done.images) == [
        path.relative_to(root).as_posix() for path in images
    ]
    assert manifest.files == [*done.data_files, *done.images]
    assert sum((manifest.question_counts or {}).values()) == 11
    assert load_dataset("mg", root).f1_variant == "f1-memgallery-v1"
    capsys.readouterr()
    options = ["--images", str(root / "mg" / "image"), "--f1-variant", "f1-locomo-v1"]
    assert add(root, *map(str, dialogs), "--format", "mem-gallery", "--id", "mg2", *options) == 0
    out = capsys.readouterr().out
    assert f"{len(images)} images pinned under mg/image" in out
    assert out.count("\nfile mg/dialog/") == 2
    assert read_manifest(root / "manifests" / "mg2.json").f1_variant == "f1-locomo-v1"
