// Test-only content script (tests/extension.rs adds it to the built extension, never shipped):
// relays a test page's {tildeopenTest: {id, msg}} to ext-driver.js in the service worker and
// posts the reply back as {tildeopenTestReply: {id, reply}}. {readStorage: true} is answered
// here instead: what a content script of the extension gets from chrome.storage.local itself.
window.addEventListener("message", (e) => {
  const q = e.source === window && e.data?.tildeopenTest;
  if (!q) return;
  const asked = q.msg.readStorage
    ? Promise.resolve().then(() => chrome.storage.local.get(null)).then((items) => ({ items }))
    : chrome.runtime.sendMessage({ type: "tildeopen-test", msg: q.msg });
  asked.catch((err) => ({ failure: String(err) }))
    .then((reply) => window.postMessage({ tildeopenTestReply: { id: q.id, reply } }, "*"));
});
