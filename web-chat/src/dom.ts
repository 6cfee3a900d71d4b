/**
 * Small DOM helpers. Text always goes in as text nodes (`textContent`), never as HTML,
 * so user text cannot inject markup.
 */

/** Child of {@link el}: an element, a string (becomes a text node), or nothing. */
export type Child = Node | string | null | undefined | false;

/** Makes `<tag>` with attributes (`class`, `data-*`, ...) and children. */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    node.append(typeof c === "string" ? document.createTextNode(c) : c);
  }
  return node;
}

/** The element with this id, of this type; throws when the page lacks it. */
export function byId<T extends HTMLElement>(id: string, type: new () => T): T {
  const node = document.getElementById(id);
  if (!(node instanceof type)) throw new Error(`the page has no #${id} ${type.name}`);
  return node;
}

/** Shows or hides an element. */
export function show(node: HTMLElement, visible: boolean): void {
  node.hidden = !visible;
}

/** A clock time (HH:MM) for a ms timestamp. */
export function clock(ms: number): string {
  if (!ms) return "";
  const d = new Date(ms);
  return `${String(d.getHours()).padStart(2, "0")}:${String(d.getMinutes()).padStart(2, "0")}`;
}

/** Sets a node's text only when it differs (a rewrite would drop a selection in it). */
export function setText(node: Element, text: string): void {
  if (node.textContent !== text) node.textContent = text;
}

/** Sets an attribute only when it differs. */
export function setAttr(node: Element, name: string, value: string): void {
  if (node.getAttribute(name) !== value) node.setAttribute(name, value);
}

/**
 * Makes `parent`'s children the nodes of `items`, in order, keeping the node already
 * made for each key (in `cache`) so a click or a selection on it survives a render.
 */
export function keyedChildren<T, N extends HTMLElement>(
  parent: HTMLElement,
  cache: Map<string, N>,
  items: readonly T[],
  key: (item: T) => string,
  make: (item: T) => N,
  update: (node: N, item: T) => void,
): void {
  const keep = new Set<string>();
  items.forEach((item, i) => {
    const k = key(item);
    keep.add(k);
    let node = cache.get(k);
    if (!node) {
      node = make(item);
      cache.set(k, node);
    }
    update(node, item);
    const at = parent.children[i];
    if (at !== node) parent.insertBefore(node, at ?? null);
  });
  for (const [k, node] of cache) {
    if (!keep.has(k)) {
      node.remove();
      cache.delete(k);
    }
  }
}
