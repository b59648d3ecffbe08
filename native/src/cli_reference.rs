//! The CLI reference (`docs/cli.md`), written from the `clap` definitions in `cli.rs`, so it
//! lists exactly the flags, values and defaults that run. Its test regenerates the page and
//! fails when the checked-in copy differs; `NAPKIN_BLESS=1` rewrites it.

use std::fmt::Write;

use clap::{Arg, ArgAction, Command};

/// The whole reference: one section per command, sub-commands after their parent.
pub fn markdown(mut root: Command) -> String {
    root.build();
    let mut out = String::new();
    out.push_str("# CLI reference\n\n");
    out.push_str(
        "Generated from the command line's own definitions (`native/src/cli.rs`) by the test \
         `cli_reference`; `napkin <command> --help` prints the same text. Every flag of \
         `napkin train` is also a key of its `--config` TOML file, with underscores for \
         dashes.\n\n",
    );
    out.push_str("| command | what it does |\n|---|---|\n");
    for sub in visible(&root) {
        let _ = writeln!(
            out,
            "| [`napkin {}`](#napkin-{}) | {} |",
            sub.get_name(),
            sub.get_name(),
            one_line(sub.get_about().map(|s| s.to_string()).unwrap_or_default())
        );
    }
    out.push('\n');
    for sub in visible(&root) {
        section(&mut out, "napkin", sub);
    }
    out
}

/// The sub-commands a user sees (not clap's own `help`).
fn visible(cmd: &Command) -> Vec<&Command> {
    cmd.get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .collect()
}

fn one_line(text: String) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn section(out: &mut String, parent: &str, cmd: &Command) {
    let path = format!("{parent} {}", cmd.get_name());
    let _ = writeln!(out, "## {path}\n");
    let about = cmd
        .get_long_about()
        .or(cmd.get_about())
        .map(|s| s.to_string())
        .unwrap_or_default();
    if !about.is_empty() {
        let _ = writeln!(out, "{}\n", about.trim());
    }
    let mut usage_cmd = cmd.clone().bin_name(&path);
    let usage = usage_cmd.render_usage().to_string();
    let usage = usage.trim().trim_start_matches("Usage:").trim();
    let _ = writeln!(out, "```text\n{usage}\n```\n");
    let args: Vec<&Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !matches!(a.get_id().as_str(), "help" | "version"))
        .collect();
    if !args.is_empty() {
        out.push_str("| argument | what it sets | values | default |\n|---|---|---|---|\n");
        for arg in args {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                spelling(arg),
                one_line(
                    arg.get_long_help()
                        .or(arg.get_help())
                        .map(|s| s.to_string())
                        .unwrap_or_default()
                ),
                values(arg),
                defaults(arg)
            );
        }
        out.push('\n');
    }
    if let Some(after) = cmd.get_after_long_help().or(cmd.get_after_help()) {
        let _ = writeln!(out, "```text\n{}\n```\n", after.to_string().trim());
    }
    for sub in visible(cmd) {
        section(out, &path, sub);
    }
}

/// `--flag <VALUE>` (with its other spellings), or `<NAME>` for a positional argument.
fn spelling(arg: &Arg) -> String {
    let value = arg
        .get_value_names()
        .map(|names| {
            names
                .iter()
                .map(|n| format!("<{n}>"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| format!("<{}>", arg.get_id().as_str().to_uppercase()));
    if arg.is_positional() {
        return format!("`{value}`");
    }
    let takes_value = !matches!(
        arg.get_action(),
        ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count
    );
    let mut names = Vec::new();
    if let Some(long) = arg.get_long() {
        names.push(format!("--{long}"));
    }
    if let Some(short) = arg.get_short() {
        names.push(format!("-{short}"));
    }
    let mut text = names.join(", ");
    if takes_value {
        text.push(' ');
        text.push_str(&value);
    }
    let mut out = format!("`{text}`");
    if let Some(aliases) = arg.get_visible_aliases() {
        for alias in aliases {
            let _ = write!(out, " (or `--{alias}`)");
        }
    }
    out.replace('|', "\\|")
}

/// The accepted values, each with its other spellings.
fn values(arg: &Arg) -> String {
    arg.get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| {
            let mut names = v.get_name_and_aliases();
            let name = names.next().unwrap_or_default();
            let aliases: Vec<&str> = names.collect();
            if aliases.is_empty() {
                format!("`{name}`")
            } else {
                format!("`{name}` (`{}`)", aliases.join("`, `"))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
        .replace('|', "\\|")
}

fn defaults(arg: &Arg) -> String {
    arg.get_default_values()
        .iter()
        .map(|v| format!("`{}`", v.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(", ")
        .replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::CommandFactory;

    use super::markdown;
    use crate::cli::Cli;

    /// docs/cli.md is what the definitions generate (`NAPKIN_BLESS=1` rewrites it).
    #[test]
    fn cli_reference_matches_the_definitions() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
        let generated = markdown(Cli::command());
        if std::env::var_os("NAPKIN_BLESS").is_some() {
            let temp = path.with_extension("md.tmp");
            std::fs::write(&temp, &generated).expect("writing docs/cli.md.tmp");
            std::fs::rename(&temp, &path).expect("renaming docs/cli.md.tmp");
            return;
        }
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        if checked_in != generated {
            let first = checked_in
                .lines()
                .zip(generated.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| checked_in.lines().count().min(generated.lines().count()));
            panic!(
                "docs/cli.md differs from the CLI's definitions from line {} on; run \
                 `NAPKIN_BLESS=1 cargo test -p napkin cli_reference` and commit the page",
                first + 1
            );
        }
    }

    /// Every flag with a fixed set of values lists them, so `--help` and the reference show them.
    #[test]
    fn every_flag_with_a_set_of_values_lists_them() {
        let reference = markdown(Cli::command());
        for flag in [
            "`--dtype",
            "`--device",
            "`--optimizer",
            "`--attention",
            "`--kernels",
        ] {
            let rows: Vec<&str> = reference
                .lines()
                .filter(|l| l.starts_with(&format!("| {flag}")))
                .collect();
            assert!(!rows.is_empty(), "no command has {flag}`");
            for row in rows {
                let cells: Vec<&str> = row.split(" | ").collect();
                assert!(
                    cells.len() >= 3 && !cells[2].trim().is_empty(),
                    "{flag}` lists no values: {row}"
                );
            }
        }
    }
}
