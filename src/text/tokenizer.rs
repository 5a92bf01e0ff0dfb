//! Tokenizers: whatever vocabulary a model comes with, behind one type.
//!
//! - SentencePiece `tokenizer.model` (BPE and Unigram), and GGUF `"llama"` vocabularies: [`spm`].
//! - HF `tokenizer.json`, and GGUF `"gpt2"` byte-level BPE vocabularies (SmolLM2): the
//!   `tokenizers` crate, built from the GGUF's tokens and merges with llama.cpp's pre-tokenizer.
//!
//! [`Tokenizer::encode`] never parses special-token text (as `sentencepiece.encode` and
//! `llama_tokenize(parse_special = false)`), [`Tokenizer::encode_chat`] does (for rendered chat
//! templates). [`StreamDecoder`] turns generated ids into text pieces that are always valid UTF-8.


use crate::error::{Error, Result};
use crate::model::gguf::{Gguf, Value};
use super::spm::{is_marker, PieceType, SpmKind, SpmModel};

enum Backend {
    Spm(Box<SpmModel>),
    Hf {
        /// Special tokens are not extracted from text.
        plain: Box<tokenizers::Tokenizer>,
        /// Special tokens are extracted from text.
        special: Box<tokenizers::Tokenizer>,
    },
}

/// A model's tokenizer with its special tokens and (when the model ships one) chat template.
pub struct Tokenizer {
    backend: Backend,
    /// The beginning-of-sequence token, when the model has one.
    pub bos: Option<u32>,
    /// Whether the model's tokenizer prepends `bos` to a prompt.
    pub add_bos: bool,
    /// End-of-generation tokens: eos, end-of-turn markers.
    pub eog: Vec<u32>,
    /// A Jinja chat template, when the model ships one.
    pub chat_template: Option<String>,
    /// Text of special tokens matched by [`Tokenizer::encode_chat`], longest first.
    specials: Vec<(String, u32)>,
    /// Text a message's content may not turn into a token in a chat prompt, longest first:
    /// special tokens, and user-defined or added tokens that read as markers (`<tool_call>`).
    guardable: Vec<String>,
}

/// `bytes` as text with one U+FFFD per byte that is not part of a valid UTF-8 character, as
/// sentencepiece decodes byte pieces (`String::from_utf8_lossy` gives one per invalid run).
fn lossy_per_byte(mut bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    loop {
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let ok = e.valid_up_to();
                out.push_str(std::str::from_utf8(&bytes[..ok]).expect("valid up to here"));
                let bad = e.error_len().unwrap_or(bytes.len() - ok);
                out.extend(std::iter::repeat_n('\u{FFFD}', bad));
                bytes = &bytes[ok + bad..];
            }
        }
    }
}

fn hf_err(e: impl std::fmt::Display) -> Error {
    Error::Unsupported(format!("tokenizer: {e}"))
}

impl Tokenizer {
    fn with_backend(backend: Backend) -> Self {
        Tokenizer { backend, bos: None, add_bos: false, eog: Vec::new(), chat_template: None, specials: Vec::new(), guardable: Vec::new() }
    }

    /// A SentencePiece `tokenizer.model`'s bytes.
    pub fn from_spm_bytes(bytes: &[u8], path: &str) -> Result<Self> {
        let m = SpmModel::from_proto(bytes, path)?;
        Ok(Self::from_spm(m))
    }

    fn from_spm(m: SpmModel) -> Self {
        let mut specials = Vec::new();
        let mut guardable = Vec::new();
        for (i, (p, _, ty)) in m.pieces.iter().enumerate() {
            if matches!(ty, PieceType::Control | PieceType::UserDefined) && !p.is_empty() {
                specials.push((p.clone(), i as u32));
                if *ty == PieceType::Control || is_marker(p) {
                    guardable.push(p.clone());
                }
            }
        }
        let mut t = Self::with_backend(Backend::Spm(Box::new(m)));
        t.set_specials(specials);
        t.set_guardable(guardable);
        // sentencepiece's own defaults; tokenizer_config.json / GGUF metadata override them.
        t.bos = t.token_id("<s>");
        t.eog = t.token_id("</s>").into_iter().collect();
        t
    }

    fn set_specials(&mut self, mut specials: Vec<(String, u32)>) {
        specials.sort_by_key(|s| std::cmp::Reverse(s.0.len()));
        self.specials = specials;
    }

