//! Which language a text is in (whatlang's trigram and alphabet models, compiled in: no data
//! files), as ISO 639-1 codes where one exists. Used by the page translator to find a block's
//! source language when the page does not say, and to leave text already in the target alone.
//! Short texts are guesses: [`Detected::reliable`] says when the detector is confident.

/// A detection: the language code, the detector's confidence (0..1) and whether it calls the
/// result reliable (enough text, a clear margin over the next language).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Detected {
    pub language: String,
    pub confidence: f64,
    pub reliable: bool,
}

/// ISO 639-3 (whatlang) to 639-1, for the languages that have a two-letter code.
const TWO_LETTER: &[(&str, &str)] = &[
    ("afr", "af"), ("aka", "ak"), ("amh", "am"), ("ara", "ar"), ("aze", "az"), ("bel", "be"), ("ben", "bn"), ("bul", "bg"),
    ("cat", "ca"), ("ces", "cs"), ("cmn", "zh"), ("cym", "cy"), ("dan", "da"), ("deu", "de"), ("ell", "el"), ("eng", "en"),
    ("epo", "eo"), ("est", "et"), ("fin", "fi"), ("fra", "fr"), ("guj", "gu"), ("heb", "he"), ("hin", "hi"), ("hrv", "hr"),
    ("hun", "hu"), ("hye", "hy"), ("ind", "id"), ("ita", "it"), ("jav", "jv"), ("jpn", "ja"), ("kan", "kn"), ("kat", "ka"),
    ("khm", "km"), ("kor", "ko"), ("lat", "la"), ("lav", "lv"), ("lit", "lt"), ("mal", "ml"), ("mar", "mr"), ("mkd", "mk"),
    ("mya", "my"), ("nep", "ne"), ("nld", "nl"), ("nob", "no"), ("ori", "or"), ("pan", "pa"), ("pes", "fa"), ("pol", "pl"),
    ("por", "pt"), ("ron", "ro"), ("rus", "ru"), ("sin", "si"), ("slk", "sk"), ("slv", "sl"), ("sna", "sn"), ("spa", "es"),
    ("srp", "sr"), ("swe", "sv"), ("tam", "ta"), ("tel", "te"), ("tgl", "tl"), ("tha", "th"), ("tuk", "tk"), ("tur", "tr"),
    ("ukr", "uk"), ("urd", "ur"), ("uzb", "uz"), ("vie", "vi"), ("yid", "yi"), ("zul", "zu"),
];

/// The language of `text` (at most its first 4 KiB are read), or `None` when it has no letters.
pub fn detect(text: &str) -> Option<Detected> {
    let mut end = text.len().min(4096);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let info = whatlang::detect(&text[..end])?;
    let code = info.lang().code();
    let language = TWO_LETTER.iter().find(|p| p.0 == code).map_or(code, |p| p.1).to_string();
    Some(Detected { language, confidence: info.confidence(), reliable: info.is_reliable() })
}

#[cfg(test)]
mod tests {
    use super::detect;

    #[test]
    fn baltic_and_other_european_sentences() {
        for (want, text) in [
            ("lv", "Man ļoti patīk kūkas, un es tās cepu katru svētdienu kopā ar savu vecmāmiņu."),
            ("lt", "Man labai patinka pyragai, ir aš juos kepu kiekvieną sekmadienį su savo močiute."),
            ("et", "Mulle väga meeldivad koogid ja ma küpsetan neid igal pühapäeval koos vanaemaga."),
            ("de", "Ich mag Kuchen sehr und backe sie jeden Sonntag zusammen mit meiner Großmutter."),
            ("en", "I like cakes very much, and I bake them every Sunday together with my grandmother."),
            ("pl", "Bardzo lubię ciasta i piekę je w każdą niedzielę razem z moją babcią."),
        ] {
            let d = detect(text).unwrap();
            assert_eq!(d.language, want, "{text}: {d:?}");
        }
        assert_eq!(detect("12345 !!!"), None);
        // The extension's pipeline test page relies on these two being reliable.
        let de = detect("Das Brot wird jeden Morgen frisch gebacken.").unwrap();
        assert!(de.language == "de" && de.reliable, "{de:?}");
        let lv = detect("Maize tiek cepta katru rītu, un maiznīca atveras septiņos.").unwrap();
        assert!(lv.language == "lv" && lv.reliable, "{lv:?}");
    }
}
