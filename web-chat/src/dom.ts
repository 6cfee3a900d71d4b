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
