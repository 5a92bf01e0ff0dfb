//! Chat templates: the model's own Jinja template (`tokenizer_config.json`'s `chat_template`,
//! GGUF's `tokenizer.chat_template`) rendered with minijinja as transformers renders it
//! (`trim_blocks`, `lstrip_blocks`, Python string methods, `raise_exception`), or, for a model
//! without one (TildeOpen base), [`TILDEOPEN_TEMPLATE`].

use crate::error::{Error, Result};
use crate::text::tokenizer::Tokenizer;

/// The built-in template for models that ship none: Tilde's instruction format
/// `<|user|>...<|user|><|assistant|>...<|assistant|>`, bos first, system messages prepended to
/// the next user turn (several joined by blank lines) followed by a blank line; system
/// messages no user turn follows are a user turn of their own. Generation ends at
/// `<|assistant|>` (the end of the assistant's turn), `<|user|>` or eos.
pub const TILDEOPEN_TEMPLATE: &str = concat!(
    "{{- bos_token -}}",
    "{%- set ns = namespace(system='') -%}",
    "{%- for message in messages -%}",
    "{%- if message['role'] == 'system' -%}{%- set ns.system = ns.system + ('\\n\\n' if ns.system else '') + message['content'] -%}",
    "{%- elif message['role'] == 'user' -%}{{- '<|user|>' + (ns.system + '\\n\\n' if ns.system else '') + message['content'] + '<|user|>' -}}{%- set ns.system = '' -%}",
    "{%- elif message['role'] == 'assistant' -%}",
    "{%- if ns.system -%}{{- '<|user|>' + ns.system + '<|user|>' -}}{%- set ns.system = '' -%}{%- endif -%}",
    "{{- '<|assistant|>' + message['content'] + '<|assistant|>' -}}",
    "{%- endif -%}",
    "{%- endfor -%}",
    "{%- if ns.system -%}{{- '<|user|>' + ns.system + '<|user|>' -}}{%- endif -%}",
    "{%- if add_generation_prompt -%}{{- '<|assistant|>' -}}{%- endif -%}",
);

/// A compiled chat template with the special-token strings it is rendered with.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    /// Whether this is [`TILDEOPEN_TEMPLATE`] (the model shipped none).
    pub builtin: bool,
    bos_token: String,
    eos_token: String,
    /// Extra end-of-generation ids the template implies (`<|assistant|>`, `<|user|>` for the
    /// built-in one).
    pub stop_ids: Vec<u32>,
}

/// Instructions one template render may run (minijinja's fuel).
pub const TEMPLATE_FUEL: u64 = 20_000_000;

impl ChatTemplate {
    /// The template for a tokenizer: its own, or the built-in TildeOpen one.
    pub fn for_tokenizer(tok: &Tokenizer) -> Result<Self> {
        let (source, builtin) = match &tok.chat_template {
            Some(t) => (t.clone(), false),
            None => (TILDEOPEN_TEMPLATE.to_string(), true),
        };
        let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or_default();
        let mut stop_ids = Vec::new();
        if builtin {
            for m in ["<|assistant|>", "<|user|>"] {
                match tok.token_id(m) {
                    Some(i) => stop_ids.push(i),
                    None => {
                        return Err(Error::Unsupported(format!(
                            "the model has no chat template and its vocabulary lacks {m}, which the built-in TildeOpen template needs"
                        )))
                    }
                }
            }
        }
        Self::new(source, builtin, text(tok.bos), text(tok.eog.first().copied()), stop_ids)
    }

    /// A template from its Jinja source.
    pub fn new(source: String, builtin: bool, bos_token: String, eos_token: String, stop_ids: Vec<u32>) -> Result<Self> {
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // A template comes with the model file: bound the work one render may do (a real chat
        // template over thousands of messages takes well under a tenth of this).
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source).map_err(|e| Error::Unsupported(format!("chat template does not compile: {e}")))?;
        Ok(ChatTemplate { env, builtin, bos_token, eos_token, stop_ids })
    }

    /// The prompt text for `messages` (objects with `role` and `content`, such as the chat layer's
    /// `Message`), ending with the assistant's turn opening when
    /// `add_generation_prompt`.
    pub fn render<M: serde::Serialize>(&self, messages: &[M], add_generation_prompt: bool) -> Result<String> {
        let t = self.env.get_template("chat").expect("added in new()");
        t.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
        .map_err(|e| Error::Input(format!("chat template: {e}")))
    }
}

/// Stands in for message `i`'s content in a render that finds where the contents land
/// ([`place_contents`]): private-use characters, which no template changes.
pub fn content_marker(i: usize) -> String {
    format!("\u{F8F0}{i}\u{F8F1}")
}

/// Where the messages' `contents` stand in `real`, a template's render of them: `marked` is
/// the same template's render with each content replaced by its [`content_marker`]; the
/// contents are put back (as they are, or trimmed, as templates that `| trim` them do) and the
/// result must be `real` to the byte. `None` when it is not (the template changed a content in
/// another way, or branched on it).
pub fn place_contents(real: &str, marked: &str, contents: &[&str]) -> Option<Vec<std::ops::Range<usize>>> {
    let put_back = |trim: bool| -> Option<Vec<std::ops::Range<usize>>> {
        let mut out = String::with_capacity(real.len());
        let mut ranges = Vec::new();
        let mut rest = marked;
        while let Some(open) = rest.find('\u{F8F0}') {
            out.push_str(&rest[..open]);
            let after = &rest[open + '\u{F8F0}'.len_utf8()..];
            let close = after.find('\u{F8F1}')?;
            let i: usize = after[..close].parse().ok()?;
            let c = contents.get(i)?;
            let c = if trim { c.trim() } else { c };
            ranges.push(out.len()..out.len() + c.len());
            out.push_str(c);
            rest = &after[close + '\u{F8F1}'.len_utf8()..];
        }
        out.push_str(rest);
        (out == real).then_some(ranges)
    };
    put_back(false).or_else(|| put_back(true))
}
