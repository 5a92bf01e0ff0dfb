//! A real pretrained model end to end: SmolLM2-135M-Instruct (Q4_1, embeddings Q8_0, tied
//! lm_head, byte-level BPE vocabulary) against llama.cpp's greedy outputs.

mod common;
use common::*;
use tildeopen::{Session, SessionOptions};

#[test]
fn greedy_matches_llama_cpp() {
    let path = smollm2();
    let model = load(&path, None);
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("smollm2/llama-cpp-greedy.json")).unwrap(),
    )
    .unwrap();
    let mut s = Session::new(&model, SessionOptions { ctx_size: 512, ..Default::default() }).unwrap();
    let mut total_equal = 0;
    for c in cases.as_array().unwrap() {
        let ids = |k: &str| c[k].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<_>>();
        let (prompt, want) = (ids("prompt_ids"), ids("ids"));
        s.reset();
        let n = 8.min(want.len());
        let got = pollster::block_on(s.generate_greedy(&prompt, n, &[])).unwrap();
        let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        println!("{:?}: {same}/{n} first tokens equal to llama.cpp ({got:?} vs {:?})", c["prompt"].as_str(), &want[..n]);
        assert!(same >= 3, "{:?}: only {same} first tokens equal", c["prompt"]);
        total_equal += same;
    }
    println!("{total_equal} tokens equal in all");
}
