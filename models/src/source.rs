//! Where a model comes from: a local directory or a Hugging Face model id resolved
//! through the local HF cache (`hf-hub`, built without network support, so it is
//! offline by construction), and reading its safetensors weights, single-file or
//! sharded via `model.safetensors.index.json`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::safetensors::{Load, MmapedSafetensors};
use candle_core::{DType, Device, Tensor};

use crate::{ModelError, Result, regular_file};

/// The files of one model: `config.json`, the weights, and `tokenizer.json` if
/// shipped; or one GGUF file, whose metadata holds the config and the tokenizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFiles {
    /// `config.json`; `None` for a GGUF model.
    pub config: Option<PathBuf>,
    /// The safetensors files (one, or every shard named by the index), or the GGUF file.
    pub weights: Vec<PathBuf>,
    /// `tokenizer.json`, when the model ships one.
    pub tokenizer: Option<PathBuf>,
}

impl ModelFiles {
    /// One GGUF file.
    pub fn gguf(file: PathBuf) -> Self {
        Self {
            config: None,
            weights: vec![file],
            tokenizer: None,
        }
    }

    /// The GGUF file of a GGUF model, `None` for safetensors.
    pub fn gguf_file(&self) -> Option<&Path> {
        match (&self.config, self.weights.as_slice()) {
            (None, [file]) => Some(file),
            _ => None,
        }
    }

