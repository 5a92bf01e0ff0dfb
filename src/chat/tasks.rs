//! The five tasks of the response format as request builders: each turns task inputs into chat
//! messages, and [`OutputFilter`] turns the model's answer into the plain text the response
//! format asks for (no preamble, no wrapping quotes), streaming or not.

use crate::chat::api::Message;
use serde::{Deserialize, Serialize};

/// A task; serialised with `"type"`: `translate`, `ask`, `summarise`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Task {
    /// Translation; with `glossary` term pairs (source term, target term) and/or `examples`
    /// (source, translation) pairs for style and terminology.
    Translate {
        text: String,
        /// Language code (`en`, `lv`, ...) or name.
        source: String,
        target: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        glossary: Vec<(String, String)>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        examples: Vec<(String, String)>,
    },
    /// Contextual question answering.
    Ask { context: String, question: String },
    /// Summarisation; `instruction` sets length and focus.
    #[serde(alias = "summarize")]
    Summarise {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instruction: Option<String>,
    },
}

const LANGUAGES: &[(&str, &str)] = &[
    ("bg", "Bulgarian"),
    ("bs", "Bosnian"),
    ("cs", "Czech"),
    ("da", "Danish"),
    ("de", "German"),
    ("el", "Greek"),
    ("en", "English"),
    ("es", "Spanish"),
    ("et", "Estonian"),
    ("fi", "Finnish"),
    ("fr", "French"),
    ("ga", "Irish"),
    ("hr", "Croatian"),
    ("hu", "Hungarian"),
    ("is", "Icelandic"),
    ("it", "Italian"),
    ("lt", "Lithuanian"),
    ("lv", "Latvian"),
    ("mk", "Macedonian"),
    ("mt", "Maltese"),
    ("nl", "Dutch"),
    ("no", "Norwegian"),
    ("nb", "Norwegian"),
    ("pl", "Polish"),
    ("pt", "Portuguese"),
    ("ro", "Romanian"),
    ("ru", "Russian"),
    ("sk", "Slovak"),
    ("sl", "Slovenian"),
    ("sq", "Albanian"),
    ("sr", "Serbian"),
    ("sv", "Swedish"),
    ("tr", "Turkish"),
    ("uk", "Ukrainian"),
];

/// English name of a language code (`lv` -> `Latvian`); other strings come back as given.
pub fn language_name(code: &str) -> String {
    let c = code.trim().to_ascii_lowercase();
    let base = c.split(['-', '_']).next().unwrap_or("");
    LANGUAGES.iter().find(|(k, _)| *k == base).map(|(_, n)| n.to_string()).unwrap_or_else(|| code.trim().to_string())
}

fn translate_instruction(source: &str, target: &str) -> String {
    format!(
        "Translate the following text from {} to {}. Reply with the translation only: no preamble, \
         explanation or quotation marks. Keep the line and paragraph structure of the text.",
        language_name(source),
        language_name(target)
    )
}

impl Task {
    /// The chat messages that carry this task.
    pub fn messages(&self) -> Vec<Message> {
        match self {
            Task::Translate { text, source, target, glossary, examples } => {
                let mut msgs = Vec::new();
                let instruction = translate_instruction(source, target);
                // Few-shot examples as earlier turns, so the model sees the exact format.
                for (src, tgt) in examples {
                    msgs.push(Message::user(format!("{instruction}\n\n{src}")));
                    msgs.push(Message::assistant(tgt.clone()));
                }
                let mut prompt = instruction;
                if !glossary.is_empty() {
                    prompt += &format!(
                        " Use these glossary terms, inflected as {} grammar requires:",
                        language_name(target)
                    );
                    for (s, t) in glossary {
                        prompt += &format!("\n- {s} = {t}");
                    }
                }
                prompt += "\n\n";
                prompt += text;
                msgs.push(Message::user(prompt));
                msgs
            }
            Task::Ask { context, question } => vec![Message::user(format!(
                "Answer the question using only the context below. Answer briefly, in the language of the \
                 question. If the context does not contain the answer, say in one sentence what the context \
                 is about and then that it does not contain enough information to answer the question.\n\n\
                 Context:\n{context}\n\nQuestion: {question}"
            ))],
            Task::Summarise { text, instruction } => {
                let instruction = instruction.as_deref().unwrap_or("Summarise the following text in a few sentences.");
                vec![Message::user(format!(
                    "{instruction}\nWrite the summary in the language of the text unless the instruction says \
                     otherwise, and reply with the summary only.\n\nText:\n{text}"
                ))]
            }
        }
    }

