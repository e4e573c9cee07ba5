// Entry point: wires the API key box, the library (collections, uploads, documents), the ask
// panel and the conversation panel together.

import { api, getApiKey, setApiKey } from "./api.js";
import { Answers } from "./answers.js";
import { Conversation } from "./conversation.js";
import { say } from "./dom.js";
import { Library } from "./library.js";

const keyForm = document.querySelector("#key-form");
const keyInput = document.querySelector("#api-key");
const keyState = document.querySelector("#key-state");
const keyAlert = document.querySelector("#key-alert");

function showKeyState() {
  keyState.textContent = getApiKey() ? "key set for this session" : "no key";
  document.querySelector("#forget-key").hidden = !getApiKey();
}

function onAuthError(detail) {
  say(keyAlert, `${detail}: enter an API key.`);
  document.querySelector("#key-box").open = true;
  keyInput.focus();
}

const library = new Library(document.querySelector("#library"), onAuthError);
const answers = new Answers(document.querySelector("#ask"), document.querySelector("#viewer"),
  onAuthError);
const conversation = new Conversation(document.querySelector("#chat"), onAuthError);
library.addEventListener("change", (e) => {
  answers.setScope(e.detail);
  conversation.setScope(e.detail);
});

keyForm.addEventListener("submit", async (e) => {
  e.preventDefault();
  setApiKey(keyInput.value.trim());
  keyInput.value = "";
  say(keyAlert, "");
  await start();
});
document.querySelector("#forget-key").addEventListener("click", () => {
  setApiKey("");
  showKeyState();
  library.refresh().catch(() => {});
});
document.querySelector("#viewer-close").addEventListener("click", () =>
  document.querySelector("#viewer").close());

async function showModel() {
  try {
    const info = await api("GET", "/v1/info");
    document.querySelector("#model-line").textContent =
      `model ${info.model} · policy ${info.policy} · budget ${Math.round(info.budget * 100)}%`;
    const note = document.querySelector("#model-note");
    note.hidden = !String(info.model).startsWith("builtin:");
    note.textContent = `${info.model} has random weights: its answers are noise. The cited ` +
      "pages, their snippets and the cost figures are real.";
  } catch {
    /* shown once a key is entered */
  }
}

async function start() {
  showKeyState();
  await library.refresh().catch(() => {});
  await showModel();
}

start();
