// Live updates without a reload: the server sends the grid fragment (rendered and
// escaped server-side) over server-sent events whenever the run's files change.
"use strict";
(function () {
  var live = document.getElementById("live");
  if (!live || !window.EventSource) { return; }
  var source = new EventSource(live.getAttribute("data-events"));
  source.onmessage = function (e) { live.innerHTML = e.data; live.setAttribute("data-version", e.lastEventId); };
})();
