export const LANGUAGES = { lv: "Latvian", lt: "Lithuanian", et: "Estonian", en: "English", de: "German", fr: "French", pl: "Polish", fi: "Finnish", sv: "Swedish", uk: "Ukrainian", es: "Spanish", it: "Italian", cs: "Czech", sk: "Slovak", sl: "Slovenian", hr: "Croatian", ro: "Romanian", bg: "Bulgarian", hu: "Hungarian", nl: "Dutch", pt: "Portuguese", da: "Danish", no: "Norwegian", is: "Icelandic", el: "Greek", mt: "Maltese", ga: "Irish", sq: "Albanian", mk: "Macedonian", sr: "Serbian", bs: "Bosnian", tr: "Turkish", ru: "Russian" };

/** A block's source language: the detector's guess where it is reliable (a page's `lang` is
 *  often wrong for parts of it: quotes, user content), else the block's `lang` attribute
 *  (`en-GB` is `en`), else the tab's first reliable guess (`page`), else `fallback`; only
 *  languages the extension offers. */
export function sourceLanguage({ lang, detected, page, fallback }) {
  const offered = (l) => (typeof l === "string" && Object.hasOwn(LANGUAGES, l) ? l : null);
  const base = typeof lang === "string" ? lang.trim().toLowerCase().split(/[-_]/)[0] : null;
  return (detected?.reliable && offered(detected.language)) || offered(base) || offered(page) || fallback;
}
