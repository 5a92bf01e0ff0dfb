// Test-only content script (tests/extension.rs adds it to the built extension, never shipped):
// relays a test page's {tildeopenTest: {id, msg}} to ext-driver.js in the service worker and
// posts the reply back as {tildeopenTestReply: {id, reply}}.
window.addEventListener("message", (e) => {
  const q = e.source === window && e.data?.tildeopenTest;
  if (!q) return;
  chrome.runtime.sendMessage({ type: "tildeopen-test", msg: q.msg })
    .catch((err) => ({ failure: String(err) }))
    .then((reply) => window.postMessage({ tildeopenTestReply: { id: q.id, reply } }, "*"));
});
