// Unit test of www/builtin-ai-core.js (run by tests/extension.rs with node): language pairs as
// the Translator API names them.
import assert from "node:assert/strict";
import { pairError, primary, languageName } from "../../www/builtin-ai-core.js";

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
console.log("builtin-ai-core.js: ok");
