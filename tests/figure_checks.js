// What every plotly figure must show, read from plotly.js's own layout once drawn: the data inside
// each axis's range and that range no more than a decade wider on a log axis (a shape or an
// annotation placed in the wrong units stretches it), no empty subplot, every axis with ticks titled.
(root) => {
  const problems = [];
  const finite = (v) => typeof v === "number" && Number.isFinite(v);
  for (const gd of document.querySelectorAll(root + " .js-plotly-plot")) {
    const L = gd._fullLayout;
    if (!L || !gd._fullData) continue;
    const cell = gd.closest(".jp-Cell"), cells = [...document.querySelectorAll(root + " .jp-Cell")];
    const where = cell ? `cell ${cells.indexOf(cell)}: ` : "";
    const title = L.title && L.title.text && !/^Click to enter/.test(L.title.text) ? L.title.text : "(untitled figure)";
    const name = where + title.replace(/<[^>]+>/g, "").slice(0, 60);
    // a live figure (a FigureWidget) after Run All: drawn with its title and traces that hold points,
    // not the bare axes of a widget that drew before its figure reached the browser
    if (gd.closest(".jupyter-widgets")) {
      const points = gd._fullData.reduce((n, t) => n + ((t.x && t.x.length) || (t.y && t.y.length) || 0), 0);
      if (!gd._fullData.length || !points || title === "(untitled figure)") {
        problems.push(`${name}: a live figure drawn empty (${gd._fullData.length} traces, ${points} points)`);
        continue;
      }
    }
    const axes = Object.keys(L).filter((k) => /^[xy]axis\d*$/.test(k));
    for (const key of axes) {
      const ax = L[key], letter = key[0];
      if (!ax || !ax._id || ax.visible === false) continue;
      const traces = gd._fullData.filter((t) => t.visible === true && (t[letter + "axis"] || letter) === ax._id);
      if (!traces.length) {
        const drawn = (L.shapes || []).concat(L.annotations || []).some((s) => s[letter + "ref"] && s[letter + "ref"].startsWith(ax._id));
        if (!drawn && !ax.matches && !ax.overlaying) problems.push(`${name}: ${key} has no data (an empty subplot)`);
        continue;
      }
      if (ax.showticklabels !== false && !ax.matches && !(ax.title && ax.title.text) && ax.type !== "category")
        problems.push(`${name}: ${key} has no title`);
      if (ax.type !== "log" || !Array.isArray(ax.range) || ax.matches) continue;  // a matched axis: with its own
      // an axis shares its range with the axes that match it (make_subplots(shared_yaxes=True)): their data too
      const ids = [ax._id, ...axes.filter((k) => k[0] === letter && L[k].matches === ax._id).map((k) => L[k]._id)];
      const shared = gd._fullData.filter((t) => t.visible === true && ids.includes(t[letter + "axis"] || letter)
        && (Array.isArray(t[letter]) || ArrayBuffer.isView(t[letter])));
      const vals = [];
      for (const t of shared) for (const v of t[letter]) if (finite(v) && v > 0) vals.push(Math.log10(v));
      for (const sh of L.shapes || [])  // a shape is drawn at its data value: a line past the data is meant
        if (ids.includes(sh[letter + "ref"])) for (const v of [sh[letter + "0"], sh[letter + "1"]]) if (finite(v) && v > 0) vals.push(Math.log10(v));
      if (!vals.length) continue;
      const lo = Math.min(...vals), hi = Math.max(...vals), [r0, r1] = ax.range;
      if (lo < r0 - 1e-6 || hi > r1 + 1e-6)
        problems.push(`${name}: ${key} shows 10^${r0.toFixed(1)}–10^${r1.toFixed(1)}, its data run 10^${lo.toFixed(1)}–10^${hi.toFixed(1)}`);
      else if (ax.autorange !== false && (lo - r0 > 1 || r1 - hi > 1))  // a range set by hand is meant
        problems.push(`${name}: ${key} runs 10^${r0.toFixed(1)}–10^${r1.toFixed(1)}, more than a decade past its data (10^${lo.toFixed(1)}–10^${hi.toFixed(1)})`);
    }
    // Text that fits: no label cut off at the figure's edge, and no legend drawn over a bar's label,
    // an annotation or a tick label (read from the rendered boxes, in screen pixels)
    const box = gd.getBoundingClientRect();
    if (box.width < 50 || box.height < 50) continue;  // not laid out (a collapsed output)
    const label = (el) => (el.textContent || "").trim().slice(0, 40);
    const texts = [...gd.querySelectorAll(
      ".textpoint text, .annotation-text-g text, .xtick text, .ytick text, .g-xtitle text, .g-ytitle text, .legendtext")]
      .filter((el) => label(el) && el.getBoundingClientRect().width > 0);
    for (const el of texts) {
      const r = el.getBoundingClientRect();
      if (r.left < box.left - 2 || r.right > box.right + 2 || r.top < box.top - 2 || r.bottom > box.bottom + 2)
        problems.push(`${name}: the text "${label(el)}" is cut off at the figure's edge`);
    }
    // a point's label: inside its subplot's plotting area (plotly clips it at that edge, not the
    // figure's) and clear of every other point's label
    const points = [...gd.querySelectorAll(".textpoint text")].filter((el) => label(el) && el.getBoundingClientRect().width > 0);
    const boxes = points.map((el) => el.getBoundingClientRect());
    points.forEach((el, i) => {
      const sub = el.closest(".subplot"), plot = sub && L._plots && L._plots[[...sub.classList].find((c) => L._plots[c])];
      if (!plot) return;
      const r = boxes[i], left = box.left + plot.xaxis._offset, top = box.top + plot.yaxis._offset;
      if (r.left < left - 2 || r.right > left + plot.xaxis._length + 2 || r.top < top - 2 || r.bottom > top + plot.yaxis._length + 2)
        problems.push(`${name}: the label "${label(el)}" is cut off at the plotting area's edge`);
      for (let j = 0; j < i; j++) {
        const q = boxes[j], w = Math.min(r.right, q.right) - Math.max(r.left, q.left), h = Math.min(r.bottom, q.bottom) - Math.max(r.top, q.top);
        if (w > 2 && h > 2) problems.push(`${name}: the labels "${label(points[j])}" and "${label(el)}" overlap`);
      }
    });
    const legend = gd.querySelector(".legend .bg") || gd.querySelector(".legend");
    if (legend && L.showlegend !== false) {
      const g = legend.getBoundingClientRect();
      const covered = texts.filter((el) => !el.classList.contains("legendtext") && !el.closest(".legend")).find((el) => {
        const r = el.getBoundingClientRect();
        const w = Math.min(r.right, g.right) - Math.max(r.left, g.left), h = Math.min(r.bottom, g.bottom) - Math.max(r.top, g.top);
        return w > 2 && h > 2;
      });
      if (covered) problems.push(`${name}: the legend is drawn over "${label(covered)}"`);
    }
  }
  return problems;
}
