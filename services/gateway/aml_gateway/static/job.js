// A team's private job page. The Leaderboard API Key is asked for in a form, kept only in this
// tab's sessionStorage and sent as a Bearer header to the JSON API; it never goes into a URL.
// While the job runs, its status is read again every 2 seconds.
(function () {
  "use strict";

  var KEY = "aml.leaderboardApiKey";
  var POLL_MS = 2000;
  // A coding job's attempts are read a page at a time: a few hundred in a full run.
  var ATTEMPTS_PAGE = 50;
  // A coding dataset's memory conditions, in the order its categories number them.
  var CONDITIONS = ["relevant", "noisy"];
  var STAGES = ["add", "search", "answer", "score", "aggregate"];
  var jobId = decodeURIComponent(window.location.pathname.replace(/\/+$/, "").split("/").pop());
  var timer = null;
  var lastAnnounced = "";
  var attempts = { cursor: null, shown: 0, total: 0, loading: false };

  function $(id) { return document.getElementById(id); }

  function storedKey() {
    try { return window.sessionStorage.getItem(KEY); } catch (error) { return null; }
  }

  function storeKey(value) {
    try { window.sessionStorage.setItem(KEY, value); } catch (error) { /* private mode */ }
  }

  function forgetKey() {
    try { window.sessionStorage.removeItem(KEY); } catch (error) { /* nothing stored */ }
  }

  function stopPolling() {
    if (timer !== null) { window.clearTimeout(timer); timer = null; }
  }

  function showForm(message) {
    stopPolling();
    $("job-section").hidden = true;
    $("key-section").hidden = false;
    var error = $("key-error");
    error.textContent = message || "";
    error.hidden = !message;
  }

  function percent(value) {
    return value === null || value === undefined ? "—" : (value * 100).toFixed(1) + "%";
  }

  function number(value, digits) {
    return value === null || value === undefined ? "—" : value.toFixed(digits);
  }

  function cell(row, text, header, className) {
    var element = document.createElement(header ? "th" : "td");
    if (header) element.scope = "row";
    if (className) element.className = className;
    element.textContent = text;
    row.appendChild(element);
    return element;
  }

  // A category kept out of Overall: a visible mark, and words for screen readers.
  function markExcluded(element) {
    var mark = document.createElement("span");
    mark.className = "excluded-mark";
    mark.setAttribute("aria-hidden", "true");
    mark.textContent = "†";
    var words = document.createElement("span");
    words.className = "visually-hidden";
    words.textContent = " (not in Overall)";
    element.appendChild(mark);
    element.appendChild(words);
  }

  function fillRows(tableId, rows) {
    $(tableId).tBodies[0].textContent = "";
    appendRows(tableId, rows);
  }

  function appendRows(tableId, rows) {
    var body = $(tableId).tBodies[0];
    rows.forEach(function (cells) {
      var row = document.createElement("tr");
      cells.forEach(function (spec, index) {
        var element = cell(row, spec.text, index === 0, spec.className);
        if (spec.excluded) markExcluded(element);
      });
      if (cells.excluded) row.className = "excluded";
      body.appendChild(row);
    });
  }

  function when(iso) {
    // One zone for everyone: UTC, to the second.
    return iso ? new Date(iso).toISOString().slice(0, 19).replace("T", " ") + " UTC" : "";
  }

  function setTime(id, iso, missing) {
    var element = $(id);
    element.textContent = iso ? when(iso) : missing;
    if (iso) element.setAttribute("datetime", iso);
    else element.removeAttribute("datetime");
  }

  function fillFacts(listId, pairs) {
    var list = $(listId);
    list.textContent = "";
    pairs.forEach(function (pair) {
      var group = document.createElement("div");
      var term = document.createElement("dt");
      term.textContent = pair[0];
      var value = document.createElement("dd");
      var code = document.createElement("code");
      code.textContent = pair[1];
      value.appendChild(code);
      group.appendChild(term);
      group.appendChild(value);
      list.appendChild(group);
    });
  }

  function elapsed(seconds) {
    var whole = Math.round(seconds);
    var hours = Math.floor(whole / 3600);
    var minutes = Math.floor((whole % 3600) / 60);
    var rest = whole % 60;
    return (hours ? hours + " h " : "") + (hours || minutes ? minutes + " min " : "") + rest + " s";
  }

  var BOARDS = { academic: "Academic", industrial: "Industrial" };

  var REVIEW = {
    gate_failed: "not publishable: the automatic gate failed",
    pending_review: "gate passed, waiting for admin review",
    approved: "approved and published",
    rejected: "rejected by the admins",
    disqualified: "disqualified by the admins",
  };

  function renderStatus(job) {
    $("job-system").textContent = job.system_name || "—";
    $("job-version").textContent = job.version_label || "—";
    $("job-board").textContent = job.board ? BOARDS[job.board] || job.board : "—";
    // Not a plain "completed" when the platform failed items of the run (not publishable, not
    // charged): the API words it once, for this page and `aml team` alike.
    $("job-state").textContent = job.state_summary || job.state;
    $("job-quota").textContent = job.charged === false
      ? "not charged: the platform's failure"
      : "counts against your quota";
    $("job-stage").textContent = job.stage || "—";
    // An outage the running job waits out: its work is paused, not failed.
    var paused = (job.paused || []).map(function (pause) { return pause.message; });
    $("job-paused").textContent = paused.join("; ");
    $("job-paused-row").hidden = paused.length === 0;
    $("job-mode").textContent = job.mode;
    $("job-track").textContent = job.track;
    $("job-label").textContent = job.run_label;

    setTime("job-created", job.created_at, "—");
    setTime("job-started", job.started_at, "not yet");
    setTime("job-finished", job.finished_at, "not yet");
    var finished = job.duration_seconds !== null && job.duration_seconds !== undefined;
    $("job-duration-label").textContent = finished ? "Duration" : "Running for";
    $("job-duration").textContent = finished
      ? elapsed(job.duration_seconds)
      : job.started_at ? elapsed(job.elapsed_seconds) : "not started";

    $("job-answer-model").textContent = job.answer_model || "not recorded yet";
    $("job-spec-hash").textContent = job.spec_hash || "not recorded yet";
    $("job-code-hash").textContent = job.code_hash || "not recorded yet";
    $("job-bundle-hash").textContent = job.dataset_bundle_hash || "not recorded yet";
    var bundles = job.dataset_bundles || {};
    fillFacts("job-bundles", Object.keys(bundles).sort().map(function (id) {
      return ["Bundle of " + id, bundles[id]];
    }));
    var spec = job.spec || {};
    var specKeys = Object.keys(spec).sort();
    $("spec-details").hidden = specKeys.length === 0;
    fillFacts("job-spec", specKeys.map(function (name) { return [name, spec[name]]; }));
    var review = job.review_state ? REVIEW[job.review_state] || job.review_state : "not reviewed";
    if (job.review_reason) review += " (" + job.review_reason + ")";
    if (job.platform_failures && job.not_publishable_reason) review = job.not_publishable_reason;
    $("job-review").textContent = review;

    STAGES.forEach(function (stage) {
      var progress = job.stages[stage] || { total: 0, done: 0, failed: 0 };
      var bar = $("progress-" + stage);
      bar.max = Math.max(progress.total, 1);
      bar.value = Math.min(progress.done + progress.failed, bar.max);
      var text = progress.total ? progress.done + " of " + progress.total + " done" : "not planned yet";
      if (progress.failed) text += ", " + progress.failed + " failed";
      $("progress-" + stage + "-text").textContent = text;
    });

    var errors = job.errors || [];
    $("errors-empty").hidden = errors.length > 0;
    $("errors-wrap").hidden = errors.length === 0;
    fillRows("errors-table", errors.map(function (error) {
      return [{ text: error.stage }, { text: error.kind }, { text: error.item || "—" }, { text: error.reason }];
    }));

    var gate = job.gate;
    $("gate-block").hidden = !gate;
    if (gate) {
      fillRows("gate-table", gate.checks.map(function (check) {
        return [
          { text: check.name },
          { text: check.passed ? "passed" : "failed", className: check.passed ? "passed" : "failed" },
          { text: check.reason },
        ];
      }));
    }

    var announcement = "Job " + (job.state_summary || job.state) +
      (job.stage ? ", stage " + job.stage : "") + (paused.length ? ", " + paused.join("; ") : "");
    if (announcement !== lastAnnounced) {
      $("job-live").textContent = announcement + ".";
      lastAnnounced = announcement;
    }
    $("poll-note").hidden = job.state === "completed" || job.state === "failed";
  }

  function metricCells(metrics) {
    return [
      { text: String(metrics.questions), className: "number" },
      { text: String(metrics.scored), className: "number" },
      { text: String(metrics.failed), className: "number" },
      { text: percent(metrics.accuracy), className: "number" },
      { text: percent(metrics.judge_accuracy), className: "number" },
      // Over the multiple-choice questions alone; "-" where there are none.
      { text: percent(metrics.option_accuracy), className: "number" },
      { text: number(metrics.f1_mean, 3), className: "number" },
      { text: number(metrics.bleu1_mean, 3), className: "number" },
      { text: percent(metrics.qs_mean), className: "number" },
      { text: percent(evidence(metrics, "recall", "5")), className: "number" },
      { text: percent(evidence(metrics, "recall", "10")), className: "number" },
      { text: percent(evidence(metrics, "joint", "10")), className: "number" },
    ];
  }

  // Recall@k or Joint@k of a cell whose questions declare evidence; undefined elsewhere.
  function evidence(metrics, kind, k) {
    return metrics.evidence ? metrics.evidence[kind][k] : undefined;
  }

  // The categories kept out of Overall last; a coding dataset's conditions first, in order.
  function orderedCategories(dataset) {
    var excluded = dataset.excluded_from_overall || [];
    var names = Object.keys(dataset.categories);
    var conditions = CONDITIONS.filter(function (name) { return names.indexOf(name) >= 0; });
    names = conditions.concat(names.filter(function (name) { return conditions.indexOf(name) < 0; }));
    return names.filter(function (name) { return excluded.indexOf(name) < 0; })
      .concat(names.filter(function (name) { return excluded.indexOf(name) >= 0; }));
  }

  function resolvedCells(metrics) {
    var resolved = metrics.resolved === null || metrics.resolved === undefined ? "—" : String(metrics.resolved);
    // The share first: at phone width it is the figure still in view.
    return [
      { text: percent(metrics.resolved_rate), className: "number" },
      { text: resolved, className: "number" },
      { text: String(metrics.questions), className: "number" },
      { text: String(metrics.failed), className: "number" },
    ];
  }

  // A coding job: the resolved share per memory condition and task type, then its attempts.
  // One naming column ("<dataset>: relevant"), so that the share is in view at phone width.
  function renderCoding(results) {
    var rows = [[{ text: "Overall" }].concat(resolvedCells(results.overall))];
    Object.keys(results.datasets).forEach(function (datasetId) {
      var dataset = results.datasets[datasetId];
      var named = function (text, metrics) {
        rows.push([{ text: text }].concat(resolvedCells(metrics)));
      };
      named(datasetId, dataset.overall);
      orderedCategories(dataset).forEach(function (name) {
        named(datasetId + ": " + name, dataset.categories[name]);
      });
      var types = dataset.task_types || {};
      Object.keys(types).sort().forEach(function (name) {
        named(datasetId + ": " + name + " tasks", types[name]);
      });
    });
    fillRows("coding-table", rows);
    attempts = { cursor: null, shown: 0, total: results.overall.questions, loading: false };
    $("attempts-table").tBodies[0].textContent = "";
    $("attempts-status").textContent = "";
    loadAttempts();
  }

  var STAGE_NAMES = { search: "search", answer: "solve", score: "verify" };

  function verdict(attempt) {
    if (attempt.outcome === "resolved") return { text: "resolved", className: "passed" };
    if (attempt.outcome === "unresolved") return { text: "unresolved" };
    if (attempt.outcome === "failed") {
      var kind = attempt.failure_kind ? " (" + attempt.failure_kind + ")" : "";
      return { text: "failed at " + STAGE_NAMES[attempt.failed_at] + kind, className: "failed" };
    }
    return { text: "not finished" };
  }

  function attemptCells(attempt) {
    // The verdict beside the task, so that it is in view at phone width too.
    return [
      { text: attempt.task },
      { text: attempt.condition },
      verdict(attempt),
      { text: attempt.end_reason ? attempt.end_reason.replace(/_/g, " ") : "—" },
      { text: attempt.steps === null || attempt.steps === undefined ? "—" : String(attempt.steps), className: "number" },
      { text: attempt.task_type || "—" },
      { text: attempt.reason || "—", className: "reason" },
    ];
  }

  function loadAttempts() {
    var more = $("attempts-more");
    var status = $("attempts-status");
    var path = "/v1/jobs/" + encodeURIComponent(jobId) + "/attempts?limit=" + ATTEMPTS_PAGE +
      (attempts.cursor ? "&cursor=" + encodeURIComponent(attempts.cursor) : "");
    // A second press while a page loads is ignored; the button is not disabled, which would
    // take the keyboard's focus away from it.
    if (attempts.loading) return null;
    attempts.loading = true;
    more.setAttribute("aria-busy", "true");
    return request(path)
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.json();
      })
      .then(function (page) {
        appendRows("attempts-table", page.attempts.map(attemptCells));
        attempts.shown += page.attempts.length;
        attempts.cursor = page.next_cursor;
        var hadFocus = document.activeElement === more;
        more.hidden = !page.next_cursor;
        status.textContent = page.next_cursor
          ? "Showing " + attempts.shown + " of " + attempts.total + " attempts."
          : "All " + attempts.shown + " attempts shown.";
        // The button goes away with the last page: focus stays where the list ends.
        if (hadFocus && more.hidden) status.focus();
      })
      .catch(function (error) {
        // The button asks for the same page again.
        more.hidden = false;
        status.textContent = "The attempts could not be read (" + error.message + "). Try again.";
      })
      .then(function () {
        attempts.loading = false;
        more.removeAttribute("aria-busy");
      });
  }

  function renderResults(results) {
    // What the results cost is drawn by efficiency.js, from the same answer.
    document.dispatchEvent(new CustomEvent("aml:results", { detail: results }));
    var coding = results.track === "coding";
    $("results-generic").hidden = coding;
    $("coding-block").hidden = !coding;
    if (coding) {
      renderCoding(results);
      $("results-block").hidden = false;
      return;
    }
    var rows = [[{ text: "Overall" }, { text: "all" }].concat(metricCells(results.overall))];
    var anyExcluded = false;
    Object.keys(results.datasets).forEach(function (datasetId) {
      var dataset = results.datasets[datasetId];
      var excluded = dataset.excluded_from_overall || [];
      rows.push([{ text: datasetId }, { text: "overall" }].concat(metricCells(dataset.overall)));
      // A streaming dataset: its overall split by the point where each question was asked.
      var points = dataset.points || {};
      Object.keys(points)
        .sort(function (a, b) { return Number(a) - Number(b); })
        .forEach(function (ordinal) {
          rows.push([{ text: datasetId }, { text: "asked at point " + ordinal }].concat(
            metricCells(points[ordinal])
          ));
        });
      // The categories kept out of Overall last, as on the board.
      orderedCategories(dataset).forEach(function (name) {
        var out = excluded.indexOf(name) >= 0;
        var row = [{ text: datasetId }, { text: name, excluded: out }].concat(
          metricCells(dataset.categories[name])
        );
        row.excluded = out;
        anyExcluded = anyExcluded || out;
        rows.push(row);
      });
    });
    fillRows("results-table", rows);
    $("evidence-legend").hidden = !(results.overall.evidence || results.overall.qs_mean !== undefined);
    $("results-legend").hidden = !anyExcluded;
    if (anyExcluded) $("results-table").setAttribute("aria-describedby", "results-legend");
    else $("results-table").removeAttribute("aria-describedby");
    $("results-block").hidden = false;
  }

  function request(path) {
    return window.fetch(path, {
      headers: { Authorization: "Bearer " + storedKey(), Accept: "application/json" },
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    });
  }

  function refused(response) {
    if (response.status === 401) {
      forgetKey();
      showForm("That key was not accepted. Check the Leaderboard API Key and try again.");
    } else if (response.status === 404) {
      showForm("This key has no job with this id.");
    } else {
      showForm("The job could not be read (HTTP " + response.status + "). Try again later.");
    }
  }

  function poll() {
    timer = null;
    var base = "/v1/jobs/" + encodeURIComponent(jobId);
    request(base)
      .then(function (response) {
        if (!response.ok) { refused(response); return null; }
        return response.json();
      })
      .then(function (job) {
        if (!job) return;
        $("key-section").hidden = true;
        $("job-section").hidden = false;
        renderStatus(job);
        if (job.state === "completed") {
          return request(base + "/results").then(function (response) {
            if (response.ok) return response.json().then(renderResults);
          });
        }
        if (job.state !== "failed") timer = window.setTimeout(poll, POLL_MS);
      })
      .catch(function () {
        // A network hiccup: try again at the next tick rather than give up.
        timer = window.setTimeout(poll, POLL_MS);
      });
  }

  function start() {
    $("job-id").textContent = jobId;
    $("key-form").addEventListener("submit", function (event) {
      event.preventDefault();
      var input = $("api-key");
      var key = input.value.trim();
      if (!key) { showForm("Enter the Leaderboard API Key."); input.focus(); return; }
      storeKey(key);
      input.value = "";
      stopPolling();
      poll();
    });
    $("attempts-more").addEventListener("click", loadAttempts);
    $("forget-key").addEventListener("click", function () {
      forgetKey();
      showForm("");
      $("api-key").focus();
    });
    if (storedKey()) poll();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
