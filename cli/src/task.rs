//! `rota task add | claim | get | list | update | delete` and `rota groups`: the worker
//! API from the command line, with tables for people and `--json` for scripts. The
//! request bodies are rpc's types, built where each command is parsed.

use std::io::Read;

use rpc::worker::TaskJson;

use crate::CliError;

/// Largest `--data` read from a file or standard input.
pub const DATA_BYTES_MAX: u64 = 1024 * 1024;

/// Reads `--data`: literal text, `@path` for a file, or `@-` for standard input.
pub fn read_data(data: Option<&str>) -> Result<Option<String>, CliError> {
    let Some(data) = data else { return Ok(None) };
    let Some(source) = data.strip_prefix('@') else {
        return Ok(Some(data.to_string()));
    };
    let mut text = String::new();
    let result = if source == "-" {
        std::io::stdin()
            .take(DATA_BYTES_MAX + 1)
            .read_to_string(&mut text)
    } else {
        std::fs::File::open(source)
            .and_then(|f| f.take(DATA_BYTES_MAX + 1).read_to_string(&mut text))
    };
    result.map_err(|e| CliError::Usage(format!("--data {data}: {e}")))?;
    if text.len() as u64 > DATA_BYTES_MAX {
        return Err(CliError::Usage(format!(
            "--data {data}: more than {DATA_BYTES_MAX} bytes"
        )));
    }
    Ok(Some(text))
}

/// A client id for this invocation: the given one, or a random one.
pub fn client_id(given: Option<i64>) -> i64 {
    given.unwrap_or_else(|| {
        // Random enough to keep invocations apart; clients choose their ids (seed).
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as i64);
        (i64::from(std::process::id()) << 32 | nanos) & 0x7fff_ffff_ffff
    })
}

/// Tasks as a table for people.
pub fn render_tasks(tasks: &[Option<TaskJson>]) -> String {
    let mut out = format!(
        "{:<12} {:<16} {:<15} {:<13} {}\n",
        "ID", "GROUP", "AVAILABLE", "OWNER", "DATA"
    );
    for task in tasks {
        match task {
            None => out.push_str("(missing)\n"),
            Some(t) => out.push_str(&format!(
                "{:<12} {:<16} {:<15} {:<13} {}\n",
                t.id,
                t.group,
                t.timespec,
                t.ownerid,
                t.data.escape_debug()
            )),
        }
    }
    out
}
