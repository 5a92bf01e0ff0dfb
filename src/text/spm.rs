//! SentencePiece, exactly as the sentencepiece library encodes and decodes.
//!
//! Reads `tokenizer.model` (a `ModelProto` protobuf, decoded here with a small wire-format
//! reader: only five fields of it matter) or a GGUF `"llama"` vocabulary (pieces, scores, types).
//! Both of sentencepiece's model types are implemented as the library does them:
//! - BPE: start from characters (user-defined pieces kept whole), repeatedly merge the adjacent
//!   pair whose concatenation is a piece with the highest score (leftmost on ties), split
//!   `UNUSED` pieces back into their parts;
//! - Unigram: Viterbi over the lattice of all pieces, user-defined pieces scored
//!   `len * max_score - 0.1`, unknown characters `min_score - 10`.
//!
//! Then byte fallback turns every unknown piece into `<0xXX>` pieces. The HF `tokenizers` crate
//! has neither sentencepiece's score-ordered BPE merging nor its user-defined scoring in the
//! lattice, so this stays a dedicated implementation; its `Precompiled` normaliser is reused for
//! models that carry a precompiled character map.

use crate::error::{Error, Result};
use std::collections::{BinaryHeap, HashMap};

/// sentencepiece's piece types (the GGUF token types use the same numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl PieceType {
    pub fn from_code(c: u64) -> Self {
        match c {
            2 => PieceType::Unknown,
            3 => PieceType::Control,
            4 => PieceType::UserDefined,
            5 => PieceType::Unused,
            6 => PieceType::Byte,
            _ => PieceType::Normal,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpmKind {
    Unigram,
    Bpe,
}

/// Whether a piece's text reads as a control marker (`<|user|>`, `<s>`, `[INST]`), as opposed
/// to user-defined text pieces such as runs of whitespace: the pieces a message's own text must
/// not produce in a chat prompt.
pub fn is_marker(p: &str) -> bool {
    p.chars().count() >= 3 && ((p.starts_with('<') && p.ends_with('>')) || (p.starts_with('[') && p.ends_with(']')))
}

/// A SentencePiece model.
pub struct SpmModel {
    pub kind: SpmKind,
    pub pieces: Vec<(String, f32, PieceType)>,
    pub byte_fallback: bool,
    pub add_dummy_prefix: bool,
    pub remove_extra_whitespaces: bool,
    pub escape_whitespaces: bool,
    pub unk_id: u32,
    unk_surface: String,
    charsmap: Option<tokenizers::normalizers::Precompiled>,
    /// NORMAL, USER_DEFINED and UNUSED pieces (what the model may produce).
    lookup: HashMap<String, u32>,
    /// CONTROL, UNKNOWN and BYTE pieces.
    reserved: HashMap<String, u32>,
    /// User-defined pieces, longest first, for prefix matching.
    user_defined: Vec<(String, u32)>,
    byte_ids: [Option<u32>; 256],
    min_score: f32,
    max_score: f32,
}

// ---- protobuf wire format -------------------------------------------------------------------

struct Wire<'a> {
    b: &'a [u8],
    pos: usize,
}

enum Field<'a> {
    Varint(u64),
    Fixed32(u32),
    Fixed64,
    Bytes(&'a [u8]),
}

impl<'a> Wire<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.b.get(self.pos)?;
            self.pos += 1;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    /// The next (field number, value), `None` at the end, `Some(Err)` on malformed input.
    fn next(&mut self) -> Option<std::result::Result<(u64, Field<'a>), ()>> {
        if self.pos >= self.b.len() {
            return None;
        }
        Some((|| {
            let key = self.varint().ok_or(())?;
            let f = match key & 7 {
                0 => Field::Varint(self.varint().ok_or(())?),
                1 => {
                    self.skip(8)?;
                    Field::Fixed64
                }
                2 => {
                    let n = self.varint().ok_or(())? as usize;
                    let s = self.b.get(self.pos..self.pos.checked_add(n).ok_or(())?).ok_or(())?;
                    self.pos += n;
                    Field::Bytes(s)
                }
                5 => {
                    let s = self.b.get(self.pos..self.pos + 4).ok_or(())?;
                    self.pos += 4;
                    Field::Fixed32(u32::from_le_bytes(s.try_into().unwrap()))
                }
                _ => return Err(()),
            };
            Ok((key >> 3, f))
        })())
    }
    fn skip(&mut self, n: usize) -> std::result::Result<(), ()> {
        if self.b.len() - self.pos < n {
            return Err(());
        }
        self.pos += n;
        Ok(())
    }
}

