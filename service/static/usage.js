// The tenant's usage line near the upload area: documents, pages and bytes stored against
// the quotas of `GET /v1/usage` (a null limit is unlimited). Failures leave the line as it was.

import { api } from "./api.js";

const count = (n) => n.toLocaleString("en");

function bytes(n) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

function part(measure, name, fmt) {
  const limit = measure.limit === null ? "" : ` of ${fmt(measure.limit)}`;
  return `${fmt(measure.used)}${limit} ${name}`;
}

/** Fill `line` with the caller's usage; resolves when shown (or when the call failed). */
export async function showUsage(line) {
  try {
    const u = await api("GET", "/v1/usage");
    line.textContent = "Using " + [part(u.documents, "documents", count),
      part(u.pages, "pages", count), part(u.bytes, "stored", bytes)].join(" · ");
    line.hidden = false;
  } catch {
    /* the key box or the library's alert says what is wrong */
  }
}
