//! The whole page as plain data: the sandbox controls (`state.rs`), the training run in the
//! worker, a measurement loaded from a file, and the exercise mode — with one action enum and
//! one reducer, tested natively. The components render a `Page` and dispatch `PageAction`s.

use napkin_core::exercises::{Instance, catalog, check, instance};
use napkin_core::measure::MeasurementReport;
use napkin_core::report::run::MetricRow;

use napkin_core::memory::meter::MeterMethod;

use crate::real_model::LessonDraft;
use crate::state::{Action, SandboxState, reduce};
use crate::training::{AnswerStage, TrainBackend, TrainEvent};

/// Where the training run is.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum RunStatus {
    /// Nothing started.
    #[default]
    Idle,
    /// The worker is measuring or training.
    Running,
    /// The run finished.
    Finished,
    /// The run stopped with this message.
    Failed(String),
    /// The learner stopped the run (the worker was ended).
    Stopped,
}

/// Which of the page's two runs an action is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// "Train in this tab": a tiny preset with the sandbox's tricks.
    Tiny,
    /// "Teach a real model": SmolLM2-135M-Instruct with QLoRA.
    Real,
}

/// A field of the real-model lesson.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LessonField {
    /// The question/answer pairs.
    Pairs,
    /// The question asked before and after.
    Question,
    /// The number of steps.
    Steps,
}

/// The training run as the page shows it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Run {
    /// Status.
    pub status: RunStatus,
    /// The backend the worker used, in words.
    pub backend: Option<String>,
    /// Loss per optimizer step.
    pub losses: Vec<f32>,
    /// Tokens per second of the last step, then of the whole run.
    pub tokens_per_second: Option<f64>,
    /// Bytes in use after the last step (the worker's heap, or the GPU's memory pool).
    pub live_bytes: Option<u64>,
    /// How the memory figures were read.
    pub memory_method: Option<MeterMethod>,
    /// Predicted beside measured (the CPU run's per-block measurement).
    pub report: Option<MeasurementReport>,
    /// What stays between steps: predicted, measured, and NF4 bytes kept on the host.
    pub resident: Option<Resident>,
    /// The last file the worker fetched, as it arrived.
    pub download: Option<Download>,
    /// The real model, loaded.
    pub loaded: Option<Loaded>,
    /// The real model's answers, before and after training.
    pub answers: Vec<Answered>,
}

/// A file the worker fetches (a module, the model).
#[derive(Debug, Clone, PartialEq)]
pub struct Download {
    /// What, in words.
    pub what: String,
    /// Bytes received (decompressed).
    pub loaded: u64,
    /// The size, when the server said it and sent the file as it is.
    pub total: Option<u64>,
}

impl Download {
    /// Whether bytes are still to come (unknown: until a later event says otherwise).
    pub fn arriving(&self) -> bool {
        self.total.is_none_or(|t| self.loaded < t)
    }
}

/// What a number field accepts.
#[derive(Clone, Copy)]
pub enum Accepts {
    /// A whole number at least this.
    WholeFrom(u64),
    /// Any number at least this.
    From(f64),
}

impl Accepts {
    /// The number `text` holds when it is one this field accepts.
    pub fn check(self, text: &str) -> Option<f64> {
        let v = text.trim().parse::<f64>().ok().filter(|v| v.is_finite())?;
        match self {
            Accepts::WholeFrom(min) => (v.fract() == 0.0 && v >= min as f64).then_some(v),
            Accepts::From(min) => (v >= min).then_some(v),
        }
    }

    /// What it accepts, in words.
    pub fn words(self) -> String {
        match self {
            Accepts::WholeFrom(min) => format!("a whole number from {min}"),
            Accepts::From(min) => format!("a number from {min}"),
        }
    }

    /// The number, or the refusal shown under the controls naming the field.
    pub fn read(self, field: &str, text: &str) -> Result<f64, String> {
        self.check(text).ok_or_else(|| {
            format!(
                "{field}: `{}` is not {}; the prediction keeps the last accepted value",
                text.trim(),
                self.words()
            )
        })
    }
}