fn walk<'a>(b: &'a [u8], path: &str, mut f: impl FnMut(u64, Field<'a>) -> Result<()>) -> Result<()> {
    let mut w = Wire { b, pos: 0 };
    while let Some(r) = w.next() {
        let (num, field) = r.map_err(|_| Error::corrupt(path, "malformed SentencePiece protobuf"))?;
        f(num, field)?;
    }
    Ok(())
}

/// Checks a `precompiled_charsmap` (a u32 trie size in bytes, the trie as a darts double array
/// of u32 units, then NUL-terminated replacement strings) so that normalising any text with it
/// stays inside the trie and the strings: every node reachable from the root, for every next
/// byte, names a unit inside the array, and every leaf value is the start of a character in
/// the strings. The normaliser itself indexes without checks, so a charsmap that fails here
/// would panic at the first text that walks into the broken part.
fn check_charsmap(b: &[u8]) -> std::result::Result<(), String> {
    let Some(size) = b.get(..4).map(|s| u32::from_le_bytes(s.try_into().unwrap()) as usize) else {
        return Err("shorter than its 4-byte trie size".into());
    };
    if size == 0 || !size.is_multiple_of(4) || size > b.len() - 4 {
        return Err(format!("trie of {size} bytes in a {}-byte charsmap (must be a positive multiple of 4 that fits)", b.len()));
    }
    let units: Vec<u32> = b[4..4 + size].chunks_exact(4).map(|u| u32::from_le_bytes(u.try_into().unwrap())).collect();
    let strings = std::str::from_utf8(&b[4 + size..]).map_err(|_| "replacement strings are not UTF-8".to_string())?;
    // The unit layout sentencepiece's darts-clone writes (and the normaliser reads).
    let offset = |u: u32| ((u >> 10) << ((u & (1 << 9)) >> 6)) as usize;
    let label = |u: u32| u & ((1 << 31) | 0xff);
    let has_leaf = |u: u32| (u >> 8) & 1 == 1;
    let value = |u: u32| (u & ((1 << 31) - 1)) as usize;
    let mut seen = std::collections::HashSet::new();
    let mut todo = vec![offset(units[0])];
    while let Some(node) = todo.pop() {
        if !seen.insert(node) {
            continue;
        }
        for c in 1..=255u32 {
            let child = node ^ c as usize;
            let Some(&unit) = units.get(child) else {
                return Err(format!("trie node {node} has child {child} for byte {c:#04x}, past its {} units", units.len()));
            };
            if label(unit) != c {
                continue;
            }
            let next = child ^ offset(unit);
            if has_leaf(unit) {
                let Some(&leaf) = units.get(next) else {
                    return Err(format!("trie leaf {next} past its {} units", units.len()));
                };
                let v = value(leaf);
                if !strings.is_char_boundary(v) {
                    return Err(format!("replacement offset {v} is not the start of a character in the {}-byte strings", strings.len()));
                }
            }
            todo.push(next);
        }
    }
    Ok(())
}

