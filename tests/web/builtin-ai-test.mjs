// Unit test of www/builtin-ai-core.js (run by tests/extension.rs with node): language pairs as
// the Translator API names them.
import assert from "node:assert/strict";
import { pairError, primary, languageName, summarizerOptions, summaryInstruction, summaryMaxTokens, samplingOptions, promptMessages, trimHistory, languagesError } from "../../www/builtin-ai-core.js";

assert.equal(primary("en-GB"), "en");
assert.equal(primary("LV"), "lv");
assert.equal(primary(""), null);
assert.equal(primary(5), null);
assert.equal(pairError("en", "lv"), null);
assert.equal(pairError("en-US", "lt-LT"), null);
assert.match(pairError("en", "ja"), /ja is not a language this model translates into/);
assert.match(pairError("xx", "lv"), /not a language this model translates from/);
assert.match(pairError("en", "en-GB"), /same language/);
assert.match(pairError(undefined, "lv"), /BCP 47/);
assert.equal(languageName("et-EE"), "Estonian");
assert.equal(languageName("ja"), null);

// Summarizer options: defaults, enums (TypeError), languages (NotSupportedError's message).
const d = summarizerOptions();
assert.deepEqual([d.type, d.format, d.length, d.sharedContext, d.error], ["key-points", "markdown", "short", "", null]);
assert.throws(() => summarizerOptions({ type: "bullets" }), TypeError);
assert.throws(() => summarizerOptions({ length: "tiny" }), /length must be one of/);
assert.match(summarizerOptions({ outputLanguage: "ja" }).error, /"ja" is not a language/);
assert.match(summarizerOptions({ expectedInputLanguages: ["en", "zz-ZZ"] }).error, /zz-ZZ/);
assert.equal(summarizerOptions({ expectedInputLanguages: ["en-US"], outputLanguage: "lv" }).error, null);
assert.equal(languagesError(["et", "lt"]), null);
// The instruction follows type, length, format, output language and both contexts.
const kp = summaryInstruction(summarizerOptions({ length: "medium" }));
assert.match(kp, /5 bullet points/);
assert.match(kp, /Markdown list item/);
assert.match(summaryInstruction(summarizerOptions({ type: "key-points", format: "plain-text" })), /without Markdown/);
assert.match(summaryInstruction(summarizerOptions({ type: "tldr", length: "long" })), /five sentences/);
assert.match(summaryInstruction(summarizerOptions({ type: "headline" })), /at most 12 words/);
assert.match(summaryInstruction(summarizerOptions({ type: "teaser", outputLanguage: "lv-LV" })), /Write it in Latvian\./);
const withCtx = summaryInstruction(summarizerOptions({ sharedContext: "A city council's minutes." }), "For residents.");
assert.match(withCtx, /Background: A city council's minutes\. For residents\.$/);
assert.ok(!/Background/.test(summaryInstruction(summarizerOptions(), "  ")));
assert.equal(summaryMaxTokens(summarizerOptions({ length: "long" })), 512);
assert.equal(summaryMaxTokens(summarizerOptions({ type: "headline" })), 64);

// Prompt API sampling: both or neither, clamped.
assert.deepEqual(samplingOptions(), { topK: 3, temperature: 1 });
assert.deepEqual(samplingOptions({ topK: 500, temperature: 9 }), { topK: 128, temperature: 2 });
assert.deepEqual(samplingOptions({ topK: 1, temperature: 0 }), { topK: 1, temperature: 0 });
assert.match(samplingOptions({ topK: 2 }).error, /both/);
assert.match(samplingOptions({ topK: 0, temperature: 1 }).error, /topK/);
assert.match(samplingOptions({ topK: 1, temperature: -1 }).error, /temperature/);

// Prompt messages: strings, message lists, text parts; system first only; text only.
assert.deepEqual(promptMessages("Hi"), [{ role: "user", content: "Hi" }]);
assert.deepEqual(promptMessages([{ role: "system", content: "Be brief." }, { content: [{ type: "text", value: "a" }, { type: "text", value: "b" }] }], true), [{ role: "system", content: "Be brief." }, { role: "user", content: "ab" }]);
assert.equal(promptMessages([{ role: "system", content: "x" }]).name, "TypeError");
assert.equal(promptMessages([{ role: "user", content: "x" }, { role: "system", content: "y" }], true).name, "TypeError");
assert.equal(promptMessages([{ role: "user", content: [{ type: "image", value: {} }] }]).name, "NotSupportedError");
assert.equal(promptMessages([{ role: "tool", content: "x" }]).name, "TypeError");
assert.equal(promptMessages([{ role: "user", content: 5 }]).name, "TypeError");

// History trimming: oldest turns first, the system message kept, null when nothing fits.
const sys = [{ role: "system", content: "S" }];
const turns = ["a", "b", "c", "d"].map((content) => ({ role: "user", content }));
const len = (m) => m.reduce((n, x) => n + x.content.length, 0);
assert.deepEqual(await trimHistory(sys, turns, async (m) => len(m) <= 3), turns.slice(2));
assert.deepEqual(await trimHistory(sys, turns, async () => true), turns);
assert.equal(await trimHistory(sys, turns, async (m) => len(m) < 1), null);
console.log("builtin-ai-core.js: ok");
