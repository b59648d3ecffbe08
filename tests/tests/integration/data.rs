//! Training data: packing without leakage between samples, padding, loss on replies only,
//! JSONL errors that name the line, and a seeded loader that resumes exactly.

use std::path::Path;

use napkin_core::Error;
use napkin_core::chat::{ChatFormat, Message};
use napkin_core::data::instruct::parse_jsonl;
use napkin_core::data::packing::micro_batch;
use napkin_core::data::{Conversation, DataLoader, Sample, pack, pad_each};
use napkin_core::device::DeviceKind;
use napkin_core::io::gguf::GgufFile;
use napkin_core::io::load_hf_llama;
use napkin_core::model::{IGNORE_INDEX, Llama, TokenBatch, causal_lm_loss};
use napkin_core::tokenizer::TextTokenizer;
use napkin_core::values::{scalar, to_f32_vec};
use napkin_tests::model_dirs;

use super::smollm2::smollm2_path;

fn tiny_model() -> Llama {
    load_hf_llama(&model_dirs()[0], &DeviceKind::Cpu.open().unwrap()).unwrap()
}

/// Three samples of different lengths with arbitrary ids below `vocab`.
fn samples(vocab: u32) -> Vec<Sample> {
    [5usize, 9, 4]
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            Sample::causal(
                (0..n as u32)
                    .map(|i| (i * 37 + k as u32 * 11 + 3) % vocab)
                    .collect(),
            )
        })
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn packed_samples_see_only_themselves() {
    let model = tiny_model();
    let v = model.config.vocab_size;
    let samples = samples(v as u32);
    let rows = pack(&samples, 20);
    assert_eq!(rows.len(), 1, "5 + 9 + 4 tokens fit one row of 20");
    let row = &rows[0];
    assert_eq!(
        row.segments,
        [[0; 5].as_slice(), &[1; 9], &[2; 4], &[3; 2]].concat()
    );
    assert_eq!(&row.positions[5..14], (0..9).collect::<Vec<u32>>());
    // The first token of a later sample, and padding, carry no label.
    assert_eq!(
        (row.labels[5], row.labels[14], row.labels[18]),
        (IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX)
    );

    let micro = micro_batch(&rows);
    let packed = to_f32_vec(model.forward(&micro.batch));
    let mut start = 0;
    let mut separate_loss = 0.0;
    for s in &samples {
        let alone = to_f32_vec(model.forward(&TokenBatch::single(&s.ids).unwrap()));
        let got = &packed[start * v..(start + s.len()) * v];
        let err = max_diff(got, &alone);
        assert!(
            err < 1e-5,
            "sample at {start}: logits differ by {err} when packed"
        );
        let loss = causal_lm_loss(
            model.forward(&TokenBatch::single(&s.ids).unwrap()),
            &s.labels,
        )
        .unwrap();
        separate_loss += scalar(loss.sum);
        start += s.len();
    }
    let packed_loss = causal_lm_loss(model.forward(&micro.batch), &micro.labels).unwrap();
    assert_eq!(
        packed_loss.tokens,
        samples.iter().map(|s| s.len() - 1).sum::<usize>()
    );
    let packed_sum = scalar(packed_loss.sum);
    assert!(
        (packed_sum - separate_loss).abs() < 1e-4,
        "packed loss {packed_sum} vs separate {separate_loss}"
    );
}

#[test]
fn padded_rows_match_samples_alone() {
    let model = tiny_model();
    let v = model.config.vocab_size;
    let samples = samples(v as u32);
    let rows = pad_each(&samples, 32);
    assert!(
        rows.iter().all(|r| r.ids.len() == 9),
        "padded to the longest sample"
    );
    let logits = to_f32_vec(model.forward(&micro_batch(&rows).batch));
    for (b, s) in samples.iter().enumerate() {
        let alone = to_f32_vec(model.forward(&TokenBatch::single(&s.ids).unwrap()));
        let got = &logits[b * 9 * v..(b * 9 + s.len()) * v];
        assert!(max_diff(got, &alone) < 1e-5, "row {b}");
    }
}