impl SpmModel {
    /// Parses a `tokenizer.model` file's bytes.
    pub fn from_proto(bytes: &[u8], path: &str) -> Result<Self> {
        let mut pieces = Vec::new();
        let mut kind = SpmKind::Unigram;
        let mut byte_fallback = false;
        let (mut dummy, mut remove_ws, mut escape_ws) = (true, true, true);
        let mut charsmap: &[u8] = &[];
        let mut unk_surface = " \u{2047} ".to_string();
        walk(bytes, path, |num, field| {
            match (num, field) {
                (1, Field::Bytes(p)) => {
                    let (mut piece, mut score, mut ty) = (String::new(), 0.0f32, PieceType::Normal);
                    walk(p, path, |n, f| {
                        match (n, f) {
                            (1, Field::Bytes(s)) => piece = String::from_utf8_lossy(s).into_owned(),
                            (2, Field::Fixed32(v)) => score = f32::from_bits(v),
                            (3, Field::Varint(v)) => ty = PieceType::from_code(v),
                            _ => {}
                        }
                        Ok(())
                    })?;
                    pieces.push((piece, score, ty));
                }
                (2, Field::Bytes(t)) => walk(t, path, |n, f| {
                    match (n, f) {
                        (3, Field::Varint(v)) => {
                            kind = match v {
                                1 => SpmKind::Unigram,
                                2 => SpmKind::Bpe,
                                other => {
                                    return Err(Error::Unsupported(format!(
                                        "SentencePiece model type {other} (only Unigram and BPE are supported)"
                                    )))
                                }
                            }
                        }
                        (35, Field::Varint(v)) => byte_fallback = v != 0,
                        (44, Field::Bytes(s)) => unk_surface = String::from_utf8_lossy(s).into_owned(),
                        _ => {}
                    }
                    Ok(())
                })?,
                (3, Field::Bytes(t)) => walk(t, path, |n, f| {
                    match (n, f) {
                        (2, Field::Bytes(s)) => charsmap = s,
                        (3, Field::Varint(v)) => dummy = v != 0,
                        (4, Field::Varint(v)) => remove_ws = v != 0,
                        (5, Field::Varint(v)) => escape_ws = v != 0,
                        _ => {}
                    }
                    Ok(())
                })?,
                _ => {}
            }
            Ok(())
        })?;
        if pieces.is_empty() {
            return Err(Error::corrupt(path, "SentencePiece model without pieces"));
        }
        let charsmap = if charsmap.is_empty() {
            None
        } else {
            check_charsmap(charsmap).map_err(|e| Error::corrupt(path, format!("precompiled charsmap: {e}")))?;
            Some(
                tokenizers::normalizers::Precompiled::from(charsmap)
                    .map_err(|e| Error::corrupt(path, format!("precompiled charsmap: {e}")))?,
            )
        };
        let mut m = Self::new(kind, pieces, byte_fallback, dummy, remove_ws, escape_ws)?;
        m.unk_surface = unk_surface;
        m.charsmap = charsmap;
        Ok(m)
    }