    /// The text the output is derived from (its quoting and surrounding whitespace decide what
    /// [`OutputFilter`] may strip).
    pub fn source_text(&self) -> &str {
        match self {
            Task::Translate { text, .. } | Task::Summarise { text, .. } => text,
            Task::Ask { question, .. } => question,
        }
    }

    /// Checks the inputs: no empty text.
    pub fn validate(&self) -> Result<(), String> {
        let empty = |s: &str, what: &str| if s.trim().is_empty() { Err(format!("task {what} is empty")) } else { Ok(()) };
        match self {
            Task::Translate { text, source, target, .. } => {
                empty(text, "text")?;
                empty(source, "source language")?;
                empty(target, "target language")
            }
            Task::Ask { context, question } => {
                empty(context, "context")?;
                empty(question, "question")
            }
            Task::Summarise { text, .. } => empty(text, "text"),
        }
    }
}

const QUOTES: &[(char, char)] = &[('"', '"'), ('\u{201C}', '\u{201D}'), ('\u{201E}', '\u{201C}'), ('\u{AB}', '\u{BB}'), ('\'', '\''), ('\u{2018}', '\u{2019}')];

/// Words that open a model's preamble line ("Here is the translation:").
const PREAMBLES: &[&str] = &["here is", "here's", "here are", "sure", "certainly", "translation", "the translation", "summary", "the summary", "answer", "the answer"];

fn is_preamble(line: &str) -> bool {
    let l = line.trim().to_lowercase();
    l.ends_with(':') && l.len() < 80 && PREAMBLES.iter().any(|p| l.starts_with(p))
}

/// Whether an unfinished first line could still turn out a preamble (so it must be held): it
/// is short enough and starts with, or is the start of, a preamble word.
fn may_become_preamble(partial: &str) -> bool {
    let l = partial.trim_start().to_lowercase();
    l.trim_end().len() < 80 && PREAMBLES.iter().any(|p| l.starts_with(p) || p.starts_with(l.as_str()))
}

/// Cleans a task's output as it streams; `push` and `finish` together give exactly what the
/// whole-text cleaning gives, so streamed deltas concatenate to the non-streamed content.
///
/// It strips, only where the input did not have them itself: leading and trailing whitespace,
/// a first line that is a preamble ending in `:` ("Here is the translation:"), and one pair of
/// quotes around the whole output when no such quote occurs inside. While undecided it holds
/// text back: the first line (preamble?), everything after an opening quote (wrapping?),
/// trailing whitespace.
pub struct OutputFilter {
    active: bool,
    keep_lead_ws: bool,
    keep_trail_ws: bool,
    source_quoted: bool,
    source_first_line_preamble: bool,
    /// Text not yet decided on.
    held: String,
    started: bool,
    quote: Option<(char, char)>,
}

impl OutputFilter {
    /// A filter for `task`; `None` passes text through unchanged.
    pub fn new(task: Option<&Task>) -> Self {
        let src = task.map(Task::source_text).unwrap_or("");
        let first = src.trim_start().chars().next();
        let last = src.trim_end().chars().last();
        OutputFilter {
            active: task.is_some(),
            keep_lead_ws: src.starts_with(char::is_whitespace),
            keep_trail_ws: src.ends_with(char::is_whitespace),
            source_quoted: QUOTES.iter().any(|(o, c)| first == Some(*o) && last == Some(*c)),
            // A translated heading keeps its colon: where the source's first line ends in one
            // ("Atbilde:", "Kopsavilkums:"), the answer's first line is its translation.
            source_first_line_preamble: {
                let first = src.trim_start().lines().next().unwrap_or("");
                is_preamble(first) || (matches!(task, Some(Task::Translate { .. })) && first.trim_end().ends_with(':'))
            },
            held: String::new(),
            started: false,
            quote: None,
        }
    }

