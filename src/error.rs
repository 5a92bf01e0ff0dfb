//! One error type for the whole crate: every failure becomes a readable one-line message.

/// Errors the runtime can report. Each variant's `Display` is one readable line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A model file is malformed: bad magic, truncated, inconsistent header.
    #[error("corrupt model file {path}: {msg}")]
    Corrupt { path: String, msg: String },
    /// The file is well-formed but describes something this runtime does not run.
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// A tensor has the wrong shape for the configuration.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// A caller passed an invalid argument (token id out of range, empty prompt, ...).
    #[error("invalid input: {0}")]
    Input(String),
    /// No GPU adapter, or one whose limits are too small.
    #[error("GPU error: {0}")]
    Gpu(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn corrupt(path: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Corrupt { path: path.into(), msg: msg.into() }
    }
}
