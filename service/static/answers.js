// Asking: the answer streams in token by token (POST /v1/query/stream), then its cited pages
// appear as thumbnails with the highlighted snippet, and a details panel shows what the answer
// cost and where its page KV came from. "Compare" re-asks with full prefill beside it, over
// the same documents. A question goes to the documents ticked in the library (`document_ids`
// when not all of them are), and its answer names the documents that were searched.

import { pageImage, stream } from "./api.js";
import { el, fmtPercent, fmtSeconds, say } from "./dom.js";

const THUMB_WIDTH = 240;
const FULL_WIDTH = 1400;
const TIERS = ["memory", "redis", "disk"];
const SEARCHED_NAMES = 8; // names listed with an answer; the rest are counted

export class Answers {
  constructor(root, viewer, onAuthError) {
    this.root = root;
    this.viewer = viewer;
    this.onAuthError = onAuthError;
    this.form = root.querySelector("#ask-form");
    this.question = root.querySelector("#question");
    this.list = root.querySelector("#answers");
    this.alert = root.querySelector("#ask-alert");
    this.collectionId = "";
    this.ready = [];
    this.chosen = [];
    this.form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.ask();
    });
    this.question.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        this.form.requestSubmit();
      }
    });
  }

  /** The collection, its ready documents and the ones ticked to ask over. */
  setScope({ collectionId, ready, chosen = ready }) {
    this.collectionId = collectionId;
    this.ready = ready;
    this.chosen = chosen;
    const button = this.form.querySelector("button[type=submit]");
    button.disabled = !collectionId || chosen.length === 0;
    const n = ready.length;
    this.root.querySelector("#ask-hint").textContent = !collectionId
      ? "Create or pick a collection, then upload a document."
      : n === 0 ? "Upload a document; you can ask once it is ready."
        : chosen.length === 0 ? "Tick a document to ask over."
          : chosen.length === n ? `Asking over ${n === 1 ? "1 ready document" :
            `all ${n} ready documents`}.`
            : `Asking over ${chosen.length} of ${n} ready documents.`;
  }

  async ask() {
    const text = this.question.value.trim();
    if (!text) {
      say(this.alert, "Type a question first.");
      this.question.focus();
      return;
    }
    say(this.alert, "");
    const body = { collection_id: this.collectionId, question: text,
      top_k: Number(this.root.querySelector("#top-k").value), max_new_tokens: 48 };
    const searched = this.chosen;
    // all ticked: the whole collection (as the API does without document_ids)
    if (searched.length < this.ready.length) body.document_ids = searched.map((d) => d.document_id);
    const card = el("article", { class: "answer-card", "aria-label": `Answer to: ${text}` },
      el("h3", { class: "asked" }, text), searchedNode(searched, this.ready.length));
    const runs = el("div", { class: "runs" });
    const citations = el("section", { class: "citations", "aria-label": "Cited pages" });
    card.append(runs, citations);
    this.list.prepend(card);
    const out = await this.run(runs, body, "Reused KV, selective refresh");
    if (!out) return;
    this.renderCitations(citations, out.citations);
    const compare = el("button", { type: "button", class: "compare" },
      "Compare with full prefill");
    compare.addEventListener("click", async () => {
      compare.disabled = true;
      runs.classList.add("compared");
      const full = this.run(runs, { ...body, policy: "full_prefill" }, "Full prefill (baseline)");
      const other = await full;
      if (other) runs.after(comparison(out, other));
      compare.remove();
    });
    card.insertBefore(compare, citations);
    this.question.select();
  }

  /** Stream one answer into a new column of `parent`; resolves to its `done` body or null. */
  run(parent, body, title) {
    const textBox = el("p", { class: "answer-text", "aria-live": "polite" });
    const status = el("span", { class: "run-status" }, "thinking…");
    const details = el("details", { class: "details" }, el("summary", {}, "Details"));
    const box = el("div", { class: "run", "data-policy": body.policy || "default" },
      el("div", { class: "run-head" }, el("h4", {}, title), status), textBox, details);
    parent.append(box);
    let answer = "";
    let final = null;
    return stream("/v1/query/stream", body, (name, data) => {
      if (name === "token") {
        answer += data.text;
        textBox.textContent = answer;
        status.textContent = "streaming…";
      } else if (name === "done") {
        final = data;
        textBox.textContent = data.answer || answer;
        status.textContent = `${data.policy} · ${fmtSeconds(data.timings.total_s)}`;
        details.append(detailList(data));
        box.dataset.done = "1";
      } else if (name === "error") {
        throw Object.assign(new Error(data.detail), { detail: data.detail });
      }
    }).then(() => final, (err) => {
      if (err.status === 401) this.onAuthError(err.detail);
      status.textContent = "failed";
      box.append(el("p", { class: "run-error", role: "alert" }, err.detail || String(err)));
      return null;
    });
  }

  renderCitations(section, citations) {
    section.replaceChildren(el("h4", {}, "Cited pages"),
      el("ol", { class: "cites" }, citations.map((c) => this.citation(c))));
  }

  citation(c) {
    const name = `${c.filename}, page ${c.page}`;
    const img = el("img", { alt: `Page ${c.page} of ${c.filename}`, width: THUMB_WIDTH,
      loading: "lazy" });
    pageImage(c.document_id, c.page, THUMB_WIDTH).then((url) => {
      img.src = url;
    }, () => img.replaceWith(el("span", { class: "thumb-missing" }, "image unavailable")));
    const open = el("button", { type: "button", class: "thumb", "aria-label": `Enlarge ${name}` },
      img);
    open.addEventListener("click", () => this.enlarge(c, open));
    return el("li", { class: "cite" }, open,
      el("div", { class: "cite-body" },
        el("p", { class: "cite-name" }, el("strong", {}, c.filename), ` · page ${c.page}`,
          el("span", { class: "score" }, ` · score ${c.score.toFixed(3)}`),
          c.attention == null ? null : el("span", { class: "attention",
            title: "how much the question looked at this page (its peak attention, " +
              "as a share of all cited pages')" },
          ` · attention ${(100 * c.attention).toFixed(0)}%`)),
        snippetNode(c.snippet)));
  }

  async enlarge(c, opener) {
    const v = this.viewer;
    const img = v.querySelector("img");
    img.removeAttribute("src");
    img.alt = `Page ${c.page} of ${c.filename}`;
    v.querySelector(".viewer-title").textContent = `${c.filename} · page ${c.page}`;
    v.querySelector(".viewer-snippet").replaceChildren(snippetNode(c.snippet));
    v.showModal();
    v.addEventListener("close", () => opener.focus(), { once: true });
    try {
      img.src = await pageImage(c.document_id, c.page, FULL_WIDTH);
    } catch (err) {
      v.querySelector(".viewer-snippet").append(el("p", { role: "alert" }, err.detail));
    }
  }
}

