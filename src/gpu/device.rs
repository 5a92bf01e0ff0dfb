//! The GPU context: adapter and device with the adapter's real limits, buffer helpers and
//! asynchronous readback (awaited on the web, polled natively).

use crate::error::{Error, Result};
use wgpu::util::DeviceExt;

/// Options for opening the GPU.
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// Caps the storage binding size (and so every buffer) below the adapter's limit, to test
    /// tensor splitting on any machine.
    pub max_binding_size: Option<u64>,
    /// Only the baseline kernels: no fused ops, no split attention (also with the environment
    /// variable `TILDEOPEN_BASELINE_KERNELS=1`). For testing the fallbacks and for comparison.
    pub baseline: bool,
    /// The subgroup matvec: `None` picks it where the adapter has subgroups and is not a CPU
    /// device (on lavapipe it measured 1.4-2.2x slower per decode step than the plain matvec);
    /// `Some(true)` wherever the adapter has subgroups, `Some(false)` never. The environment
    /// variable `TILDEOPEN_SUBGROUPS=1` or `0` overrides `None`.
    pub subgroups: Option<bool>,
    /// The RMSNorm folded into the matvecs that consume it (Q/K/V, gate/up): `None` picks it on
    /// devices that are not CPUs (on lavapipe the redundant per-row-group norm measured slower
    /// than the norm pass it replaces), `Some(b)` forces it. The environment variable
    /// `TILDEOPEN_NORM_FOLD=1` or `0` overrides `None`.
    pub norm_fold: Option<bool>,
    /// The 8-bit integer-dot matvec (`shaders/matvec_q8.wgsl`) for Q8_0, Q4_0, Q4_1, Q4_K and Q6_K
    /// matrices fed by a norm (Q/K/V, gate/up), where WGSL has `dot4I8Packed`. Lossy (the
    /// input is rounded to 8 bits), so off unless asked for here or with
    /// `TILDEOPEN_INT_DOT=1`.
    pub int_dot: Option<bool>,
    /// Prefill attention with several tokens per workgroup (each key and value row read once
    /// for all of them): `None` or `Some(true)` where split attention runs, `Some(false)` one
    /// token per workgroup. The environment variable `TILDEOPEN_QUERY_TILES=0` or `1`
    /// overrides `None`.
    pub query_tiles: Option<bool>,
    /// Decode attention split into enough context slices to fill a GPU: slices of as few as 16
    /// keys, so a pass launches 32 workgroups per KV head once the context passes 512 tokens.
    /// `None` picks it on devices that are not CPUs (a CPU device's few cores are filled by a
    /// handful of slices of 256 keys, and each more costs it a workgroup's fixed work);
    /// `Some(b)` forces it. The environment variable `TILDEOPEN_WIDE_ATTENTION=1` or `0`
    /// overrides `None`.
    pub wide_attention: Option<bool>,
    /// Open the first adapter whose name contains this (case-insensitive) instead of the
    /// fastest; on a machine with several GPUs. The environment variable `TILDEOPEN_ADAPTER`
    /// sets it when this is `None` (native only). No match is an error that lists the adapters.
    pub adapter: Option<String>,
}

/// Every adapter this machine offers, as "name (backend, device type)" (native only; in the
/// browser there is the one the browser picks).
#[cfg(not(target_arch = "wasm32"))]
pub async fn adapters() -> Vec<String> {
    let (instance, backends) = instance();
    instance.enumerate_adapters(backends).await.iter().map(|a| {
        let i = a.get_info();
        format!("{} ({:?}, {:?})", i.name, i.backend, i.device_type)
    }).collect()
}

/// The first adapter whose name contains `name`, ignoring case.
#[cfg(not(target_arch = "wasm32"))]
async fn adapter_named(instance: &wgpu::Instance, backends: wgpu::Backends, name: &str) -> Result<wgpu::Adapter> {
    let all = instance.enumerate_adapters(backends).await;
    let names: Vec<String> = all.iter().map(|a| a.get_info().name).collect();
    let low = name.to_lowercase();
    all.into_iter().find(|a| a.get_info().name.to_lowercase().contains(&low)).ok_or_else(|| {
        let here = if names.is_empty() { "none".to_string() } else { names.join(", ") };
        Error::Gpu(format!("no GPU adapter's name contains {name:?}; adapters here: {here}"))
    })
}

