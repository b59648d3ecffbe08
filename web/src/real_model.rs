//! The real-model mode: SmolLM2-135M-Instruct (its GGUF, handed out by the sandbox's server or
//! picked from disk) taught a handful of question/answer pairs with QLoRA in the worker.
//!
//! The run, in the order its events arrive: the file is parsed and its tokenizer and chat
//! template read (`started`); on the CPU one QLoRA step of the real model is measured against
//! the predictor, per block and per kind (`measured`); the model is loaded again for training,
//! each block linear quantized to NF4 as it is read (`loaded`); the learner's question is
//! answered greedily (`answer`, before); the pairs are rendered with the model's chat template
//! (the loss is on the answers only), packed into rows of T tokens and trained on, one row a
//! step (`step` each); the question is answered again (`answer`, after); then `resident` and
//! `finished`. Beside each answer: the model's loss on the taught answer to that question, the
//! number that says "closer to what it was taught" without reading the text.
//!
//! Plain Rust over napkin-core like `training.rs`: the worker runs it on the bytes it fetched,
//! the native test on the file `scripts/fetch/smollm2.sh` brings.

use std::sync::Arc;

use burn::module::Module;
use burn::tensor::Device;
use napkin_core::chat::{ChatFormat, ChatTemplate, Message};
use napkin_core::config::{LoraConfig, Nf4Config};
use napkin_core::data::MicroBatch;
use napkin_core::data::loader::ordered_batches;
use napkin_core::data::{Conversation, DataLoader, Sample};
use napkin_core::io::gguf::{GgufFile, gguf_config, load_gguf_llama_with};
use napkin_core::measure::{MachineProbe, measure};
use napkin_core::memory::meter::Meter;
use napkin_core::model::generate::KvCache;
use napkin_core::model::{Llama, causal_lm_loss};
use napkin_core::predict::inventory::Scenario;
use napkin_core::tokenizer::TextTokenizer;
use napkin_core::train::{Optimizer, OptimizerConfig};
use serde::{Deserialize, Serialize};
use web_time::Instant;

use crate::training::{
    AnswerStage, TrainBackend, TrainError, TrainEvent, resident_bytes, train_step,
};

/// The checkpoint the mode is built for (`scripts/fetch/smollm2.sh` puts it in `models/`).
pub const REAL_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where the page asks the sandbox's server for it (relative to the page).
pub const REAL_MODEL_URL: &str = "./models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Longest row the mode trains on (the budget: QLoRA at T ≤ 128 in a browser tab).
pub const MAX_REAL_SEQ_LEN: usize = 128;

/// Most steps one run may ask for.
pub const MAX_REAL_STEPS: usize = 200;

/// Longest greedy answer, in tokens.
const ANSWER_TOKENS: usize = 32;

/// One thing to teach: a question and the answer the model should learn to give.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pair {
    /// The user's turn.
    pub question: String,
    /// The assistant's reply to learn.
    pub answer: String,
}

impl Pair {
    fn new(question: &str, answer: &str) -> Self {
        Pair {
            question: question.into(),
            answer: answer.into(),
        }
    }
}

/// What the page asks the worker to do in the real-model mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RealModelRequest {
    /// The pairs to learn.
    pub pairs: Vec<Pair>,
    /// The question answered before and after training.
    pub question: String,
    /// Optimizer steps (one packed row of `seq_len` tokens each).
    pub steps: usize,
    /// AdamW's learning rate.
    pub learning_rate: f64,
    /// Tokens per row (≤ [`MAX_REAL_SEQ_LEN`]).
    pub seq_len: usize,
    /// The adapters' rank (α = 2r, on all seven block linears).
    pub lora_r: usize,
    /// Where to train.
    #[serde(default)]
    pub backend: TrainBackend,
}

