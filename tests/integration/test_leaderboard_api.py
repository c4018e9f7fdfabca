"""Publication review and the public leaderboard (R-2.4, R-3.8, R-3.9, R-5.3, R-7.4): the real
gateway app on a real nx-27017 and nats-server.

No pipeline or publisher runs here: a finished, gated job is written as the scheduler and the
publisher leave it (`results`, `review_state`, `gate`); everything after that goes through the
gateway's own routes: admin review, disqualification, the public API and the web pages."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from gateway_support import ADMIN, ADMIN_TOKEN, Clock, Gateway, request_body
from leaderboard_support import ANSWER_MODEL, RELEASE, finished_job, version_body

from aml_evaluation.aggregate import results_fingerprint
from aml_gateway.publication import repair_entries
from aml_runtime.stores import Stores

pytestmark = pytest.mark.integration

# 30, 34 and 24 of 40: Overall 75%, 85% and 60%.
GOOD = {"single-hop": 9, "multi-hop": 7, "temporal": 8, "open-domain": 6}
BETTER = {"single-hop": 10, "multi-hop": 8, "temporal": 9, "open-domain": 7}
WORSE = {"single-hop": 7, "multi-hop": 5, "temporal": 6, "open-domain": 6}
# 39 of 40 (97.5%): a score that only the jobs never approved have.
SECRET_SCORES = {"single-hop": 10, "multi-hop": 10, "temporal": 10, "open-domain": 9}
SECRET_MARKS = ("0.975", "97.5", "0.98125")


@dataclass
class Version:
    version_id: str
    team_id: str
    key: str | None

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


async def register(gw: Gateway, team: str, system: str, label: str, **changes: Any) -> Version:
    response = await gw.client.post(
        "/v1/admin/versions", json=version_body(team, system, label, **changes), headers=ADMIN
    )
    assert response.status_code == 201, response.text
    body = response.json()
    return Version(body["version_id"], body["team_id"], body["leaderboard_api_key"])


async def gated_job(
    db: Any, version: Version, correct: dict[str, int], at: datetime, **fields: Any
) -> str:
    job = finished_job(version.team_id, version.version_id, correct, at, **fields)
    await db.jobs.insert_one(job)
    job_id: str = job["_id"]
    return job_id


async def approve(gw: Gateway, job_id: str) -> httpx.Response:
    return await gw.client.post(f"/v1/admin/reviews/{job_id}/approve", headers=ADMIN)


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def refused(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    reason: str = response.json()["detail"]["reason"]
    assert reason
    return reason


async def test_review_publishes_approved_jobs_only(gateway: Gateway, db: Any, clock: Clock) -> None:
    gw = gateway
    alpha1 = await register(gw, "team-alpha", "alpha-mem", "1.0")
    alpha2 = await register(gw, "team-alpha", "alpha-mem", "2.0")
    beta = await register(gw, "team-beta", "beta-mem", "1.0", board="academic")
    gamma = await register(gw, "team-gamma", "gamma-mem", "1.0")
    assert alpha2.key is None and alpha1.team_id == alpha2.team_id

    jobs = []
    for version, scores, fields in (
        (alpha1, GOOD, {}),
        (alpha2, BETTER, {}),
        (beta, WORSE, {}),
        (gamma, WORSE, {}),
        (gamma, SECRET_SCORES, {"review_state": "gate_failed"}),
        (gamma, SECRET_SCORES, {"review_state": None}),
    ):
        clock.advance(timedelta(minutes=1))
        jobs.append(await gated_job(db, version, scores, clock(), **fields))
    first, second, academic, gamma_job, failed_gate, not_gated = jobs

    # The team sees its job's gate checks and review state, no other team's job.
    status = ok(await gw.client.get(f"/v1/jobs/{first}", headers=alpha1.auth))
    assert status["review_state"] == "pending_review"
    # What ran and what it was held to, as the job page shows it.
    assert (status["system_name"], status["version_label"], status["board"]) == (
        "alpha-mem",
        "1.0",
        "industrial",
    )
    assert status["answer_model"] == ANSWER_MODEL
    assert {k: status[k] for k in RELEASE} == RELEASE
    assert status["duration_seconds"] == 0.0  # seeded as started and finished at once
    assert status["gate"]["passed"] is True and len(status["gate"]["checks"]) == 8
    assert status["gate"]["checks"][0] == {
        "name": "mode_full",
        "passed": True,
        "reason": "mode_full: equal to the release baseline",
    }
    gated = ok(await gw.client.get(f"/v1/jobs/{failed_gate}", headers=gamma.auth))
    assert gated["review_state"] == "gate_failed" and gated["gate"]["passed"] is False
    assert ok(await gw.client.get(f"/v1/jobs/{not_gated}", headers=gamma.auth))["gate"] is None
    refused(await gw.client.get(f"/v1/jobs/{first}", headers=gamma.auth), 404)

    # Admin only: the team key is refused, like no key.
    for method, path in (
        ("GET", "/v1/admin/reviews"),
        ("POST", f"/v1/admin/reviews/{first}/approve"),
        ("GET", "/v1/admin/leaderboard"),
    ):
        refused(await gw.client.request(method, path, headers=alpha1.auth), 403)
        refused(await gw.client.request(method, path), 403)

    waiting = ok(await gw.client.get("/v1/admin/reviews", headers=ADMIN))
    assert [r["job_id"] for r in waiting] == [first, second, academic, gamma_job]
    one = waiting[0]
    assert (one["system_name"], one["version_label"], one["team_name"]) == (
        "alpha-mem",
        "1.0",
        "team-alpha",
    )
    assert one["board"] == "industrial" and one["overall"]["accuracy"] == 0.75
    assert one["gate"]["passed"] and one["answer_model"] == ANSWER_MODEL
    assert one["spec_hash"] == RELEASE["spec_hash"]
    listed = ok(await gw.client.get("/v1/admin/reviews?state=gate_failed", headers=ADMIN))
    assert [r["job_id"] for r in listed] == [failed_gate]

    # Only a job pending review can be approved.
    assert "gate_failed" in refused(await approve(gw, failed_gate), 409)
    assert "not gated" in refused(await approve(gw, not_gated), 409)
    refused(await approve(gw, "j-unknown"), 404)

    clock.advance(timedelta(days=1))
    entry = ok(await approve(gw, first))
    job = await db.jobs.find_one({"_id": first})
    assert entry["entry_id"].startswith("lb-") and job["entry_id"] == entry["entry_id"]
    assert job["review_state"] == "approved"
    assert {k: entry[k] for k in ("system_name", "version_label", "team_name", "board")} == {
        "system_name": "alpha-mem",
        "version_label": "1.0",
        "team_name": "team-alpha",
        "board": "industrial",
    }
    assert entry["track"] == "textual" and entry["answer_model"] == ANSWER_MODEL
    assert {k: entry[k] for k in RELEASE} == RELEASE
    assert entry["overall"] == job["results"]["overall"]
    assert entry["datasets"] == job["results"]["datasets"]
    assert datetime.fromisoformat(entry["published_at"]) == clock()
    assert (entry["job_id"], entry["version_id"], entry["team_id"]) == (
        first,
        alpha1.version_id,
        alpha1.team_id,
    )
    assert entry["results_fingerprint"] == results_fingerprint(job["results"]["datasets"])
    assert entry["disqualified"] is False
    stored = await db.leaderboard.find_one({"_id": entry["entry_id"]})
    assert stored["job_id"] == first and stored["disqualified"] in (False, 0)
    assert "approved" in refused(await approve(gw, first), 409)
    status = ok(await gw.client.get(f"/v1/jobs/{first}", headers=alpha1.auth))
    assert status["review_state"] == "approved"

    clock.advance(timedelta(days=30))
    second_entry = ok(await approve(gw, second))
    ok(await approve(gw, academic))

    # Rejection: reason kept and shown to the team; a rejected job is never approved.
    rejection = {"reason": "The run label names another system; please rerun."}
    rejected = ok(
        await gw.client.post(f"/v1/admin/reviews/{gamma_job}/reject", json=rejection, headers=ADMIN)
    )
    assert rejected["review_state"] == "rejected" and rejected["reason"] == rejection["reason"]
    assert rejected["reviewed_at"] is not None
    status = ok(await gw.client.get(f"/v1/jobs/{gamma_job}", headers=gamma.auth))
    assert status["review_state"] == "rejected"
    assert status["review_reason"] == rejection["reason"]
    path = f"/v1/admin/reviews/{gamma_job}/reject"
    refused(await gw.client.post(path, json=rejection, headers=ADMIN), 409)
    assert "rejected" in refused(await approve(gw, gamma_job), 409)
    refused(await gw.client.post(path, json={}, headers=ADMIN), 422)
    refused(
        await gw.client.post(f"/v1/admin/reviews/{first}/reject", json=rejection, headers=ADMIN),
        409,
    )
    assert ok(await gw.client.get("/v1/admin/reviews", headers=ADMIN)) == []

    # The public board: no login, sorted by Overall, per-dataset and per-category metrics.
    board = ok(await gw.client.get("/v1/leaderboard?track=textual&board=industrial"))
    assert board["track"] == "textual" and board["board"] == "industrial"
    assert [(e["system_name"], e["version_label"]) for e in board["entries"]] == [
        ("alpha-mem", "2.0"),
        ("alpha-mem", "1.0"),
    ]
    top = board["entries"][0]
    assert top["overall"]["accuracy"] == 0.85
    assert top["datasets"]["locomo_refined"]["categories"]["single-hop"]["accuracy"] == 1.0
    assert set(top) == {
        "entry_id",
        "system_name",
        "version_label",
        "team_name",
        "board",
        "track",
        "overall",
        "datasets",
        "spec_hash",
        "code_hash",
        "dataset_bundle_hash",
        "answer_model",
        "published_at",
        "declared_models",
        "repository_url",
        "efficiency",
        "tied_with_above",
    }
    # Results computed before efficiency figures existed: the entry has none.
    assert top["efficiency"] is None
    # The first entry of a board has none above it.
    assert top["tied_with_above"] is None
    every_board = ok(await gw.client.get("/v1/leaderboard"))
    assert [e["overall"]["accuracy"] for e in every_board["entries"]] == [0.85, 0.75, 0.6]
    assert every_board["board"] is None
    academic_board = ok(await gw.client.get("/v1/leaderboard?board=academic"))
    assert [e["system_name"] for e in academic_board["entries"]] == ["beta-mem"]
    assert ok(await gw.client.get("/v1/leaderboard?track=coding"))["entries"] == []
    refused(await gw.client.get("/v1/leaderboard?track=video"), 422)

    # A system's versions over time, oldest publication first.
    history = ok(await gw.client.get("/v1/leaderboard/systems/alpha-mem"))
    assert [e["version_label"] for e in history["entries"]] == ["1.0", "2.0"]
    assert history["entries"][0]["published_at"] < history["entries"][1]["published_at"]
    refused(await gw.client.get("/v1/leaderboard/systems/gamma-mem"), 404)
    refused(await gw.client.get("/v1/leaderboard/systems/nobody"), 404)

    # Disqualification: gone from every public answer, the record kept with reason and time.
    reason = {"reason": "Results copied from another submission."}
    clock.advance(timedelta(hours=2))
    path = f"/v1/admin/leaderboard/{second_entry['entry_id']}/disqualify"
    refused(await gw.client.post(path, json=reason, headers=alpha1.auth), 403)
    record = ok(await gw.client.post(path, json=reason, headers=ADMIN))
    assert record["disqualified"] is True and record["disqualified_reason"] == reason["reason"]
    assert datetime.fromisoformat(record["disqualified_at"]) == clock()
    assert "already" in refused(await gw.client.post(path, json=reason, headers=ADMIN), 409)
    refused(
        await gw.client.post(
            "/v1/admin/leaderboard/lb-unknown/disqualify", json=reason, headers=ADMIN
        ),
        404,
    )
    board = ok(await gw.client.get("/v1/leaderboard?track=textual&board=industrial"))
    assert [e["version_label"] for e in board["entries"]] == ["1.0"]
    history = ok(await gw.client.get("/v1/leaderboard/systems/alpha-mem"))
    assert [e["version_label"] for e in history["entries"]] == ["1.0"]
    records = ok(await gw.client.get("/v1/admin/leaderboard", headers=ADMIN))
    assert len(records) == 3
    assert {r["entry_id"] for r in records if r["disqualified"]} == {second_entry["entry_id"]}
    kept = next(r for r in records if r["disqualified"])
    assert kept["job_id"] == second and kept["overall"]["accuracy"] == 0.85
    # The team's job says so, with the reason.
    job = ok(await gw.client.get(f"/v1/jobs/{second}", headers=alpha1.auth))
    assert (job["review_state"], job["review_reason"]) == ("disqualified", reason["reason"])
    # The pages follow the same rule.
    page = (await gw.client.get("/leaderboard?track=textual&board=industrial")).text
    assert "alpha-mem" in page and "75.0%" in page and "85.0%" not in page
    # So do the tabs' counts: the disqualified entry is not counted.
    text = " ".join(re.sub(r"<[^>]+>", "", page).split())
    assert "Textual (2 entries)" in text and "Coding (0 entries)" in text
    assert "Academic (1 entry)" in text and "Industrial (1 entry)" in text
    # With no board named, the page opens on the first one that has entries.
    for path, title in (
        ("/leaderboard", "Textual track, Academic board"),
        ("/leaderboard?board=industrial", "Textual track, Industrial board"),
        ("/leaderboard?track=coding", "Coding track, Academic board"),
    ):
        opened = (await gw.client.get(path)).text
        assert f"<title>{title} ·" in opened, path


async def test_concurrent_approvals_create_one_entry(
    gateway: Gateway, db: Any, clock: Clock
) -> None:
    version = await register(gateway, "team-race", "race-mem", "1.0")
    job_id = await gated_job(db, version, GOOD, clock())
    answers = await asyncio.gather(*(approve(gateway, job_id) for _ in range(6)))
    statuses = sorted(response.status_code for response in answers)
    assert statuses == [200, 409, 409, 409, 409, 409], [r.text for r in answers]
    assert await db.leaderboard.count_documents({"job_id": job_id}) == 1
    winner = next(r.json() for r in answers if r.status_code == 200)
    job = await db.jobs.find_one({"_id": job_id})
    assert job["entry_id"] == winner["entry_id"]
    # A concurrent approval and rejection: exactly one decision stands.
    other = await gated_job(db, version, WORSE, clock())
    decided = await asyncio.gather(
        approve(gateway, other),
        gateway.client.post(
            f"/v1/admin/reviews/{other}/reject", json={"reason": "race"}, headers=ADMIN
        ),
    )
    assert sorted(r.status_code for r in decided) == [200, 409]
    state = (await db.jobs.find_one({"_id": other}))["review_state"]
    entries = await db.leaderboard.count_documents({"job_id": other})
    assert (state, entries) in {("approved", 1), ("rejected", 0)}


async def test_approval_needs_a_passed_gate(gateway: Gateway, db: Any, clock: Clock) -> None:
    version = await register(gateway, "team-odd", "odd-mem", "1.0")
    job = finished_job(version.team_id, version.version_id, SECRET_SCORES, clock())
    job["gate"]["passed"] = False  # inconsistent: pending review, yet the gate failed
    await db.jobs.insert_one(job)
    assert "gate" in refused(await approve(gateway, job["_id"]), 409)
    assert (await db.jobs.find_one({"_id": job["_id"]}))["review_state"] == "pending_review"
    assert await db.leaderboard.count_documents({"job_id": job["_id"]}) == 0


async def test_interrupted_approval_is_repaired(gateway: Gateway, db: Any, clock: Clock) -> None:
    """The process died between the job's approval and the entry's insert: the next start
    creates the entry (the gateway runs `repair_entries` in its lifespan)."""
    version = await register(gateway, "team-crash", "crash-mem", "1.0")
    job = finished_job(version.team_id, version.version_id, GOOD, clock(), review_state="approved")
    job |= {"entry_id": "lb-interrupted", "reviewed_at": clock()}
    await db.jobs.insert_one(job)
    refused(await gateway.client.get("/v1/leaderboard/systems/crash-mem"), 404)
    assert await repair_entries(Stores.over(db), clock) == 1
    assert await repair_entries(Stores.over(db), clock) == 0
    history = ok(await gateway.client.get("/v1/leaderboard/systems/crash-mem"))
    assert [e["entry_id"] for e in history["entries"]] == ["lb-interrupted"]


async def public_bodies(gw: Gateway, system_names: list[str]) -> dict[str, str]:
    """Every public answer: the board API and pages for each track and board, and each
    system's API and page."""
    paths = ["/", "/leaderboard", "/v1/leaderboard"]
    for track in ("textual", "multimodal", "coding"):
        paths.append(f"/v1/leaderboard?track={track}")
        for board in ("academic", "industrial"):
            paths.append(f"/v1/leaderboard?track={track}&board={board}")
            paths.append(f"/leaderboard?track={track}&board={board}")
    for name in system_names:
        paths += [f"/v1/leaderboard/systems/{name}", f"/systems/{name}"]
    bodies = {}
    for path in paths:
        response = await gw.client.get(path)
        assert response.status_code in (200, 404), (path, response.status_code)
        assert response.status_code < 500
        bodies[path] = response.text
    return bodies


