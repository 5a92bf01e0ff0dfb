//! A chat request body, as the HTTP server and Batch Transform read it: bytes, UTF-8, JSON, the
//! request's validation; then what the engine derives from an accepted request (messages,
//! stop strings, sampling) and the task's output filter, streamed in pieces and whole; and its
//! prompt, rendered and tokenized with the tiny TildeOpen tokenizer (SentencePiece, built-in
//! template) and SmolLM2's (byte-level BPE, ChatML) where they are at hand: the only special
//! tokens in it are the template's own, whatever special-token text the messages hold.
//!
//! Shared by the fuzz target (fuzz/fuzz_targets/) and the seed replay of the test command
//! (tests/fuzz_seeds.rs).

use tildeopen::chat::api::ChatRequest;
use tildeopen::chat::api::Message;
use tildeopen::chat::tasks::{clean_output, OutputFilter};
use tildeopen::chat::Prompter;
use tildeopen::text::template::ChatTemplate;
use tildeopen::text::tokenizer::Tokenizer;
use std::sync::OnceLock;

/// The prompters to check prompts with (none where the files are missing).
fn prompters() -> &'static Vec<(Prompter, Tokenizer)> {
    static P: OnceLock<Vec<(Prompter, Tokenizer)>> = OnceLock::new();
    P.get_or_init(|| {
        let fixtures = crate::fixtures_dir().join("models/tiny-tildeopen");
        let smollm2 = std::env::var_os("TILDEOPEN_SMOLLM2").map(std::path::PathBuf::from);
        [Some(fixtures), smollm2]
            .into_iter()
            .flatten()
            .filter_map(|p| {
                let tok = Tokenizer::load(&p).ok()?;
                let template = ChatTemplate::for_tokenizer(&tok).ok()?;
                Some((Prompter::new(Tokenizer::load(&p).ok()?, template, 4096), tok))
            })
            .collect()
    })
}

/// One input: panics (an assertion) when a check fails.
pub fn run(data: &[u8]) {
    // The server: the body must be UTF-8.
    let Ok(body) = std::str::from_utf8(data) else { return };
    check(body);
    // Batch Transform: one request a line.
    if body.contains('\n') {
        for line in body.lines().filter(|l| !l.trim().is_empty()).take(8) {
            check(line);
        }
    }
}

fn check(body: &str) {
    let Ok(req) = ChatRequest::from_json(body) else { return };
    for (p, tok) in prompters() {
        check_prompt(p, tok, &req);
    }
    req.validate().expect("from_json returns a validated request");
    let msgs = req.effective_messages();
    assert!(!msgs.is_empty(), "an accepted request has messages");
    let stops = req.stop_strings();
    assert!(stops.iter().all(|s| !s.is_empty()));
    let p = req.sampling();
    assert!(p.temperature.is_finite() && p.top_p.is_finite() && p.min_p.is_finite() && p.repetition_penalty.is_finite());
    // Round trip: what the request serialises to parses to the same request.
    let again = serde_json::to_string(&req).expect("a request serialises");
    assert_eq!(ChatRequest::from_json(&again).as_ref(), Ok(&req), "{again}");
    // The task's output filter over model output made from the request's own text: streamed
    // in pieces it gives what it gives in one piece.
    let out: String = msgs.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n");
    let out: String = out.chars().take(512).collect();
    let whole = clean_output(req.task.as_ref(), &out);
    for step in [1, 3, 7] {
        let mut f = OutputFilter::new(req.task.as_ref());
        let chars: Vec<char> = out.chars().collect();
        let mut s = String::new();
        for c in chars.chunks(step) {
            s += &f.push(&c.iter().collect::<String>());
        }
        s += &f.finish();
        assert_eq!(s, whole, "{out:?} in steps of {step}");
    }
}

/// The request's prompt holds exactly the special tokens of the same messages with their
/// special-token text taken out: no message opens or closes a turn.
fn check_prompt(p: &Prompter, tok: &Tokenizer, req: &ChatRequest) {
    let Ok(prepared) = p.prepare(req) else { return };
    let cleaned: Vec<Message> = req.effective_messages().iter().map(|m| Message::new(&m.role, tok.without_specials(&m.content))).collect();
    let plain = ChatRequest { messages: cleaned, task: None, ..req.clone() };
    let Ok(text) = p.render(&plain) else { return };
    let Ok(want) = p.tokenize(&text, &[]) else { return };
    let specials = |ids: &[u32]| ids.iter().filter(|&&i| tok.is_special(i)).copied().collect::<Vec<u32>>();
    assert_eq!(specials(&prepared.prompt), specials(&want), "{text:?}");
}
