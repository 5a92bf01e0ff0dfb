// Unit test of www/extension/whole.js with a model stand-in (run by tests/extension.rs with
// node): a "translation" is the text upper-cased, cut after BUDGET characters like an answer
// that reaches max_tokens.
import assert from "node:assert/strict";
import { translateWhole, halves, MARK, requestCap } from "../../www/extension/whole.js";

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
// A long block whose parts never finish: at most requestCap requests (2 per part of splitAbove
// characters, plus 3), not the 2x more that halving every part down to splitAbove would take;
// what the cap leaves keeps its original text, so nothing is lost.
const huge = Array.from({ length: 60 }, (_, i) => `Sentence number ${i} is about bread.`).join(" ");
calls.length = 0;
const uncapped = await translateWhole(model(() => true), huge, { splitAbove: BUDGET, maxRequests: Infinity });
calls.length = 0;
r = await translateWhole(model(() => true), huge, { splitAbove: BUDGET });
const cap = requestCap(huge, BUDGET);
assert.equal(cap, 2 * Math.ceil(huge.length / BUDGET) + 3);
assert.ok(r.requests <= cap && calls.length === r.requests, `${r.requests} requests, cap ${cap}`);
assert.ok(uncapped.requests > cap, `the cap bites: ${uncapped.requests} requests without it`);
assert.deepEqual([r.complete, r.capped, uncapped.capped], [false, true, false]);
assert.equal(r.text.replaceAll(MARK, ""), huge, "nothing lost under the cap");

// A prompt over the context (context_length_exceeded) is split like a cut answer.
const CONTEXT = 100;
const small = (text, onPartial) => {
  calls.push(text);
  if (text.length > CONTEXT) return Promise.reject(Object.assign(new Error("{}"), { code: "context_length_exceeded" }));
  return model()(text, onPartial);
};
calls.length = 0;
r = await translateWhole(small, para, { splitAbove: BUDGET });
assert.equal(r.text, para.toUpperCase(), "over the context: translated in parts, whole");
assert.equal(r.complete, true);
assert.ok(calls[0] === para && calls.length > 2, "tried whole first, then in parts");
// Other errors still fail the block.
await assert.rejects(translateWhole(() => Promise.reject(Object.assign(new Error("gone"), { code: "device_lost" })), para, { splitAbove: BUDGET }), /gone/);
console.log("whole.js: ok");