    fn set_guardable(&mut self, mut g: Vec<String>) {
        g.retain(|t| t.chars().count() >= 2);
        g.sort_by_key(|t| std::cmp::Reverse(t.len()));
        g.dedup();
        self.guardable = g;
    }

    /// An HF `tokenizer.json`'s bytes.
    pub fn from_hf_json(bytes: &[u8]) -> Result<Self> {
        let special = tokenizers::Tokenizer::from_bytes(bytes).map_err(hf_err)?;
        Ok(Self::from_hf(special))
    }

    fn from_hf(special: tokenizers::Tokenizer) -> Self {
        let mut plain = special.clone();
        plain.set_encode_special_tokens(true);
        let added = special.get_added_tokens_decoder();
        let specials = added.iter().filter(|(_, t)| t.special).map(|(id, t)| (t.content.clone(), *id)).collect();
        // The tokenizers crate takes every added token whole, special or not (`<tool_call>`).
        let guardable = added.values().filter(|t| t.special || is_marker(&t.content)).map(|t| t.content.clone()).collect();
        let mut t = Self::with_backend(Backend::Hf { plain: Box::new(plain), special: Box::new(special) });
        t.set_specials(specials);
        t.set_guardable(guardable);
        t
    }

    /// The vocabulary embedded in a GGUF file (`tokenizer.ggml.*`).
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let kind = g.get("tokenizer.ggml.model").and_then(Value::as_str).unwrap_or("");
        let arr = |k: &str| match g.get(k) {
            Some(Value::Array(a)) => Ok(a.as_slice()),
            _ => Err(Error::Unsupported(format!("GGUF has no {k}"))),
        };
        let bad = |k: &str, what: &str| Error::corrupt("GGUF metadata", format!("{k}: {what}"));
        let tokens: Vec<String> = arr("tokenizer.ggml.tokens")?
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(|| bad("tokenizer.ggml.tokens", "an entry is not a string")))
            .collect::<Result<_>>()?;
        // Per-token arrays must be one entry per token, of the right type: a short or mistyped
        // list would shift or default every piece after it.
        let per_token = |k: &str| -> Result<Option<&[Value]>> {
            match g.get(k) {
                None => Ok(None),
                Some(Value::Array(a)) if a.len() == tokens.len() => Ok(Some(a.as_slice())),
                Some(Value::Array(a)) => Err(bad(k, &format!("{} entries for {} tokens", a.len(), tokens.len()))),
                Some(_) => Err(bad(k, "not an array")),
            }
        };
        let types: Vec<PieceType> = match per_token("tokenizer.ggml.token_type")? {
            Some(a) => a
                .iter()
                .map(|v| v.as_u64().map(PieceType::from_code).ok_or_else(|| bad("tokenizer.ggml.token_type", "an entry is not an integer")))
                .collect::<Result<_>>()?,
            None => vec![PieceType::Normal; tokens.len()],
        };
        let flag = |k: &str| match g.get(k) {
            Some(Value::Bool(b)) => Some(*b),
            _ => None,
        };
        let id = |k: &str| -> Result<Option<u32>> {
            match g.get(k) {
                None => Ok(None),
                Some(v) => v.as_u64().and_then(|v| u32::try_from(v).ok()).map(Some).ok_or_else(|| bad(k, "not a token id")),
            }
        };
        let mut t = match kind {
            "llama" => {
                let scores: Vec<f32> = match per_token("tokenizer.ggml.scores")? {
                    Some(a) => a
                        .iter()
                        .map(|v| v.as_f64().map(|s| s as f32).ok_or_else(|| bad("tokenizer.ggml.scores", "an entry is not a number")))
                        .collect::<Result<_>>()?,
                    None => vec![0.0; tokens.len()],
                };
                // llama.cpp's converter stores sentencepiece's user-defined pieces (TildeOpen's
                // `<|user|>`, `<|endoftext|>`) as NORMAL, and a NORMAL `<|...|>` piece can never
                // be reached by merges. Restore them so text and chat prompts tokenize as
                // sentencepiece does.
                let pieces: Vec<(String, f32, PieceType)> = tokens
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let mut ty = types.get(i).copied().unwrap_or(PieceType::Normal);
                        if ty == PieceType::Normal && p.len() > 4 && p.starts_with("<|") && p.ends_with("|>") {
                            ty = PieceType::UserDefined;
                        }
                        (p.clone(), scores.get(i).copied().unwrap_or(0.0), ty)
                    })
                    .collect();
                // GGUF does not say which kind of SentencePiece model the vocabulary came from
                // (llama.cpp tokenizes every "llama" vocabulary with score-ordered merges). BPE
                // models score their pieces by merge rank, whole numbers; Unigram models by log
                // probability, fractions: tokenize as sentencepiece does for the kind the scores
                // show.
                let unigram = pieces.iter().any(|(_, sc, ty)| *ty == PieceType::Normal && sc.fract() != 0.0);
                let m = SpmModel::new(
                    if unigram { SpmKind::Unigram } else { SpmKind::Bpe },
                    pieces,
                    true,
                    flag("tokenizer.ggml.add_space_prefix").unwrap_or(true),
                    flag("tokenizer.ggml.remove_extra_whitespaces").unwrap_or(false),
                    true,
                )?;
                Self::from_spm(m)
            }
            "gpt2" => {
                let merges: Vec<(String, String)> = arr("tokenizer.ggml.merges")?
                    .iter()
                    .filter_map(|v| v.as_str())
                    .filter_map(|m| m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())))
                    .collect();
                let pre = g.get("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default");
                Self::from_hf(byte_level_bpe(&tokens, &types, merges, pre)?)
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "GGUF tokenizer model {other:?} (supported: \"llama\" SentencePiece, \"gpt2\" byte-level BPE)"
                )))
            }
        };
        t.bos = id("tokenizer.ggml.bos_token_id")?;
        t.add_bos = flag("tokenizer.ggml.add_bos_token").unwrap_or(kind == "llama");
        t.eog = Vec::new();
        for k in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some(i) = id(k)? {
                t.add_eog(i);
            }
        }
        t.chat_template = g.get("tokenizer.chat_template").and_then(Value::as_str).map(str::to_string);
        t.add_end_of_turn_markers();
        Ok(t)
    }

    /// Adds an end-of-generation id.
    pub fn add_eog(&mut self, id: u32) {
        if !self.eog.contains(&id) {
            self.eog.push(id);
        }
    }

    /// Well-known end-of-turn markers ends generation too, as llama.cpp does.
    fn add_end_of_turn_markers(&mut self) {
        for m in ["<|im_end|>", "<|eot_id|>", "<|end_of_turn|>", "<end_of_turn>", "<|endoftext|>", "<|end|>"] {
            if let Some(i) = self.token_id(m) {
                if self.specials.iter().any(|(_, s)| *s == i) {
                    self.add_eog(i);
                }
            }
        }
    }

    /// Ids of `text`, no special-token parsing, no bos.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match &self.backend {
            Backend::Spm(m) => Ok(m.encode(text)),
            Backend::Hf { plain, .. } => Ok(plain.encode_fast(text, false).map_err(hf_err)?.get_ids().to_vec()),
        }
    }

    /// Ids of a rendered chat prompt: special-token text (`<|im_start|>`, `<|user|>`, ...)
    /// becomes those tokens; each run of text between them is encoded as [`Tokenizer::encode`]
    /// does (for SentencePiece with its dummy prefix, as llama.cpp and transformers' slow
    /// tokenizer do). No bos is added.
    pub fn encode_chat(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_chat_guarded(text, &[])
    }

    /// [`Tokenizer::encode_chat`], except that marker text (special tokens, `<tool_call>`-like
    /// added or user-defined tokens) overlapping a `guarded` byte range (where the messages'
    /// contents stand in the rendered prompt) stays text: a message, a page being translated,
    /// cannot open or close turns of its own, even split across two contents. Text without
    /// such markers in or across a guarded range gets exactly `encode_chat`'s ids.
    pub fn encode_chat_guarded(&self, text: &str, guarded: &[std::ops::Range<usize>]) -> Result<Vec<u32>> {
        let overlaps = |a: usize, b: usize| guarded.iter().any(|r| a < r.end && r.start < b);
        if let Backend::Hf { special, .. } = &self.backend {
            // The tokenizers crate finds added tokens itself: each guarded occurrence (all of
            // them, overlapping ones included) is cut after its first character, so no piece
            // holds it whole; the pieces are encoded as before, one after another.
            let mut cuts = Vec::new();
            if !guarded.is_empty() {
                for g in &self.guardable {
                    let mut from = 0;
                    while let Some(p) = text[from..].find(g.as_str()) {
                        let at = from + p;
                        let first = text[at..].chars().next().map_or(1, char::len_utf8);
                        if overlaps(at, at + g.len()) {
                            cuts.push(at + first);
                        }
                        from = at + first;
                    }
                }
            }
            cuts.sort_unstable();
            cuts.dedup();
            let mut ids = Vec::new();
            let mut at = 0;
            for c in cuts.into_iter().chain(std::iter::once(text.len())) {
                if c > at || (c == 0 && text.is_empty()) {
                    ids.extend(special.encode_fast(&text[at..c], false).map_err(hf_err)?.get_ids());
                    at = c;
                }
            }
            return Ok(ids);
        }
        // A run of text between special tokens that overlaps a guarded range is spelt without
        // marker pieces (sentencepiece would take user-defined ones whole, also where a
        // normalizer made them); without such text the ids are the same either way.
        let run = |a: usize, b: usize| -> Result<Vec<u32>> {
            match &self.backend {
                Backend::Spm(m) if overlaps(a, b) => Ok(m.encode_literal(&text[a..b])),
                _ => self.encode(&text[a..b]),
            }
        };
        let guard = |s: &str, at: usize| overlaps(at, at + s.len()) && self.guardable.iter().any(|g| g == s);
        let mut ids = Vec::new();
        let mut start = 0;
        let mut pending = 0;
        while start + pending < text.len() {
            let at = start + pending;
            let here = &text[at..];
            match self.specials.iter().find(|(s, _)| here.starts_with(s.as_str()) && !guard(s, at)) {
                Some((s, id)) => {
                    ids.extend(run(start, at)?);
                    ids.push(*id);
                    start = at + s.len();
                    pending = 0;
                }
                None => pending += here.chars().next().map_or(1, char::len_utf8),
            }
        }
        ids.extend(run(start, text.len())?);
        Ok(ids)
    }

    /// Whether `text` holds marker text a chat prompt guards (see
    /// [`Tokenizer::encode_chat_guarded`]).
    pub fn holds_special(&self, text: &str) -> bool {
        self.guardable.iter().any(|s| text.contains(s.as_str()))
    }

    /// `text` without any guarded marker text (removed until none is left, so no removal can
    /// join two halves into a new one).
    pub fn without_specials(&self, text: &str) -> String {
        let mut t = text.to_string();
        while let Some(s) = self.guardable.iter().find(|s| t.contains(s.as_str())) {
            t = t.replace(s.as_str(), "");
        }
        t
    }

    /// The longest piece's text in bytes (as the vocabulary spells it, which is never shorter
    /// than the text it stands for): a text with `n` letters and digits is at least
    /// `n / max_piece_bytes()` tokens, whatever the normalizer does to spaces and accents.
    pub fn max_piece_bytes(&self) -> usize {
        let vocab = match &self.backend {
            Backend::Spm(m) => m.pieces.iter().map(|p| p.0.len()).max().unwrap_or(1),
            Backend::Hf { plain, .. } => plain.get_vocab(true).keys().map(String::len).max().unwrap_or(1),
        };
        vocab.max(self.specials.iter().map(|s| s.0.len()).max().unwrap_or(1)).max(1)
    }

    /// Text of `ids`, special tokens left out, invalid UTF-8 replaced by U+FFFD (for
    /// SentencePiece one per invalid byte, as the library does).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.backend {
            Backend::Spm(m) => {
                let ids: Vec<u32> = ids.iter().copied().filter(|i| !self.is_special(*i)).collect();
                Ok(lossy_per_byte(&m.decode_bytes(&ids)))
            }
            Backend::Hf { special, .. } => special.decode(ids, true).map_err(hf_err),
        }
    }

    /// Text of `ids` with special tokens kept (as `sentencepiece.decode` does).
    pub fn decode_all(&self, ids: &[u32]) -> Result<String> {
        match &self.backend {
            Backend::Spm(m) => Ok(lossy_per_byte(&m.decode_bytes(ids))),
            Backend::Hf { special, .. } => special.decode(ids, false).map_err(hf_err),
        }
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.specials.iter().any(|(_, s)| *s == id)
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    pub fn token_id(&self, piece: &str) -> Option<u32> {
        match &self.backend {
            Backend::Spm(m) => m.piece_to_id(piece),
            Backend::Hf { special, .. } => special.token_to_id(piece),
        }
    }

    pub fn token_text(&self, id: u32) -> Option<String> {
        match &self.backend {
            Backend::Spm(m) => m.pieces.get(id as usize).map(|p| p.0.clone()),
            Backend::Hf { special, .. } => special.id_to_token(id),
        }
    }

    pub fn vocab_size(&self) -> usize {
        match &self.backend {
            Backend::Spm(m) => m.pieces.len(),
            Backend::Hf { special, .. } => special.get_vocab_size(true),
        }
    }

    /// This tokenizer as an HF `tokenizer.json` document (byte-level BPE and tokenizer.json
    /// backends; `None` for SentencePiece, whose reference format is `tokenizer.model`).
    pub fn to_hf_json(&self) -> Option<String> {
        match &self.backend {
            Backend::Hf { special, .. } => special.to_string(false).ok(),
            Backend::Spm(_) => None,
        }
    }

    /// Whether this is a SentencePiece tokenizer (TildeOpen's kind).
    pub fn is_sentencepiece(&self) -> bool {
        matches!(self.backend, Backend::Spm(_))
    }

    /// Applies an HF `tokenizer_config.json` (bos/eos, add_bos_token, chat_template) and a
    /// `generation_config.json` (eos_token_id, one or a list).
    pub fn apply_hf_configs(&mut self, tokenizer_config: Option<&str>, generation_config: Option<&str>) -> Result<()> {
        let tok_text = |v: &serde_json::Value| -> Option<String> {
            match v {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(str::to_string),
                _ => None,
            }
        };
        if let Some(text) = tokenizer_config {
            let c: serde_json::Value = serde_json::from_str(text).map_err(|e| Error::Input(format!("tokenizer_config.json: {e}")))?;
            if let Some(b) = c.get("bos_token").and_then(tok_text) {
                self.bos = self.token_id(&b).or(self.bos);
            }
            if let Some(e) = c.get("eos_token").and_then(tok_text) {
                if let Some(i) = self.token_id(&e) {
                    // First: the eos a chat template's `eos_token` names (sentencepiece's own
                    // default `</s>` stays an end of generation after it).
                    self.eog.retain(|&x| x != i);
                    self.eog.insert(0, i);
                }
            }
            if let Some(b) = c.get("add_bos_token").and_then(|v| v.as_bool()) {
                self.add_bos = b;
            }
            match c.get("chat_template") {
                Some(serde_json::Value::String(s)) => self.chat_template = Some(s.clone()),
                Some(serde_json::Value::Array(list)) => {
                    // [{name, template}, ...]: take "default".
                    self.chat_template = list
                        .iter()
                        .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                        .or(list.first())
                        .and_then(|t| t.get("template"))
                        .and_then(|t| t.as_str())
                        .map(str::to_string);
                }
                _ => {}
            }
        }
        if let Some(text) = generation_config {
            let c: serde_json::Value = serde_json::from_str(text).map_err(|e| Error::Input(format!("generation_config.json: {e}")))?;
            let id = |v: &serde_json::Value, key: &str| -> Result<u32> {
                v.as_u64()
                    .and_then(|i| u32::try_from(i).ok())
                    .ok_or_else(|| Error::Input(format!("generation_config.json: `{key}` holds {v}, not a token id")))
            };
            match c.get("eos_token_id") {
                None | Some(serde_json::Value::Null) => {}
                Some(serde_json::Value::Array(a)) => {
                    for v in a {
                        let i = id(v, "eos_token_id")?;
                        self.add_eog(i);
                    }
                }
                Some(v) => {
                    let i = id(v, "eos_token_id")?;
                    self.add_eog(i);
                }
            }
            match c.get("bos_token_id") {
                None | Some(serde_json::Value::Null) => {}
                Some(v) => self.bos = Some(id(v, "bos_token_id")?),
            }
        }
        self.add_end_of_turn_markers();
        Ok(())
    }

    /// The tokenizer of a model file or directory, or a bare `tokenizer.model` /
    /// `tokenizer.json`. A directory uses its `tokenizer.model` when it has one (the reference
    /// for TildeOpen), else its `tokenizer.json`.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(path: &std::path::Path) -> Result<Self> {
        use std::path::Path;
        let read = |p: &Path| std::fs::read(p).map_err(|e| Error::Io { path: p.display().to_string(), source: e });
        let read_opt = |p: &Path| std::fs::read_to_string(p).ok();
        if path.is_dir() {
            let spm = path.join("tokenizer.model");
            let json = path.join("tokenizer.json");
            let mut t = if spm.exists() {
                Self::from_spm_bytes(&read(&spm)?, &spm.display().to_string())?
            } else if json.exists() {
                Self::from_hf_json(&read(&json)?)?
            } else {
                return Err(Error::Unsupported(format!("{}: no tokenizer.model or tokenizer.json", path.display())));
            };
            t.apply_hf_configs(
                read_opt(&path.join("tokenizer_config.json")).as_deref(),
                read_opt(&path.join("generation_config.json")).as_deref(),
            )?;
            return Ok(t);
        }
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with(".json") {
            return Self::from_hf_json(&read(path)?);
        }
        if name.ends_with(".model") {
            return Self::from_spm_bytes(&read(path)?, &path.display().to_string());
        }
        let files = crate::model::loader::ModelFiles::open(path, crate::model::loader::WeightFormat::Q8_0)?;
        match &files {
            crate::model::loader::ModelFiles::Gguf { gguf, .. } => Self::from_gguf(gguf),
            crate::model::loader::ModelFiles::Hf(_) => unreachable!("directories handled above"),
        }
    }
}

