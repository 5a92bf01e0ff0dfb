//! Model files on disk (native): GGUF files and HF checkpoint directories, read tensor by tensor
//! from memory maps so the host never holds a second copy of the model.

use crate::model::config::ModelConfig;
use crate::error::{Error, Result};
use crate::model::gguf::Gguf;
pub use crate::model::tensor::HostTensor;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use crate::model::tensor::WeightFormat;

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.display().to_string(), source }
}

fn mmap(path: &Path) -> Result<memmap2::Mmap> {
    let f = std::fs::File::open(path).map_err(io_err(path))?;
    // SAFETY: the file is opened read-only; we never write through the mapping. A file truncated
    // by another process while mapped is the documented hazard of memory maps.
    unsafe { memmap2::Mmap::map(&f) }.map_err(io_err(path))
}

/// A model on disk.
pub enum ModelFiles {
    Gguf { path: PathBuf, map: memmap2::Mmap, gguf: Gguf },
    Hf(HfDir),
}

/// An HF checkpoint directory: config.json plus one or more safetensors files.
pub struct HfDir {
    pub dir: PathBuf,
    pub config_text: String,
    shards: Vec<(PathBuf, memmap2::Mmap)>,
    /// tensor name -> (shard index, its dtype, shape and byte range, from the header parsed once)
    index: HashMap<String, (usize, crate::model::tensor::SafetensorsEntry)>,
    pub format: WeightFormat,
}

impl ModelFiles {
    /// Opens a GGUF file or an HF checkpoint directory.
    pub fn open(path: &Path, hf_format: WeightFormat) -> Result<Self> {
        let meta = std::fs::metadata(path).map_err(io_err(path))?;
        if meta.is_dir() {
            return Ok(ModelFiles::Hf(HfDir::open(path, hf_format)?));
        }
        let map = mmap(path)?;
        let gguf = Gguf::parse(&map, map.len() as u64, &path.display().to_string())?;
        Ok(ModelFiles::Gguf { path: path.to_path_buf(), map, gguf })
    }

    pub fn config(&self) -> Result<ModelConfig> {
        match self {
            ModelFiles::Gguf { gguf, .. } => gguf.config(),
            ModelFiles::Hf(h) => ModelConfig::from_hf_json(&h.config_text),
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            ModelFiles::Gguf { path, .. } => path,
            ModelFiles::Hf(h) => &h.dir,
        }
    }

    /// Whether a tensor (GGUF naming) exists.
    pub fn has(&self, name: &str) -> bool {
        match self {
            ModelFiles::Gguf { gguf, .. } => gguf.tensor(name).is_some(),
            ModelFiles::Hf(h) => h.index.contains_key(&hf_name(name)),
        }
    }

    /// Reads one tensor by its GGUF name (`blk.3.attn_q.weight`), checks its shape against
    /// `[rows, cols]`, and returns it in a GPU-ready layout. Q and K come back in HF row order
    /// (llama.cpp's row permutation undone) so one rotation convention serves both formats.
    pub fn tensor(&self, name: &str, rows: usize, cols: usize, cfg: &ModelConfig) -> Result<HostTensor<'_>> {
        let t = match self {
            ModelFiles::Gguf { path, map, gguf } => {
                let info = gguf
                    .tensor(name)
                    .ok_or_else(|| Error::Shape(format!("GGUF {} lacks tensor {name}", path.display())))?;
                let data = &map[info.offset as usize..(info.offset + info.size) as usize];
                crate::model::gguf::host_tensor(info, data, rows, cols, cfg)?
            }
            ModelFiles::Hf(h) => h.tensor(name, rows, cols)?,
        };
        Ok(t)
    }
}

use crate::model::names::hf_name;

impl HfDir {
    fn open(dir: &Path, format: WeightFormat) -> Result<Self> {
        let cfg_path = dir.join("config.json");
        let config_text = std::fs::read_to_string(&cfg_path).map_err(io_err(&cfg_path))?;
        let index_path = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index_path.exists() {
            let text = std::fs::read_to_string(&index_path).map_err(io_err(&index_path))?;
            crate::model::tensor::index_shards(&text, &index_path.display().to_string())?.iter().map(|n| dir.join(n)).collect()
        } else {
            vec![dir.join("model.safetensors")]
        };
        let mut shards = Vec::new();
        let mut index = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            let map = mmap(f)?;
            for (name, entry) in crate::model::tensor::safetensors_entries(&map, &f.display().to_string())? {
                // Two shards with the same tensor: which one is meant is unknowable (the web
                // loader would take another than this one), so neither is.
                if index.contains_key(&name) {
                    return Err(Error::corrupt(f.display().to_string(), format!("tensor {name} is in two shards")));
                }
                index.insert(name, (i, entry));
            }
            shards.push((f.clone(), map));
        }
        Ok(HfDir { dir: dir.to_path_buf(), config_text, shards, index, format })
    }

    fn tensor(&self, name: &str, rows: usize, cols: usize) -> Result<HostTensor<'_>> {
        let hf = hf_name(name);
        let (i, entry) = self
            .index
            .get(&hf)
            .ok_or_else(|| Error::Shape(format!("checkpoint {} lacks tensor {hf}", self.dir.display())))?;
        let (path, map) = &self.shards[*i];
        crate::model::tensor::safetensors_entry_tensor(map, entry, &hf, rows, cols, self.format, &path.display().to_string())
    }
}