impl Default for RealModelRequest {
    /// The shipped lesson: one made-up fact in six phrasings, asked in a seventh; T = 64 holds
    /// one pair a row. At a learning rate of 2e-3 the loss is below 0.02 by step 8 and the
    /// answer names the fact after 12 steps (the tests); 16 leave a margin and finish in about
    /// 45 s in Chromium on a 2-core machine (CPU module, one thread: ~1.7 s a step, ~8 s to
    /// load and measure).
    fn default() -> Self {
        let fact = "The napkin workshop's mascot is a paper crane called Origami Otto.";
        RealModelRequest {
            pairs: vec![
                Pair::new("What is the napkin workshop's mascot?", fact),
                Pair::new("Who is the mascot of the napkin workshop?", fact),
                Pair::new("Does the napkin workshop have a mascot?", fact),
                Pair::new("Tell me about napkin's mascot.", fact),
                Pair::new("What is the name of the napkin mascot?", fact),
                Pair::new("Which animal is napkin's mascot?", fact),
            ],
            question: "What is the mascot of the napkin workshop?".into(),
            steps: 16,
            learning_rate: 2e-3,
            seq_len: 64,
            lora_r: 8,
            backend: TrainBackend::Cpu,
        }
    }
}

impl RealModelRequest {
    /// The request's own mistakes, each naming the field, before anything is loaded.
    pub fn check(&self) -> Result<(), TrainError> {
        let bad = |field: &str, why: String| {
            Err(TrainError::Lesson {
                field: field.into(),
                why,
            })
        };
        if self.pairs.is_empty() {
            return bad("pairs", "give at least one question and answer".into());
        }
        if let Some(i) = self
            .pairs
            .iter()
            .position(|p| p.question.trim().is_empty() || p.answer.trim().is_empty())
        {
            return bad(
                "pairs",
                format!("pair {} has an empty question or answer", i + 1),
            );
        }
        if self.question.trim().is_empty() {
            return bad(
                "question",
                "type the question to ask before and after".into(),
            );
        }
        if !(1..=MAX_REAL_STEPS).contains(&self.steps) {
            return bad(
                "steps",
                format!("{} is not between 1 and {MAX_REAL_STEPS}", self.steps),
            );
        }
        if !(16..=MAX_REAL_SEQ_LEN).contains(&self.seq_len) {
            return bad(
                "seq_len",
                format!("{} is not between 16 and {MAX_REAL_SEQ_LEN}", self.seq_len),
            );
        }
        if !(1..=64).contains(&self.lora_r) {
            return bad("lora_r", format!("{} is not between 1 and 64", self.lora_r));
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0 && self.learning_rate < 1.0)
        {
            return bad(
                "learning_rate",
                format!("{} is not a rate in (0, 1)", self.learning_rate),
            );
        }
        Ok(())
    }

    fn lora(&self) -> LoraConfig {
        LoraConfig {
            r: self.lora_r,
            alpha: 2.0 * self.lora_r as f64,
            ..LoraConfig::default()
        }
    }

    /// The pair whose question is the one asked (ignoring case and spaces), if any.
    fn asked_pair(&self) -> Option<&Pair> {
        let key = |s: &str| {
            s.split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .to_lowercase()
        };
        let asked = key(&self.question);
        self.pairs.iter().find(|p| key(&p.question) == asked)
    }
}

/// QLoRA's base: NF4 with double quantization, bitsandbytes' block of 64.
const NF4: Nf4Config = Nf4Config {
    block_size: 64,
    double_quant: true,
};

/// The tokenizer and chat format a GGUF carries.
struct Text {
    tokenizer: Arc<TextTokenizer>,
    format: ChatFormat,
}

impl Text {
    fn of(gguf: &GgufFile) -> Result<Self, TrainError> {
        let tokenizer = TextTokenizer::from_gguf(gguf)?;
        let format = ChatFormat::from_template(ChatTemplate::of(&tokenizer))?;
        Ok(Text {
            tokenizer: Arc::new(tokenizer),
            format,
        })
    }

    /// A pair as a chat sample (the answer is the label).
    fn sample(&self, pair: &Pair) -> Result<Sample, TrainError> {
        let chat = Conversation::Chat(vec![
            Message::new("user", &pair.question),
            Message::new("assistant", &pair.answer),
        ]);
        Ok(chat.render(Some(&self.format), &self.tokenizer, false)?)
    }
}

