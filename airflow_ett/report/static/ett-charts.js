/* Draws the report's plotly figure specs (airflow_ett/report/html.py) at their size, and
   keeps them there. One file for every place a chart is drawn: the HTML report inlines it,
   the ETT pages of the Airflow UI load it from /ett/static/ (airflow_ett/plugin/web).

   Why not plotly's `responsive` mode: on a window resize it deletes the layout's height
   (it keeps a height only when a width is set too) and autosizes to the container, whose
   height is its content's: the charts fell to plotly's minimum and drew over the tables
   until a reload. Here every draw gives plotly both numbers: the width of the chart's box
   (its content box, so the padding stays) and the spec's height; a ResizeObserver (or, in
   a browser without one, the window's resize event) draws again when the box's width
   changes, whatever changed it (the window, the Airflow UI's iframe, the grid reflowing).

   Legends: plotly takes a legend's rows out of the plot (a horizontal legend of many
   tenants left the trend 70 px), so after each draw the chart grows by what its plot lost,
   until the plot has the height the spec gives it (the spec's height less its margins).

   Each drawn node gets `data-drawn-width` (the width it was drawn at): a test waits for
   it to equal the box's width to know a resize has been drawn. */
(function (global) {
  "use strict";

  var FIT_ROUNDS = 4;  // a legend's height settles in one or two; bounded all the same

  function contentWidth(node) {
    var style = global.getComputedStyle(node);
    var width = node.clientWidth - parseFloat(style.paddingLeft || "0")
      - parseFloat(style.paddingRight || "0");
    return Math.max(0, Math.floor(width));
  }

  function copy(obj) {
    var out = {}, k;
    for (k in obj) { if (Object.prototype.hasOwnProperty.call(obj, k)) { out[k] = obj[k]; } }
    return out;
  }

  // Grow the chart until its plot has the height the spec meant (margins as the spec's).
  function fit(node, height, round) {
    var full = node._fullLayout;
    if (!full || !full._size || round >= FIT_ROUNDS) { return Promise.resolve(); }
    var wanted = height - full.margin.t - full.margin.b;
    var short = Math.ceil(wanted - full._size.h);
    if (short <= 1) { return Promise.resolve(); }
    return global.Plotly.relayout(node, { height: full.height + short }).then(function () {
      return fit(node, height, round + 1);
    });
  }

  function render(node) {
    var state = node._ettChart;
    var width = contentWidth(node);
    if (!state || width <= 0) { return Promise.resolve(); }  // hidden: drawn when shown
    if (state.busy) { state.again = true; return state.busy; }
    var layout = copy(state.layout);
    var height = layout.height || 360;
    layout.width = width;
    layout.height = height;
    layout.autosize = false;
    state.width = width;
    state.busy = Promise.resolve(global.Plotly.react(node, state.data, layout, state.config))
      .then(function () { return fit(node, height, 0); })
      .then(function () {
        node.setAttribute("data-drawn-width", String(width));
        state.busy = null;
        if (state.again) { state.again = false; return render(node); }
        return undefined;
      }, function (error) {
        state.busy = null;
        node.setAttribute("data-error", String(error));
      });
    return state.busy;
  }

  function resized(node) {
    var state = node._ettChart;
    if (state && contentWidth(node) !== state.width) { render(node); }
  }

  var observer = global.ResizeObserver ? new global.ResizeObserver(function (entries) {
    entries.forEach(function (entry) { resized(entry.target); });
  }) : null;
  var watched = [];
  if (!observer) {
    global.addEventListener("resize", function () { watched.forEach(resized); });
  }

  /* Draw `data` with `layout` (a spec's, themed) and `config` in `node`, at the node's
     width and the layout's height; redrawn when the node's width changes. Calling it
     again (a new theme, new figures) replaces what is drawn. Returns a promise. */
  function draw(node, data, layout, config) {
    var state = node._ettChart;
    if (!state) {
      state = node._ettChart = { busy: null, again: false, width: null };
      if (observer) { observer.observe(node); } else { watched.push(node); }
    }
    state.data = data;
    state.layout = layout;
    state.config = config;
    state.width = null;
    return render(node);
  }

  global.EttCharts = { draw: draw, contentWidth: contentWidth };
})(window);
