//! Every fixture model (HF dirs and every GGUF) against its HF-transformers golden, on the real
//! WGSL kernels, with the fixtures README's tolerances.

mod common;
use common::*;
use tildeopen::{KvType, Session, SessionOptions};

fn opts(kv: KvType) -> SessionOptions {
    SessionOptions { ctx_size: 256, kv, ..Default::default() }
}

/// f32 KV cache: max |logit - golden| <= 0.01 everywhere, and greedy tokens identical up to the
/// first step whose golden margin is < 0.05. Then the same with the binding size forced to 128 KiB
/// (embedding, lm_head and logits split across buffers), with the subgroup matvec and the norms
/// folded into the matvecs (a GPU's defaults; lavapipe has subgroups, and CPU devices use
/// neither by default), and with the baseline kernels only.
#[test]
fn f32_cache_matches_golden_and_greedy() {
    for (binding, baseline, sg) in [(None, false, false), (Some(131072), false, false), (None, false, true), (None, true, false)] {
        let gpu = if baseline { gpu_baseline() } else if sg { gpu_norm_fold(true) } else { gpu(binding) };
        assert_eq!(gpu.fast.fused, !baseline);
        for (name, model_path, golden_path) in cases() {
            let g = golden(&golden_path);
            let model = load_on(&model_path, &gpu);
            if binding.is_some() {
                assert!(model.embed.chunks.len() > 1, "{name}: embedding not split under a 128 KiB cap");
            }
            let mut s = Session::new(&model, opts(KvType::F32)).unwrap();
            let logits = pollster::block_on(s.logits_all(&g.input_ids)).unwrap();
            let d = max_abs_diff(&logits, &g.logits);
            println!("{name} binding={binding:?} baseline={baseline} subgroups={} norm_fold={}: max |dlogit| = {d:.6}", gpu.fast.subgroups, gpu.fast.norm_fold);
            assert!(d <= 0.01, "{name} (binding {binding:?}, baseline {baseline}, subgroups {sg}): max |dlogit| {d} > 0.01");

            s.reset();
            let n = g.greedy_ids.len();
            let ids = pollster::block_on(s.generate_greedy(&g.prompt_ids, n, &[])).unwrap();
            let firm = g.greedy_margins.iter().position(|m| *m < 0.05).unwrap_or(n);
            assert_eq!(&ids[..firm], &g.greedy_ids[..firm], "{name}: greedy tokens differ before step {firm}");
            println!("{name}: greedy {firm}/{n} firm steps equal");
        }
    }
}

/// f16 KV cache: argmax equal wherever the golden's top-1 margin >= 0.25, and the 99th
/// percentile of |dlogit| <= 0.15. One documented exception: the bf16 checkpoint of
/// `tiny-tildeopen`, whose hostile last layer amplifies f16 rounding of K/V; an exact numpy
/// reference with K/V rounded to f16 gives p99 0.282 there, so the bound for it is 0.3.
#[test]
fn f16_cache_within_tolerance() {
    let gpu = gpu(None);
    for (name, model_path, golden_path) in cases() {
        let g = golden(&golden_path);
        let model = load_on(&model_path, &gpu);
        let mut s = Session::new(&model, opts(KvType::F16)).unwrap();
        let logits = pollster::block_on(s.logits_all(&g.input_ids)).unwrap();
        let mut diffs: Vec<f32> = vec![];
        for (pos, (row, grow)) in logits.iter().zip(&g.logits).enumerate() {
            diffs.extend(row.iter().zip(grow).map(|(a, b)| (a - b).abs()));
            let (top, margin) = top_margin(grow);
            if margin >= 0.25 {
                assert_eq!(argmax(row), top, "{name}: argmax differs at position {pos}");
            }
        }
        diffs.sort_by(f32::total_cmp);
        let p99 = diffs[(diffs.len() as f64 * 0.99) as usize];
        let bound = if name == "tiny-tildeopen/hf" { 0.3 } else { 0.15 };
        println!("{name}: f16 cache p99 |dlogit| = {p99:.5}, max = {:.5}", diffs.last().unwrap());
        assert!(p99 <= bound, "{name}: p99 {p99} > {bound}");
    }
}