/// A GGUF `"gpt2"` vocabulary as a `tokenizers` byte-level BPE with llama.cpp's pre-tokenizer.
fn byte_level_bpe(tokens: &[String], types: &[PieceType], merges: Vec<(String, String)>, pre: &str) -> Result<tokenizers::Tokenizer> {
    use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
    use tokenizers::models::bpe::BPE;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::digits::Digits;
    use tokenizers::pre_tokenizers::sequence::Sequence;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::pre_tokenizers::PreTokenizerWrapper;
    use tokenizers::{AddedToken, SplitDelimiterBehavior};

    let vocab: tokenizers::models::bpe::Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().map_err(hf_err)?;
    let mut tk = tokenizers::Tokenizer::new(bpe);
    let byte_level = ByteLevel::new(false, false, true);
    let pre_tok: PreTokenizerWrapper = match pre {
        // llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM: every digit alone, then GPT-2's regex.
        "smollm" => Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into(),
        "llama-bpe" | "llama3" => {
            let re = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
            let split = Split::new(SplitPattern::Regex(re.into()), SplitDelimiterBehavior::Isolated, false).map_err(hf_err)?;
            Sequence::new(vec![split.into(), ByteLevel::new(false, false, false).into()]).into()
        }
        "gpt2" | "default" | "gpt-2" => byte_level.into(),
        other => {
            log::warn!("GGUF pre-tokenizer {other:?} is not known here; using GPT-2's");
            byte_level.into()
        }
    };
    tk.with_pre_tokenizer(Some(pre_tok));
    tk.with_decoder(Some(ByteLevelDecoder::default()));
    let added: Vec<AddedToken> = tokens
        .iter()
        .zip(types)
        .filter(|(_, ty)| matches!(ty, PieceType::Control | PieceType::UserDefined))
        .map(|(t, ty)| AddedToken::from(t.clone(), *ty == PieceType::Control))
        .collect();
    tk.add_tokens(&added);
    Ok(tk)
}

