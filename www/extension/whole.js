// Translating a block whole: a translation that stops at max_tokens (finish_reason "length") is
// not passed off as the whole block. A block longer than the answer can hold is split (sentences
// first, then clauses, then words, in two halves of about equal length) and each part translated
// the same way; a prompt over the model's context (error code context_length_exceeded) is split
// the same way. A part that still cannot finish, or that is short enough to have fit (the model
// ran on instead of stopping), keeps its original text followed by a visible MARK. One block
// makes at most requestCap(text, splitAbove) requests; parts left when they are spent keep their
// original text and the MARK too.

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

/** The most requests one block of `text` may make: about twice its number of parts of
 *  `splitAbove` characters, plus a few (a block that splits cleanly needs fewer). */
export const requestCap = (text, splitAbove) => 2 * Math.ceil(text.length / splitAbove) + 3;

/** Translates `text` whole. `translate(text, onPartial)` resolves to `{ text, cut }` (cut: the
 *  answer stopped at max_tokens) or rejects with an error whose `code` is
 *  `context_length_exceeded` (taken as a cut), and reports its partial text as it streams;
 *  `onText(full)` gets the block's whole text so far (earlier parts + the part in progress). A
 *  part longer than `splitAbove` characters that gets cut is split; shorter ones keep their
 *  original + MARK, as does every part left once `maxRequests` (default `requestCap`) are made.
 *  Resolves to `{ text, complete, requests, capped }`. */
export async function translateWhole(translate, text, { splitAbove, onText = () => {}, maxRequests } = {}) {
  const budget = { left: maxRequests ?? requestCap(text, splitAbove), capped: false };
  const r = await whole(translate, text, splitAbove, onText, budget, 0);
  return { ...r, capped: budget.capped };
}

async function whole(translate, text, splitAbove, onText, budget, depth) {
  const keep = () => {
    onText(text + MARK);
    return { text: text + MARK, complete: false, requests };
  };
  let requests = 0;
  if (budget.left <= 0) {
    budget.capped = true;
    return keep();
  }
  budget.left--;
  requests = 1;
  let r;
  try {
    r = await translate(text, (partial) => onText(partial));
  } catch (e) {
    if (e?.code !== "context_length_exceeded") throw e;
    r = { text: "", cut: true };
  }
  if (!r.cut) return { text: r.text, complete: true, requests };
  const parts = text.length > splitAbove && depth < 24 ? halves(text) : null;
  if (!parts) return keep();
  // Splitting takes two more requests at least: with fewer left, the part keeps its text whole.
  if (budget.left < 2) {
    budget.capped = true;
    return keep();
  }
  let done = "", complete = true;
  for (const p of parts) {
    const sub = await whole(translate, p, splitAbove, (partial) => onText(join(done, partial)), budget, depth + 1);
    done = join(done, sub.text.trim());
    complete &&= sub.complete;
    requests += sub.requests;
  }
  return { text: done, complete, requests };
}