    /// Builds a model from pieces (e.g. a GGUF `"llama"` vocabulary).
    pub fn new(
        kind: SpmKind,
        pieces: Vec<(String, f32, PieceType)>,
        byte_fallback: bool,
        add_dummy_prefix: bool,
        remove_extra_whitespaces: bool,
        escape_whitespaces: bool,
    ) -> Result<Self> {
        let mut lookup = HashMap::new();
        let mut reserved = HashMap::new();
        let mut user_defined = Vec::new();
        let mut byte_ids = [None; 256];
        let mut unk_id = None;
        // As sentencepiece: the largest score starts at FLT_MIN (the smallest positive float), so
        // with Unigram's negative log probabilities a user-defined piece scores about -0.1 per byte
        // and always wins.
        let (mut min_score, mut max_score) = (f32::MAX, f32::MIN_POSITIVE);
        for (i, (p, score, ty)) in pieces.iter().enumerate() {
            let id = i as u32;
            match ty {
                PieceType::Normal | PieceType::UserDefined | PieceType::Unused => {
                    lookup.entry(p.clone()).or_insert(id);
                }
                _ => {
                    reserved.entry(p.clone()).or_insert(id);
                }
            }
            match ty {
                PieceType::Normal => {
                    min_score = min_score.min(*score);
                    max_score = max_score.max(*score);
                }
                PieceType::UserDefined if !p.is_empty() => user_defined.push((p.clone(), id)),
                PieceType::Unknown => unk_id = unk_id.or(Some(id)),
                PieceType::Byte => {
                    if let Some(b) = p.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
                        if let Ok(b) = u8::from_str_radix(b, 16) {
                            byte_ids[b as usize] = Some(id);
                        }
                    }
                }
                _ => {}
            }
        }
        user_defined.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        let unk_id = unk_id.ok_or_else(|| Error::Unsupported("SentencePiece vocabulary without an <unk> piece".into()))?;
        if min_score > max_score {
            (min_score, max_score) = (0.0, 0.0);
        }
        Ok(Self {
            kind,
            pieces,
            byte_fallback,
            add_dummy_prefix,
            remove_extra_whitespaces,
            escape_whitespaces,
            unk_id,
            unk_surface: " \u{2047} ".into(),
            charsmap: None,
            lookup,
            reserved,
            user_defined,
            byte_ids,
            min_score,
            max_score,
        })
    }

    pub fn piece_to_id(&self, piece: &str) -> Option<u32> {
        self.lookup.get(piece).or_else(|| self.reserved.get(piece)).copied()
    }

    fn user_defined_at(&self, s: &str) -> Option<(usize, u32)> {
        self.user_defined.iter().find(|(p, _)| s.starts_with(p.as_str())).map(|(p, id)| (p.len(), *id))
    }

    /// sentencepiece's normaliser without a rule table: optional character map, whitespace
    /// trimming and collapsing, dummy prefix, spaces as U+2581.
    fn normalize(&self, text: &str) -> String {
        let mapped;
        let text = match &self.charsmap {
            Some(cm) => {
                use tokenizers::tokenizer::{NormalizedString, Normalizer};
                let mut n = NormalizedString::from(text);
                mapped = match cm.normalize(&mut n) {
                    Ok(()) => n.get().to_string(),
                    Err(_) => text.to_string(),
                };
                mapped.as_str()
            }
            None => text,
        };
        let mut s = String::with_capacity(text.len() + 4);
        let ws = if self.escape_whitespaces { '\u{2581}' } else { ' ' };
        let body: String = if self.remove_extra_whitespaces {
            let mut out = String::with_capacity(text.len());
            let mut prev_space = true;
            for c in text.trim_matches(' ').chars() {
                if c == ' ' {
                    if !prev_space {
                        out.push(' ');
                    }
                    prev_space = true;
                } else {
                    out.push(c);
                    prev_space = false;
                }
            }
            out
        } else {
            text.to_string()
        };
        if body.is_empty() {
            return s;
        }
        if self.add_dummy_prefix {
            s.push(ws);
        }
        for c in body.chars() {
            s.push(if c == ' ' { ws } else { c });
        }
        s
    }

    /// Token ids of `text` (no bos/eos), as `SentencePieceProcessor.encode(text)`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.encode_normalized(&self.normalize(text))
    }

    /// [`SpmModel::encode`], but user-defined marker pieces ([`is_marker`]: TildeOpen's
    /// `<|user|>`) are not taken whole from the text, nor made by merges: their text is text,
    /// spelt in other pieces. Text without such markers encodes exactly as `encode` does.
    pub fn encode_literal(&self, text: &str) -> Vec<u32> {
        self.encode_mode(&self.normalize(text), true)
    }

    /// Encodes text that is already normalised (no dummy prefix added here).
    pub fn encode_normalized(&self, norm: &str) -> Vec<u32> {
        self.encode_mode(norm, false)
    }

    fn encode_mode(&self, norm: &str, literal: bool) -> Vec<u32> {
        if norm.is_empty() {
            return Vec::new();
        }
        let pieces = match self.kind {
            SpmKind::Bpe => self.bpe(norm, literal),
            SpmKind::Unigram => self.unigram(norm, literal),
        };
        let mut ids = Vec::with_capacity(pieces.len());
        for (piece, id) in pieces {
            if id == self.unk_id && self.byte_fallback {
                for b in piece.bytes() {
                    ids.push(self.byte_ids[b as usize].unwrap_or(self.unk_id));
                }
            } else {
                ids.push(id);
            }
        }
        ids
    }

    fn bpe<'s>(&self, s: &'s str, literal: bool) -> Vec<(&'s str, u32)> {
        // Symbols as a doubly linked list of byte ranges into `s`.
        struct Sym {
            start: usize,
            end: usize,
            prev: isize,
            next: isize,
            frozen: bool,
        }
        let mut syms: Vec<Sym> = Vec::new();
        let mut pos = 0;
        while pos < s.len() {
            let (len, frozen) = match self.user_defined_at(&s[pos..]).filter(|(len, _)| !(literal && is_marker(&s[pos..pos + len]))) {
                Some((len, _)) => (len, true),
                None => (s[pos..].chars().next().unwrap().len_utf8(), false),
            };
            let i = syms.len() as isize;
            syms.push(Sym { start: pos, end: pos + len, prev: i - 1, next: i + 1, frozen });
            pos += len;
        }
        let n = syms.len() as isize;
        syms.last_mut().unwrap().next = -1;

        #[derive(PartialEq)]
        struct Pair {
            score: f32,
            left: usize,
            right: usize,
            len: usize,
        }
        impl Eq for Pair {}
        impl Ord for Pair {
            fn cmp(&self, o: &Self) -> std::cmp::Ordering {
                self.score.partial_cmp(&o.score).unwrap_or(std::cmp::Ordering::Equal).then(o.left.cmp(&self.left))
            }
        }
        impl PartialOrd for Pair {
            fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(o))
            }
        }
        let mut rev_merge: HashMap<&str, (&str, &str)> = HashMap::new();
        let mut agenda = BinaryHeap::new();
        let try_add = |syms: &Vec<Sym>, agenda: &mut BinaryHeap<Pair>, rev: &mut HashMap<&'s str, (&'s str, &'s str)>, l: isize, r: isize| {
            if l < 0 || r < 0 || r >= n {
                return;
            }
            let (a, b) = (&syms[l as usize], &syms[r as usize]);
            if a.frozen || b.frozen {
                return;
            }
            let piece = &s[a.start..b.end];
            if let Some(&id) = self.lookup.get(piece).filter(|&&id| !(literal && self.pieces[id as usize].2 == PieceType::UserDefined && is_marker(piece))) {
                agenda.push(Pair { score: self.pieces[id as usize].1, left: l as usize, right: r as usize, len: piece.len() });
                if self.pieces[id as usize].2 == PieceType::Unused {
                    rev.insert(piece, (&s[a.start..a.end], &s[b.start..b.end]));
                }
            }
        };
        for i in 1..n {
            try_add(&syms, &mut agenda, &mut rev_merge, i - 1, i);
        }
        while let Some(top) = agenda.pop() {
            let (l, r) = (top.left, top.right);
            // Skip pairs made stale by an earlier merge.
            if syms[l].end == syms[l].start || syms[r].end == syms[r].start || syms[l].next != r as isize {
                continue;
            }
            if syms[r].end - syms[l].start != top.len {
                continue;
            }
            syms[l].end = syms[r].end;
            syms[l].next = syms[r].next;
            if syms[r].next >= 0 {
                let nx = syms[r].next as usize;
                syms[nx].prev = l as isize;
            }
            syms[r].start = syms[r].end; // empty: removed
            let (prev, next) = (syms[l].prev, syms[l].next);
            try_add(&syms, &mut agenda, &mut rev_merge, prev, l as isize);
            try_add(&syms, &mut agenda, &mut rev_merge, l as isize, next);
        }
        let mut out = Vec::new();
        let mut i = 0isize;
        while i >= 0 && i < n {
            let sy = &syms[i as usize];
            self.resegment(&s[sy.start..sy.end], &rev_merge, &mut out);
            i = sy.next;
        }
        out
    }

    fn resegment<'s>(&self, piece: &'s str, rev: &HashMap<&'s str, (&'s str, &'s str)>, out: &mut Vec<(&'s str, u32)>) {
        match self.lookup.get(piece) {
            Some(&id) if self.pieces[id as usize].2 != PieceType::Unused => out.push((piece, id)),
            Some(&id) => match rev.get(piece) {
                Some(&(a, b)) => {
                    self.resegment(a, rev, out);
                    self.resegment(b, rev, out);
                }
                None => out.push((piece, id)),
            },
            None => out.push((piece, self.unk_id)),
        }
    }

    fn unigram<'s>(&self, s: &'s str, literal: bool) -> Vec<(&'s str, u32)> {
        const UNK_PENALTY: f32 = 10.0;
        let unk_score = self.min_score - UNK_PENALTY;
        // best[i] = (score, start, id) of the best path ending at byte offset i.
        let mut best: Vec<Option<(f32, usize, u32)>> = vec![None; s.len() + 1];
        best[0] = Some((0.0, 0, 0));
        let max_len = self.pieces.iter().map(|p| p.0.len()).max().unwrap_or(1);
        for (start, c) in s.char_indices() {
            let Some((base, _, _)) = best[start] else { continue };
            let rest = &s[start..];
            let mut has_single = false;
            // Prefixes shortest first, as sentencepiece's trie enumerates them.
            for (end_rel, _) in rest.char_indices().skip(1).chain(std::iter::once((rest.len(), ' '))) {
                if end_rel > max_len {
                    break;
                }
                let piece = &rest[..end_rel];
                let Some(&id) = self.lookup.get(piece) else { continue };
                let (_, score, ty) = &self.pieces[id as usize];
                let score = match ty {
                    PieceType::Unused => continue,
                    PieceType::UserDefined if literal && is_marker(piece) => continue,
                    PieceType::UserDefined => end_rel as f32 * self.max_score - 0.1,
                    _ => *score,
                };
                if end_rel == c.len_utf8() {
                    has_single = true;
                }
                let total = base + score;
                let slot = &mut best[start + end_rel];
                if slot.is_none_or(|(b, _, _)| total > b) {
                    *slot = Some((total, start, id));
                }
            }
            if !has_single {
                let end = start + c.len_utf8();
                let total = base + unk_score;
                let slot = &mut best[end];
                if slot.is_none_or(|(b, _, _)| total > b) {
                    *slot = Some((total, start, self.unk_id));
                }
            }
        }
        let mut out = Vec::new();
        let mut end = s.len();
        while end > 0 {
            let (_, start, id) = best[end].expect("every character has a path");
            let piece = &s[start..end];
            match out.last_mut() {
                // Without byte fallback, consecutive unknown characters become one <unk>.
                Some((p, last)) if !self.byte_fallback && id == self.unk_id && *last == self.unk_id => {
                    let p: &mut &str = p;
                    *p = &s[start..start + piece.len() + p.len()];
                }
                _ => out.push((piece, id)),
            }
            end = start;
        }
        out.reverse();
        out
    }

    /// Raw bytes of a sequence of ids, as `SentencePieceProcessor.decode` builds them (control
    /// pieces dropped, U+2581 as space, the dummy prefix's space removed).
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut first = true;
        for &id in ids {
            let Some((piece, _, ty)) = self.pieces.get(id as usize) else { continue };
            match ty {
                PieceType::Control => continue,
                PieceType::Unknown => out.extend_from_slice(self.unk_surface.as_bytes()),
                PieceType::Byte => match piece.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => out.push(b),
                    None => continue,
                },
                PieceType::UserDefined => out.extend_from_slice(piece.as_bytes()),
                _ => {
                    let text = piece.replace('\u{2581}', " ");
                    let text = if first && self.add_dummy_prefix { text.strip_prefix(' ').unwrap_or(&text).to_string() } else { text };
                    out.extend_from_slice(text.as_bytes());
                }
            }
            first = false;
        }
        out
    }
}
