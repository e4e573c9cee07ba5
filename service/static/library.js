// Collections (pick or create), document upload (PDFs, images, Office files, e-books, text:
// drag and drop or file picker, optional password), and the document list with per-document
// progress, page facts and delete. Ready documents carry a tick box choosing the ones a
// question is asked over (all of them by default).

import { api } from "./api.js";
import { el, say } from "./dom.js";
import { showUsage } from "./usage.js";

const COLLECTION_STORAGE = "conduit.collection";
const STAGES = { queued: "queued", render: "rendering", text: "reading text", index: "indexing",
  prefill: "prefilling KV", done: "done" };

export class Library extends EventTarget {
  constructor(root, onAuthError) {
    super();
    this.root = root;
    this.onAuthError = onAuthError;
    this.select = root.querySelector("#collection");
    this.docList = root.querySelector("#documents");
    this.alert = root.querySelector("#library-alert");
    this.polls = new Map();
    this.collectionId = "";
    this.docs = new Map();
    // the ready documents to ask over: null means all of them (documents that become ready
    // later included); otherwise the ids the user ticked
    this.chosen = null;
    this.allBox = root.querySelector("#scope-all");
    this.allBox.addEventListener("change", () => {
      this.chosen = this.allBox.checked ? null : new Set();
      this.changed();
    });
    // failures are shown in the alert region by guard(); nothing is left unhandled
    const quiet = () => {};
    root.querySelector("#collection-form").addEventListener("submit",
      (e) => this.create(e).catch(quiet));
    this.select.addEventListener("change", () => this.use(this.select.value).catch(quiet));
    this.bindUpload(root.querySelector("#dropzone"), root.querySelector("#file-input"));
  }

  async guard(promise) {
    try {
      return await promise;
    } catch (err) {
      if (err.status === 401) this.onAuthError(err.detail); // said once, by the key box
      else say(this.alert, err.detail || String(err));
      throw err;
    }
  }

  async refresh() {
    say(this.alert, "");
    this.usage();
    const cols = await this.guard(api("GET", "/v1/collections"));
    this.select.replaceChildren(
      ...(cols.length ? [] : [el("option", { value: "" }, "no collections yet")]),
      ...cols.map((c) => el("option", { value: c.collection_id }, c.name)));
    const saved = localStorage.getItem(COLLECTION_STORAGE);
    const pick = cols.find((c) => c.collection_id === saved) || cols[0];
    await this.use(pick ? pick.collection_id : "");
  }

  async create(event) {
    event.preventDefault();
    const input = this.root.querySelector("#new-collection");
    const name = input.value.trim();
    if (!name) {
      say(this.alert, "Type a name for the new collection.");
      input.focus();
      return;
    }
    const col = await this.guard(api("POST", "/v1/collections", { name }));
    input.value = "";
    this.select.querySelector('option[value=""]')?.remove();
    this.select.append(el("option", { value: col.collection_id }, col.name));
    say(this.alert, `Collection “${col.name}” created.`, "info");
    await this.use(col.collection_id);
  }

  async use(collectionId) {
    this.collectionId = collectionId;
    this.select.value = collectionId;
    for (const timer of this.polls.values()) clearTimeout(timer);
    this.polls.clear();
    this.docs.clear();
    this.chosen = null;
    this.docList.replaceChildren();
    this.root.querySelector("#upload").toggleAttribute("disabled", !collectionId);
    if (collectionId) {
      localStorage.setItem(COLLECTION_STORAGE, collectionId);
      const docs = await this.guard(api("GET", `/v1/collections/${collectionId}/documents`));
      docs.forEach((d) => this.show(d));
    }
    this.changed();
  }

  isChosen(id) {
    return this.chosen === null || this.chosen.has(id);
  }

  /** Tick or untick one ready document. */
  choose(id, on) {
    const ready = this.ready().map((d) => d.document_id);
    if (this.chosen === null) this.chosen = new Set(ready);
    if (on) this.chosen.add(id);
    else this.chosen.delete(id);
    this.changed();
  }

  ready() {
    return [...this.docs.values()].filter((d) => d.status === "ready");
  }

  changed() {
    const ready = this.ready();
    if (this.chosen !== null) {
      const ids = new Set(ready.map((d) => d.document_id));
      for (const id of this.chosen) if (!ids.has(id)) this.chosen.delete(id);
      // every one ticked is all again; with fewer than two ready there is nothing to choose
      if (this.chosen.size === ready.length || ready.length < 2) this.chosen = null;
    }
    const chosen = ready.filter((d) => this.isChosen(d.document_id));
    for (const box of this.docList.querySelectorAll("input.pick")) {
      box.checked = this.isChosen(box.value);
    }
    this.allBox.checked = chosen.length === ready.length;
    this.allBox.indeterminate = chosen.length > 0 && chosen.length < ready.length;
    this.root.querySelector("#scope-count").textContent =
      `${chosen.length} of ${ready.length} ticked`;
    this.root.querySelector("#scope").hidden = ready.length < 2;
    this.root.classList.toggle("choosing", ready.length >= 2);
    this.root.querySelector("#empty-docs").hidden = this.docs.size > 0;
    this.dispatchEvent(new CustomEvent("change",
      { detail: { collectionId: this.collectionId, ready, chosen } }));
  }

  bindUpload(zone, input) {
    zone.querySelector("#choose-files").addEventListener("click", () => input.click());
    input.addEventListener("change", () => {
      this.upload([...input.files]);
      input.value = "";
    });
    for (const type of ["dragenter", "dragover"]) {
      zone.addEventListener(type, (e) => {
        e.preventDefault();
        zone.classList.add("dragging");
      });
    }
    for (const type of ["dragleave", "drop"]) {
      zone.addEventListener(type, () => zone.classList.remove("dragging"));
    }
    zone.addEventListener("drop", (e) => {
      e.preventDefault();
      this.upload([...e.dataTransfer.files]);
    });
  }