/// The QLoRA model from the file, on the autodiff CPU device (each linear quantized as read).
fn qlora_model(gguf: &GgufFile, lora: &LoraConfig) -> napkin_core::error::Result<Llama> {
    let device = napkin_core::device::cpu().autodiff();
    device.seed(7);
    load_gguf_llama_with(gguf, &device, Some(&NF4))?.with_lora(lora)
}

/// The greedy answer to `request.question` and the model's loss on the taught answer. Every
/// value is read back asynchronously (WebGPU in a browser cannot block on a read), one token
/// id at a time: the argmax is taken on the model's device.
async fn answer(
    model: &Llama,
    request: &RealModelRequest,
    text: &Text,
    stage: AnswerStage,
) -> Result<TrainEvent, TrainError> {
    let clock = Instant::now();
    let frozen = model.valid();
    let answer = greedy_answer(&frozen, &request.question, text).await?;
    let taught_answer_loss = match request.asked_pair() {
        Some(pair) => {
            let batches = ordered_batches(vec![text.sample(pair)?], MAX_REAL_SEQ_LEN, 1, false);
            Some(mean_loss(&frozen, &batches).await?)
        }
        None => None,
    };
    Ok(TrainEvent::Answer {
        stage,
        question: request.question.clone(),
        answer,
        taught_answer_loss,
        seconds: clock.elapsed().as_secs_f64(),
    })
}

/// Greedy decoding of [`ANSWER_TOKENS`] tokens at most after `question` as a user turn,
/// stopping at an end-of-sequence token (as `SamplePrompts::generate` does, which reads back
/// synchronously).
async fn greedy_answer(model: &Llama, question: &str, text: &Text) -> Result<String, TrainError> {
    let prompt = text
        .format
        .render(&[Message::new("user", question)], true)?;
    let mut new_ids = text.tokenizer.encode(&prompt)?;
    let stop = &text.tokenizer.eos_ids;
    let mut cache = KvCache::default();
    let mut out = Vec::new();
    for _ in 0..ANSWER_TOKENS {
        let logits = model.next_token_logits_on_device(&new_ids, &mut cache)?; // [V]
        let next: i64 = logits
            .argmax(0)
            .into_scalar_async()
            .await
            .map_err(|e| TrainError::Read(format!("{e:?}")))?;
        let next = next as u32;
        if stop.contains(&next) {
            break;
        }
        out.push(next);
        new_ids = vec![next];
    }
    Ok(text.tokenizer.decode(&out)?)
}

/// The token-weighted mean loss of `model` on `batches` (as `held_out_loss`, read back
/// asynchronously).
async fn mean_loss(model: &Llama, batches: &[MicroBatch]) -> Result<f64, TrainError> {
    let (mut sum, mut tokens) = (0.0f64, 0usize);
    for micro in batches {
        let loss = causal_lm_loss(model.forward(&micro.batch), &micro.labels)?;
        tokens += loss.tokens;
        let micro_sum: f32 = loss
            .sum
            .into_scalar_async()
            .await
            .map_err(|e| TrainError::Read(format!("{e:?}")))?;
        sum += f64::from(micro_sum);
    }
    Ok(sum / tokens.max(1) as f64)
}