/** "Searched 1 of 2 documents: a.pdf" under the question (names as sent, ids as data). */
function searchedNode(docs, readyCount) {
  const shown = docs.slice(0, SEARCHED_NAMES);
  const names = shown.flatMap((d, i) => [i ? ", " : "",
    el("span", { class: "searched-doc", "data-document-id": d.document_id }, d.filename)]);
  const rest = docs.length - shown.length;
  const what = docs.length === readyCount
    ? `Searched ${readyCount === 1 ? "the only" : `all ${readyCount}`} ready document` +
      `${readyCount === 1 ? "" : "s"}: `
    : `Searched ${docs.length} of ${readyCount} ready documents: `;
  return el("p", { class: "searched small" }, what, names,
    rest > 0 ? ` and ${rest} more` : "");
}

export function snippetNode(snippet) {
  const p = el("p", { class: "snippet" });
  if (!snippet || !snippet.text) {
    p.append(el("em", {}, "This page has no text."));
    return p;
  }
  if (snippet.clipped_left) p.append("… ");
  let at = 0;
  for (const [start, end] of snippet.spans) {
    p.append(snippet.text.slice(at, start), el("mark", {}, snippet.text.slice(start, end)));
    at = end;
  }
  p.append(snippet.text.slice(at));
  if (snippet.clipped_right) p.append(" …");
  return p;
}

function flopsRatios(a) {
  if ("flops_ratio_lm" in a) {
    return [["FLOPs (LM) vs full prefill", fmtPercent(a.flops_ratio_lm)],
      ["FLOPs (with vision) vs full", fmtPercent(a.flops_ratio_total)]];
  }
  return [["FLOPs vs full prefill", fmtPercent(a.flops_ratio)]];
}

function detailList(a) {
  const cache = a.cache || { pages_from: {}, pages_prefilled_now: 0 };
  const tiers = TIERS.filter((t) => t in cache.pages_from)
    .map((t) => `${t} ${cache.pages_from[t]}`).join(" · ");
  const rows = [
    ["Policy", a.policy],
    ["Budget", fmtPercent(a.budget)],
    ["Prefill", a.fallback
      ? `full prefill from cached page embeddings: ${a.policy} was predicted to cost more here`
      : `${a.policy} over the cached page KV`],
    ["Time to first token", fmtSeconds(a.timings.ttft_s)],
    ["Total time", fmtSeconds(a.timings.total_s)],
    ...flopsRatios(a),
    ["Refreshed visual tokens", `${a.refreshed_visual_tokens} of ${a.visual_tokens}`],
    ["Pages from KV cache", tiers || "–"],
    ["Pages prefilled now", String(cache.pages_prefilled_now)],
    ["Prompt head from cache", `${cache.head_tokens || 0} tokens`],
  ];
  return el("dl", {}, rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

function comparison(reuse, full) {
  const lm = (a) => ("flops_ratio_lm" in a ? a.flops_ratio_lm : a.flops_ratio);
  const speed = full.timings.ttft_s / Math.max(reuse.timings.ttft_s, 1e-9);
  return el("p", { class: "comparison" },
    `Reuse: TTFT ${fmtSeconds(reuse.timings.ttft_s)}, ${fmtPercent(lm(reuse))} of the prefill ` +
    `FLOPs. Full prefill: TTFT ${fmtSeconds(full.timings.ttft_s)}, ${fmtPercent(lm(full))}. ` +
    `Time to first token ${speed >= 1 ? `${speed.toFixed(2)}× faster` :
      `${(1 / speed).toFixed(2)}× slower`} with reuse.`);
}