async def test_unapproved_jobs_never_appear_publicly(
    gateway: Gateway, db: Any, clock: Clock, participant: str
) -> None:
    gw = gateway
    # A team made through the access-request workflow: its contact e-mail is stored.
    created = ok(
        await gw.client.post(
            "/v1/access-requests",
            json=request_body(
                participant,
                system_name="open-mem",
                contact={
                    "name": "Grace",
                    "email": "grace.private@example.org",
                    "organisation": "Open Lab",
                },
            ),
        ),
        201,
    )
    grant = ok(
        await gw.client.post(f"/v1/admin/access-requests/{created['id']}/approve", headers=ADMIN)
    )
    public = Version(grant["version_id"], grant["team_id"], grant["leaderboard_api_key"])
    shown = await gated_job(db, public, GOOD, clock())
    shown_entry = ok(await approve(gw, shown))
    assert shown_entry["team_name"] == "Open Lab"
    assert shown_entry["declared_models"]["embedding_model"] == "text-embedding-v4"

    hidden = await register(gw, "team-hidden", "hidden-mem", "9.9")
    pending = await gated_job(db, hidden, SECRET_SCORES, clock())
    failed_gate = await gated_job(db, hidden, SECRET_SCORES, clock(), review_state="gate_failed")
    rejected = await gated_job(db, hidden, SECRET_SCORES, clock())
    smoke = await gated_job(db, hidden, SECRET_SCORES, clock(), review_state=None, mode="smoke")
    running = await gated_job(
        db, hidden, SECRET_SCORES, clock(), review_state=None, state="running"
    )
    ok(
        await gw.client.post(
            f"/v1/admin/reviews/{rejected}/reject", json={"reason": "no"}, headers=ADMIN
        )
    )
    # The same team's second version, published then disqualified.
    hidden2 = await register(gw, "team-hidden", "hidden-mem", "9.8")
    disqualified = await gated_job(db, hidden2, SECRET_SCORES, clock())
    entry = ok(await approve(gw, disqualified))
    ok(
        await gw.client.post(
            f"/v1/admin/leaderboard/{entry['entry_id']}/disqualify",
            json={"reason": "copied"},
            headers=ADMIN,
        )
    )

    bodies = await public_bodies(gw, ["hidden-mem", "open-mem", "alpha-mem"])
    assert "open-mem" in bodies["/v1/leaderboard?track=textual&board=academic"]
    assert "open-mem" in bodies["/leaderboard?track=textual&board=academic"]
    assert "Open Lab" in bodies["/systems/open-mem"]
    private_marks = [
        pending,
        failed_gate,
        rejected,
        smoke,
        running,
        disqualified,
        shown,  # even an approved job's id stays internal
        entry["entry_id"],
        "hidden-mem",
        "team-hidden",
        *SECRET_MARKS,
    ]
    secrets = [
        ADMIN_TOKEN,
        public.key,
        hidden.key,
        "grace.private@example.org",
        "msk-",
        "msk-test-key",
        "key_hash",
        "secret_ref",
        "results_fingerprint",
        public.team_id,
        public.version_id,
    ]
    for path, body in bodies.items():
        for mark in [*private_marks, *secrets]:
            assert mark and mark not in body, f"{mark!r} in the public answer to {path}"
        assert not re.search(r"aml_[A-Za-z0-9_-]{20,}", body), path
    assert '<html lang="en">' in bodies["/systems/open-mem"]


