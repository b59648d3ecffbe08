//! `napkin completions SHELL`: the shell's completion script on stdout, from the same clap
//! definitions as the parser (every flag, and the values of the flags that take a fixed set).

use std::io::Write;

use anyhow::{Context, Result};
use clap::CommandFactory;

use crate::cli::{Cli, CompletionsArgs};

pub fn run(args: &CompletionsArgs) -> Result<()> {
    // Written to a buffer first: clap_complete panics when its writer fails, and a closed pipe
    // (`| head`) is no reason to panic.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "napkin", &mut script);
    match std::io::stdout().write_all(&script) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing the completion script"),
    }
}
