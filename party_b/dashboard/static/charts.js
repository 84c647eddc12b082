// Line and dot charts drawn as inline SVG: axes with round ticks, linear or log y, a legend.
// No library. Charts.draw(svg, {series, logY, fromZero, format, empty}) replaces the svg's
// content; each series is {name, points: [[x, y], ...], dots: bool, color: 0-5}; a null y
// breaks a line. The svg's data-last-step and data-points tell what it shows (tests read them).
"use strict";

const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const MARGIN = { left: 58, right: 14, top: 22, bottom: 24 };

  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, content, anchor) {
    const node = el("text", { x, y, "text-anchor": anchor || "start" }, parent);
    node.textContent = content;
    return node;
  }

  // Round tick values covering [lo, hi]: steps of 1, 2 or 5 times a power of ten.
  function linearTicks(lo, hi, count) {
    if (!(hi > lo)) return [lo];
    const raw = (hi - lo) / count;
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((s) => s >= raw);
    const ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
      ticks.push(Math.abs(t) < step * 1e-9 ? 0 : t);
    }
    return ticks;
  }

  function logTicks(lo, hi) {
    const ticks = [];
    for (let p = Math.floor(Math.log10(lo)); p <= Math.ceil(Math.log10(hi)); p++) {
      for (const m of hi / lo < 100 ? [1, 2, 5] : [1]) {
        const t = m * Math.pow(10, p);
        if (t >= lo && t <= hi) ticks.push(t);
      }
    }
    return ticks.length ? ticks : [lo, hi];
  }

  function extent(values, pad, logY) {
    let lo = Math.min(...values);
    let hi = Math.max(...values);
    if (logY) return [lo / 1.5, hi * 1.5];
    if (lo === hi) {
      const spread = Math.abs(lo) * 0.1 || 1;
      return [lo - spread, hi + spread];
    }
    const margin = (hi - lo) * pad;
    return [lo >= 0 && lo - margin < 0 ? 0 : lo - margin, hi + margin];
  }

  function compact(value) {
    const abs = Math.abs(value);
    if (abs >= 1e9) return (value / 1e9).toPrecision(3).replace(/\.?0+$/, "") + "G";
    if (abs >= 1e6) return (value / 1e6).toPrecision(3).replace(/\.?0+$/, "") + "M";
    if (abs >= 1e4) return (value / 1e3).toPrecision(3).replace(/\.?0+$/, "") + "k";
    if (abs >= 100 || value === 0) return String(Math.round(value));
    return value.toPrecision(3).replace(/\.?0+$/, "");
  }

  function draw(svg, options) {
    const series = options.series.filter((s) => s.points.some((p) => isFinite(p[1])));
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const width = svg.clientWidth || 480;
    const height = svg.clientHeight || 210;
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    const usable = (p) => p[1] !== null && isFinite(p[1]) && (!options.logY || p[1] > 0);
    const points = series.flatMap((s) => s.points.filter(usable));
    svg.dataset.points = String(points.length);
    svg.dataset.lastStep = String(points.length ? Math.max(...points.map((p) => p[0])) : 0);
    if (!points.length) {
      const empty = text(svg, width / 2, height / 2, options.empty || "nothing yet", "middle");
      empty.setAttribute("class", "empty");
      return;
    }
    const [x0, x1] = extent(points.map((p) => p[0]), 0, false);
    let [y0, y1] = extent(points.map((p) => p[1]), 0.08, options.logY);
    if (options.fromZero && !options.logY) [y0, y1] = [Math.min(0, y0), Math.max(y1, 1e-9)];
    const plotW = width - MARGIN.left - MARGIN.right;
    const plotH = height - MARGIN.top - MARGIN.bottom;
    const sx = (x) => MARGIN.left + ((x - x0) / (x1 - x0)) * plotW;
    const fy = options.logY ? (y) => Math.log10(y) : (y) => y;
    const sy = (y) => MARGIN.top + plotH - ((fy(y) - fy(y0)) / (fy(y1) - fy(y0))) * plotH;
    const format = options.format || compact;

    const axis = el("g", { class: "axis" }, svg);
    const yTicks = options.logY ? logTicks(y0, y1) : linearTicks(y0, y1, 4);
    for (const t of yTicks) {
      el("line", { x1: MARGIN.left, x2: width - MARGIN.right, y1: sy(t), y2: sy(t) }, axis);
      text(axis, MARGIN.left - 6, sy(t) + 4, format(t), "end");
    }
    for (const t of linearTicks(x0, x1, 6).filter((t) => Number.isInteger(t))) {
      text(axis, sx(t), height - 6, compact(t), "middle");
    }
    text(axis, MARGIN.left - 6, height - 6, "step", "end");

    series.forEach((s, i) => {
      const color = s.color === undefined ? i % 6 : s.color;
      if (s.dots) {
        const group = el("g", { class: "dots" }, svg);
        for (const p of s.points.filter(usable)) {
          el("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 3.5, class: `f${color}` }, group);
        }
      } else {
        for (const run of segments(s.points, usable)) {
          const d = run.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
          el("polyline", { points: d, class: `series c${color}` }, svg);
        }
      }
    });
    legend(svg, series, width);
  }

  function segments(points, usable) {
    const runs = [[]];
    for (const p of points) {
      if (usable(p)) runs[runs.length - 1].push(p);
      else if (runs[runs.length - 1].length) runs.push([]);
    }
    return runs.filter((r) => r.length);
  }

  function legend(svg, series, width) {
    const group = el("g", { class: "legend" }, svg);
    let x = width - MARGIN.right;
    for (let i = series.length - 1; i >= 0; i--) {
      const s = series[i];
      const color = s.color === undefined ? i % 6 : s.color;
      const label = text(group, x, 12, s.name, "end");
      x -= label.getComputedTextLength ? label.getComputedTextLength() + 6 : s.name.length * 6;
      el("rect", { x: x - 10, y: 4, width: 10, height: 10, class: `f${color}` }, group);
      x -= 22;
    }
  }

  return { draw, compact };
})();
