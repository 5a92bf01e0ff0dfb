//! Several sequences in one forward pass (continuous batching): the engine's per-token cache
//! rows and positions, and the chat engine answering requests side by side.

mod common;
use common::*;
use tildeopen::chat::api::{ChatRequest, Message};
use tildeopen::chat::{Event, Output};
use tildeopen::gpu::session::Piece;
use tildeopen::text::tokenizer::Tokenizer;
use tildeopen::{ChatEngine, ChatOptions, KvType, Model, Session, SessionOptions};

fn tiny() -> (Model, Tokenizer) {
    let path = fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf");
    (load(&path, None), tiny_tokenizer())
}

fn tiny_tokenizer() -> Tokenizer {
    Tokenizer::load(&fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf")).unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Three sequences fed in mixed passes (prefill chunks next to decode tokens, at different
/// positions) give the logits each gets alone; the one fed the golden's input ids also matches
/// HF transformers' logits (the fixture's bound, 0.01).
#[test]
fn sequences_in_one_pass_match_each_alone() {
    let (model, _) = tiny();
    let g = golden(&fixtures().join("models/tiny-tildeopen/model-Q8_0.golden.safetensors"));
    let prompts: [Vec<u32>; 3] = [vec![48, 7, 300, 301, 302, 303, 304], g.input_ids[..19].to_vec(), vec![48, 7, 1000, 1001]];
    // Alone: logits at every position of each sequence.
    let alone: Vec<Vec<Vec<f32>>> = prompts
        .iter()
        .map(|p| {
            let mut s = Session::new(&model, SessionOptions { ctx_size: 64, kv: KvType::F32, ..Default::default() }).unwrap();
            pollster::block_on(s.logits_all(p)).unwrap()
        })
        .collect();

    let mut s = Session::new(&model, SessionOptions { ctx_size: 32, kv: KvType::F32, sequences: 3, ..Default::default() }).unwrap();
    assert_eq!(s.sequences(), 3);
    // (sequence, first token, tokens, logits wanted) per pass.
    let passes: [&[(usize, usize, usize, bool)]; 4] = [
        &[(0, 0, 5, true), (1, 0, 3, false)],
        &[(0, 5, 1, true), (1, 3, 13, true), (2, 0, 4, true)],
        &[(2, 4, 0, false), (1, 16, 1, true), (0, 6, 1, true)],
        &[(1, 17, 2, true)],
    ];
    let (mut worst, mut golden_worst) = (0f32, 0f32);
    for pass in passes {
        let pieces: Vec<Piece> = pass
            .iter()
            .filter(|p| p.2 > 0)
            .map(|&(seq, start, n, logits)| Piece { seq, tokens: &prompts[seq][start..start + n], logits })
            .collect();
        let rows = s.forward(&pieces).unwrap();
        let want: Vec<_> = pieces.iter().filter(|p| p.logits).collect();
        assert_eq!(rows, want.len());
        let got = pollster::block_on(s.output_logits(rows)).unwrap();
        let argmax = pollster::block_on(s.output_argmax(rows)).unwrap();
        for (r, p) in want.iter().enumerate() {
            let pos = s.position_of(p.seq) - 1;
            let d = max_diff(&got[r], &alone[p.seq][pos]);
            assert!(d < 1e-3, "sequence {} position {pos}: max |d| {d}", p.seq);
            worst = worst.max(d);
            if p.seq == 1 {
                let dg = max_diff(&got[r], &g.logits[pos]);
                assert!(dg <= 0.01, "position {pos}: max |logit - golden| {dg}");
                golden_worst = golden_worst.max(dg);
            }
            let best = (0..got[r].len()).max_by(|&a, &b| got[r][a].total_cmp(&got[r][b]).then(b.cmp(&a))).unwrap();
            assert_eq!(argmax[r] as usize, best);
        }
    }
    eprintln!("batched vs alone: max |dlogit| {worst}; vs golden: {golden_worst}");
    assert!(golden_worst > 0.0, "the golden rows were compared");
    assert_eq!((s.position_of(0), s.position_of(1), s.position_of(2)), (7, 19, 4));

    // A sequence can start from a copy of another's first rows.
    s.copy_prefix(1, 2, 10).unwrap();
    assert_eq!(s.position_of(2), 10);
    s.forward(&[Piece { seq: 2, tokens: &prompts[1][10..12], logits: true }]).unwrap();
    let got = pollster::block_on(s.output_logits(1)).unwrap();
    assert!(max_diff(&got[0], &alone[1][11]) < 1e-3);
    assert!(max_diff(&got[0], &g.logits[11]) <= 0.01);
    assert!(s.copy_prefix(0, 2, 8).is_err(), "sequence 0 holds only 7 tokens");

    // Rolling one sequence back leaves the others alone.
    s.truncate_seq(1, 3);
    s.forward(&[Piece { seq: 1, tokens: &prompts[1][3..5], logits: true }, Piece { seq: 0, tokens: &[5], logits: false }]).unwrap();
    let got = pollster::block_on(s.output_logits(1)).unwrap();
    assert!(max_diff(&got[0], &alone[1][4]) < 1e-3);
    assert!(max_diff(&got[0], &g.logits[4]) <= 0.01);

    // Bad passes are errors, not garbage.
    for (pieces, what) in [
        (vec![Piece { seq: 0, tokens: &[1], logits: true }, Piece { seq: 0, tokens: &[2], logits: true }], "twice"),
        (vec![Piece { seq: 3, tokens: &[1], logits: true }], "does not exist"),
        (vec![Piece { seq: 0, tokens: &[1; 26], logits: true }], "do not fit"),
        (vec![Piece { seq: 2, tokens: &[], logits: true }], "no tokens"),
        (vec![Piece { seq: 2, tokens: &[1 << 30], logits: true }], "out of range"),
    ] {
        let e = s.forward(&pieces).unwrap_err().to_string();
        assert!(e.contains(what), "{e}");
    }
}

fn request(msg: &str, max_tokens: u64) -> ChatRequest {
    ChatRequest { max_tokens: Some(max_tokens), temperature: Some(0.0), ..ChatRequest::new(vec![Message::user(msg)]) }
}

fn engine(model: &Model, tok: Tokenizer, parallel: usize) -> ChatEngine {
    let opts = ChatOptions { ctx_size: Some(96), kv: KvType::F32, parallel, model_name: "tiny".into(), ..Default::default() };
    ChatEngine::new(model, tok, opts).unwrap()
}

/// Requests answered side by side (some streamed, one arriving while others decode) give the
/// answers they get one at a time; a full engine says busy; cancelled and dropped requests free
/// their slots.
#[test]
fn chat_requests_side_by_side_match_one_at_a_time() {
    let (model, tok) = tiny();
    let reqs = [request("Tell me about cakes.", 12), request("Hi", 5), request("What is the capital of Latvia?", 9), request("Tell me about cakes. And pies.", 7)];
    let mut one = engine(&model, tok, 1);
    let expected: Vec<String> = reqs.iter().map(|r| pollster::block_on(one.complete(r)).unwrap().content().to_string()).collect();

    let mut eng = engine(&model, tiny_tokenizer(), 3);
    assert_eq!(eng.parallel(), 3);
    let mut ids = vec![eng.submit(&reqs[0], false).unwrap(), eng.submit(&reqs[1], true).unwrap(), eng.submit(&reqs[2], false).unwrap()];
    let busy = eng.submit(&reqs[3], false).unwrap_err();
    assert_eq!((busy.status, busy.code.as_deref()), (503, Some("busy")));
    let mut texts = vec![String::new(); 4];
    let mut finished = [false; 4];
    let mut passes = 0;
    while finished.iter().any(|f| !f) {
        let events: Vec<Event> = pollster::block_on(eng.step());
        passes += 1;
        assert!(passes < 200, "never finished");
        for ev in events {
            let i = ids.iter().position(|&id| id == ev.id).unwrap();
            match ev.output {
                Output::Completion(c) => {
                    assert!(ev.last);
                    texts[i] = c.content().to_string();
                }
                Output::Chunk(c) => texts[i] += c.choices[0].delta.content.as_deref().unwrap_or(""),
                Output::Error(e) => panic!("request {i}: {e:?}"),
            }
            finished[i] |= ev.last;
        }
        // The fourth request comes in as soon as a slot is free.
        if ids.len() == 3 && eng.has_free_slot() {
            ids.push(eng.submit(&reqs[3], true).unwrap());
        }
    }
    assert_eq!(texts, expected);
    // Fewer passes than one at a time would take (12 + 5 + 9 + 7 tokens plus prefills).
    assert!(passes < 33, "{passes} passes");
    // The fourth request starts like the first: that prefix came from the first one's slot.
    let st = eng.stats();
    assert!(st.copied >= 8, "{st:?}");
    assert_eq!(st.generated, 12 + 5 + 9 + 7);
    assert_eq!(eng.in_flight(), 0);

    // Requests that arrive together with a long common start (a system prompt): the first
    // computes it, the others wait and copy it; answers unchanged.
    let sys = "You are a careful assistant. Answer in one short sentence and keep names as they are.";
    let shared: Vec<ChatRequest> = ["Hi", "Who are you?", "Name a colour."]
        .iter()
        .map(|u| ChatRequest { max_tokens: Some(4), temperature: Some(0.0), ..ChatRequest::new(vec![Message::system(sys), Message::user(*u)]) })
        .collect();
    let expected_shared: Vec<String> = shared.iter().map(|r| pollster::block_on(one.complete(r)).unwrap().content().to_string()).collect();
    let mut eng = engine(&model, tiny_tokenizer(), 3);
    let ids: Vec<_> = shared.iter().map(|r| eng.submit(r, false).unwrap()).collect();
    let mut texts = vec![String::new(); 3];
    while eng.in_flight() > 0 {
        for ev in pollster::block_on(eng.step()) {
            if let Output::Completion(c) = ev.output {
                texts[ids.iter().position(|&id| id == ev.id).unwrap()] = c.content().to_string();
            }
        }
    }
    assert_eq!(texts, expected_shared);
    let st = eng.stats();
    let prompt_len = eng.prompt_tokens(&shared[0]).unwrap().len() as u64;
    assert!(st.copied >= 2 * (prompt_len - 8), "{st:?} (prompt of {prompt_len})");
    assert!(st.prefilled < 2 * prompt_len, "{st:?}");

    // A cancelled request frees its slot at once; so does a dropped stream.
    let a = eng.submit(&reqs[0], false).unwrap();
    let _ = pollster::block_on(eng.step());
    eng.cancel(a);
    assert_eq!(eng.in_flight(), 0);
    let mut single = engine(&model, tiny_tokenizer(), 1);
    let mut s = pollster::block_on(single.start_stream(&reqs[1])).unwrap();
    let _ = pollster::block_on(single.next_chunk(&mut s));
    drop(s);
    let c = pollster::block_on(single.complete(&reqs[1])).unwrap();
    assert_eq!(c.content(), expected[1]);
}

/// A request that starts like one still being prefilled (over several passes): it copies what
/// is there at once, waits for the rest, then copies only the new rows. Every prompt token is
/// counted exactly once (computed, reused or copied) and answers are unchanged.
#[test]
fn late_request_copies_a_prefix_still_being_prefilled() {
    let (model, tok) = tiny();
    let sys = "You are a careful assistant. Answer in one short sentence, keep names as they are, and never use lists.";
    let reqs: Vec<ChatRequest> = ["Hi", "Who are you?"]
        .iter()
        .map(|u| ChatRequest { max_tokens: Some(3), temperature: Some(0.0), ..ChatRequest::new(vec![Message::system(sys), Message::user(*u)]) })
        .collect();
    let mut one = engine(&model, tok, 1);
    let expected: Vec<String> = reqs.iter().map(|r| pollster::block_on(one.complete(r)).unwrap().content().to_string()).collect();

    let opts = ChatOptions { ctx_size: Some(96), kv: KvType::F32, parallel: 2, max_batch: 8, model_name: "tiny".into() };
    let mut eng = ChatEngine::new(&model, tiny_tokenizer(), opts).unwrap();
    let lens: Vec<u64> = reqs.iter().map(|r| eng.prompt_tokens(r).unwrap().len() as u64).collect();
    assert!(lens[0] > 24, "the shared start must take several 8-token passes");
    let a = eng.submit(&reqs[0], false).unwrap();
    let _ = pollster::block_on(eng.step());
    let b = eng.submit(&reqs[1], false).unwrap();
    assert_eq!(eng.stats().copied, 8, "the 8 rows already prefilled are copied at once");
    let mut texts = vec![String::new(); 2];
    while eng.in_flight() > 0 {
        for ev in pollster::block_on(eng.step()) {
            if let Output::Completion(c) = ev.output {
                texts[if ev.id == a { 0 } else { 1 }] = c.content().to_string();
                assert!(ev.id == a || ev.id == b);
            }
        }
    }
    assert_eq!(texts, expected);
    let st = eng.stats();
    assert_eq!(st.prefilled + st.reused + st.copied, lens[0] + lens[1], "{st:?}");
    assert!(st.copied > lens[0] / 2, "{st:?}");
}
