"""`aml dataset`: register a dataset an operator placed under the datasets root, and list
every dataset.

    aml dataset add PATH [PATH ...] --format locomo|longmemeval|personamem|mem-gallery --id ID
                    [--track T] [--scorer S] [--version V] [--f1-variant F]
                    [--exclude-from-overall N ...] [--images DIR] [--replace]
    aml dataset add DIR [PATH ...] --format atm-bench --id ID [--version V] [--replace]
    aml dataset add DIR --format coding --id ID [--version V] [--replace]
    aml dataset list [--json]

`add` takes the dataset's data files: one file, or every file of a bundle that spans several
(PersonaMem: `questions_<size>.csv` and `shared_contexts_<size>.jsonl`; Mem-Gallery: one dialog
file per conversation). Files are named one by one, never as a directory: PersonaMem's release
directory holds every context size side by side. `add` refuses a PATH outside the datasets root
(`--datasets-root`, default AML_DATASETS_ROOT; symlinks and '..' resolved first) or given twice,
parses the files together with the format's parser (files that do not parse are refused with the
parser's error, and nothing is written), and writes the manifest to
`<datasets root>/manifests/<ID>.json` atomically: each file's path and sha256 (in path order,
whatever order they were named in), format, track, scorer, categories and questions per
category. A format with images (mem-gallery) needs `--images DIR`, the directory under the
datasets root that holds the images the files reference (Mem-Gallery's `benchmark/data/image`):
each referenced image is checked (type, size) and pinned in the manifest by path and sha256;
files whose images are not all there are refused, naming how many are missing and the first of
them. An ATM-Bench bundle (`--format atm-bench`) is named by its directory (or its files):
every file under the directory is a data file (its QA files, `emails.json`, the
`batch_results.json` files, raw images under `image/` and videos under `video/`; see
aml_evaluation.atmbench.dataset), each checked against its size limit before it is read; its
defaults are scorer `atm_qs`, track multimodal and categories number, list_recall, open_end.
The same manifest again is a no-op; different content under
a registered id needs `--replace`; a shipped id is refused. Licensed benchmark files are never
shipped with AML: the manifest pins them by sha256 and every load checks it.

A coding bundle (`--format coding`) is named by its directory under the datasets root (its
`tasks.jsonl`, `trajectories.jsonl`, `conditions.json` and the snapshots its tasks name; see
docs/evaluation.md, "Coding track"). Besides the static checks (the files parse, ids, conditions,
no trajectory dated after its task, snapshots present, pinned and safe) every task is run in the
bubblewrap sandbox: with no patch it must be unresolved and with its gold patch resolved
(`aml_devtools.coding_registration`); a task failing either is refused with its reason. Without
bwrap the command refuses with the sandbox's one line. Track, scorer and Search top_k are the
coding track's (`coding`, `swe_resolved`, 100).

`list` shows every dataset, shipped and operator-registered: id, track, format, scorer,
categories with question counts, source, and whether its files are present and verified under the
datasets root. A registered dataset runs once its id is in AML_SMOKE_DATASETS or AML_FULL_SUITE.
Exit codes: 0 done, 2 refused (nothing written) or a manifest is unreadable, 1 the sandbox failed
while checking a coding bundle (nothing written).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, TextIO, get_args

from aml_contract.api.vocabulary import Track
from aml_devtools.coding_registration import register_coding_bundle
from aml_devtools.tables import render_table
from aml_evaluation import media
from aml_evaluation.registration import RegistrationError, register_dataset
from aml_evaluation.registry import (
    FORMATS,
    DatasetFileError,
    RegisteredManifest,
    bundle_hash,
    bundle_root,
    count_questions,
    list_manifests,
    load_manifest_bundle,
    unreadable_manifests,
)
from aml_evaluation.scoring import F1_VARIANTS
from aml_pipeline.sandbox import SandboxFault, SandboxUnavailable

OK, FAILED, REFUSED = 0, 1, 2
# Options of `add` a coding bundle does not take: its track, scorer and categories are the
# coding track's, and it has no images.
_NOT_FOR_CODING: Final = {
    "track": "--track",
    "scorer": "--scorer",
    "f1_variant": "--f1-variant",
    "exclude_from_overall": "--exclude-from-overall",
    "images": "--images",
}


def add_arguments(parser: argparse.ArgumentParser, default_root: Path) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--datasets-root",
        type=Path,
        default=Path(os.environ.get("AML_DATASETS_ROOT", default_root)),
        help="default: AML_DATASETS_ROOT",
    )
    sub = parser.add_subparsers(dest="dataset_command", required=True)
    add = sub.add_parser("add", parents=[common], help="register a file under the datasets root")
    add.add_argument(
        "paths",
        type=Path,
        nargs="+",
        metavar="PATH",
        help="the data file, or every file of the bundle (personamem: the questions .csv and "
        "the shared contexts .jsonl; coding, atm-bench: the bundle's directory), inside the "
        "datasets root",
    )
    add.add_argument("--format", required=True, choices=FORMATS, dest="format_name")
    add.add_argument("--id", required=True, dest="dataset_id", help="e.g. longmemeval_s")
    add.add_argument(
        "--track",
        choices=get_args(Track),
        help="default: the format's (mem-gallery, atm-bench: multimodal)",
    )
    add.add_argument(
        "--images",
        type=Path,
        metavar="DIR",
        help="the image directory of a format with images, inside the datasets root",
    )
    add.add_argument(
        "--scorer", help="default: the format's (personamem: multiple_choice; atm-bench: atm_qs)"
    )
    add.add_argument("--version", help="default: the file name and the start of its sha256")
    add.add_argument(
        "--f1-variant", choices=sorted(F1_VARIANTS), help="token F1 the dataset reports"
    )
    add.add_argument(
        "--exclude-from-overall",
        type=int,
        action="append",
        metavar="CATEGORY",
        help="a category reported apart, not counted in Overall (repeatable; default: the "
        "format's, LoCoMo's adversarial 5)",
    )
    add.add_argument(
        "--replace", action="store_true", help="overwrite a registration with other content"
    )
    listing = sub.add_parser("list", parents=[common], help="every dataset, shipped and operator")
    listing.add_argument("--json", action="store_true", help="one JSON document")


def main_from_args(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = sys.stdout if out is None else out
    if args.dataset_command == "add":
        return _add(args, out)
    return _list(args.datasets_root, args.json, out)


def _add(args: argparse.Namespace, out: TextIO) -> int:
    if args.format_name == "coding":
        return _add_coding(args, out)
    options: dict[str, Any] = {}
    if args.f1_variant is not None:
        options["f1_variant"] = args.f1_variant
    try:
        done = register_dataset(
            args.paths,
            args.format_name,
            args.dataset_id,
            args.datasets_root,
            track=args.track,
            scorer=args.scorer,
            version=args.version,
            excluded_from_overall=args.exclude_from_overall,
            replace=args.replace,
            images=args.images,
            **options,
        )
    except (RegistrationError, OSError) as exc:
        print(f"aml dataset add: {exc}", file=sys.stderr)
        return REFUSED
    manifest = done.manifest
    counts = manifest.question_counts or {}
    images = len(done.images)
    print(
        f"{done.outcome} {manifest.dataset_id} ({manifest.format}, {manifest.track}, "
        f"{sum(counts.values())} questions): {done.path}\n"
        + "".join(f"file {entry.path} sha256 {entry.sha256}\n" for entry in done.data_files)
        + (f"{images} images pinned under {manifest.image_dir}\n" if images else "")
        + _fitted_line(done.fitted)
        + f"bundle {bundle_hash(manifest)}\n"
        f"runs once {manifest.dataset_id} is in AML_SMOKE_DATASETS or AML_FULL_SUITE",
        file=out,
    )
    return OK


def _add_coding(args: argparse.Namespace, out: TextIO) -> int:
    given = [option for name, option in _NOT_FOR_CODING.items() if getattr(args, name) is not None]
    if given or len(args.paths) != 1:
        why = f"{', '.join(given)} do not apply" if given else "name the bundle's directory, once"
        print(f"aml dataset add: a coding bundle: {why}", file=sys.stderr)
        return REFUSED
    try:
        done = register_coding_bundle(
            args.paths[0],
            args.dataset_id,
            args.datasets_root,
            version=args.version,
            replace=args.replace,
        )
    except SandboxUnavailable as exc:
        print(f"aml dataset add: {exc}", file=sys.stderr)
        return REFUSED
    except SandboxFault as exc:
        print(f"aml dataset add: the sandbox failed, nothing written: {exc}", file=sys.stderr)
        return FAILED
    except (RegistrationError, OSError) as exc:
        print(f"aml dataset add: {exc}", file=sys.stderr)
        return REFUSED
    manifest = done.manifest
    counts = manifest.question_counts or {}
    tasks = counts.get(1, 0)
    print(
        f"{done.outcome} {manifest.dataset_id} ({manifest.format}, {manifest.track}, {tasks} "
        f"tasks, {sum(counts.values())} attempts): {done.path}\n"
        + "".join(f"file {entry.path} sha256 {entry.sha256}\n" for entry in done.data_files)
        + f"every task checked in the sandbox: unresolved with no patch, resolved with its gold "
        f"patch\nbundle {bundle_hash(manifest)}\n"
        f"runs once {manifest.dataset_id} is in AML_SMOKE_DATASETS or AML_FULL_SUITE",
        file=out,
    )
    return OK


def _fitted_line(fitted: Sequence[str], shown: int = 5) -> str:
    """Which pinned images are sent fitted, and why ("" when none is)."""
    if not fitted:
        return ""
    more = " …" if len(fitted) > shown else ""
    return (
        f"{len(fitted)} of them sent fitted ({media.FIT_RULE}: their source is over "
        f"{media.MAX_IMAGE_BYTES // media.MIB} MiB for an Add or "
        f"{media.MAX_QUERY_IMAGE_BYTES // media.KIB} KiB for a Search): "
        f"{', '.join(fitted[:shown])}{more}\n"
    )


def describe(item: RegisteredManifest, datasets_root: Path) -> dict[str, Any]:
    """One dataset of `aml dataset list`: its manifest's facts, and whether its files are
    present and verified (counted from them when the manifest holds no counts)."""
    manifest = item.manifest
    counts = manifest.question_counts
    try:
        dataset = load_manifest_bundle(manifest, bundle_root(manifest, datasets_root))
    except DatasetFileError as exc:
        files = str(exc)
    else:
        files = "verified"
        counts = counts if counts is not None else count_questions(dataset)
    return {
        "dataset_id": manifest.dataset_id,
        "version": manifest.version,
        "track": manifest.track,
        "format": manifest.format,
        "scorer": manifest.scorer,
        "f1_variant": manifest.f1_variant,
        "categories": [
            {
                "number": number,
                "name": name,
                "questions": None if counts is None else counts.get(number, 0),
                "in_overall": number not in manifest.excluded_from_overall,
            }
            for number, name in sorted(manifest.categories.items())
        ],
        "questions": None if counts is None else sum(counts.values()),
        "source": item.source,
        "manifest": str(item.path),
        "bundle_hash": bundle_hash(manifest),
        "files": files,
    }


def _list(datasets_root: Path, as_json: bool, out: TextIO) -> int:
    found = [describe(item, datasets_root) for item in list_manifests(datasets_root)]
    problems = unreadable_manifests(datasets_root)
    for path, reason in problems.items():
        print(f"aml dataset list: unreadable manifest {path}: {reason}", file=sys.stderr)
    if as_json:
        print(json.dumps(found, indent=2, ensure_ascii=False), file=out)
        return REFUSED if problems else OK
    rows = [
        [
            d["dataset_id"],
            d["track"],
            d["format"],
            d["scorer"],
            "?" if d["questions"] is None else str(d["questions"]),
            "; ".join(
                f"{c['number']} {c['name']}"
                + ("" if c["questions"] is None else f" ({c['questions']})")
                + ("" if c["in_overall"] else " *")
                for c in d["categories"]
            ),
            d["source"],
            "verified" if d["files"] == "verified" else "NOT VERIFIED",
        ]
        for d in found
    ]
    header = ["dataset", "track", "format", "scorer", "questions", "categories", "source", "files"]
    print(render_table(header, rows), file=out)
    print(f"datasets root {datasets_root}; * reported apart, not counted in Overall", file=out)
    for d in found:
        if d["files"] != "verified":
            print(f"  {d['dataset_id']}: {d['files']}", file=out)
    return REFUSED if problems else OK
