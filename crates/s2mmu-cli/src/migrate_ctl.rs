//! `s2mmu migrate-ctl`: the operator's side of post-copy recovery. It
//! sends one command to the control socket of a running
//! `s2mmu migrate --control PATH` and prints the answer
//! ([`s2mmu_migrate::session::postcopy::control`]).

use s2mmu_migrate::session::postcopy::control::{request, MAX_ADDR};
use std::path::{Path, PathBuf};

/// Options of `s2mmu migrate-ctl`.
#[derive(clap::Args)]
pub struct Params {
    /// The control socket of a running `s2mmu migrate --control PATH`.
    #[arg(long, value_name = "PATH")]
    control: PathBuf,
    /// Print the answer in the JSON envelope (its `results` hold it).
    #[arg(long, global = true)]
    json: bool,
    /// Print nothing: the exit status says whether the migration took the command.
    #[arg(short = 'q', long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// One JSON line: side, phase (migrating, postcopy, paused, recovering, done, failed), pages_missing, recoveries, last_error.
    Status,
    /// A paused post-copy resumes over new connections (the source connects to --to ADDR if given, else to its own --to; the destination listens on --listen ADDR if given, else on its own --listen socket). Tell the destination first.
    Recover {
        /// The source only: the destination's address for the new connections (host:port, at most 255 bytes).
        #[arg(long, value_name = "ADDR", conflicts_with = "listen")]
        to: Option<String>,
        /// The destination only: a new address to accept the source's new connections on (host:port, at most 255 bytes).
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
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
        Action::Recover { to, listen } => match (to, listen) {
            (None, None) => "recover".to_string(),
            (Some(a), _) => recover_at(&p.control, "--to", a, "source")?,
            (None, Some(a)) => recover_at(&p.control, "--listen", a, "destination")?,
        },
        Action::Cancel => "cancel".to_string(),
    };
    let answer = request(&p.control, &line)?;
    if answer.starts_with("error:") {
        return Err(format!("the migration refused {line:?}: {answer}"));
    }
    if p.json {
        let mut r = crate::report::Report::new("migrate-ctl", serde_json::json!({"request": line}));
        let v = serde_json::from_str(&answer).unwrap_or(serde_json::Value::String(answer));
        r.result(&line, "answer", serde_json::json!({"answer": v}));
        crate::report::emit(&r, true);
    } else if !p.quiet {
        println!("{answer}");
    }
    Ok(())
}

/// `recover ADDR`, once `addr` is checked and the socket's side is the
/// one `flag` applies to (`--to` the source's, `--listen` the
/// destination's).
fn recover_at(control: &Path, flag: &str, addr: &str, side: &str) -> Result<String, String> {
    if addr.is_empty() || addr.len() > MAX_ADDR || addr.chars().any(char::is_whitespace) {
        return Err(format!(
            "{flag} {addr:?}: give host:port, 1 to {MAX_ADDR} bytes, no spaces"
        ));
    }
    let status: serde_json::Value = serde_json::from_str(&request(control, "status")?)
        .map_err(|e| format!("the migration's status is not JSON: {e}"))?;
    if status["side"] != side {
        return Err(format!(
            "recover {flag} applies to a {side}; {} is a {}",
            control.display(),
            status["side"]
        ));
    }
    Ok(format!("recover {addr}"))
}
