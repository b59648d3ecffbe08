//! Training data: packing without leakage between samples, padding, loss on replies only,
//! every record format as JSON lines and arrays, errors that name the file and line, and a
//! seeded loader that resumes exactly.

use std::path::Path;

use napkin_core::Error;
use napkin_core::chat::{ChatFormat, ChatTemplate, Message};
use napkin_core::data::packing::micro_batch;
use napkin_core::data::{
    Conversation, DataContent, DataFormat, DataLoader, Sample, pack, pad_each, parse_data,
};
use napkin_core::device::DeviceKind;
use napkin_core::io::gguf::GgufFile;
use napkin_core::io::load_hf_llama;
use napkin_core::kernels::values::{scalar, to_f32_vec};
use napkin_core::model::{IGNORE_INDEX, Llama, TokenBatch, causal_lm_loss};
use napkin_core::tokenizer::TextTokenizer;
use napkin_tests::{ONE_MODEL, model_dir};

use super::smollm2::smollm2_path;

fn tiny_model() -> Llama {
    load_hf_llama(&model_dir(ONE_MODEL), &DeviceKind::Cpu.open().unwrap()).unwrap()
}

/// Each run of learned labels of `sample`, decoded.
fn learned_pieces(sample: &Sample, tokenizer: &TextTokenizer) -> Vec<String> {
    sample
        .labels
        .split(|&l| l == IGNORE_INDEX)
        .filter(|run| !run.is_empty())
        .map(|run| {
            let ids: Vec<u32> = run.iter().map(|&l| l as u32).collect();
            tokenizer.decode(&ids).unwrap()
        })
        .collect()
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
    let format = ChatFormat::from_template(ChatTemplate::of(&tokenizer)).unwrap();
    let chat = Conversation::Chat(vec![
        Message::new("user", "Capital of France?"),
        Message::new("assistant", "Paris."),
        Message::new("user", "And of Italy?"),
        Message::new("assistant", "Rome."),
    ]);
    let Conversation::Chat(messages) = &chat else {
        unreachable!()
    };
    let sample = chat.render(Some(&format), &tokenizer, false).unwrap();
    assert_eq!(
        tokenizer.decode(&sample.ids).unwrap(),
        format.render(messages, false).unwrap()
    );
    let learned = learned_pieces(&sample, &tokenizer);
    assert_eq!(learned, ["Paris.<|im_end|>\n", "Rome.<|im_end|>\n"]);
}

/// A template in Llama-3's format (written for this test; Jinja with whitespace control)
/// renders incrementally, so only the replies, each with its end-of-turn marker, are learned.
#[test]
fn a_llama3_style_template_learns_only_the_replies() {
    let tokenizer =
        TextTokenizer::from_file(&napkin_tests::fixture_root().join("tokenizer/tokenizer.json"))
            .unwrap();
    let format = ChatFormat::from_template(Some(ChatTemplate {
        source: "{{- bos_token }}{%- for m in messages %}{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}".into(),
        bos_token: Some("<|begin_of_text|>".into()),
        eos_token: Some("<|eot_id|>".into()),
    }))
    .unwrap();
    let chat = Conversation::Chat(vec![
        Message::new("system", "Be brief."),
        Message::new("user", "Capital of France?"),
        Message::new("assistant", "Paris."),
        Message::new("user", "And of Italy?"),
        Message::new("assistant", "Rome."),
    ]);
    let sample = chat.render(Some(&format), &tokenizer, false).unwrap();
    let learned = learned_pieces(&sample, &tokenizer);
    assert_eq!(learned, ["Paris.<|eot_id|>", "Rome.<|eot_id|>"]);
}

