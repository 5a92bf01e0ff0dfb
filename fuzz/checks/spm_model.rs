//! A SentencePiece `tokenizer.model`: parse, and once it loads, encoding and decoding must
//! not panic on any text (a model whose charsmap or pieces are inconsistent is an error at
//! load, never a panic at the first encode).
//!
//! The input is the model's bytes, optionally followed by `0xff 0xfe 'T' 'X'` and text to
//! encode (its first 512 bytes; the model part then ends at the marker); a fixed multilingual
//! string is encoded too.
//!
//! Shared by the fuzz target (fuzz/fuzz_targets/) and the seed replay of the test command
//! (tests/fuzz_seeds.rs).

use tildeopen::text::tokenizer::{StreamDecoder, Tokenizer};

const MARK: &[u8] = b"\xff\xfeTX";
const FIXED: &str = "Sveiki, pasaule!  Tere\tmaailm\n\n<|user|>ąčęėįšųūž ŠĐČĆŽ 12345 \u{2581}x 😀 <s></s>\u{0}";

/// One input: panics (an assertion) when a check fails.
pub fn run(data: &[u8]) {
    let (model, text) = match data.windows(MARK.len()).position(|w| w == MARK) {
        // At most 512 bytes of text: the encoders are linear in it, and a long text only
        // slows the search for models that break them.
        Some(i) => (&data[..i], String::from_utf8_lossy(&data[i + MARK.len()..][..(data.len() - i - MARK.len()).min(512)]).into_owned()),
        None => (data, String::new()),
    };
    let Ok(tok) = Tokenizer::from_spm_bytes(model, "fuzz.model") else { return };
    let n = tok.vocab_size() as u32;
    for t in [FIXED, text.as_str()] {
        let ids = tok.encode(t).expect("a SentencePiece tokenizer always encodes");
        assert!(ids.iter().all(|&i| i < n), "id out of range for {t:?}: {ids:?}");
        let _ = tok.decode_all(&ids);
        let ids = tok.encode_chat(t).expect("a SentencePiece tokenizer always encodes");
        let _ = tok.decode(&ids);
        let mut sd = StreamDecoder::new();
        for &i in &ids {
            let _ = sd.push(&tok, i);
        }
        let _ = sd.finish(&tok);
    }
    // Ids the input names directly (in and out of range).
    let raw: Vec<u32> = text.bytes().map(|b| b as u32 * 17 % (n + 3)).collect();
    let _ = tok.decode_all(&raw);
    let _ = tok.max_piece_bytes();
}