/// The integer-dot matvec (opt-in and lossy: the input of Q/K/V and gate/up is rounded to 8
/// bits per value) in passes it takes (at most 16 tokens): models whose matrices have an
/// integer dot (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) really take it (their logits differ from the f32
/// matvec's), the others fall back to the f32 matvec (identical logits), and a decode step has
/// as many dispatches as without it (one norm_quant in place of each norm). Within the f16
/// cache's tolerances (argmax equal wherever the golden's margin >= 0.25, p99 |dlogit| <= 0.15)
/// on every fixture but one: `tiny-tildeopen`, whose last layer is built to amplify rounding
/// (the spec's numerical pitfall), moves by up to about 21 (p99 2.4) there; its numbers are
/// printed, and the README says why the path is off by default. (`tests/kernels.rs` checks that
/// the integer arithmetic itself is exact.)
#[test]
fn int_dot_matvec_within_tolerance() {
    let (gpu, plain) = (gpu_int_dot(), gpu(None));
    let opts = SessionOptions { max_batch: 16, ..opts(KvType::F32) };
    let mut failures = vec![];
    for (name, model_path, golden_path) in cases() {
        let g = golden(&golden_path);
        let model = load_on(&model_path, &gpu);
        let mut s = Session::new(&model, opts.clone()).unwrap();
        let logits = pollster::block_on(s.logits_all(&g.input_ids)).unwrap();
        let plain_model = load_on(&model_path, &plain);
        let mut p = Session::new(&plain_model, opts.clone()).unwrap();
        assert_eq!(s.dispatches(1, 10, 1), p.dispatches(1, 10, 1), "{name}: dispatches");
        let reference = pollster::block_on(p.logits_all(&g.input_ids)).unwrap();
        let moved = max_abs_diff(&logits, &reference);
        let int_types = ["Q8_0", "Q4_0", "Q4_1", "Q4_K_M", "Q6_K"].iter().any(|t| name.ends_with(&format!("model-{t}")));
        assert_eq!(moved > 0.0, int_types, "{name}: logits moved by {moved} with the integer dot");
        let hostile = int_types && name.starts_with("tiny-tildeopen/");
        let mut diffs: Vec<f32> = vec![];
        for (pos, (row, grow)) in logits.iter().zip(&g.logits).enumerate() {
            diffs.extend(row.iter().zip(grow).map(|(a, b)| (a - b).abs()));
            let (top, margin) = top_margin(grow);
            if margin >= 0.25 && argmax(row) != top && !hostile {
                failures.push(format!("{name}: argmax differs at position {pos}"));
            }
        }
        diffs.sort_by(f32::total_cmp);
        let p99 = diffs[(diffs.len() as f64 * 0.99) as usize];
        println!("{name}: integer dot p99 |dlogit| = {p99:.5}, max = {:.5} (vs the f32 matvec: {moved:.5})", diffs.last().unwrap());
        if p99 > 0.15 && !hostile {
            failures.push(format!("{name}: p99 {p99} > 0.15"));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Prefill then one-token decode steps give the same logits as one long prefill, with the
/// default kernels, with the subgroup matvec, and with the norms folded into the matvecs (plain
/// and subgroup: the prefill's matmul reads the norm pass's rows, so this compares the two).
#[test]
fn prefill_then_decode_equals_one_prefill() {
    let root = fixtures().join("models");
    for (gpu, m) in [gpu(None), gpu_subgroups(), gpu_norm_fold(false), gpu_norm_fold(true)].into_iter().flat_map(|g| {
        ["tiny-tildeopen/model-Q4_K_M.gguf", "tiny-tildeopen-decoupled", "tiny-tildeopen-64k/model-Q4_K_M.gguf"].map(move |m| (g.clone(), m))
    }) {
        let model = load_on(&root.join(m), &gpu);
        let g = golden(&root.join(if m.ends_with(".gguf") { m.replace(".gguf", ".golden.safetensors") } else { format!("{m}/golden.safetensors") }));
        let ids = &g.input_ids[..g.input_ids.len().min(80)];
        let mut s = Session::new(&model, opts(KvType::F32)).unwrap();
        // A folded norm leaves a decode step two dispatches per layer (the attention and FFN
        // norms); a pass over more tokens than the matvec takes keeps them.
        let saved = if gpu.fast.norm_fold { 2 * model.cfg.num_layers } else { 0 };
        assert_eq!(s.dispatches(1, 10, 1) + saved, s.dispatches(64, 63, 1), "{m}: dispatches");
        let whole = pollster::block_on(s.logits_all(ids)).unwrap();
        s.reset();
        let split = ids.len() / 2;
        let mut stepped = vec![];
        pollster::block_on(s.feed(&ids[..split])).unwrap();
        stepped.push(pollster::block_on(s.last_logits()).unwrap());
        for &t in &ids[split..] {
            pollster::block_on(s.feed(&[t])).unwrap();
            stepped.push(pollster::block_on(s.last_logits()).unwrap());
        }
        let d = max_abs_diff(&stepped, &whole[split - 1..]);
        println!("{m} (subgroups {}, norm fold {}): prefill+decode vs prefill max |d| = {d}", gpu.fast.subgroups, gpu.fast.norm_fold);
        assert!(d <= 1e-3, "{m}: {d}");
        assert_eq!(s.position(), ids.len());
    }
}

/// Decode passes (a few tokens) take the split attention kernel, which walks a long context in
/// several slices and merges them; its logits equal those of one long pass (one slice per
/// token), whose first 300 equal those of the baseline kernels (one workgroup per query head:
/// cost growing with the square of the context, so not the whole 712), for each cache type and
/// head layout.
#[test]
fn split_attention_over_long_contexts_equals_full_attention() {
    let root = fixtures().join("models");
    let gpu = gpu(None);
    let base = gpu_baseline();
    for m in ["tiny-tildeopen/model-Q4_K_M.gguf", "tiny-tildeopen-decoupled", "tiny-tildeopen-64k/model-Q4_K_M.gguf"] {
        let model = load_on(&root.join(m), &gpu);
        let base_model = load_on(&root.join(m), &base);
        let vocab = model.cfg.vocab_size as u32;
        // 700 tokens: three 256-key slices; then 5 tokens in one pass and 7 one at a time.
        let ids: Vec<u32> = (0..712u32).map(|i| (i * 2654435761u32.wrapping_add(i)) % vocab).collect();
        // f16 on every model, f32 on the first; each quantized type on one (they share the f16
        // layout's head loop: the decoupled model's 6-head groups take q8_0, the 64k one q4_0).
        let types = match m {
            "tiny-tildeopen-decoupled" => vec![KvType::F16, KvType::Q8_0],
            "tiny-tildeopen-64k/model-Q4_K_M.gguf" => vec![KvType::F16, KvType::Q4_0],
            _ => vec![KvType::F32, KvType::F16],
        };
        for kv in types {
            let opts = SessionOptions { ctx_size: 1024, kv, ..Default::default() };
            let mut s = Session::new(&base_model, opts.clone()).unwrap();
            let baseline = pollster::block_on(s.logits_all(&ids[..300])).unwrap();
            let mut s = Session::new(&model, opts).unwrap();
            let whole = pollster::block_on(s.logits_all(&ids)).unwrap();
            let d = max_abs_diff(&whole[..300], &baseline);
            println!("{m} ({kv} cache): one long pass vs baseline kernels, max |d| = {d}");
            // The fused RoPE + store may round K differently in the last f32 bit, which can move
            // an f16 cache entry by one f16 step; this model amplifies that (see the f16 test).
            let bound = if kv == KvType::F32 { 1e-3 } else { 0.15 };
            assert!(d <= bound, "{m}: {d}");
            s.reset();
            pollster::block_on(s.feed(&ids[..700])).unwrap();
            let mut stepped = vec![];
            pollster::block_on(s.feed(&ids[700..705])).unwrap();
            stepped.push(pollster::block_on(s.last_logits()).unwrap());
            for &t in &ids[705..] {
                pollster::block_on(s.feed(&[t])).unwrap();
                stepped.push(pollster::block_on(s.last_logits()).unwrap());
            }
            let d = max_abs_diff(&stepped, &whole[704..]);
            println!("{m} ({kv} cache): split vs full attention at 700+ tokens, max |d| = {d}");
            assert!(d <= 1e-3, "{m}: {d}");
        }
    }
}

/// Wide attention (a GPU's default): decode passes split the context into up to 32 slices of as
/// few as 16 keys (here 32 slices of 16 to 32 keys past 512 tokens, and from 2 slices at 17
/// tokens); the logits equal those of one long pass, with an f16 and a q4_0 cache.
#[test]
fn wide_attention_slices_equal_full_attention() {
    let m = fixtures().join("models/tiny-tildeopen-decoupled/model-Q4_K_M.gguf");
    let gpu = pollster::block_on(tildeopen::gpu::Gpu::new(&tildeopen::gpu::GpuOptions { wide_attention: Some(true), ..Default::default() })).unwrap();
    assert!(gpu.fast.wide_attention);
    let model = load_on(&m, &gpu);
    let ids: Vec<u32> = (0..520u32).map(|i| (i * 2654435761u32.wrapping_add(i)) % 4096).collect();
    for kv in [KvType::F16, KvType::Q4_0] {
        let mut s = Session::new(&model, SessionOptions { ctx_size: 1024, kv, ..Default::default() }).unwrap();
        assert_eq!(s.attn_workgroups(16), 2 * 2, "2 KV heads x 2 slices at 17 tokens");
        assert_eq!(s.attn_workgroups(511), 2 * 32);
        assert_eq!(s.attn_workgroups(1023), 2 * 32);
        let whole = pollster::block_on(s.logits_all(&ids[..520])).unwrap();
        s.reset();
        // Decode steps from 10 to 20 tokens (1 then 2 slices) and from 505 to 520 (32 slices),
        // with a prefill pass between.
        let mut stepped = vec![];
        for (from, to) in [(10, 20), (505, 520)] {
            pollster::block_on(s.feed(&ids[s.position()..from])).unwrap();
            for &t in &ids[from..to] {
                pollster::block_on(s.feed(&[t])).unwrap();
                if [16, 17, 20, 512, 520].contains(&s.position()) {
                    stepped.push((s.position(), pollster::block_on(s.last_logits()).unwrap()));
                }
            }
        }
        assert_eq!(stepped.len(), 5);
        for (pos, row) in stepped {
            let d = max_abs_diff(&[row], &whole[pos - 1..pos]);
            println!("{kv}: wide slices vs one pass at {pos} tokens, max |d| = {d}");
            assert!(d <= 1e-3, "{kv} at {pos}: {d}");
        }
    }
}

/// Token ids out of range and prompts longer than the context are errors, not panics.
#[test]
fn bad_tokens_and_context_overflow_are_errors() {
    let model = load(&fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf"), None);
    let mut s = Session::new(&model, SessionOptions { ctx_size: 8, ..Default::default() }).unwrap();
    let e = pollster::block_on(s.feed(&[1, 2, 4096])).unwrap_err().to_string();
    assert!(e.contains("out of range"), "{e}");
    let e = pollster::block_on(s.feed(&[1; 9])).unwrap_err().to_string();
    assert!(e.contains("context"), "{e}");
    assert_eq!(s.position(), 0);
}

/// The subgroup matvec (and the norms folded into it) must not depend on the subgroup size:
/// WGSL leaves it to the device (4 to 128; NVIDIA 32, AMD 32 or 64, Intel 8 to 32), and lavapipe
/// has one, 8 lanes here. lavapipe's follows `LP_NATIVE_VECTOR_WIDTH`, read once per process, so
/// this test runs itself again in a child process with 128-bit vectors (4 lanes, WGSL's
/// smallest) and there checks every fixture GGUF of `tiny-tildeopen` (every weight type) and
/// the decoupled one against the goldens with the GPU defaults. On a device other than lavapipe
/// the child check runs at the device's own size.
#[test]
fn subgroup_kernels_at_another_subgroup_size() {
    const CHILD: &str = "TILDEOPEN_TEST_SUBGROUP_SIZE";
    let want = std::env::var(CHILD).ok().map(|v| v.parse::<u32>().unwrap());
    let probe = gpu_subgroups();
    if want.is_none() && probe.info.name.contains("llvmpipe") {
        println!("{}: subgroup size {}; checking at 4 in a child process", probe.info.name, probe.info.subgroup_min_size);
        drop(probe);
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["subgroup_kernels_at_another_subgroup_size", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "4")
            .env("LP_NATIVE_VECTOR_WIDTH", "128")
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        println!("{log}");
        assert!(out.status.success(), "the check at subgroup size 4 failed");
        assert!(log.contains("1 passed"), "the child ran no test");
        return;
    }
    if let Some(n) = want {
        let info = &probe.info;
        assert_eq!((info.subgroup_min_size, info.subgroup_max_size), (n, n), "{}: subgroup size not {n}", info.name);
    }
    drop(probe);
    for gpu in [gpu_subgroups(), gpu_norm_fold(true)] {
        for (name, model_path, golden_path) in cases() {
            if !(name.starts_with("tiny-tildeopen/model-") || name == "tiny-tildeopen-decoupled/model-Q4_K_M") {
                continue;
            }
            let g = golden(&golden_path);
            let model = load_on(&model_path, &gpu);
            // The subgroup matvec serves passes of up to 16 tokens: the input in passes of 5
            // (its 8-token loop) and the first 12 one at a time (its one-token pipeline).
            let mut s = Session::new(&model, opts(KvType::F32)).unwrap();
            let mut logits = vec![];
            for piece in g.input_ids.chunks(5) {
                logits.extend(pollster::block_on(s.logits_all(piece)).unwrap());
            }
            s.reset();
            let mut one = vec![];
            for &t in &g.input_ids[..12] {
                pollster::block_on(s.feed(&[t])).unwrap();
                one.push(pollster::block_on(s.last_logits()).unwrap());
            }
            let d = max_abs_diff(&logits, &g.logits).max(max_abs_diff(&one, &g.logits[..12]));
            println!("{name} subgroup size {} norm_fold={}: max |dlogit| = {d:.6}", gpu.info.subgroup_min_size, gpu.fast.norm_fold);
            assert!(d <= 0.01, "{name} (subgroup size {}, norm fold {}): max |dlogit| {d} > 0.01", gpu.info.subgroup_min_size, gpu.fast.norm_fold);
        }
    }
}
