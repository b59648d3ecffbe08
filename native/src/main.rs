//! `napkin`: the command-line entry point. Parsing lives in `cli.rs`, each command in
//! `commands/`; this file only dispatches and reports errors.

mod cli;
#[cfg(test)]
mod cli_reference;
mod commands;
mod heap;

use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};

/// Counts heap bytes so `napkin train` can report measured memory (CPU backends keep none).
#[global_allocator]
static ALLOC: napkin_core::memory::CountingAllocator = napkin_core::memory::CountingAllocator;

fn main() -> ExitCode {
    heap::keep_large_buffers();
    let matches = cli::Cli::command().get_matches();
    let cli = cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let result = napkin_core::device::on_compute_threads(move || match cli.command {
        cli::Command::Inspect(args) => commands::inspect::run(&args),
        cli::Command::Eval(args) => commands::eval::run(&args),
        cli::Command::Generate(args) => commands::generate::run(&args),
        cli::Command::Quantize(args) => commands::quantize::run(&args),
        cli::Command::Export(args) => commands::export::run(&args),
        cli::Command::Estimate(args) => commands::estimate::run(&args),
        cli::Command::Exercise(args) => commands::exercise::run(&args),
        cli::Command::Measure(args) => commands::measure::run(&args),
        cli::Command::Train(args) => {
            // A flag at its default does not override `--config`'s value.
            let train = matches.subcommand_matches("train");
            let given = |id: &str| {
                train.is_some_and(|m| {
                    matches!(
                        m.value_source(id),
                        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
                    )
                })
            };
            commands::train::run(&args, &given)
        }
        cli::Command::Bench(args) => commands::bench::run(&args),
        cli::Command::Report(args) => commands::report::run(&args),
        cli::Command::Completions(args) => commands::completions::run(&args),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // `{:#}` prints the context chain on one line: "reading X: file not found".
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