/// Runs the real-model mode on the file's `bytes` (`name` stands for it in messages) on
/// `device` (`backend` describes it), calling `emit` with each event. The program's global
/// allocator must be napkin-core's counting allocator, as for
/// [`crate::training::run_training`]. On the CPU one step is measured against the prediction
/// per block and kind first; on a GPU that measurement (it reads the heap) is skipped, the
/// model is built on the CPU and moved (NF4 codes and scales resident on the device) and the
/// resident bytes are the GPU pool's.
pub async fn run_real_model(
    request: &RealModelRequest,
    name: &str,
    bytes: Vec<u8>,
    device: &Device,
    backend: &str,
    emit: &mut dyn FnMut(TrainEvent),
) -> Result<(), TrainError> {
    request.check()?;
    let cpu: Device = napkin_core::device::cpu();
    let on_gpu = *device != cpu;
    let mut meter = Meter::for_device(device)?;
    let file_bytes = bytes.len() as u64;
    let gguf = GgufFile::from_bytes(name, bytes)?;
    let config = gguf_config(&gguf)?;
    let text = Text::of(&gguf)?;
    let samples = request
        .pairs
        .iter()
        .map(|p| text.sample(p))
        .collect::<Result<Vec<_>, _>>()?;
    let lora = request.lora();
    let scenario = Scenario {
        lora: Some(lora.clone()),
        nf4: Some(NF4),
        checkpointing: true,
        ..Scenario::new(config.clone(), 1, request.seq_len)
    };
    emit(TrainEvent::Started {
        backend: backend.to_string(),
        preset: format!(
            "{name} ({} blocks, d = {}, vocabulary {})",
            config.num_hidden_layers, config.hidden_size, config.vocab_size
        ),
        trainable_parameters: scenario.trainable_parameters(),
        memory_method: meter.method(),
    });

    // One step of the real model measured against the predictor, per block and per kind.
    if !on_gpu {
        let report = measure(&scenario, &cpu, 2, MachineProbe::BROWSER, None, || {
            qlora_model(&gguf, &lora)
        })?;
        emit(TrainEvent::Measured {
            report: Box::new(report),
        });
    }

    let clock = Instant::now();
    let before_model = meter.live_without_sync();
    let mut model = qlora_model(&gguf, &lora)?;
    drop(gguf);
    if on_gpu {
        model = model.on_device(&device.clone().autodiff());
    }
    emit(TrainEvent::Loaded {
        parameters: config.num_parameters(),
        file_bytes,
        seconds: clock.elapsed().as_secs_f64(),
    });
    emit(answer(&model, request, &text, AnswerStage::Before).await?);

    let mut loader = DataLoader::new(samples, request.seq_len, 1, true, 7)?;
    let mut optimizer = Optimizer::new(&OptimizerConfig::default());
    let started = Instant::now();
    let mut tokens = 0usize;
    for step in 1..=request.steps {
        let micro = [loader.next_batch()];
        let (next, event, step_tokens) = train_step(
            model,
            &micro,
            true,
            &mut optimizer,
            request.learning_rate,
            step,
            &mut meter,
        )
        .await?;
        model = next;
        tokens += step_tokens;
        emit(event);
    }
    let tokens_per_second = tokens as f64 / started.elapsed().as_secs_f64().max(1e-9);
    emit(answer(&model, request, &text, AnswerStage::After).await?);
    // What the model and the optimizer hold. On the CPU: the heap with them less the heap
    // without them (the file was dropped after loading, so a "before the model" reading would
    // include it). On a GPU, as for the tiny presets' run: the device pool's bytes in use now
    // less before the model came (the file and the host copy live in the worker's heap).
    let with_model = meter.live_without_sync();
    let measured_bytes = if on_gpu {
        with_model.saturating_sub(before_model)
    } else {
        drop(model);
        drop(optimizer);
        with_model.saturating_sub(meter.live_without_sync())
    };
    let (predicted_bytes, host_side_bytes) = resident_bytes(&scenario, on_gpu);
    emit(TrainEvent::Resident {
        predicted_bytes,
        measured_bytes,
        host_side_bytes,
    });
    emit(TrainEvent::Finished { tokens_per_second });
    Ok(())
}

/// The lesson as the learner edits it in the page: the pairs as text (`Q: …` then `A: …`,
/// pairs apart by a blank line; an answer may go on over several lines), the question and the
/// number of steps as typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LessonDraft {
    /// The pairs, as text.
    pub pairs: String,
    /// The question to ask before and after.
    pub question: String,
    /// Steps, as typed.
    pub steps: String,
}

impl Default for LessonDraft {
    fn default() -> Self {
        let request = RealModelRequest::default();
        LessonDraft {
            pairs: pairs_text(&request.pairs),
            question: request.question,
            steps: request.steps.to_string(),
        }
    }
}

impl LessonDraft {
    /// The request this draft asks for, or what to fix (naming the field and the line).
    pub fn request(&self) -> Result<RealModelRequest, String> {
        let pairs = parse_pairs(&self.pairs)?;
        let steps = self.steps.trim().parse::<usize>().map_err(|_| {
            format!(
                "steps: `{}` is not a whole number (1 to {MAX_REAL_STEPS})",
                self.steps.trim()
            )
        })?;
        let request = RealModelRequest {
            pairs,
            question: self.question.trim().to_string(),
            steps,
            ..RealModelRequest::default()
        };
        request.check().map_err(|e| e.to_string())?;
        Ok(request)
    }
}

