// Default settings; scripts/build-extension rewrites this file in the package from its flags.
export default { modelUrl: "", source: "en", target: "lv", glossary: [], autoTranslate: false, maxTokens: 512, parallel: 4 };
