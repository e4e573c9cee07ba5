// The public REST API, as the page uses it: JSON calls, SSE over fetch (POST bodies), images
// as blob URLs. The API key (if any) lives in sessionStorage and goes out as a bearer token.

const KEY_STORAGE = "conduit.apiKey";

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
    this.detail = detail;
  }
}

export function getApiKey() {
  return sessionStorage.getItem(KEY_STORAGE) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
}

function headers(extra = {}) {
  const h = { ...extra };
  const key = getApiKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function failure(resp) {
  let detail = `${resp.status} ${resp.statusText}`;
  try {
    const body = await resp.json();
    if (typeof body.detail === "string") detail = body.detail;
    else if (Array.isArray(body.detail)) {
      detail = body.detail.map((d) => `${(d.loc || []).slice(1).join(".")}: ${d.msg}`).join("; ");
    }
  } catch {
    /* not JSON: keep the status line */
  }
  return new ApiError(resp.status, detail);
}

/** JSON request; resolves to the parsed body (null for 204), rejects with ApiError. */
export async function api(method, path, body) {
  const init = { method, headers: headers() };
  if (body instanceof FormData) init.body = body;
  else if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const resp = await fetch(path, init);
  if (!resp.ok) throw await failure(resp);
  return resp.status === 204 ? null : resp.json();
}

/** POST a body to an SSE endpoint; calls onEvent(name, data) for each event. */
export async function stream(path, body, onEvent, signal) {
  const resp = await fetch(path, {
    method: "POST",
    headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
    body: JSON.stringify(body),
    signal,
  });
  if (!resp.ok) throw await failure(resp);
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) !== -1) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
      }
      if (data.length) onEvent(name, JSON.parse(data.join("\n")));
    }
  }
}

const imageCache = new Map();

/** A blob URL of a page image (fetched with the bearer token, which <img src> cannot send). */
export function pageImage(documentId, page, width) {
  const path = `/v1/documents/${encodeURIComponent(documentId)}/pages/${page}/image` +
    (width ? `?width=${width}` : "");
  if (!imageCache.has(path)) {
    const p = fetch(path, { headers: headers() }).then(async (resp) => {
      if (!resp.ok) throw await failure(resp);
      return URL.createObjectURL(await resp.blob());
    });
    p.catch(() => imageCache.delete(path));
    imageCache.set(path, p);
  }
  return imageCache.get(path);
}
