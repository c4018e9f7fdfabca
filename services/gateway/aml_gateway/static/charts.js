// Draws the charts described in `<script type="application/json" id="chart-data">` with the
// vendored Chart.js (served by the gateway, never a CDN). Every chart's numbers are also in a
// table on the page; the canvases are labelled images.
(function () {
  "use strict";

  // Distinguishable colours, each at least 3:1 against white (WCAG non-text contrast).
  var PALETTE = ["#0a58ca", "#b4530a", "#146c2e", "#8e24aa", "#b3261e", "#00727a", "#5d4037", "#4a5360"];

  function percent(value) {
    return value === null || value === undefined ? "no score" : value.toFixed(1) + "%";
  }

  function draw(spec) {
    var canvas = document.getElementById(spec.id);
    if (!canvas) return;
    var line = spec.type === "line";
    var datasets = spec.series.map(function (series, index) {
      var colour = PALETTE[index % PALETTE.length];
      return {
        label: series.label,
        data: series.values,
        backgroundColor: colour,
        borderColor: colour,
        borderWidth: line ? 2 : 0,
        pointRadius: line ? 4 : 0,
        spanGaps: true,
      };
    });
    new window.Chart(canvas, {
      type: spec.type,
      data: { labels: spec.labels, datasets: datasets },
      options: {
        responsive: true,
        maintainAspectRatio: false,
        animation: false,
        scales: {
          y: {
            min: 0,
            max: 100,
            title: { display: true, text: spec.axis || "Accuracy (%)", color: "#1b1f24" },
            ticks: { color: "#1b1f24", callback: function (value) { return value + "%"; } },
          },
          x: { ticks: { color: "#1b1f24" } },
        },
        plugins: {
          legend: { position: "bottom", labels: { color: "#1b1f24" } },
          tooltip: {
            callbacks: {
              label: function (item) { return item.dataset.label + ": " + percent(item.raw); },
            },
          },
        },
      },
    });
  }

  function start() {
    var source = document.getElementById("chart-data");
    if (!source || !window.Chart) return;
    JSON.parse(source.textContent).forEach(draw);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