/// The real model as loaded for training.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Loaded {
    /// The checkpoint's parameters.
    pub parameters: u64,
    /// Its file's size.
    pub file_bytes: u64,
    /// Seconds to load and quantize it.
    pub seconds: f64,
}

/// One of the real model's answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    /// Before or after training.
    pub stage: AnswerStage,
    /// The text.
    pub answer: String,
    /// The loss on the taught answer (nats/token), when the question is one of the pairs'.
    pub taught_answer_loss: Option<f64>,
    /// Seconds it took.
    pub seconds: f64,
}

/// The memory that stays between steps, predicted beside measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Resident {
    /// The predictor's bytes.
    pub predicted: u64,
    /// The measured bytes.
    pub measured: u64,
    /// NF4 codes and scales in host memory on a GPU backend.
    pub host_side: u64,
}

/// The exercise mode.
#[derive(Debug, Clone, PartialEq)]
pub struct ExerciseMode {
    /// The exercise on screen (id and seed).
    pub instance: Instance,
    /// The learner's answer as typed.
    pub answer: String,
    /// The checker's verdict on the last answer: (correct, message).
    pub verdict: Option<(bool, String)>,
    /// Whether the hint is shown.
    pub hint: bool,
}

/// Everything on the page.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Page {
    /// The controls.
    pub sandbox: SandboxState,
    /// Where the next run trains.
    pub backend: TrainBackend,
    /// The training run.
    pub run: Run,
    /// The real-model run.
    pub real: Run,
    /// The real-model lesson as typed.
    pub lesson: LessonDraft,
    /// The last refused control value, in words (cleared by the next accepted change).
    pub control_error: Option<String>,
    /// A `napkin measure --json` report loaded from a file, with its file name.
    pub imported: Option<(String, MeasurementReport)>,
    /// A `napkin train` run's metrics loaded from a file, with its file name.
    pub imported_run: Option<(String, Vec<MetricRow>)>,
    /// The last refused file, in words.
    pub import_error: Option<String>,
    /// The exercise mode, when open.
    pub exercise: Option<ExerciseMode>,
}

/// What happens on the page.
#[derive(Debug, Clone, PartialEq)]
pub enum PageAction {
    /// A control changed.
    Sandbox(Action),
    /// The learner picked where to train.
    SelectBackend(TrainBackend),
    /// The learner pressed "train" (or "teach").
    TrainStarted(Job),
    /// The worker reported.
    Train(Job, TrainEvent),
    /// The worker could not be reached or its message was not understood.
    WorkerError(Job, String),
    /// The learner pressed "stop": the worker was ended.
    Stopped(Job),
    /// A field of the real-model lesson changed.
    EditLesson(LessonField, String),
    /// A control's value was refused (the message names the field and what it accepts).
    ControlRefused(String),
    /// A measurement file was read and parsed.
    Imported(String, Box<MeasurementReport>),
    /// A run's metrics.jsonl was read and parsed.
    ImportedRun(String, Vec<MetricRow>),
    /// A dropped file was refused.
    ImportFailed(String),
    /// Open an exercise (unknown ids are ignored).
    OpenExercise(String, u64),
    /// Close the exercise mode.
    CloseExercise,
    /// The answer box changed.
    SetAnswer(String),
    /// Check the answer; a correct one presets the sandbox to the exercise's scenario.
    CheckAnswer,
    /// Show the hint.
    ShowHint,
}

/// The first exercise's id (the exercise mode opens on it).
pub fn first_exercise() -> &'static str {
    catalog().first().map_or("", |e| e.id)
}

impl Page {
    /// The run an action is about.
    pub fn run_mut(&mut self, job: Job) -> &mut Run {
        match job {
            Job::Tiny => &mut self.run,
            Job::Real => &mut self.real,
        }
    }
}