fn instance() -> (wgpu::Instance, wgpu::Backends) {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::PRIMARY);
    let backends = desc.backends;
    (wgpu::Instance::new(desc), backends)
}

/// The optional kernel paths a device uses; each has a baseline fallback that is tested.
#[derive(Debug, Clone, Copy)]
pub struct FastPaths {
    /// Fused ops: RoPE with the KV store, gate and up with SwiGLU in one matrix kernel.
    pub fused: bool,
    /// Attention with the query heads of a KV head together, split across long contexts.
    pub split_attention: bool,
    /// Matrix-vector products with one workgroup per 4 rows, reduced with subgroup operations
    /// (`matvec_sg.wgsl`), where the adapter has `wgpu::Features::SUBGROUP` (native only: wgpu's
    /// WebGPU backend does not expose it); see [`GpuOptions::subgroups`].
    pub subgroups: bool,
    /// Each RMSNorm computed by the matvecs that consume it (`shaders/mat_norm.wgsl`): a pass of
    /// a few tokens has no norm dispatch but the final one; see [`GpuOptions::norm_fold`].
    pub norm_fold: bool,
    /// Q8 input and integer dot products for the matvecs after a norm; see [`GpuOptions::int_dot`].
    pub int_dot: bool,
    /// Split attention takes several tokens per workgroup in long passes; see
    /// [`GpuOptions::query_tiles`].
    pub query_tiles: bool,
    /// Decode attention in slices of as few as 16 keys; see [`GpuOptions::wide_attention`].
    pub wide_attention: bool,
}

impl FastPaths {
    fn new(opts: &GpuOptions, has_subgroups: bool, has_int_dot: bool, cpu: bool) -> Self {
        // Environment switches (native only).
        #[cfg(not(target_arch = "wasm32"))]
        let flag = |name: &str| std::env::var(name).ok().map(|v| v == "1");
        #[cfg(target_arch = "wasm32")]
        let flag = |_: &str| None::<bool>;
        let baseline = opts.baseline || flag("TILDEOPEN_BASELINE_KERNELS") == Some(true);
        let subgroups = !baseline && has_subgroups && opts.subgroups.or_else(|| flag("TILDEOPEN_SUBGROUPS")).unwrap_or(!cpu);
        let norm_fold = !baseline && opts.norm_fold.or_else(|| flag("TILDEOPEN_NORM_FOLD")).unwrap_or(!cpu);
        let int_dot = !baseline && has_int_dot && opts.int_dot.or_else(|| flag("TILDEOPEN_INT_DOT")).unwrap_or(false);
        let query_tiles = !baseline && opts.query_tiles.or_else(|| flag("TILDEOPEN_QUERY_TILES")).unwrap_or(true);
        let wide_attention = !baseline && opts.wide_attention.or_else(|| flag("TILDEOPEN_WIDE_ATTENTION")).unwrap_or(!cpu);
        FastPaths { fused: !baseline, split_attention: !baseline, subgroups, norm_fold, int_dot, query_tiles, wide_attention }
    }

    /// Every path by the name `tildeopen info` and the JS `engine.fastPaths` report it under.
    pub fn by_name(&self) -> [(&'static str, bool); 7] {
        [
            ("fused", self.fused),
            ("split_attention", self.split_attention),
            ("query_tiles", self.query_tiles),
            ("wide_attention", self.wide_attention),
            ("norm_fold", self.norm_fold),
            ("int_dot", self.int_dot),
            ("subgroups", self.subgroups),
        ]
    }
}

/// A device and queue plus the limits the engine plans with. Cloning shares the device and its
/// compiled pipelines.
#[derive(Clone)]
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    /// The largest buffer the engine creates: min(maxStorageBufferBindingSize, maxBufferSize,
    /// the cap), rounded down to 256 bytes.
    pub max_binding: u64,
    pub kernels: std::sync::Arc<super::kernels::Kernels>,
    /// Set (with the reason) when the device is lost; every later GPU call fails.
    pub lost: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    pub fast: FastPaths,
    /// The device takes timestamp queries (`bench --profile` times kernels with them).
    pub timestamps: bool,
    /// Two small storage buffers bound to a matrix kernel's unused output slots (Y2, Y3): WebGPU
    /// rejects a dispatch whose writable bindings overlap, so no slot may repeat another's buffer.
    pub spare: [wgpu::Buffer; 2],
    /// What the engine asked of the device so far (`bench --json` reports them per token).
    pub counters: std::sync::Arc<Counters>,
    /// Staging buffers of past readbacks, kept for the next ones (a decode step reads the same
    /// few bytes every token): no buffer is created per token.
    readback: std::sync::Arc<std::sync::Mutex<Vec<wgpu::Buffer>>>,
}

