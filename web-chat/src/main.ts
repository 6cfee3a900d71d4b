/**
 * The web chat's entry point: makes the store, the view and the actions, renders after
 * every change (and while someone is typing, so the indicator expires), and signs in
 * again with the tab's remembered session.
 */
import { Actions } from "./actions.js";
import { loadSession } from "./session.js";
import { Store } from "./state.js";
import { View } from "./view.js";

/** The server URL offered when the tab remembers none: im-server's default listener. */
const DEFAULT_SERVER = "ws://127.0.0.1:7070/ws";

function main(): void {
  const store = new Store();
  const actions = new Actions(store, sessionStorage);
  const view = new View(actions);
  let queued = false;
  const render = (): void => {
    if (queued) return;
    queued = true;
    queueMicrotask(() => {
      queued = false;
      view.render(store.state, Date.now());
    });
  };
  store.subscribe(render);
  setInterval(() => {
    for (const c of store.state.conversations.values()) if (c.typing) return render();
  }, 1000);
  const saved = loadSession(sessionStorage);
  if (saved) {
    actions.signIn(saved.serverUrl, saved.token);
  } else {
    view.showSignIn(DEFAULT_SERVER, "");
  }
}

main();
