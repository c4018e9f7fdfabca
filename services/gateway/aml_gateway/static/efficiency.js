// The efficiency section of a team's private job page: what the results cost (the latency of
// its system's Add and Search calls as the platform measured them, the context its Searches
// returned against what the answer model used, the platform's own model use) and what the
// figures were measured under. job.js announces the results it read (`aml:results`); nothing
// here asks the API for anything.
(function () {
  "use strict";

  function $(id) { return document.getElementById(id); }

  function figure(value, digits) {
    return value === null || value === undefined ? "—" : value.toFixed(digits);
  }

  function fill(tableId, rows) {
    var body = $(tableId).tBodies[0];
    body.textContent = "";
    rows.forEach(function (cells) {
      var row = document.createElement("tr");
      cells.forEach(function (text, index) {
        var element = document.createElement(index === 0 ? "th" : "td");
        if (index === 0) element.scope = "row";
        else element.className = "number";
        element.textContent = text;
        row.appendChild(element);
      });
      body.appendChild(row);
    });
  }

  // Overall, each dataset, then its categories (Adds belong to no category).
  function cellsOf(efficiency) {
    var cells = [["Overall", efficiency.overall]];
    Object.keys(efficiency.datasets).sort().forEach(function (datasetId) {
      var dataset = efficiency.datasets[datasetId];
      cells.push([datasetId, dataset.overall]);
      Object.keys(dataset.categories).sort().forEach(function (name) {
        cells.push([datasetId + ": " + name, dataset.categories[name]]);
      });
    });
    return cells;
  }

  function callRows(cells) {
    var rows = [];
    cells.forEach(function (pair) {
      [["Search", pair[1].search], ["Add", pair[1].add]].forEach(function (call) {
        var stats = call[1];
        if (!stats) return;
        var first = stats.first_attempts;
        rows.push([
          pair[0] + " · " + call[0],
          figure(first.p50_ms, 1), figure(first.p95_ms, 1), figure(first.p99_ms, 1),
          figure(first.max_ms, 1), String(stats.items), String(stats.retried.count),
          String(stats.timeouts), String(stats.rate_limited), String(stats.errors),
        ]);
      });
    });
    return rows;
  }

  function questionRows(cells) {
    var rows = [];
    cells.forEach(function (pair) {
      var context = pair[1].context;
      var llm = pair[1].llm;
      if (!context && !llm) return;
      context = context || {};
      llm = llm || {};
      rows.push([
        pair[0],
        figure(context.retrieved_tokens_mean, 1), figure(context.used_tokens_mean, 1),
        figure(context.candidates_returned_mean, 1),
        context.questions ? context.truncated_questions + " of " + context.questions : "—",
        figure(llm.answer_tokens_in_mean, 1) + " / " + figure(llm.answer_tokens_out_mean, 1),
        figure(llm.judge_tokens_in_mean, 1) + " / " + figure(llm.judge_tokens_out_mean, 1),
      ]);
    });
    return rows;
  }

  function underText(efficiency) {
    var under = efficiency.measured_under;
    var topK = Object.keys(under.search_top_k).sort().map(function (id) {
      return id + " " + under.search_top_k[id];
    }).join(", ") || "—";
    var rate = under.max_rps === null || under.max_rps === undefined
      ? "no declared rate" : under.max_rps + " requests/s";
    var concurrency = under.max_concurrency === null || under.max_concurrency === undefined
      ? "—" : String(under.max_concurrency);
    return "Measured from the deployment “" + under.deployment + "” (" + efficiency.method +
      "): Search top_k " + topK + "; your declared concurrency " + concurrency + " and " + rate +
      ". Compare these figures only with results measured under the same.";
  }

  function render(efficiency) {
    var block = $("efficiency-block");
    if (!block) return;
    block.hidden = false;
    var none = !efficiency;
    $("efficiency-none").hidden = !none;
    $("efficiency-figures").hidden = none;
    if (none) return;
    $("efficiency-under").textContent = underText(efficiency);
    var cells = cellsOf(efficiency);
    fill("efficiency-calls", callRows(cells));
    fill("efficiency-context", questionRows(cells));
  }

  document.addEventListener("aml:results", function (event) {
    render(event.detail ? event.detail.efficiency : null);
  });
})();