/// Counts of what the engine asked of the device, since it was opened.
#[derive(Debug, Default)]
pub struct Counters {
    /// Buffers created (weights, caches, scratch, readback staging).
    pub buffers_created: std::sync::atomic::AtomicU64,
    /// Command buffers submitted (submits of none included: they only flush the queue).
    pub submits: std::sync::atomic::AtomicU64,
    /// Times the host waited for the device (readbacks and explicit waits).
    pub syncs: std::sync::atomic::AtomicU64,
}

/// A snapshot of [`Counters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CounterValues {
    pub buffers_created: u64,
    pub submits: u64,
    pub syncs: u64,
}

impl Counters {
    pub fn get(&self) -> CounterValues {
        use std::sync::atomic::Ordering::Relaxed;
        CounterValues { buffers_created: self.buffers_created.load(Relaxed), submits: self.submits.load(Relaxed), syncs: self.syncs.load(Relaxed) }
    }

    fn add(c: &std::sync::atomic::AtomicU64) {
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl std::ops::Sub for CounterValues {
    type Output = CounterValues;
    fn sub(self, o: CounterValues) -> CounterValues {
        CounterValues { buffers_created: self.buffers_created - o.buffers_created, submits: self.submits - o.submits, syncs: self.syncs - o.syncs }
    }
}

/// Readback staging buffers kept at most, and the largest kept (a bigger one, the logits of a
/// long pass, is dropped after its read).
const READBACK_KEEP: usize = 4;
const READBACK_KEEP_BYTES: u64 = 16 << 20;

/// The largest buffer the engine binds: the device's binding and buffer limits, the caller's cap,
/// and at most 2 GiB, so that every byte offset a kernel computes inside one binding fits a u32
/// with room to spare (GPUs that allow larger bindings get tensors split across buffers instead
/// of offsets that wrap); rounded down to 256 bytes.
pub fn binding_size(max_storage_binding: u64, max_buffer: u64, cap: Option<u64>) -> u64 {
    const KERNEL_OFFSET_CAP: u64 = 1 << 31;
    max_storage_binding.min(max_buffer).min(cap.unwrap_or(u64::MAX)).min(KERNEL_OFFSET_CAP) & !255
}

impl Gpu {
    /// Opens the best adapter with its own limits (not WebGPU's defaults).
    pub async fn new(opts: &GpuOptions) -> Result<Self> {
        let (instance, backends) = instance();
        #[cfg(not(target_arch = "wasm32"))]
        let wanted = opts.adapter.clone().or_else(|| std::env::var("TILDEOPEN_ADAPTER").ok()).filter(|n| !n.is_empty());
        #[cfg(target_arch = "wasm32")]
        let wanted: Option<String> = { let _ = backends; None };
        let adapter = match wanted {
            #[cfg(not(target_arch = "wasm32"))]
            Some(name) => adapter_named(&instance, backends, &name).await?,
            _ => instance
                .request_adapter(&wgpu::RequestAdapterOptions {
                    power_preference: wgpu::PowerPreference::HighPerformance,
                    force_fallback_adapter: false,
                    compatible_surface: None,
                    apply_limit_buckets: false,
                })
                .await
                .map_err(|e| {
                    #[cfg(not(target_arch = "wasm32"))]
                    let fix = "install a Vulkan driver; on Debian/Ubuntu: apt-get install mesa-vulkan-drivers gives a CPU fallback";
                    #[cfg(target_arch = "wasm32")]
                    let fix = "this browser has no WebGPU (Chromium 113+ or enable it in the browser's settings)";
                    Error::Gpu(format!("no usable GPU adapter ({e}): {fix}"))
                })?,
        };
        let info = adapter.get_info();
        let al = adapter.limits();
        let mut limits = wgpu::Limits::downlevel_defaults();
        limits.max_storage_buffer_binding_size = al.max_storage_buffer_binding_size;
        limits.max_buffer_size = al.max_buffer_size;
        limits.max_storage_buffers_per_shader_stage = al.max_storage_buffers_per_shader_stage.min(10);
        limits.max_compute_workgroup_storage_size = al.max_compute_workgroup_storage_size;
        limits.max_compute_invocations_per_workgroup = al.max_compute_invocations_per_workgroup.min(256);
        limits.max_compute_workgroup_size_x = al.max_compute_workgroup_size_x.min(256);
        limits.max_compute_workgroup_size_y = al.max_compute_workgroup_size_y.min(256);
        limits.max_compute_workgroups_per_dimension = al.max_compute_workgroups_per_dimension;
        let need = [
            ("maxComputeInvocationsPerWorkgroup", limits.max_compute_invocations_per_workgroup as u64, 256),
            ("maxComputeWorkgroupSizeX", limits.max_compute_workgroup_size_x as u64, 256),
            // matmul.wgsl holds two 8 KB tiles, WebGPU's default (many browsers report no more).
            ("maxComputeWorkgroupStorageSize", limits.max_compute_workgroup_storage_size as u64, 16384),
            // rope_kv.wgsl binds seven storage buffers (WebGPU guarantees eight).
            ("maxStorageBuffersPerShaderStage", limits.max_storage_buffers_per_shader_stage as u64, 7),
        ];
        for (name, have, want) in need {
            if have < want {
                return Err(Error::Gpu(format!("adapter {} has {name} = {have}, need {want}", info.name)));
            }
        }
        let int_dot = instance.wgsl_language_features().contains(wgpu::WgslLanguageFeatures::Packed4x8IntegerDotProduct);
        let fast = FastPaths::new(opts, adapter.features().contains(wgpu::Features::SUBGROUP), int_dot, info.device_type == wgpu::DeviceType::Cpu);
        let mut required_features = if fast.subgroups { wgpu::Features::SUBGROUP } else { wgpu::Features::empty() };
        // For `bench --profile`'s per-kernel GPU times (native only; browsers hide timestamps
        // behind a flag). `TILDEOPEN_TIMESTAMPS=0` takes the host-clock fallback.
        let timestamps = !cfg!(target_arch = "wasm32")
            && adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY)
            && std::env::var("TILDEOPEN_TIMESTAMPS").as_deref() != Ok("0");
        if timestamps {
            required_features |= wgpu::Features::TIMESTAMP_QUERY;
        }
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("tildeopen"),
                required_features,
                required_limits: limits.clone(),
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| Error::Gpu(format!("cannot open device on {}: {e}", info.name)))?;
        let max_binding = binding_size(limits.max_storage_buffer_binding_size, limits.max_buffer_size, opts.max_binding_size);
        if max_binding < 256 {
            let asked = opts.max_binding_size.map(|v| format!(" ({v} asked for)")).unwrap_or_default();
            return Err(Error::Gpu(format!("max binding size {max_binding}{asked} is too small: it must be at least 256 bytes")));
        }
        #[allow(clippy::arc_with_non_send_sync)] // wgpu's web types are !Send; wasm is single-threaded
        let kernels = std::sync::Arc::new(super::kernels::Kernels::new(&device, info.backend));
        let lost = std::sync::Arc::new(std::sync::Mutex::new(None));
        let l = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut g) = l.lock() {
                *g = Some(format!("{reason:?}: {msg}"));
            }
        });
        // A validation or internal error outside an error scope (wgpu's default handler
        // panics natively and only logs in a browser): recorded like a lost device, so the next
        // GPU call fails with an error instead of returning whatever the skipped dispatch left.
        {
            let l = lost.clone();
            device.on_uncaptured_error(std::sync::Arc::new(move |e: wgpu::Error| {
                log::error!("GPU error: {e}");
                if let Ok(mut g) = l.lock() {
                    g.get_or_insert_with(|| match e {
                        wgpu::Error::OutOfMemory { .. } => OUT_OF_MEMORY.to_string(),
                        _ => format!("GPU error: {e}"),
                    });
                }
            }));
        }
        let spare = [0, 1].map(|i| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(&format!("spare output {i}")),
                size: 16,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        });
        let counters = std::sync::Arc::new(Counters::default());
        counters.buffers_created.store(2, std::sync::atomic::Ordering::Relaxed);
        Ok(Gpu { device, queue, info, limits, max_binding, kernels, lost, fast, timestamps, spare, counters, readback: Default::default() })
    }

    /// An error when the device has been lost (the model must be loaded again).
    pub fn check_lost(&self) -> Result<()> {
        match self.lost.lock().ok().and_then(|g| g.clone()) {
            Some(why) => Err(lost_error(&why)),
            None => Ok(()),
        }
    }

    /// A storage buffer of `size` bytes (rounded up to 4, plus 4 bytes of padding so unaligned
    /// block reads of the last word stay in bounds).
    pub fn storage(&self, label: &str, size: u64) -> Result<wgpu::Buffer> {
        let padded = (size.div_ceil(4) + 1) * 4;
        if padded > self.max_binding + 4 || padded > self.limits.max_buffer_size {
            return Err(Error::Gpu(format!(
                "{label}: a buffer of {size} bytes exceeds the device's binding limit of {} bytes",
                self.max_binding
            )));
        }
        Ok(self.buffer_padded(label, padded))
    }

    /// A storage buffer of exactly `size` bytes (a multiple of 4), up to the binding limit itself:
    /// for buffers no kernel reads past the end of (the KV cache).
    pub fn storage_exact(&self, label: &str, size: u64) -> Result<wgpu::Buffer> {
        if size > self.max_binding || size > self.limits.max_buffer_size || !size.is_multiple_of(4) {
            return Err(Error::Gpu(format!(
                "{label}: a buffer of {size} bytes exceeds the device's binding limit of {} bytes",
                self.max_binding
            )));
        }
        Ok(self.buffer_padded(label, size.max(4)))
    }

    /// A storage buffer bound by the device's real limits only, not the engine's cap (for tools
    /// and tests that feed kernels directly).
    pub fn storage_uncapped(&self, label: &str, data: &[u8]) -> Result<wgpu::Buffer> {
        let padded = (data.len() as u64).div_ceil(4) * 4 + 4;
        if padded > self.limits.max_storage_buffer_binding_size {
            return Err(Error::Gpu(format!("{label}: {padded} bytes exceed the device's binding limit")));
        }
        let buf = self.buffer_padded(label, padded);
        let mut v = data.to_vec();
        v.resize(padded as usize, 0);
        self.queue.write_buffer(&buf, 0, &v);
        Ok(buf)
    }

    fn buffer_padded(&self, label: &str, padded: u64) -> wgpu::Buffer {
        Counters::add(&self.counters.buffers_created);
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: padded,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    }

    /// A storage buffer initialised with `data`.
    pub fn storage_init(&self, label: &str, data: &[u8]) -> Result<wgpu::Buffer> {
        let buf = self.storage(label, data.len() as u64)?;
        let whole = data.len() & !3;
        if whole > 0 {
            self.queue.write_buffer(&buf, 0, &data[..whole]);
        }
        if whole < data.len() {
            let mut tail = [0u8; 4];
            tail[..data.len() - whole].copy_from_slice(&data[whole..]);
            self.queue.write_buffer(&buf, whole as u64, &tail);
        }
        Ok(buf)
    }

    /// A uniform buffer holding `data` (padded to 16 bytes).
    pub fn uniform(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        let mut v = data.to_vec();
        v.resize(data.len().div_ceil(16).max(1) * 16, 0);
        Counters::add(&self.counters.buffers_created);
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: &v,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        })
    }

    /// Submits one command buffer (counted).
    pub fn submit(&self, cmd: wgpu::CommandBuffer) {
        Counters::add(&self.counters.submits);
        self.queue.submit([cmd]);
    }

    /// Waits for queued work natively (the browser runs it on its own); counted as a sync.
    pub fn flush(&self) {
        Counters::add(&self.counters.syncs);
        self.wait();
    }

    fn wait(&self) {
        #[cfg(not(target_arch = "wasm32"))]
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
    }

    /// Bytes per second the device copies buffer to buffer (each byte read once and written
    /// once, counted twice), over 8 copies of up to 256 MiB.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn copy_bandwidth(&self) -> Result<f64> {
        let size = (self.max_binding.min(256 << 20) / 2 / 256 * 256).max(256);
        let usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        self.counters.buffers_created.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
        let a = self.device.create_buffer(&wgpu::BufferDescriptor { label: Some("bw_a"), size, usage, mapped_at_creation: false });
        let b = self.device.create_buffer(&wgpu::BufferDescriptor { label: Some("bw_b"), size, usage, mapped_at_creation: false });
        let run = |n: usize| {
            let mut enc = self.device.create_command_encoder(&Default::default());
            for i in 0..n {
                let (src, dst) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
                enc.copy_buffer_to_buffer(src, 0, dst, 0, size);
            }
            let t0 = std::time::Instant::now();
            self.submit(enc.finish());
            self.flush();
            t0.elapsed().as_secs_f64()
        };
        run(1);
        let secs = run(8);
        self.check_lost()?;
        Ok(2.0 * 8.0 * size as f64 / secs.max(1e-9))
    }

    /// Copies `size` bytes at `offset` of `src` back to the host, through a staging buffer kept
    /// from an earlier read where one is large enough.
    pub async fn read(&self, src: &wgpu::Buffer, offset: u64, size: u64) -> Result<Vec<u8>> {
        let staging = self.staging(size);
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(src, offset, &staging, 0, size);
        self.submit(enc.finish());
        Counters::add(&self.counters.syncs);
        let (tx, rx) = futures_channel::oneshot::channel();
        staging.slice(..size).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.wait();
        rx.await
            .map_err(|_| Error::Gpu("device lost during readback".into()))?
            .map_err(|e| Error::Gpu(format!("readback failed: {e}")))?;
        let data = staging
            .slice(..size)
            .get_mapped_range()
            .map_err(|e| Error::Gpu(format!("readback failed: {e}")))?
            .to_vec();
        staging.unmap();
        self.keep_staging(staging);
        // A validation error in the work that produced these bytes (a shader that did not
        // compile, say) makes them garbage: report it instead.
        self.check_lost()?;
        Ok(data)
    }

    /// A staging buffer of at least `size` bytes: the smallest kept one that is large enough,
    /// else a new one of the next power of two (at least 256 bytes), so reads of slowly varying
    /// sizes (a pass's output rows) reuse it.
    fn staging(&self, size: u64) -> wgpu::Buffer {
        if let Ok(mut kept) = self.readback.lock() {
            if let Some(i) = (0..kept.len()).filter(|&i| kept[i].size() >= size).min_by_key(|&i| kept[i].size()) {
                return kept.swap_remove(i);
            }
        }
        Counters::add(&self.counters.buffers_created);
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: size.next_power_of_two().max(256),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Keeps a staging buffer for later reads (at most READBACK_KEEP, none over
    /// READBACK_KEEP_BYTES; the smallest goes when full).
    fn keep_staging(&self, b: wgpu::Buffer) {
        if b.size() > READBACK_KEEP_BYTES {
            return;
        }
        if let Ok(mut kept) = self.readback.lock() {
            kept.push(b);
            if kept.len() > READBACK_KEEP {
                let smallest = (0..kept.len()).min_by_key(|&i| kept[i].size()).unwrap_or(0);
                kept.swap_remove(smallest);
            }
        }
    }
}

/// What the uncaptured-error handler records for a `wgpu::Error::OutOfMemory`.
const OUT_OF_MEMORY: &str = "out of GPU memory";

/// The error every GPU call returns once the device is lost or a GPU error was recorded
/// (`why`, as the handlers wrote it). Running out of memory says what to change: loading the
/// model again would run out again.
pub fn lost_error(why: &str) -> Error {
    if why == OUT_OF_MEMORY {
        Error::Gpu(
            "out of GPU memory: the model's weights and KV cache do not fit on this device; use a smaller context (--ctx-size, ctxSize), fewer parallel sequences (--parallel) or a smaller model".into(),
        )
    } else {
        Error::Gpu(format!("device lost ({why}): load the model again"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn out_of_memory_says_what_to_change() {
        let e = super::lost_error(super::OUT_OF_MEMORY).to_string();
        assert!(e.contains("out of GPU memory") && e.contains("--ctx-size") && !e.contains("load the model again"), "{e}");
        let e = super::lost_error("GPU error: Validation Error").to_string();
        assert!(e.contains("device lost (GPU error: Validation Error)") && e.contains("load the model again"), "{e}");
    }
}
