// Test-only part of the service worker (tests/extension.rs imports it from the built
// background.js, never shipped): sends what a test page asks for to the page's own content
// script, as the popup does ({type: "translate", target}, "show-original", "status",
// "translate-selection"), or sets settings ({storage: {...}}, as the options page does).
chrome.runtime.onMessage.addListener((m, sender, reply) => {
  if (m?.type !== "tildeopen-test" || !sender.tab) return false;
  const msg = m.msg;
  const done = msg.storage ? chrome.storage.local.set(msg.storage).then(() => ({ ok: true })) : chrome.tabs.sendMessage(sender.tab.id, msg, { frameId: 0 });
  done.then(reply, (e) => reply({ failure: String(e) }));
  return true; // async reply
});
