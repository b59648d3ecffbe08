//! `napkin exercise list | show ID | check ID --answer "..."`: the course exercises on the
//! command line, checked by the same code as the notebooks and the browser app.

use anyhow::{Result, anyhow, bail};
use napkin_core::exercises::{Instance, catalog, check, instance};
use serde_json::json;

use crate::cli::{ExerciseAction, ExerciseArgs};

pub fn run(args: &ExerciseArgs) -> Result<()> {
    match &args.action {
        ExerciseAction::List { json } => {
            let all = catalog();
            if *json {
                let rows: Vec<_> = all
                    .iter()
                    .map(|e| json!({"id": e.id, "title": e.title}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                for (i, e) in all.iter().enumerate() {
                    println!("{:>2}. {:<24} {}", i + 1, e.id, e.title);
                }
            }
        }
        ExerciseAction::Show {
            id,
            seed,
            hint,
            json,
        } => {
            let inst = find(id, *seed)?;
            if *json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({
                        "id": inst.id, "title": inst.title, "seed": inst.seed,
                        "question": inst.question, "hint": inst.hint,
                        "dimension": inst.expected.dimension, "choices": inst.expected.choices,
                        "sandbox": inst.sandbox,
                    }))?
                );
            } else {
                println!("{} (seed {})\n\n{}", inst.title, inst.seed, inst.question);
                if *hint {
                    println!("\nHint: {}", inst.hint);
                }
                println!(
                    "\nAnswer with: napkin exercise check {} --seed {} --answer \"...\"",
                    inst.id, inst.seed
                );
            }
        }
        ExerciseAction::Check {
            id,
            answer,
            seed,
            json,
        } => {
            let inst = find(id, *seed)?;
            let verdict = check(answer, &inst.expected).map_err(|e| anyhow!("{e}"))?;
            if *json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({
                        "id": inst.id, "seed": inst.seed, "answer": answer,
                        "correct": verdict.correct, "message": verdict.message,
                        "explanation": verdict.correct.then_some(&inst.explanation),
                        "hint": (!verdict.correct).then_some(&inst.hint),
                        "sandbox": verdict.correct.then_some(&inst.sandbox),
                    }))?
                );
            } else if verdict.correct {
                println!("{}\n\n{}", verdict.message, inst.explanation);
            } else {
                println!("{}\nHint: {}", verdict.message, inst.hint);
            }
            if !verdict.correct && !json {
                std::process::exit(1);
            }
        }
    }
    Ok(())
}

fn find(id: &str, seed: u64) -> Result<Instance> {
    match instance(id, seed) {
        Some(inst) => Ok(inst),
        None => {
            let ids: Vec<_> = catalog().iter().map(|e| e.id).collect();
            bail!("no exercise `{id}`; the ids are: {}", ids.join(", "))
        }
    }
}