  usage() {
    return showUsage(this.root.querySelector("#usage-line"));
  }

  async upload(files) {
    if (!this.collectionId) {
      say(this.alert, "Create or pick a collection first.");
      return;
    }
    const password = this.root.querySelector("#pdf-password").value;
    for (const file of files) {
      const form = new FormData();
      form.append("file", file, file.name);
      if (password) form.append("password", password);
      const row = this.row({ document_id: "", filename: file.name, status: "uploading",
        stage: "queued", pages_done: 0, pages_total: 0, error: null });
      this.docList.prepend(row);
      try {
        const out = await api("POST", `/v1/collections/${this.collectionId}/documents`, form);
        row.remove();
        this.show({ document_id: out.document_id, filename: file.name, status: out.status,
          stage: "queued", pages_done: 0, pages_total: 0, error: null });
      } catch (err) {
        if (err.status === 401) this.onAuthError(err.detail);
        row.replaceWith(this.row({ document_id: "", filename: file.name, status: "rejected",
          stage: "done", pages_done: 0, pages_total: 0, error: err.detail || String(err) }));
      }
    }
    this.usage();
  }

  show(doc) {
    const row = this.row(doc);
    const old = this.docList.querySelector(`[data-id="${doc.document_id}"]`);
    if (old) old.replaceWith(row);
    else this.docList.append(row);
    this.docs.set(doc.document_id, doc);
    if (doc.status === "queued" || doc.status === "processing") this.poll(doc.document_id);
    if (doc.status === "ready") this.pageFacts(doc, row);
    this.changed();
  }

  poll(id) {
    if (this.polls.has(id)) return;
    const tick = async () => {
      this.polls.delete(id);
      try {
        const doc = await api("GET", `/v1/documents/${id}`);
        if (this.docs.has(id)) this.show(doc);
      } catch (err) {
        if (this.docs.has(id)) this.polls.set(id, setTimeout(tick, 2000));
      }
    };
    this.polls.set(id, setTimeout(tick, 500));
  }

  async pageFacts(doc, row) {
    try {
      const pages = await api("GET", `/v1/documents/${doc.document_id}/pages`);
      const cached = pages.filter((p) => p.kv_cached).length;
      const tiers = [...new Set(pages.flatMap((p) => p.kv_tiers))];
      const ocr = pages.filter((p) => p.ocr).length;
      row.querySelector(".doc-meta").textContent =
        `${pages.length} page${pages.length === 1 ? "" : "s"} · KV cached ${cached}/${pages.length}` +
        (tiers.length ? ` (${tiers.join(", ")})` : "") + (ocr ? ` · ${ocr} OCRed` : "");
    } catch {
      /* the facts line is optional */
    }
  }

  row(doc) {
    const busy = doc.status === "queued" || doc.status === "processing" ||
      doc.status === "uploading";
    const pct = doc.pages_total ? Math.round((100 * doc.pages_done) / doc.pages_total) : 0;
    const label = doc.status === "uploading" ? "uploading…" :
      `${STAGES[doc.stage] || doc.stage} ${doc.pages_done}/${doc.pages_total}`;
    const del = el("button", { type: "button", class: "delete", disabled: busy || !doc.document_id,
      "aria-label": `Delete ${doc.filename}` }, "Delete");
    del.addEventListener("click", () => this.remove(doc, del));
    const meta = doc.status === "ready" ? `${doc.pages_total} pages` : "";
    const name = el("span", { class: "doc-name", title: doc.filename }, doc.filename);
    let head = name;
    if (doc.status === "ready") {
      const pick = el("input", { type: "checkbox", class: "pick", value: doc.document_id,
        checked: this.isChosen(doc.document_id), "aria-label": `Ask over ${doc.filename}` });
      pick.addEventListener("change", () => this.choose(doc.document_id, pick.checked));
      head = el("label", { class: "doc-pick" }, pick, name);
    }
    return el("li", { class: `doc status-${doc.status}`, "data-id": doc.document_id || null },
      el("div", { class: "doc-head" }, head,
        el("span", { class: `badge ${doc.status}` }, doc.status)),
      busy ? el("div", { class: "progress" },
        el("progress", { max: 100, value: pct, "aria-label": `${doc.filename}: ${label}` }),
        el("span", { class: "progress-label" }, label)) : null,
      el("div", { class: "doc-foot" },
        el("span", { class: "doc-meta" }, meta),
        doc.document_id ? del : doc.status === "rejected" ? dismiss() : null),
      doc.error ? el("p", { class: "doc-error", role: "alert" }, doc.error) : null);
  }

  async remove(doc, button) {
    if (button.dataset.armed !== "1") {
      button.dataset.armed = "1";
      button.textContent = "Confirm delete";
      setTimeout(() => {
        button.dataset.armed = "";
        button.textContent = "Delete";
      }, 5000);
      return;
    }
    button.disabled = true;
    try {
      await this.guard(api("DELETE", `/v1/documents/${doc.document_id}`));
      this.docList.querySelector(`[data-id="${doc.document_id}"]`)?.remove();
      this.docs.delete(doc.document_id);
      say(this.alert, `Deleted ${doc.filename}.`, "info");
      this.usage();
      this.changed();
    } catch {
      button.disabled = false;
    }
  }
}

function dismiss() {
  const b = el("button", { type: "button", class: "dismiss" }, "Dismiss");
  b.addEventListener("click", () => b.closest("li").remove());
  return b;
}
