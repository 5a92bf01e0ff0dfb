//! HF checkpoints: sharded safetensors with an index, and the load-time formats (f16, q8_0,
//! q4_0) against the bf16 golden.

mod common;
use common::*;
use std::collections::HashMap;
use tildeopen::model::loader::WeightFormat;
use tildeopen::{KvType, Model, Session, SessionOptions};

fn logits(model: &Model, ids: &[u32]) -> Vec<Vec<f32>> {
    let mut s = Session::new(model, SessionOptions { ctx_size: 256, kv: KvType::F32, ..Default::default() }).unwrap();
    pollster::block_on(s.logits_all(ids)).unwrap()
}

#[test]
fn sharded_checkpoint_matches_golden() {
    let src = fixtures().join("models/tiny-tildeopen-decoupled");
    let dir = std::env::temp_dir().join(format!("tildeopen-test-{}-sharded", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let mut weight_map = HashMap::new();
    for (i, part) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let views: Vec<(String, safetensors::tensor::TensorView)> = part.iter().map(|n| (n.clone(), st.tensor(n).unwrap())).collect();
        safetensors::serialize_to_file(views, None, &dir.join(&file)).unwrap();
        for n in part {
            weight_map.insert(n.clone(), file.clone());
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();

    let g = golden(&src.join("golden.safetensors"));
    let gpu = gpu(None);
    let model = Model::load_on(&dir, &gpu, WeightFormat::BF16).unwrap();
    let d = max_abs_diff(&logits(&model, &g.input_ids), &g.logits);
    println!("sharded: max |dlogit| {d}");
    assert!(d <= 0.01, "{d}");
}

#[test]
fn load_time_formats() {
    let src = fixtures().join("models/tiny-tildeopen-64k");
    let g = golden(&src.join("golden.safetensors"));
    let gpu = gpu(None);
    // (format, bound on max |dlogit| against the bf16 golden): f16 holds these bf16 weights
    // exactly; the 8- and 4-bit formats carry their quantization error.
    for (fmt, bound, argmax_share) in [("f16", 0.01, 1.0), ("q8_0", 0.5, 0.9), ("q4_0", 5.0, 0.3)] {
        let model = Model::load_on(&src, &gpu, WeightFormat::parse(fmt).unwrap()).unwrap();
        let l = logits(&model, &g.input_ids);
        let d = max_abs_diff(&l, &g.logits);
        let same = l.iter().zip(&g.logits).filter(|(a, b)| argmax(a) == argmax(b)).count() as f64 / l.len() as f64;
        println!("{fmt}: max |dlogit| {d:.4}, argmax agreement {same:.3}, {} weight bytes", model.weight_bytes);
        assert!(d <= bound, "{fmt}: {d} > {bound}");
        assert!(same >= argmax_share, "{fmt}: argmax agreement {same}");
    }
}

/// Load-time quantization of a bf16 checkpoint gives llama.cpp's bytes: the HF fixture quantized
/// here equals `llama-quantize`'s GGUF of the same checkpoint, block for block.
#[test]
fn load_time_quantization_matches_llama_cpp() {
    use tildeopen::model::loader::ModelFiles;
    let dir = fixtures().join("models/tiny-tildeopen");
    for (fmt, file) in [("q8_0", "model-Q8_0.gguf"), ("q4_0", "model-Q4_0.gguf")] {
        let hf = ModelFiles::open(&dir, WeightFormat::parse(fmt).unwrap()).unwrap();
        let cfg = hf.config().unwrap();
        let gg = ModelFiles::open(&dir.join(file), WeightFormat::BF16).unwrap();
        for name in ["blk.0.ffn_gate.weight", "blk.2.ffn_up.weight", "blk.1.attn_v.weight"] {
            let (rows, cols) = if name.contains("attn_v") { (cfg.kv_dim(), cfg.hidden_size) } else { (cfg.intermediate_size, cfg.hidden_size) };
            let a = hf.tensor(name, rows, cols, &cfg).unwrap();
            let b = gg.tensor(name, rows, cols, &cfg).unwrap();
            assert_eq!(a.ty, b.ty, "{fmt} {name}");
            let bb = a.ty.block_bytes();
            let differ = a.data.chunks(bb).zip(b.data.chunks(bb)).filter(|(x, y)| x != y).count();
            println!("{fmt} {name}: {differ} of {} blocks differ from llama.cpp", a.data.len() / bb);
            assert_eq!(differ, 0, "{fmt} {name}");
        }
    }
}

/// YaRN's factor is the one the config or GGUF names, as transformers and llama.cpp take it.
/// TildeOpen-30b-64k has factor 10 over 8192 original tokens and a 65,536-token maximum: the
/// ratio of the two lengths (8) is used only where no factor is given. (The 64k fixture's
/// maximum is exactly 10 x its original length, so its golden cannot tell the two apart.)
#[test]
fn yarn_factor_is_the_files_own() {
    use tildeopen::model::config::RopeScaling;
    use tildeopen::model::gguf::{Gguf, Value};
    let factor = |c: &tildeopen::ModelConfig| match c.rope_scaling {
        RopeScaling::Yarn { factor, original_max_position_embeddings, .. } => (factor, original_max_position_embeddings),
        ref other => panic!("not YaRN: {other:?}"),
    };
    let dir = fixtures().join("models/tiny-tildeopen-64k");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(factor(&tildeopen::ModelConfig::from_hf_json(&v.to_string()).unwrap()), (10.0, 64));
    v["max_position_embeddings"] = serde_json::json!(512);
    assert_eq!(factor(&tildeopen::ModelConfig::from_hf_json(&v.to_string()).unwrap()), (10.0, 64), "transformers 5 layout");
    let mut old = v.clone();
    let params = old.as_object_mut().unwrap().remove("rope_parameters").unwrap();
    old["rope_theta"] = params["rope_theta"].clone();
    old["rope_scaling"] = params;
    assert_eq!(factor(&tildeopen::ModelConfig::from_hf_json(&old.to_string()).unwrap()), (10.0, 64), "rope_scaling layout");
    v["rope_parameters"].as_object_mut().unwrap().remove("factor");
    assert_eq!(factor(&tildeopen::ModelConfig::from_hf_json(&v.to_string()).unwrap()), (8.0, 64), "no factor: the ratio");

    let src = std::fs::read(dir.join("model-Q4_K_M.gguf")).unwrap();
    let mut g = Gguf::parse(&src, src.len() as u64, "x").unwrap();
    assert_eq!(factor(&g.config().unwrap()), (10.0, 64));
    g.metadata.insert("llama.context_length".into(), Value::U64(512));
    assert_eq!(factor(&g.config().unwrap()), (10.0, 64), "GGUF");
    g.metadata.remove("llama.rope.scaling.factor");
    assert_eq!(factor(&g.config().unwrap()), (8.0, 64), "GGUF without a factor: the ratio");
}