#[test]
fn only_the_replies_are_learned() {
    let gguf = GgufFile::open(&smollm2_path()).unwrap();
    let tokenizer = TextTokenizer::from_gguf(&gguf).unwrap();
    let format = ChatFormat::detect(tokenizer.chat_template.as_deref()).unwrap();
    let chat = Conversation::Chat(vec![
        Message::new("user", "Capital of France?"),
        Message::new("assistant", "Paris."),
        Message::new("user", "And of Italy?"),
        Message::new("assistant", "Rome."),
    ]);
    let Conversation::Chat(messages) = &chat else {
        unreachable!()
    };
    let sample = chat.render(&format, &tokenizer).unwrap();
    assert_eq!(
        tokenizer.decode(&sample.ids).unwrap(),
        format.render(messages, false)
    );
    let learned: Vec<String> = sample
        .labels
        .split(|&l| l == IGNORE_INDEX)
        .filter(|run| !run.is_empty())
        .map(|run| {
            let ids: Vec<u32> = run.iter().map(|&l| l as u32).collect();
            tokenizer.decode(&ids).unwrap()
        })
        .collect();
    assert_eq!(learned, ["Paris.<|im_end|>\n", "Rome.<|im_end|>\n"]);
}

#[test]
fn jsonl_shapes_parse_and_bad_lines_name_themselves() {
    let path = Path::new("train.jsonl");
    let good = concat!(
        r#"{"instruction": "Add", "input": "2 and 3", "output": "5"}"#,
        "\n\n",
        r#"{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}"#,
        "\n",
        r#"{"text": "plain"}"#,
        "\n"
    );
    let parsed = parse_jsonl(good, path).unwrap();
    assert_eq!(
        parsed[0],
        Conversation::Chat(vec![
            Message::new("user", "Add\n\n2 and 3"),
            Message::new("assistant", "5")
        ])
    );
    assert_eq!(parsed[2], Conversation::Text("plain".into()));
    for (text, line, needle) in [
        ("{\"text\": \"a\"}\n{not json", 2, "not valid JSON"),
        (r#"{"instruction": "x"}"#, 1, "needs `output`"),
        (
            r#"{"messages": [{"role": "bot", "content": "x"}]}"#,
            1,
            "role `bot`",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "x"}]}"#,
            1,
            "no assistant",
        ),
        (r#"{"prompt": "x"}"#, 1, "expected `messages`"),
        ("\n\n", 0, "no examples"),
    ] {
        match parse_jsonl(text, path) {
            Err(Error::Data {
                line: got, message, ..
            }) => {
                assert_eq!(got, line, "{text}");
                assert!(message.contains(needle), "{message}");
            }
            other => panic!("{text}: expected a data error, got {other:?}"),
        }
    }
}

#[test]
fn the_loader_is_seeded_and_resumes_exactly() {
    let samples: Vec<Sample> = (0..40u32)
        .map(|k| Sample::causal((0..(3 + k % 7)).map(|i| (i + k) % 50).collect()))
        .collect();
    for packing in [true, false] {
        let run = |seed| {
            let mut loader = DataLoader::new(samples.clone(), 16, 2, packing, seed).unwrap();
            (0..25)
                .map(|_| loader.next_batch().batch)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1), "same seed, same batches");
        assert_ne!(run(1), run(2), "another seed, another order");

        let mut full = DataLoader::new(samples.clone(), 16, 2, packing, 1).unwrap();
        let mut first = DataLoader::new(samples.clone(), 16, 2, packing, 1).unwrap();
        for _ in 0..13 {
            full.next_batch();
            first.next_batch();
        }
        let mut resumed = DataLoader::new(samples.clone(), 16, 2, packing, 1).unwrap();
        resumed.resume(first.state());
        for _ in 0..12 {
            assert_eq!(full.next_batch().batch, resumed.next_batch().batch);
        }
    }
}
