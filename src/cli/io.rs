//! The command line's input and output: files or standard input in, answers to standard out,
//! errors to standard error with exit code 2.

use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;

/// Reads `path`, and prints what `transform` makes of its name and text, or the error.
pub(super) fn rewrite<E: std::fmt::Display>(
    path: &Path,
    transform: impl FnOnce(&str, &str) -> Result<String, E>,
) -> ExitCode {
    let (name, text) = match read_input(path) {
        Ok(input) => input,
        Err(message) => return fail(&message),
    };
    match transform(&name, &text) {
        Ok(yaml) => out(&yaml),
        Err(e) => fail(&e.to_string()),
    }
}

/// A file's name and text; `-` is standard input.
pub(super) fn read_input(path: &Path) -> Result<(String, String), String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map_err(|e| format!("cannot read standard input: {e}"))?;
        return Ok(("<stdin>".to_string(), text));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok((path.display().to_string(), text))
}

/// Writes to stdout; a closed pipe (`balancer crd | head`) is not an error worth a panic.
pub(super) fn out(text: &str) -> ExitCode {
    match std::io::stdout().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => fail(&format!("cannot write to standard output: {e}")),
    }
}

pub(super) fn fail(message: &str) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "error: {message}");
    ExitCode::from(2)
}