    /// The files of a local model: a directory (config.json and safetensors, or one
    /// `.gguf` file) or a `.gguf` file. Errors name the missing path, or the file
    /// that is there but is not a regular file (a FIFO, a device, a link to one).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                // Something other than a folder: a model file, or an error
                // saying what it is instead.
                regular_file::check(dir).map_err(|e| ModelError::io(dir, e))?;
                if dir
                    .extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
                {
                    return Ok(Self::gguf(dir.to_path_buf()));
                }
                return Err(ModelError::InvalidInput(format!(
                    "{} is a file, not a .gguf file; a model is a folder (config.json and \
                     safetensors, or one .gguf file) or a .gguf file",
                    dir.display()
                )));
            }
            Err(_) => {
                return Err(ModelError::MissingPath {
                    what: "model directory",
                    path: dir.to_path_buf(),
                });
            }
        }
        let config = dir.join("config.json");
        if !present(&config)? {
            let ggufs = gguf_files_in(dir)?;
            return match ggufs.as_slice() {
                [one] => Ok(Self::gguf(one.clone())),
                [] => Err(ModelError::MissingPath {
                    what: "config.json (or one .gguf file)",
                    path: config,
                }),
                many => Err(ModelError::InvalidInput(format!(
                    "{} holds {} GGUF files ({}); name one: --model {}",
                    dir.display(),
                    many.len(),
                    many.iter()
                        .filter_map(|p| p.file_name()?.to_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    many[0].display()
                ))),
            };
        }
        let config = Some(config);
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let weights = if present(&single)? {
            vec![single]
        } else if present(&index)? {
            shard_names(&index)?
                .into_iter()
                .map(|n| dir.join(n))
                .collect()
        } else {
            return Err(ModelError::MissingPath {
                what: "model.safetensors (or model.safetensors.index.json)",
                path: single,
            });
        };
        for shard in &weights {
            if !present(shard)? {
                return Err(ModelError::MissingPath {
                    what: "safetensors shard",
                    path: shard.clone(),
                });
            }
        }
        let tokenizer = dir.join("tokenizer.json");
        let tokenizer = present(&tokenizer)?.then_some(tokenizer);
        Ok(Self {
            config,
            weights,
            tokenizer,
        })
    }

    /// Checks that every file is a regular file ([`regular_file`]): a model
    /// found in the Hugging Face cache is links into its blobs, each of which
    /// must be one.
    fn checked(self) -> Result<Self> {
        for path in self
            .config
            .iter()
            .chain(&self.weights)
            .chain(&self.tokenizer)
        {
            regular_file::check(path).map_err(|e| ModelError::io(path, e))?;
        }
        Ok(self)
    }

    /// The files of Hugging Face model `model_id` from the local HF cache (`HF_HOME`,
    /// default `~/.cache/huggingface`). Nothing is downloaded: a file missing from the
    /// cache is a [`ModelError::NotInHubCache`] naming the model, file and cache dir.
    pub fn from_hub_cache(model_id: &str) -> Result<Self> {
        Self::from_hub_cache_at(hf_hub::Cache::from_env(), model_id)
    }

    /// [`Self::from_hub_cache`] with an explicit cache (tests, custom `HF_HOME`).
    pub fn from_hub_cache_at(cache: hf_hub::Cache, model_id: &str) -> Result<Self> {
        let cache_dir = cache.path().clone();
        let repo = cache.model(model_id.to_string());
        let missing = |file: &str| ModelError::NotInHubCache {
            model_id: model_id.to_string(),
            file: file.to_string(),
            cache_dir: cache_dir.clone(),
        };
        let config = Some(
            repo.get("config.json")
                .ok_or_else(|| missing("config.json"))?,
        );
        let weights = if let Some(single) = repo.get("model.safetensors") {
            vec![single]
        } else {
            let index = repo
                .get("model.safetensors.index.json")
                .ok_or_else(|| missing("model.safetensors"))?;
            shard_names(&index)?
                .iter()
                .map(|n| repo.get(n).ok_or_else(|| missing(n)))
                .collect::<Result<_>>()?
        };
        Self {
            config,
            weights,
            tokenizer: repo.get("tokenizer.json"),
        }
        .checked()
    }

    /// The GGUF file of Hugging Face repository `model_id` whose name holds `quant`
    /// (`Q8_0` finds `Qwen3-4B-Q8_0.gguf`), from the local HF cache.
    pub fn gguf_from_hub_cache(model_id: &str, quant: &str) -> Result<Self> {
        Self::gguf_from_hub_cache_at(hf_hub::Cache::from_env(), model_id, quant)
    }

    /// [`Self::gguf_from_hub_cache`] with an explicit cache.
    pub fn gguf_from_hub_cache_at(
        cache: hf_hub::Cache,
        model_id: &str,
        quant: &str,
    ) -> Result<Self> {
        let cache_dir = cache.path().clone();
        let missing = || ModelError::NotInHubCache {
            model_id: model_id.to_string(),
            file: format!("*{quant}*.gguf"),
            cache_dir: cache_dir.clone(),
        };
        // The cache layout: models--ORG--NAME/refs/main names the snapshot folder.
        let repo = cache_dir.join(format!("models--{}", model_id.replace('/', "--")));
        let refs = repo.join("refs/main");
        let rev = regular_file::check(&refs)
            .and_then(|_| std::fs::read_to_string(&refs))
            .map_err(|_| missing())?;
        let snapshot = repo.join("snapshots").join(rev.trim());
        let wanted = quant.to_ascii_lowercase();
        let matches: Vec<PathBuf> = gguf_files_in(&snapshot)
            .map_err(|_| missing())?
            .into_iter()
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.to_ascii_lowercase().contains(&wanted))
            })
            .collect();
        match matches.as_slice() {
            [one] => Self::gguf(one.clone()).checked(),
            [] => Err(missing()),
            many => Err(ModelError::InvalidInput(format!(
                "{model_id}:{quant} matches {} GGUF files in the cache ({}); name the file",
                many.len(),
                many.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// A local path (directory or `.gguf` file) when `source` exists, otherwise a
    /// Hugging Face model id (`org/name`) looked up in the local HF cache, or
    /// `org/name:QUANT` for the GGUF file of that quantization in a GGUF repository.
    pub fn resolve(source: &str) -> Result<Self> {
        let path = Path::new(source);
        if path.exists() || source.starts_with('.') || source.starts_with('/') {
            return Self::from_dir(path);
        }
        match source.split_once(':') {
            Some((id, quant)) if id.split('/').count() == 2 && !quant.is_empty() => {
                Self::gguf_from_hub_cache(id, quant)
            }
            _ if source.split('/').count() == 2 => Self::from_hub_cache(source),
            _ => Self::from_dir(path),
        }
    }
}

/// Whether the regular file `path` is there; an error naming it when something
/// else is (a FIFO, a device, a link to one).
fn present(path: &Path) -> Result<bool> {
    regular_file::present(path).map_err(|e| ModelError::io(path, e))
}

/// The `.gguf` files directly in `dir`, sorted; one that is not a regular file
/// is an error naming it.
fn gguf_files_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| ModelError::io(dir, e))? {
        let path = entry.map_err(|e| ModelError::io(dir, e))?.path();
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
            && !std::fs::metadata(&path).is_ok_and(|m| m.is_dir())
            && present(&path)?
        {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// Shard file names listed in a `model.safetensors.index.json`, deduplicated, sorted.
fn shard_names(index: &Path) -> Result<Vec<String>> {
    let text = regular_file::check(index)
        .and_then(|_| std::fs::read_to_string(index))
        .map_err(|e| ModelError::io(index, e))?;
    let bad = |message: String| ModelError::SafeTensors {
        path: index.to_path_buf(),
        message,
    };
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no \"weight_map\" object".into()))?;
    let mut names: Vec<String> = map
        .values()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    if names.is_empty() {
        return Err(bad("\"weight_map\" lists no files".into()));
    }
    Ok(names)
}

/// Memory-mapped safetensors files with a name → file routing table.
pub(crate) struct Weights {
    files: Vec<(PathBuf, MmapedSafetensors)>,
    routing: HashMap<String, usize>,
}

impl Weights {
    pub(crate) fn open(paths: &[PathBuf]) -> Result<Self> {
        let mut files = Vec::with_capacity(paths.len());
        let mut routing = HashMap::new();
        for (i, path) in paths.iter().enumerate() {
            if !path.is_file() {
                return Err(ModelError::MissingPath {
                    what: "safetensors file",
                    path: path.clone(),
                });
            }
            // SAFETY: the mapping is read-only; as with every mmap-based loader the file
            // must not be truncated while the model is loading. Tensors are copied out
            // in `get`, so the map is dropped once loading ends.
            let st =
                unsafe { MmapedSafetensors::new(path) }.map_err(|e| ModelError::SafeTensors {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            for (name, _) in st.tensors() {
                routing.insert(name, i);
            }
            files.push((path.clone(), st));
        }
        Ok(Self { files, routing })
    }

    /// Loads `name`, checking it has `shape`, converted to `dtype` on `device`.
    pub(crate) fn get(
        &self,
        name: &str,
        shape: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let &i = self
            .routing
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })?;
        let (path, st) = &self.files[i];
        let view = st.get(name).map_err(|e| ModelError::SafeTensors {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if view.shape() != shape {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                expected: shape.to_vec(),
                found: view.shape().to_vec(),
            });
        }
        let bad = |message: String| ModelError::BadWeights {
            name: name.to_string(),
            path: path.clone(),
            message,
        };
        use safetensors::Dtype as St;
        if !matches!(view.dtype(), St::F32 | St::BF16 | St::F16 | St::F64) {
            return Err(bad(format!(
                "dtype {:?}; aisql loads f32, bf16, f16 or f64 weights",
                view.dtype()
            )));
        }
        let t = view
            .load(&Device::Cpu)
            .map_err(|e| ModelError::SafeTensors {
                path: path.clone(),
                message: format!("{name}: {e}"),
            })?;
        // Checked on the CPU copy, before it goes to the device.
        if let Some(why) = non_finite(&t)? {
            return Err(bad(why));
        }
        Ok(t.to_dtype(dtype)?.to_device(device)?)
    }
}

/// Why the weight `t` is unusable when one of its values is not finite (the
/// first such element and its value), `None` when all are.
pub(crate) fn non_finite(t: &Tensor) -> Result<Option<String>> {
    let values = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    Ok(values
        .iter()
        .position(|x| !x.is_finite())
        .map(|i| format!("element {i} is {} (weights must be finite)", values[i])))
}

/// The default compute dtype for a device: f32 on CPU (bf16 matmuls there are about
/// 10× slower), bf16 on GPU.
pub fn default_dtype(device: &Device) -> DType {
    if device.is_cpu() {
        DType::F32
    } else {
        DType::BF16
    }
}

/// [`default_dtype`] as a [`Precision`](crate::Precision).
pub fn default_precision(device: &Device) -> crate::Precision {
    crate::Precision::from_dtype(default_dtype(device)).expect("f32 or bf16")
}

/// The device for `cuda_ordinal`: CPU for `None`, GPU `n` for `Some(n)` (an error in
/// a build without the `cuda` feature).
pub fn device(cuda_ordinal: Option<usize>) -> Result<Device> {
    match cuda_ordinal {
        None => Ok(Device::Cpu),
        #[cfg(feature = "cuda")]
        Some(n) => Device::new_cuda(n).map_err(|e| {
            ModelError::Device(format!("cannot open CUDA device {n} (--gpu {n}): {e}"))
        }),
        #[cfg(not(feature = "cuda"))]
        Some(n) => Err(ModelError::Device(format!(
            "GPU {n} requested, but aisql was built without the `cuda` feature \
             (build with `--features cuda`, see README \"CUDA\")"
        ))),
    }
}

/// Free memory of `device` in bytes: the GPU's free memory for a CUDA device, `None`
/// for the CPU (whose budget comes from the host's memory).
pub fn device_free_memory(device: &Device) -> Option<usize> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(cuda) => cuda
            .cuda_stream()
            .context()
            .mem_get_info()
            .ok()
            .map(|(free, _)| free),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_model_dir_names_the_path() {
        let err = ModelFiles::from_dir("/no/such/model").unwrap_err();
        assert!(err.to_string().contains("/no/such/model"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn a_model_file_that_is_not_a_regular_file_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("m.gguf");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let zero = dir.path().join("zero.gguf");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        for (path, what) in [
            (&fifo, "a FIFO (named pipe), not a regular file"),
            (&zero, "a symbolic link to a character device (/dev/zero)"),
        ] {
            // Opening the FIFO would block forever: the check comes first.
            let e = ModelFiles::from_dir(path).unwrap_err().to_string();
            assert!(e.contains(what) && !e.contains("does not exist"), "{e}");
            assert!(e.contains(&path.display().to_string()), "{e}");
            let e = crate::gguf::GgufFile::open(path).unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        }
        // Inside a model folder: a config.json or a lone .gguf that is a FIFO.
        let folder = dir.path().join("model");
        std::fs::create_dir(&folder).unwrap();
        std::os::unix::fs::symlink(&fifo, folder.join("only.gguf")).unwrap();
        let e = ModelFiles::from_dir(&folder).unwrap_err().to_string();
        assert!(e.contains("only.gguf") && e.contains("a FIFO"), "{e}");
        std::fs::remove_file(folder.join("only.gguf")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", folder.join("config.json")).unwrap();
        let e = ModelFiles::from_dir(&folder).unwrap_err().to_string();
        assert!(
            e.contains("config.json") && e.contains("a character device"),
            "{e}"
        );
    }

    #[test]
    fn hub_id_not_in_cache_is_a_clear_error() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = hf_hub::Cache::new(tmp.path().to_path_buf());
        let err = ModelFiles::from_hub_cache_at(cache, "Qwen/Qwen3-0.6B").unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ModelError::NotInHubCache { .. }), "{msg}");
        assert!(
            msg.contains("Qwen/Qwen3-0.6B") && msg.contains("config.json"),
            "{msg}"
        );
        assert!(msg.contains(&tmp.path().display().to_string()), "{msg}");
    }

    #[test]
    fn hub_cache_layout_is_read_offline() {
        // The HF cache layout: models--org--name/{refs/main, snapshots/<rev>/<file>}.
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("models--org--m");
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "abc123").unwrap();
        let snap = repo.join("snapshots/abc123");
        std::fs::create_dir_all(&snap).unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::write(snap.join(f), "{}").unwrap();
        }
        let files =
            ModelFiles::from_hub_cache_at(hf_hub::Cache::new(tmp.path().to_path_buf()), "org/m")
                .unwrap();
        assert_eq!(files.config, Some(snap.join("config.json")));
        assert_eq!(files.weights, vec![snap.join("model.safetensors")]);
        assert_eq!(files.tokenizer, None);
    }

    #[test]
    fn sharded_index_lists_every_shard() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("config.json"), "{}").unwrap();
        std::fs::write(
            tmp.path().join("model.safetensors.index.json"),
            r#"{"metadata":{},"weight_map":{"a":"model-00002-of-00002.safetensors","b":"model-00001-of-00002.safetensors","c":"model-00001-of-00002.safetensors"}}"#,
        )
        .unwrap();
        let err = ModelFiles::from_dir(tmp.path()).unwrap_err();
        assert!(
            err.to_string().contains("model-00001-of-00002.safetensors"),
            "{err}"
        );
        for n in [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ] {
            std::fs::write(tmp.path().join(n), "").unwrap();
        }
        let files = ModelFiles::from_dir(tmp.path()).unwrap();
        assert_eq!(files.weights.len(), 2);
        assert!(files.weights[0].ends_with("model-00001-of-00002.safetensors"));
    }

    #[test]
    fn cpu_defaults_to_f32() {
        assert_eq!(default_dtype(&Device::Cpu), DType::F32);
        assert!(device(None).unwrap().is_cpu());
        #[cfg(not(feature = "cuda"))]
        assert!(device(Some(0)).is_err());
    }
}