    /// Adds generated text; returns what is final.
    pub fn push(&mut self, delta: &str) -> String {
        if !self.active {
            return delta.to_string();
        }
        self.held.push_str(delta);
        self.release(false)
    }

    /// The end of generation: returns the rest.
    pub fn finish(&mut self) -> String {
        if !self.active {
            return String::new();
        }
        self.release(true)
    }

    fn release(&mut self, end: bool) -> String {
        if !self.started {
            if !self.keep_lead_ws {
                let t = self.held.trim_start().len();
                self.held.drain(..self.held.len() - t);
            }
            // Preamble: decided once the first line is complete.
            match self.held.find('\n') {
                Some(nl) if !self.source_first_line_preamble && is_preamble(&self.held[..nl]) => {
                    let rest = self.held[nl..].trim_start().to_string();
                    if rest.is_empty() && !end {
                        return String::new(); // the answer has not started yet
                    }
                    self.held = rest;
                }
                // An unfinished first line is held only while it could still be a preamble, so
                // a one-line answer streams as it comes.
                None if !end && !self.source_first_line_preamble && may_become_preamble(&self.held) => return String::new(),
                _ => {}
            }
            if self.held.is_empty() && !end {
                return String::new();
            }
            self.started = true;
            if !self.source_quoted {
                let first = self.held.chars().next();
                self.quote = QUOTES.iter().find(|(o, _)| Some(*o) == first).copied();
            }
        }
        if let Some((open, close)) = self.quote {
            // Wrapping quotes: only decidable at the end.
            if !end {
                let inner = &self.held[open.len_utf8()..];
                let trimmed = inner.trim_end();
                // A quote character inside (not at the very end) means they are not wrapping.
                let inside = trimmed.strip_suffix(close).unwrap_or(trimmed);
                if inside.contains(open) || inside.contains(close) {
                    self.quote = None;
                } else {
                    return String::new();
                }
            } else {
                let t = self.held.trim_end();
                if t.len() > open.len_utf8() && t.ends_with(close) {
                    let inner = &t[open.len_utf8()..t.len() - close.len_utf8()];
                    if !inner.contains(open) && !inner.contains(close) {
                        let trail = &self.held[t.len()..];
                        self.held = format!("{inner}{trail}");
                    }
                }
                self.quote = None;
            }
        }
        let out_end = if end {
            if self.keep_trail_ws {
                self.held.len()
            } else {
                self.held.trim_end().len()
            }
        } else {
            // Trailing whitespace might be the end of the output: hold it.
            self.held.trim_end().len()
        };
        let out = self.held[..out_end].to_string();
        self.held.drain(..out_end);
        if end {
            self.held.clear();
        }
        out
    }
}