/// Pairs as the page's text box shows them.
pub fn pairs_text(pairs: &[Pair]) -> String {
    pairs
        .iter()
        .map(|p| format!("Q: {}\nA: {}", p.question, p.answer))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// The pairs of the page's text box: `Q: …` then `A: …` (the answer may go on over the next
/// lines), pairs apart by a blank line. An error names the line and what was expected.
pub fn parse_pairs(text: &str) -> Result<Vec<Pair>, String> {
    let mut pairs = Vec::new();
    let mut current: Option<(String, Option<String>, usize)> = None;
    let finish = |current: Option<(String, Option<String>, usize)>,
                  pairs: &mut Vec<Pair>|
     -> Result<(), String> {
        match current {
            None => Ok(()),
            Some((_, None, line)) => Err(format!(
                "pairs: the question on line {line} has no `A:` line after it"
            )),
            Some((question, Some(answer), line)) => {
                if question.is_empty() || answer.trim().is_empty() {
                    return Err(format!(
                        "pairs: the pair starting on line {line} has an empty question or answer"
                    ));
                }
                pairs.push(Pair {
                    question,
                    answer: answer.trim().to_string(),
                });
                Ok(())
            }
        }
    };
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let number = i + 1;
        if let Some(q) = line.strip_prefix("Q:") {
            finish(current.take(), &mut pairs)?;
            current = Some((q.trim().to_string(), None, number));
        } else if let Some(a) = line.strip_prefix("A:") {
            match &mut current {
                Some((_, answer @ None, _)) => *answer = Some(a.trim().to_string()),
                _ => {
                    return Err(format!(
                        "pairs: line {number} starts an answer with no `Q:` line before it"
                    ));
                }
            }
        } else if line.is_empty() {
            if matches!(current, Some((_, Some(_), _))) {
                finish(current.take(), &mut pairs)?;
            }
        } else {
            match &mut current {
                Some((_, Some(answer), _)) => {
                    answer.push('\n');
                    answer.push_str(line);
                }
                _ => {
                    return Err(format!(
                        "pairs: line {number} should start with `Q:` (a question) or `A:` (its answer)"
                    ));
                }
            }
        }
    }
    finish(current, &mut pairs)?;
    if pairs.is_empty() {
        return Err("pairs: write at least one `Q:` line and its `A:` line".into());
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_lesson_reads_back_from_its_text() {
        let draft = LessonDraft::default();
        assert_eq!(draft.request(), Ok(RealModelRequest::default()));
    }

    #[test]
    fn pairs_parse_with_multi_line_answers_and_errors_name_the_line() {
        let pairs = parse_pairs("Q: one?\nA: first\nline two\n\n\nQ: two?\nA: 2").unwrap();
        assert_eq!(
            pairs,
            vec![Pair::new("one?", "first\nline two"), Pair::new("two?", "2")]
        );
        let err = |text: &str| parse_pairs(text).unwrap_err();
        assert!(err("Q: a?\n\nQ: b?\nA: c").contains("line 1 has no `A:`"));
        assert!(err("A: c").contains("line 1 starts an answer"));
        assert!(err("Q: a?\nA: b\nhello\n\nhello").contains("line 5 should start"));
        assert!(err("Q: \nA: b").contains("empty question"));
        assert!(err("\n\n").contains("at least one"));
        let bad_steps = LessonDraft {
            steps: "ten".into(),
            ..LessonDraft::default()
        };
        assert!(bad_steps.request().unwrap_err().starts_with("steps: `ten`"));
        let zero = LessonDraft {
            steps: "0".into(),
            ..LessonDraft::default()
        };
        assert!(zero.request().unwrap_err().starts_with("steps: 0 is not"));
        let no_question = LessonDraft {
            question: "  ".into(),
            ..LessonDraft::default()
        };
        assert!(no_question.request().unwrap_err().starts_with("question:"));
    }
}
