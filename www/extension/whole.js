// Translating a block whole: a translation that stops at max_tokens (finish_reason "length") is
// not passed off as the whole block. A block longer than the answer can hold is split (sentences
// first, then clauses, then words, in two halves of about equal length) and each part translated
// the same way; a part that still cannot finish, or that is short enough to have fit (the model
// ran on instead of stopping), keeps its original text followed by a visible MARK.

export const MARK = " […]";

/** Two parts of `text` of about equal length, split at sentence ends, else clause marks, else
 *  spaces; null when it is one word. */
export function halves(text) {
  const t = text.trim();
  const units =
    [/(?<=[.!?…。]["'”’»)\]]*)\s+/, /(?<=[,;:])\s+/, /\s+/]
      .map((re) => t.split(re).filter(Boolean))
      .find((u) => u.length > 1) ?? null;
  if (!units) return null;
  const total = units.reduce((n, u) => n + u.length, 0);
  let acc = 0, i = 0;
  // Cut before the first unit whose middle lies past the half.
  while (i < units.length - 1 && acc + units[i].length / 2 <= total / 2) acc += units[i++].length;
  if (i === 0) i = 1;
  return [units.slice(0, i).join(" "), units.slice(i).join(" ")];
}

const join = (a, b) => (a && b ? a + " " + b : a || b);

/** Translates `text` whole. `translate(text, onPartial)` resolves to `{ text, cut }` (cut: the
 *  answer stopped at max_tokens) and reports its partial text as it streams; `onText(full)` gets
 *  the block's whole text so far (earlier parts + the part in progress). A part longer than
 *  `splitAbove` characters that gets cut is split; shorter ones keep their original + MARK.
 *  Resolves to `{ text, complete, requests }`. */
export async function translateWhole(translate, text, { splitAbove, onText = () => {}, depth = 0 } = {}) {
  let requests = 1;
  const r = await translate(text, (partial) => onText(partial));
  if (!r.cut) return { text: r.text, complete: true, requests };
  const parts = text.length > splitAbove && depth < 24 ? halves(text) : null;
  if (!parts) {
    onText(text + MARK);
    return { text: text + MARK, complete: false, requests };
  }
  let done = "", complete = true;
  for (const p of parts) {
    const sub = await translateWhole(translate, p, { splitAbove, depth: depth + 1, onText: (partial) => onText(join(done, partial)) });
    done = join(done, sub.text.trim());
    complete &&= sub.complete;
    requests += sub.requests;
  }
  return { text: done, complete, requests };
}
