/* precnb report page script: embed every chart spec with the inlined vega-embed.
   No network: the specs carry their data, vega-embed is inlined above this script. */
(function () {
  "use strict";
  var views = {};
  window.precnbViews = views;

  function fail(target, err) {
    target.setAttribute("data-rendered", "error");
    var p = document.createElement("p");
    p.className = "chart-error";
    p.textContent = "This chart could not be drawn: " + (err && err.message ? err.message : String(err));
    target.appendChild(p);
  }

  function embed(node) {
    var id = node.getAttribute("data-precnb-chart");
    var target = document.getElementById(id);
    if (!target) { return; }
    var spec;
    try {
      spec = JSON.parse(node.textContent);
    } catch (err) {
      fail(target, err);
      return;
    }
    if (typeof window.vegaEmbed !== "function") {
      fail(target, new Error("vega-embed is missing from the page"));
      return;
    }
    // tooltip: vega-tooltip's default handler escapes HTML in values (module names are text)
    window.vegaEmbed(target, spec, {renderer: "svg", actions: false, tooltip: true})
      .then(function (res) {
        views[id] = res.view;
        target.setAttribute("data-rendered", "true");
      })
      .catch(function (err) { fail(target, err); });
  }

  function start() {
    var nodes = document.querySelectorAll("script[type='application/json'][data-precnb-chart]");
    for (var i = 0; i < nodes.length; i++) { embed(nodes[i]); }
  }

  // printing: open collapsed sections, close them again afterwards
  window.addEventListener("beforeprint", function () {
    var d = document.querySelectorAll("details:not([open])");
    for (var i = 0; i < d.length; i++) { d[i].setAttribute("data-print-opened", ""); d[i].open = true; }
  });
  window.addEventListener("afterprint", function () {
    var d = document.querySelectorAll("details[data-print-opened]");
    for (var i = 0; i < d.length; i++) { d[i].open = false; d[i].removeAttribute("data-print-opened"); }
  });

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