impl Run {
    /// The run after one of its worker's events.
    fn apply(&mut self, event: TrainEvent) {
        match event {
            TrainEvent::Started {
                backend,
                memory_method,
                ..
            } => {
                self.backend = Some(backend);
                self.memory_method = Some(memory_method);
            }
            TrainEvent::Measured { report } => self.report = Some(*report),
            TrainEvent::Step {
                loss,
                tokens_per_second,
                live_bytes,
                ..
            } => {
                self.losses.push(loss);
                self.tokens_per_second = Some(tokens_per_second);
                self.live_bytes = Some(live_bytes);
            }
            TrainEvent::Resident {
                predicted_bytes,
                measured_bytes,
                host_side_bytes,
            } => {
                self.resident = Some(Resident {
                    predicted: predicted_bytes,
                    measured: measured_bytes,
                    host_side: host_side_bytes,
                });
            }
            TrainEvent::Finished { tokens_per_second } => {
                self.tokens_per_second = Some(tokens_per_second);
                self.status = RunStatus::Finished;
            }
            TrainEvent::Failed { message } => self.status = RunStatus::Failed(message),
            TrainEvent::Downloading {
                what,
                loaded,
                total,
            } => {
                self.download = Some(Download {
                    what,
                    loaded,
                    total,
                })
            }
            TrainEvent::Loaded {
                parameters,
                file_bytes,
                seconds,
            } => {
                self.loaded = Some(Loaded {
                    parameters,
                    file_bytes,
                    seconds,
                })
            }
            TrainEvent::Answer {
                stage,
                answer,
                taught_answer_loss,
                seconds,
                ..
            } => self.answers.push(Answered {
                stage,
                answer,
                taught_answer_loss,
                seconds,
            }),
        }
    }
}