/// Cleans a whole output (what [`OutputFilter`] gives for it in one piece).
pub fn clean_output(task: Option<&Task>, text: &str) -> String {
    let mut f = OutputFilter::new(task);
    let mut s = f.push(text);
    s += &f.finish();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tr(text: &str) -> Task {
        Task::Translate { text: text.into(), source: "en".into(), target: "lv".into(), glossary: vec![], examples: vec![] }
    }

    #[test]
    fn cleaning_strips_only_what_is_not_legitimate() {
        let t = tr("I like cakes.");
        assert_eq!(clean_output(Some(&t), "Here is the translation:\n\nMan patīk kūkas."), "Man patīk kūkas.");
        assert_eq!(clean_output(Some(&t), "\"Man patīk kūkas.\"\n"), "Man patīk kūkas.");
        assert_eq!(clean_output(Some(&t), "«Man patīk kūkas.»"), "Man patīk kūkas.");
        // Quotes that do not wrap the whole text stay.
        assert_eq!(clean_output(Some(&t), "\"Man\" patīk \"kūkas\"."), "\"Man\" patīk \"kūkas\".");
        // A quoted source keeps its quotes.
        assert_eq!(clean_output(Some(&tr("\"Hi\"")), "\"Sveiki\""), "\"Sveiki\"");
        // Structure kept, trailing space only when the source had it.
        assert_eq!(clean_output(Some(&t), " a\n\nb \n"), "a\n\nb");
        assert_eq!(clean_output(Some(&tr("x\n")), "a\n"), "a\n");
        // No task: untouched.
        assert_eq!(clean_output(None, " \"x\" "), " \"x\" ");
        // A heading in the source is a heading in the translation, not a preamble.
        let lv = Task::Translate { text: "Atbilde:\nJā, tā ir.".into(), source: "lv".into(), target: "en".into(), glossary: vec![], examples: vec![] };
        assert_eq!(clean_output(Some(&lv), "Answer:\nYes, it is."), "Answer:\nYes, it is.");
        assert_eq!(clean_output(Some(&tr("Summary:\nx")), "Kopsavilkums:\ny"), "Kopsavilkums:\ny");
    }

    /// A one-line answer streams as it comes; only a line that could be a preamble is held.
    #[test]
    fn one_line_answers_stream() {
        let t = tr("I like cakes.");
        let mut f = OutputFilter::new(Some(&t));
        assert_eq!(f.push("Man pat"), "Man pat");
        assert_eq!(f.push("īk kūkas."), "īk kūkas.");
        let mut f = OutputFilter::new(Some(&t));
        assert_eq!(f.push("Here is"), "");
        assert_eq!(f.push(" the translation:"), "");
        assert_eq!(f.push("\nMan"), "Man");
        let mut f = OutputFilter::new(Some(&t));
        assert_eq!(f.push("Her"), "");
        assert_eq!(f.push("bert"), "Herbert");
    }

    #[test]
    fn streaming_equals_whole() {
        let t = tr("Hello.\n\nWorld.");
        for out in ["Here is the translation:\nSveiki.\n\nPasaule.", "\"Sveiki.\n\nPasaule.\"", "Sveiki.\n\n\"Pasaule\".  ", "  x", "", "Hereby: x", "Sure:\nJā.", "Sure thing"] {
            let whole = clean_output(Some(&t), out);
            for step in 1..4 {
                let mut f = OutputFilter::new(Some(&t));
                let chars: Vec<char> = out.chars().collect();
                let mut s = String::new();
                for c in chars.chunks(step) {
                    s += &f.push(&c.iter().collect::<String>());
                }
                s += &f.finish();
                assert_eq!(s, whole, "{out:?} in steps of {step}");
            }
        }
    }

    #[test]
    fn builders() {
        let t = Task::Translate {
            text: "Line one\n\nLine two".into(),
            source: "en".into(),
            target: "lv".into(),
            glossary: vec![("cake".into(), "kūka".into())],
            examples: vec![("Good morning".into(), "Labrīt".into())],
        };
        let m = t.messages();
        assert_eq!(m.len(), 3);
        assert_eq!((m[0].role.as_str(), m[1].role.as_str(), m[2].role.as_str()), ("user", "assistant", "user"));
        assert!(m[0].content.contains("from English to Latvian") && m[0].content.ends_with("Good morning"));
        assert_eq!(m[1].content, "Labrīt");
        assert!(m[2].content.contains("- cake = kūka") && m[2].content.ends_with("Line one\n\nLine two"));
        let a = Task::Ask { context: "Riga is the capital of Latvia.".into(), question: "What is the capital?".into() }.messages();
        assert!(a[0].content.contains("Context:\nRiga is the capital of Latvia.") && a[0].content.ends_with("Question: What is the capital?"));
        let s = Task::Summarise { text: "Long text.".into(), instruction: Some("One sentence, about prices.".into()) }.messages();
        assert!(s[0].content.starts_with("One sentence, about prices.") && s[0].content.ends_with("Long text."));
        let j: Task = serde_json::from_str(r#"{"type":"summarize","text":"x"}"#).unwrap();
        assert!(matches!(j, Task::Summarise { .. }));
        assert_eq!(language_name("lv-LV"), "Latvian");
        assert_eq!(language_name("Klingon"), "Klingon");
    }
}