/// Turns generated ids into text deltas that are always valid UTF-8: a token that ends inside
/// a multi-byte character (byte fallback, byte-level BPE) is held back until the character is
/// complete. Each push decodes only a short window (the tokens since the last emission plus the
/// ones before them, for context such as SentencePiece's leading space), so a long answer costs
/// linear, not quadratic, time.
#[derive(Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    /// The window starts here; `ids[prefix..read]` is text already emitted.
    prefix: usize,
    read: usize,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one id; returns the text that became final.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let before = tok.decode(&self.ids[self.prefix..self.read])?;
        let now = tok.decode(&self.ids[self.prefix..])?;
        // Incomplete characters decode to U+FFFD at the end: hold the token back.
        if now.len() <= before.len() || now.ends_with('\u{FFFD}') || !now.starts_with(&before) {
            return Ok(String::new());
        }
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(now[before.len()..].to_string())
    }

    /// The text still held back. Bytes of a character the generation never finished are
    /// dropped (they would decode to U+FFFD, which the model did not write).
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String> {
        let before = tok.decode(&self.ids[self.prefix..self.read])?;
        let now = tok.decode(&self.ids[self.prefix..])?;
        self.prefix = self.read;
        self.read = self.ids.len();
        let tail = match now.strip_prefix(before.as_str()) {
            Some(t) => t,
            // The held tokens changed how the text before them decodes: keep what follows it.
            None => now.get(before.len().min(now.len())..).unwrap_or(""),
        };
        Ok(tail.trim_end_matches('\u{FFFD}').to_string())
    }

    /// Everything decoded so far, including what is held back.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}