async def test_pages_are_served_safely(gateway: Gateway, db: Any, clock: Clock) -> None:
    gw = gateway
    version = await register(gw, "team-page", "page-mem", "1.0")
    job_id = await gated_job(db, version, SECRET_SCORES, clock())
    page = await gw.client.get(f"/jobs/{job_id}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    # The job page holds nothing about the job, not even its id: the script reads the path.
    assert job_id not in html and "97.5" not in html and "page-mem" not in html
    assert 'type="password"' in html and '<label for="api-key">' in html
    assert "sessionStorage" not in html  # the script, not the page, handles the key
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert page.headers["referrer-policy"] == "no-referrer"

    board = await gw.client.get("/leaderboard?track=textual&board=industrial")
    assert board.status_code == 200
    for part in ('<html lang="en">', 'class="skip-link" href="#main"', 'id="main"'):
        assert part in board.text
    assert 'aria-current="page"' in board.text and 'scope="col"' in board.text
    assert "cdn" not in board.text.lower() and "https://" not in board.text
    bogus = await gw.client.get("/leaderboard?track=video")
    assert bogus.status_code == 404 and "no such track" in bogus.text
    missing = await gw.client.get("/systems/nobody-at-all")
    assert missing.status_code == 404 and "<h1>Not found</h1>" in missing.text

    script = await gw.client.get("/static/vendor/chart.umd.min.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert "Chart.js v4" in script.text[:200]
    license_text = await gw.client.get("/static/vendor/chart.js.LICENSE.md")
    assert "MIT License" in license_text.text
    for asset in ("app.css", "table-sort.js", "charts.js", "job.js"):
        assert (await gw.client.get(f"/static/{asset}")).status_code == 200
    # The pages are not API operations.
    paths = ok(await gw.client.get("/openapi.json"))["paths"]
    assert "/v1/leaderboard" in paths and "/leaderboard" not in paths and "/" not in paths
