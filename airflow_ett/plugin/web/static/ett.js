/* The ETT pages' one script (airflow_ett/plugin/web): follow the Airflow UI's theme, draw
   the plotly figures the page carries (in <script type="application/json"> elements).

   Theme: Airflow 3's UI keeps its choice with next-themes (localStorage "theme": light,
   dark or system) and puts the resolved one as a class, "light" or "dark", on its <html>.
   It passes nothing to the iframes of its external views, but they are same-origin
   (sandbox allow-same-origin), so this page reads the parent's <html> class, and watches
   it, to switch with the UI at once; opened on its own, it reads the same localStorage
   key, and else the browser's prefers-color-scheme.

   A running job's page (its header carries data-refresh-s) fetches itself again every
   that many seconds while the tab is shown: the server renders it as it did at first, so
   there is one renderer of a run; its <main> takes the place of this one's, the charts
   drawn here staying in place and drawn again with the new figures. It stops when the
   page says the run has ended (no data-refresh-s any more), or when the server refuses
   (4xx: signed out, access withdrawn, the run gone), and then says so. */
(function () {
  "use strict";

  var media = window.matchMedia ? window.matchMedia("(prefers-color-scheme: dark)") : null;
  var root = document.documentElement;

  function parentRoot() {
    try {
      if (window.parent && window.parent !== window && window.parent.document) {
        return window.parent.document.documentElement;
      }
    } catch (e) { /* another origin: not Airflow's UI */ }
    return null;
  }

  function currentTheme() {
    var outer = parentRoot();
    if (outer) {
      if (outer.classList.contains("dark")) { return "dark"; }
      if (outer.classList.contains("light")) { return "light"; }
    }
    try {
      var stored = window.localStorage.getItem("theme");
      if (stored === "dark" || stored === "light") { return stored; }
    } catch (e) { /* storage blocked */ }
    return media && media.matches ? "dark" : "light";
  }

  function read(id) {
    var node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }
  var figures = read("ett-figures") || {};
  var figuresNode = document.getElementById("ett-figures");
  var themes = read("ett-themes") || {};
  var config = read("ett-plotly-config") || {};
  var nodes = Array.prototype.slice.call(document.querySelectorAll("[data-figure]"));

  function isObject(v) { return v !== null && typeof v === "object" && !Array.isArray(v); }
  function merge(a, b) {
    var out = {}, k;
    for (k in a) { out[k] = a[k]; }
    for (k in b) { out[k] = isObject(a[k]) && isObject(b[k]) ? merge(a[k], b[k]) : b[k]; }
    return out;
  }
  function themed(layout, theme) {
    var patch = themes[theme] || { layout: {}, axis: {} };
    var out = merge(layout, patch.layout);
    ["xaxis", "yaxis"].forEach(function (k) { out[k] = merge(layout[k] || {}, patch.axis); });
    return out;
  }

  function draw(theme) {
    if (typeof Plotly === "undefined" || typeof EttCharts === "undefined") {
      nodes.forEach(function (n) { n.setAttribute("data-error", "plotly.js did not load"); });
      return;
    }
    nodes.forEach(function (node) {
      var fig = figures[node.getAttribute("data-figure")];
      if (!fig) { return; }
      if (!node.classList.contains("js-plotly-plot")) { node.replaceChildren(); }
      EttCharts.draw(node, fig.data, themed(fig.layout, theme), config);
    });
  }

  // Inside the UI, its own background and text colours (on its <html>), so the page
  // does not sit in the UI as a box of another shade.
  function takeColours() {
    var outer = parentRoot();
    if (!outer) { return; }
    root.style.removeProperty("--bg");
    root.style.removeProperty("--fg");
    var style = window.parent.getComputedStyle(outer);
    var bg = style.backgroundColor;
    if (bg && bg !== "transparent" && !/rgba\(.*,\s*0\)$/.test(bg)) {
      root.style.setProperty("--bg", bg);
      root.style.setProperty("--fg", style.color);
    }
  }

  var shown = null;
  function apply() {
    var theme = currentTheme();
    if (theme === shown) { return; }
    shown = theme;
    root.setAttribute("data-theme", theme);
    takeColours();
    draw(theme);
  }

  // -- a running job's page ------------------------------------------------------------

  function stopped(why) {
    var notes = document.getElementById("notes");
    if (!notes) { return; }
    var item = document.createElement("li");
    item.id = "refresh-stopped";
    item.textContent = "Stopped refreshing: " + why + ". Reload the page to see it again.";
    notes.appendChild(item);
  }

  // Put the fetched page's <main> in place of this one's, keeping the drawn charts.
  function swap(text) {
    var doc = new DOMParser().parseFromString(text, "text/html");
    var fresh = doc.querySelector("main");
    var data = doc.getElementById("ett-figures");
    var main = document.querySelector("main");
    if (!fresh || !main) { return false; }
    var imported = document.importNode(fresh, true);
    Array.prototype.forEach.call(imported.querySelectorAll("[data-figure]"), function (node) {
      var key = node.getAttribute("data-figure");
      var drawn = nodes.filter(function (n) { return n.getAttribute("data-figure") === key; });
      if (drawn.length) { node.replaceWith(drawn[0]); }
    });
    main.replaceWith(imported);
    nodes = Array.prototype.slice.call(document.querySelectorAll("[data-figure]"));
    if (data) {
      figures = JSON.parse(data.textContent);
      if (figuresNode) { figuresNode.textContent = data.textContent; }
    }
    draw(currentTheme());
    return true;
  }

  function refreshEvery() {
    var header = document.querySelector("[data-refresh-s]");
    var seconds = header ? parseFloat(header.getAttribute("data-refresh-s")) : NaN;
    return seconds > 0 ? seconds : null;
  }

  function scheduleRefresh() {
    var seconds = refreshEvery();
    if (seconds !== null && window.fetch && window.DOMParser) {
      setTimeout(refresh, seconds * 1000);
    }
  }

  function refresh() {
    if (document.hidden) { scheduleRefresh(); return; }  // not shown: ask again later
    window.fetch(window.location.href, { headers: { Accept: "text/html" },
                                         credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (response.status >= 400 && response.status < 500) {
          stopped("the server answered " + response.status);
          return null;
        }
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (text) {
        if (text !== null && swap(text)) { scheduleRefresh(); }
      })
      .catch(function () { scheduleRefresh(); });  // the network or the server: again later
  }

  if (parentRoot()) { root.setAttribute("data-embedded", "true"); }
  apply();
  var outer = parentRoot();
  if (outer && window.MutationObserver) {
    new MutationObserver(apply).observe(outer, { attributes: true, attributeFilter: ["class"] });
  }
  if (media && media.addEventListener) { media.addEventListener("change", apply); }
  window.addEventListener("storage", function (e) { if (e.key === "theme") { apply(); } });
  scheduleRefresh();
})();
