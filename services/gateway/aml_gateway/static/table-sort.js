// Sortable tables: every `table[data-sortable]` header button sorts the body rows by that
// column. Cells carry their sort value in `data-value` (numbers, ISO times or text); an empty
// value always sorts last. The header's `aria-sort` tells assistive technology the order, and
// a polite live region announces it.
(function () {
  "use strict";

  function cellValue(row, index) {
    var cell = row.cells[index];
    if (!cell) return "";
    var value = cell.getAttribute("data-value");
    return value === null ? cell.textContent.trim() : value;
  }

  function compare(a, b, kind) {
    if (kind === "number") return parseFloat(a) - parseFloat(b);
    return a.localeCompare(b, undefined, { numeric: true, sensitivity: "base" });
  }

  function sortTable(table, header, button) {
    var index = header.cellIndex;
    var kind = button.getAttribute("data-kind") || "text";
    var current = header.getAttribute("aria-sort");
    var direction;
    if (current === "ascending") direction = "descending";
    else if (current === "descending") direction = "ascending";
    // A column where lower is better (latency) says so; the others start from the top.
    else direction = button.getAttribute("data-first") || (kind === "number" ? "descending" : "ascending");

    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.forEach(function (row, position) { row.setAttribute("data-position", String(position)); });
    rows.sort(function (left, right) {
      var a = cellValue(left, index);
      var b = cellValue(right, index);
      if (a === "" && b === "") return 0;
      if (a === "") return 1;
      if (b === "") return -1;
      var order = compare(a, b, kind);
      if (direction === "descending") order = -order;
      if (order === 0) {
        order = Number(left.getAttribute("data-position")) - Number(right.getAttribute("data-position"));
      }
      return order;
    });
    rows.forEach(function (row) { body.appendChild(row); });

    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (cell) {
      if (cell !== header) cell.removeAttribute("aria-sort");
    });
    header.setAttribute("aria-sort", direction);

    var status = table.closest(".table-wrap");
    status = status && status.nextElementSibling;
    if (status && status.hasAttribute("data-sort-status")) {
      status.textContent = "Sorted by " + button.textContent.trim() + ", " + direction + ".";
    }
  }

  function setUp(table) {
    var headers = table.tHead ? table.tHead.rows[0].cells : [];
    Array.prototype.forEach.call(headers, function (header) {
      var button = header.querySelector("button");
      if (!button) return;
      button.addEventListener("click", function () { sortTable(table, header, button); });
    });
  }

  function start() {
    Array.prototype.forEach.call(document.querySelectorAll("table[data-sortable]"), setUp);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
