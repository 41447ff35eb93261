//! `s2mmu migrate-ctl`: the operator's side of post-copy recovery. It
//! sends one command to the control socket of a running
//! `s2mmu migrate --control PATH` and prints the answer
//! ([`s2mmu_cli::migrate::postcopy::control`]).

use s2mmu_cli::migrate::postcopy::control::{request, MAX_ADDR};
use std::path::PathBuf;

/// Options of `s2mmu migrate-ctl`.
#[derive(clap::Args)]
pub struct Params {
    /// The control socket of a running `s2mmu migrate --control PATH`.
    #[arg(long, value_name = "PATH")]
    control: PathBuf,
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// One JSON line: side, phase (migrating, postcopy, paused, recovering, done, failed), pages_missing, recoveries, last_error.
    Status,
    /// A paused post-copy resumes over new connections (the source: to --to ADDR if given, else its own --to; the destination: on its --listen socket).
    Recover {
        /// The source: the destination's address for the new connections (at most 255 bytes).
        #[arg(long, value_name = "ADDR")]
        to: Option<String>,
    },
    /// A paused post-copy is given up: the process exits with an error that says the memory is split.
    Cancel,
}

/// `s2mmu migrate-ctl`.
///
/// # Errors
/// The socket is absent or silent, or the migration answered an error.
pub fn main(p: Params) -> Result<(), String> {
    let line = match &p.action {
        Action::Status => "status".to_string(),
        Action::Recover { to: None } => "recover".to_string(),
        Action::Recover { to: Some(a) } => {
            if a.is_empty() || a.len() > MAX_ADDR || a.chars().any(char::is_whitespace) {
                return Err(format!(
                    "--to {a:?}: give host:port, 1 to {MAX_ADDR} bytes, no spaces"
                ));
            }
            format!("recover {a}")
        }
        Action::Cancel => "cancel".to_string(),
    };
    let answer = request(&p.control, &line)?;
    if answer.starts_with("error:") {
        return Err(format!("the migration refused {line:?}: {answer}"));
    }
    println!("{answer}");
    Ok(())
}
