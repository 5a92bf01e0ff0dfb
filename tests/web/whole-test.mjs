// Unit test of www/extension/whole.js with a model stand-in (run by tests/extension.rs with
// node): a "translation" is the text upper-cased, cut after BUDGET characters like an answer
// that reaches max_tokens.
import assert from "node:assert/strict";
import { translateWhole, halves, MARK } from "../../www/extension/whole.js";

const BUDGET = 60;
const calls = [];
const model = (rambles = () => false) => async (text, onPartial) => {
  calls.push(text);
  const full = rambles(text) ? (text.toUpperCase() + " AND SO ON").repeat(20) : text.toUpperCase();
  let out = "";
  for (const w of full.split(/(?<= )/)) {
    if (out.length + w.length > BUDGET) return { text: out, cut: true };
    out += w;
    onPartial(out);
  }
  return { text: out, cut: false };
};

// A paragraph longer than one answer is translated whole, part by part, in order.
const para = "The bakery opens at nine. Fresh bread comes out at ten, rolls at eleven. On Sundays the shop is closed, but the café next door sells our cakes. Orders for weddings are taken a week ahead.";
const seen = [];
let r = await translateWhole(model(), para, { splitAbove: BUDGET, onText: (t) => seen.push(t) });
assert.equal(r.text, para.toUpperCase(), "nothing lost, nothing repeated");
assert.equal(r.complete, true);
assert.ok(r.requests > 2 && r.requests < 12, `a few requests: ${r.requests}`);
assert.equal(seen.at(-1), para.toUpperCase(), "the streamed text ends as the result");
assert.ok(seen.every((t) => para.toUpperCase().startsWith(t.slice(0, Math.min(t.length, 20)))), "streamed text always starts like the block");

// Split at sentence ends first, into halves of about equal length.
assert.deepEqual(halves("One two. Three four. Five six."), ["One two. Three four.", "Five six."]);
assert.deepEqual(halves("A long clause, another clause"), ["A long clause,", "another clause"]);
assert.deepEqual(halves("word1 word2 word3 word4"), ["word1 word2", "word3 word4"]);
assert.equal(halves("Supercalifragilistic"), null);

// A short block that runs on (the model does not stop) is not split: original + mark, one request.
calls.length = 0;
r = await translateWhole(model(() => true), "Two cups of flour", { splitAbove: BUDGET });
assert.deepEqual([r.text, r.complete, calls.length], ["Two cups of flour" + MARK, false, 1]);

// In a long block, only the part that cannot finish keeps its original (marked); the rest is translated.
const bad = "Weddings are taken a week ahead.";
r = await translateWhole(model((t) => t === bad), "The bakery opens at nine and closes at six on weekdays. " + bad, { splitAbove: BUDGET });
assert.equal(r.text, "THE BAKERY OPENS AT NINE AND CLOSES AT SIX ON WEEKDAYS. " + bad + MARK);
assert.equal(r.complete, false);

// One word longer than the answer: original + mark, no endless splitting.
const word = "x".repeat(200);
r = await translateWhole(model(), word, { splitAbove: BUDGET });
assert.deepEqual([r.text, r.complete, r.requests], [word + MARK, false, 1]);
console.log("whole.js: ok");
