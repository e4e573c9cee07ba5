// A tiny element builder: el("p", {class: "x", onclick: f}, "text", child). Text is always set
// as text (never parsed as HTML), so server data cannot inject markup.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(node.dataset, value);
    else if (value === true) node.setAttribute(name, "");
    else node.setAttribute(name, String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** Show a message in an alert region (role="alert"); empty text hides it. */
export function say(region, text, kind = "error") {
  region.textContent = text || "";
  region.dataset.kind = kind;
  region.hidden = !text;
}

export function fmtSeconds(s) {
  if (s === undefined || s === null) return "–";
  return s < 1 ? `${(s * 1000).toFixed(0)} ms` : `${s.toFixed(2)} s`;
}

export function fmtPercent(x) {
  if (x === undefined || x === null) return "–";
  return `${(x * 100).toFixed(x < 0.1 ? 1 : 0)}%`;
}
