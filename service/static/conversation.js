// A conversation: a thread of turns over the chosen documents (POST /v1/conversations, then
// each question streamed from POST /v1/conversations/{id}/messages/stream), each turn with the
// pages it cited; a follow-up box under the thread, "New conversation", and the list of the
// caller's conversations (GET /v1/conversations) to open one again.

import { api, ApiError, stream } from "./api.js";
import { el, fmtPercent, say } from "./dom.js";

export class Conversation {
  constructor(root, onAuthError) {
    this.root = root;
    this.onAuthError = onAuthError;
    this.thread = root.querySelector("#thread");
    this.form = root.querySelector("#follow-form");
    this.input = root.querySelector("#follow-up");
    this.picker = root.querySelector("#conversations");
    this.alert = root.querySelector("#chat-alert");
    this.collectionId = "";
    this.ready = [];
    this.chosen = [];
    this.id = "";
    this.form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.send();
    });
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        this.form.requestSubmit();
      }
    });
    root.querySelector("#new-conversation").addEventListener("click", () => this.start(""));
    this.picker.addEventListener("change", () => this.start(this.picker.value));
  }

  /** The collection and the documents ticked in the library (a new conversation's scope). */
  setScope({ collectionId, ready, chosen = ready }) {
    const moved = collectionId !== this.collectionId;
    this.collectionId = collectionId;
    this.ready = ready;
    this.chosen = chosen;
    this.form.querySelector("button[type=submit]").disabled = !collectionId ||
      (!this.id && chosen.length === 0);
    if (moved) this.list().catch(() => {});
  }

  /** The caller's conversations in the picker, the open one selected. */
  async list() {
    const all = await api("GET", "/v1/conversations");
    this.picker.replaceChildren(el("option", { value: "" }, "(a new conversation)"),
      ...all.map((c) => el("option", { value: c.conversation_id, selected: c.conversation_id ===
        this.id }, c.title || c.conversation_id)));
  }

  /** Open conversation `id` (its turns), or an empty thread for a new one ("" ). */
  async start(id) {
    this.id = id;
    this.thread.replaceChildren();
    say(this.alert, "");
    this.setScope({ collectionId: this.collectionId, ready: this.ready, chosen: this.chosen });
    if (!id) {
      this.picker.value = "";
      this.input.focus();
      return;
    }
    const conv = await api("GET", `/v1/conversations/${encodeURIComponent(id)}`);
    for (const turn of conv.turns) {
      const node = this.turnNode(turn.question);
      node.querySelector(".turn-answer").textContent = turn.answer;
      this.finish(node, { ...turn.details, citations: turn.citations });
    }
  }

  turnNode(question) {
    const node = el("article", { class: "turn", "aria-label": `Turn: ${question}` },
      el("p", { class: "turn-question" }, question),
      el("p", { class: "turn-answer", "aria-live": "polite" }),
      el("ul", { class: "turn-pages", "aria-label": "Cited pages" }),
      el("p", { class: "turn-meta muted small" }));
    this.thread.append(node);
    return node;
  }

  finish(node, out) {
    node.querySelector(".turn-pages").replaceChildren(...out.citations.map((c) =>
      el("li", {}, el("span", { class: "page-chip" }, `${c.filename} p.${c.page}`),
        c.snippet ? el("span", { class: "muted small" }, ` ${c.snippet.text}`) : null)));
    const cache = out.cache || {};
    node.querySelector(".turn-meta").textContent = [
      cache.conversation === "hit" ? "earlier turns' KV reused"
        : cache.conversation === "rebuilt" ? "earlier turns rebuilt" : "first turn",
      out.flops_ratio_lm === undefined ? null : `${fmtPercent(out.flops_ratio_lm)} of a full ` +
        "prefill's LM FLOPs",
      out.dropped_turns ? `${out.dropped_turns} oldest turn(s) left out` : null,
    ].filter(Boolean).join(" · ");
  }

  async send() {
    const question = this.input.value.trim();
    if (!question) {
      say(this.alert, "Type a question first.");
      return;
    }
    say(this.alert, "");
    try {
      if (!this.id) {
        const body = { collection_id: this.collectionId, title: question.slice(0, 200) };
        if (this.chosen.length < this.ready.length) {
          body.document_ids = this.chosen.map((d) => d.document_id);
        }
        this.id = (await api("POST", "/v1/conversations", body)).conversation_id;
        await this.list();
      }
      this.input.value = "";
      const node = this.turnNode(question);
      const answer = node.querySelector(".turn-answer");
      await stream(`/v1/conversations/${encodeURIComponent(this.id)}/messages/stream`,
        { question, top_k: Number(this.root.querySelector("#chat-top-k").value),
          max_new_tokens: 48 },
        (name, data) => {
          if (name === "token") answer.textContent += data.text;
          else if (name === "done") this.finish(node, data);
          else if (name === "error") say(this.alert, data.detail);
        });
      node.classList.add("done");
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) this.onAuthError(err.detail);
      else say(this.alert, err.detail || String(err));
    }
  }
}