/// Every record format, as JSON lines and as a JSON array, gives the same conversations; the
/// format is the first record's and is named in the result.
#[test]
fn every_record_format_parses_as_lines_and_as_an_array() {
    let chat = |user: &str, reply: &str| {
        Conversation::Chat(vec![
            Message::new("user", user),
            Message::new("assistant", reply),
        ])
    };
    let cases: [(&str, [&str; 2], DataFormat, [Conversation; 2]); 5] = [
        (
            "alpaca",
            [
                r#"{"instruction": "Add", "input": "2 and 3", "output": "5"}"#,
                r#"{"instruction": "Hi", "input": "", "output": "Hello", "system": "Be brief."}"#,
            ],
            DataFormat::Alpaca,
            [
                chat("Add\n\n2 and 3", "5"),
                Conversation::Chat(vec![
                    Message::new("system", "Be brief."),
                    Message::new("user", "Hi"),
                    Message::new("assistant", "Hello"),
                ]),
            ],
        ),
        (
            "sharegpt",
            [
                r#"{"conversations": [{"from": "human", "value": "Add 2 and 3"}, {"from": "gpt", "value": "5"}]}"#,
                r#"{"system": "Be brief.", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}, {"from": "human", "value": "Bye"}, {"from": "gpt", "value": "Bye"}]}"#,
            ],
            DataFormat::Sharegpt,
            [
                chat("Add 2 and 3", "5"),
                Conversation::Chat(vec![
                    Message::new("system", "Be brief."),
                    Message::new("user", "Hi"),
                    Message::new("assistant", "Hello"),
                    Message::new("user", "Bye"),
                    Message::new("assistant", "Bye"),
                ]),
            ],
        ),
        (
            "messages",
            [
                r#"{"messages": [{"role": "user", "content": "Add 2 and 3"}, {"role": "assistant", "content": "5"}]}"#,
                r#"{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}"#,
            ],
            DataFormat::Messages,
            [chat("Add 2 and 3", "5"), chat("Hi", "Hello")],
        ),
        (
            "prompt-completion",
            [
                r#"{"prompt": "2 + 3 =", "completion": " 5"}"#,
                r#"{"prompt": "Hi", "completion": " there"}"#,
            ],
            DataFormat::PromptCompletion,
            [
                Conversation::Completion {
                    prompt: "2 + 3 =".into(),
                    completion: " 5".into(),
                },
                Conversation::Completion {
                    prompt: "Hi".into(),
                    completion: " there".into(),
                },
            ],
        ),
        (
            "text",
            [r#"{"text": "plain"}"#, r#"{"text": "more"}"#],
            DataFormat::Text,
            [
                Conversation::Text("plain".into()),
                Conversation::Text("more".into()),
            ],
        ),
    ];
    for (name, records, format, expected) in cases {
        let lines = format!("{}\n\n{}\n", records[0], records[1]);
        let array = format!("[\n  {},\n  {}\n]\n", records[0], records[1]);
        for (file, text) in [("d.jsonl", &lines), ("d.json", &array), ("d.json", &lines)] {
            let got = parse_data(text, Path::new(file), DataFormat::Auto);
            let want = DataContent::Records {
                format,
                examples: expected.to_vec(),
            };
            assert_eq!(got.as_ref().ok(), Some(&want), "{name} in {file}: {got:?}");
            let given = parse_data(text, Path::new(file), name.parse().unwrap());
            assert_eq!(given.ok(), Some(want), "{name} given");
        }
    }
}

/// Bad records, mixed files, tool turns and unknown files are errors naming the file and the
/// line (of a JSONL line, or of the array element), never a silent fallback to plain text.
#[test]
fn bad_data_files_are_errors_that_name_file_and_line() {
    let alpaca = r#"{"instruction": "x", "output": "y"}"#;
    let cases: Vec<(&str, String, DataFormat, usize, &str)> = vec![
        ("d.jsonl", format!("{alpaca}\n{{not json"), DataFormat::Auto, 2, "not valid JSON"),
        ("d.jsonl", r#"{"instruction": "x"}"#.into(), DataFormat::Auto, 1, "needs `output`"),
        (
            "d.jsonl",
            format!("{alpaca}\n{alpaca}\n{}", r#"{"text": "t"}"#),
            DataFormat::Auto,
            3,
            "this record is text but the file is alpaca (detected from line 1",
        ),
        (
            "d.json",
            format!("[\n{alpaca},\n\n{}\n]", r#"{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}"#),
            DataFormat::Auto,
            4,
            "this record is messages but the file is alpaca",
        ),
        (
            "d.jsonl",
            alpaca.into(),
            DataFormat::Sharegpt,
            1,
            "this record is alpaca but the file is sharegpt (--data-format)",
        ),
        (
            "d.jsonl",
            r#"{"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "{}"}, {"role": "assistant", "content": "y"}]}"#.into(),
            DataFormat::Auto,
            1,
            "turn 1: role `tool` is tool use",
        ),
        (
            "d.jsonl",
            r#"{"conversations": [{"from": "human", "value": "x"}, {"from": "function_call", "value": "{}"}]}"#.into(),
            DataFormat::Auto,
            1,
            "role `function_call` is tool use",
        ),
        (
            "d.jsonl",
            r#"{"conversations": [{"from": "robot", "value": "x"}]}"#.into(),
            DataFormat::Auto,
            1,
            "`from: robot` is not system, human or gpt",
        ),
        (
            "d.jsonl",
            r#"{"messages": [{"role": "bot", "content": "x"}]}"#.into(),
            DataFormat::Auto,
            1,
            "role `bot`",
        ),
        (
            "d.jsonl",
            r#"{"messages": [{"role": "user", "content": "x"}]}"#.into(),
            DataFormat::Auto,
            1,
            "no assistant turn",
        ),
        ("d.jsonl", r#"{"question": "x"}"#.into(), DataFormat::Auto, 1, "expected `messages`, `conversations`"),
        ("d.jsonl", r#"{"prompt": "x", "completion": 3}"#.into(), DataFormat::Auto, 1, "`completion` must be a string, found a number"),
        ("d.json", "[\n  1\n]".into(), DataFormat::Alpaca, 2, "must be a JSON object"),
        ("d.json", format!("[{alpaca} {alpaca}]"), DataFormat::Auto, 1, "expected `,` or `]`"),
        ("d.json", format!("[\n{alpaca},\n"), DataFormat::Auto, 3, "the array ends early"),
        ("d.json", format!("[{alpaca}] x"), DataFormat::Auto, 1, "text after the array"),
        ("d.jsonl", "\n\n".into(), DataFormat::Auto, 0, "no examples"),
        ("d.json", "[]".into(), DataFormat::Auto, 0, "no examples"),
        ("d.csv", "a,b".into(), DataFormat::Auto, 0, "unknown extension `.csv`: expected .jsonl"),
        ("data", "x".into(), DataFormat::Auto, 0, "no extension"),
        ("d.txt", "x".into(), DataFormat::Alpaca, 0, "a plain-text file holds no alpaca records"),
    ];
    for (file, text, format, line, needle) in cases {
        match parse_data(&text, Path::new(file), format) {
            Err(Error::Data {
                line: got,
                message,
                path,
            }) => {
                assert_eq!(
                    (got, path.as_path()),
                    (line, Path::new(file)),
                    "{text}: {message}"
                );
                assert!(message.contains(needle), "{text}: {message}");
            }
            other => panic!("{text}: expected a data error, got {other:?}"),
        }
    }
    assert_eq!(
        parse_data("words", Path::new("notes.TXT"), DataFormat::Auto).unwrap(),
        DataContent::PlainText("words".into())
    );
    assert!("chatml".parse::<DataFormat>().is_err());
    assert_eq!(
        "prompt_completion".parse::<DataFormat>().unwrap(),
        DataFormat::PromptCompletion
    );
}

/// What each kind of example learns: text and completions end with the EOS token (learned);
/// a completion's prompt is context unless `train_on_inputs`, as is a chat's non-reply text.
#[test]
fn completions_learn_the_completion_and_text_ends_with_eos() {
    let gguf = GgufFile::open(&smollm2_path()).unwrap();
    let tokenizer = TextTokenizer::from_gguf(&gguf).unwrap();
    let eos = tokenizer.eos_ids[0];
    let learned = |s: &Sample| -> String {
        let ids: Vec<u32> = s
            .labels
            .iter()
            .filter(|&&l| l != IGNORE_INDEX)
            .map(|&l| l as u32)
            .collect();
        tokenizer.decode(&ids).unwrap()
    };
    let text = Conversation::Text("The cat sat.".into())
        .render(None, &tokenizer, false)
        .unwrap();
    assert_eq!(text.ids.last(), Some(&eos));
    assert_eq!(
        text.ids[..text.len() - 1],
        tokenizer.encode("The cat sat.").unwrap()
    );
    assert_eq!(
        text.label_tokens(),
        text.len() - 1,
        "every token but the first is learned"
    );

    let pair = Conversation::Completion {
        prompt: "Q: 2 + 3?\nA:".into(),
        completion: " 5".into(),
    };
    let prompt_len = tokenizer.encode("Q: 2 + 3?\nA:").unwrap().len();
    let sample = pair.render(None, &tokenizer, false).unwrap();
    assert_eq!(sample.ids.last(), Some(&eos));
    assert!(
        sample.labels[..prompt_len]
            .iter()
            .all(|&l| l == IGNORE_INDEX)
    );
    assert_eq!(
        learned(&sample),
        format!(" 5{}", tokenizer.decode(&[eos]).unwrap())
    );
    let all = pair.render(None, &tokenizer, true).unwrap();
    assert_eq!(all.ids, sample.ids);
    assert_eq!(
        all.label_tokens(),
        all.len() - 1,
        "train_on_inputs learns the prompt"
    );

    let format = ChatFormat::from_template(ChatTemplate::of(&tokenizer)).unwrap();
    let chat = Conversation::Chat(vec![
        Message::new("user", "Capital of France?"),
        Message::new("assistant", "Paris."),
    ]);
    let inputs_too = chat.render(Some(&format), &tokenizer, true).unwrap();
    assert_eq!(inputs_too.label_tokens(), inputs_too.len() - 1);
    assert!(
        chat.render(None, &tokenizer, false).is_err(),
        "a chat needs a format"
    );
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