/// The next page.
pub fn reduce_page(page: &Page, action: PageAction) -> Page {
    let mut p = page.clone();
    match action {
        PageAction::Sandbox(a) => {
            p.sandbox = reduce(&p.sandbox, a);
            p.control_error = None;
        }
        PageAction::ControlRefused(message) => p.control_error = Some(message),
        PageAction::SelectBackend(backend) => p.backend = backend,
        PageAction::TrainStarted(job) => {
            *p.run_mut(job) = Run {
                status: RunStatus::Running,
                ..Run::default()
            };
        }
        PageAction::Stopped(job) => {
            let run = p.run_mut(job);
            if run.status == RunStatus::Running {
                run.status = RunStatus::Stopped;
            }
        }
        PageAction::EditLesson(field, text) => match field {
            LessonField::Pairs => p.lesson.pairs = text,
            LessonField::Question => p.lesson.question = text,
            LessonField::Steps => p.lesson.steps = text,
        },
        PageAction::Train(job, event) => {
            let run = p.run_mut(job);
            // A stopped run's last messages may still arrive: they change nothing.
            if run.status == RunStatus::Running {
                run.apply(event);
            }
        }
        PageAction::WorkerError(job, message) => p.run_mut(job).status = RunStatus::Failed(message),
        PageAction::Imported(name, report) => {
            p.imported = Some((name, *report));
            p.import_error = None;
        }
        PageAction::ImportedRun(name, rows) => {
            p.imported_run = Some((name, rows));
            p.import_error = None;
        }
        PageAction::ImportFailed(message) => p.import_error = Some(message),
        PageAction::OpenExercise(id, seed) => {
            if let Some(instance) = instance(&id, seed) {
                p.exercise = Some(ExerciseMode {
                    instance,
                    answer: String::new(),
                    verdict: None,
                    hint: false,
                });
            }
        }
        PageAction::CloseExercise => p.exercise = None,
        PageAction::SetAnswer(text) => {
            if let Some(x) = &mut p.exercise {
                x.answer = text;
            }
        }
        PageAction::CheckAnswer => {
            if let Some(x) = &mut p.exercise {
                let verdict = match check(&x.answer, &x.instance.expected) {
                    Ok(v) => (v.correct, v.message),
                    Err(e) => (false, e.to_string()),
                };
                if verdict.0
                    && let Some(settings) = x.instance.sandbox.clone()
                {
                    p.sandbox = reduce(&p.sandbox, Action::LoadExercise(settings));
                }
                x.verdict = Some(verdict);
            }
        }
        PageAction::ShowHint => {
            if let Some(x) = &mut p.exercise {
                x.hint = true;
            }
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_correct_answer_presets_the_sandbox_and_a_wrong_one_does_not() {
        let mut p = reduce_page(
            &Page::default(),
            PageAction::OpenExercise("will-it-fit".into(), 3),
        );
        let x = p.exercise.clone().expect("exercise open");
        let settings = x.instance.sandbox.clone().expect("a scenario");

        p = reduce_page(&p, PageAction::SetAnswer("12 parsecs".into()));
        p = reduce_page(&p, PageAction::CheckAnswer);
        let (correct, message) = p.exercise.clone().unwrap().verdict.unwrap();
        assert!(!correct);
        assert!(!message.is_empty());
        assert_eq!(p.sandbox, SandboxState::default());

        // "will it fit" is a choice: the reference is the chosen word.
        let e = &x.instance.expected;
        let reference = e.choices[e.value as usize].clone();
        p = reduce_page(&p, PageAction::SetAnswer(reference));
        p = reduce_page(&p, PageAction::CheckAnswer);
        assert!(p.exercise.clone().unwrap().verdict.unwrap().0);
        assert_eq!(p.sandbox.preset, settings.preset);
        assert_eq!(p.sandbox.seq_len, settings.seq_len);

        assert!(!p.exercise.as_ref().unwrap().hint);
        p = reduce_page(&p, PageAction::ShowHint);
        assert!(p.exercise.as_ref().unwrap().hint);
        assert!(
            reduce_page(&p, PageAction::CloseExercise)
                .exercise
                .is_none()
        );
        assert_eq!(
            reduce_page(&p, PageAction::OpenExercise("no-such".into(), 1)),
            p
        );
    }

    #[test]
    fn worker_events_build_the_run() {
        // WebGPU picked, then a run: the backend stays chosen and the run learns how its
        // memory was read.
        let gpu = reduce_page(
            &Page::default(),
            PageAction::SelectBackend(TrainBackend::WebGpu),
        );
        assert_eq!(gpu.backend, TrainBackend::WebGpu);
        let mut p = reduce_page(&gpu, PageAction::TrainStarted(Job::Tiny));
        assert_eq!(p.backend, TrainBackend::WebGpu);
        assert_eq!(p.run.status, RunStatus::Running);
        p = reduce_page(
            &p,
            PageAction::Train(
                Job::Tiny,
                TrainEvent::Started {
                    backend: "burn wgpu on WebGPU".into(),
                    preset: "tiny-smol".into(),
                    trainable_parameters: 1,
                    memory_method: MeterMethod::DevicePool,
                },
            ),
        );
        assert_eq!(p.run.memory_method, Some(MeterMethod::DevicePool));
        for (i, loss) in [6.0, 5.0].into_iter().enumerate() {
            p = reduce_page(
                &p,
                PageAction::Train(
                    Job::Tiny,
                    TrainEvent::Step {
                        step: i + 1,
                        loss,
                        tokens_per_second: 100.0,
                        live_bytes: 1 << 20,
                    },
                ),
            );
        }
        p = reduce_page(
            &p,
            PageAction::Train(
                Job::Tiny,
                TrainEvent::Resident {
                    predicted_bytes: 10,
                    measured_bytes: 11,
                    host_side_bytes: 3,
                },
            ),
        );
        assert_eq!(
            p.run.resident,
            Some(Resident {
                predicted: 10,
                measured: 11,
                host_side: 3,
            })
        );
        p = reduce_page(
            &p,
            PageAction::Train(
                Job::Tiny,
                TrainEvent::Finished {
                    tokens_per_second: 90.0,
                },
            ),
        );
        assert_eq!(p.run.losses, vec![6.0, 5.0]);
        assert_eq!(p.run.status, RunStatus::Finished);
        assert_eq!(p.run.tokens_per_second, Some(90.0));
        let failed = reduce_page(&p, PageAction::WorkerError(Job::Tiny, "no worker".into()));
        assert_eq!(failed.run.status, RunStatus::Failed("no worker".into()));
        // A new run starts clean.
        let again = reduce_page(&p, PageAction::TrainStarted(Job::Tiny));
        assert!(again.run.losses.is_empty());
        assert_eq!(again.run.resident, None);
    }

    #[test]
    fn the_real_model_run_is_its_own_and_a_stop_ends_it() {
        let mut p = reduce_page(&Page::default(), PageAction::TrainStarted(Job::Real));
        assert_eq!(p.real.status, RunStatus::Running);
        assert_eq!(p.run.status, RunStatus::Idle);
        // A compressed module: its size is unknown until the last event says it.
        let downloading = |loaded, total| {
            PageAction::Train(
                Job::Real,
                TrainEvent::Downloading {
                    what: "the real-model module".into(),
                    loaded,
                    total,
                },
            )
        };
        p = reduce_page(&p, downloading(4 << 20, None));
        assert!(p.real.download.as_ref().unwrap().arriving());
        p = reduce_page(&p, downloading(9 << 20, Some(9 << 20)));
        assert!(!p.real.download.as_ref().unwrap().arriving());
        let step = |step| {
            PageAction::Train(
                Job::Real,
                TrainEvent::Step {
                    step,
                    loss: 3.0,
                    tokens_per_second: 10.0,
                    live_bytes: 1,
                },
            )
        };
        p = reduce_page(&p, step(1));
        p = reduce_page(
            &p,
            PageAction::Train(
                Job::Real,
                TrainEvent::Answer {
                    stage: AnswerStage::Before,
                    question: "q".into(),
                    answer: "a".into(),
                    taught_answer_loss: Some(2.0),
                    seconds: 1.0,
                },
            ),
        );
        assert_eq!((p.real.losses.len(), p.run.losses.len()), (1, 0));
        assert_eq!(p.real.answers[0].answer, "a");
        p = reduce_page(&p, PageAction::Stopped(Job::Real));
        assert_eq!(p.real.status, RunStatus::Stopped);
        // What the ended worker had already sent changes nothing.
        assert_eq!(reduce_page(&p, step(2)), p);
        // Stopping a finished run leaves it finished; a new run starts afresh.
        p = reduce_page(&p, PageAction::TrainStarted(Job::Real));
        assert!(p.real.losses.is_empty() && p.real.answers.is_empty());
        p = reduce_page(
            &p,
            PageAction::Train(
                Job::Real,
                TrainEvent::Finished {
                    tokens_per_second: 1.0,
                },
            ),
        );
        assert_eq!(
            reduce_page(&p, PageAction::Stopped(Job::Real)).real.status,
            RunStatus::Finished
        );
        p = reduce_page(&p, PageAction::EditLesson(LessonField::Steps, "ten".into()));
        assert!(p.lesson.request().unwrap_err().starts_with("steps:"));
    }

    #[test]
    fn a_refused_number_is_named_until_an_accepted_change() {
        let seq = Accepts::WholeFrom(2);
        assert_eq!(seq.read("T", " 128 "), Ok(128.0));
        for bad in ["", "1", "2.5", "-4", "NaN", "inf"] {
            let err = seq.read("sequence length T", bad).unwrap_err();
            assert!(
                err.starts_with(&format!(
                    "sequence length T: `{bad}` is not a whole number from 2"
                )),
                "{err}"
            );
        }
        assert_eq!(Accepts::From(0.0).read("α", "0.5"), Ok(0.5));
        let mut p = reduce_page(&Page::default(), PageAction::ControlRefused("T: ``".into()));
        assert_eq!(p.control_error.as_deref(), Some("T: ``"));
        assert_eq!(p.sandbox, SandboxState::default());
        p = reduce_page(&p, PageAction::Sandbox(Action::SetSeqLen(64)));
        assert_eq!(p.control_error, None);
    }
}
