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
    match data.strip_prefix('@') {
        None => Ok(Some(data.to_string())),
        Some(source) => read_source(&format!("--data {data}"), source).map(Some),
    }
}

/// Reads a file, or standard input for `-`, of at most [`DATA_BYTES_MAX`] bytes;
/// `flag` names what asked for it in errors.
pub fn read_source(flag: &str, source: &str) -> Result<String, CliError> {
    let mut text = String::new();
    let result = if source == "-" {
        std::io::stdin()
            .take(DATA_BYTES_MAX + 1)
            .read_to_string(&mut text)
    } else {
        std::fs::File::open(source)
            .and_then(|f| f.take(DATA_BYTES_MAX + 1).read_to_string(&mut text))
    };
    result.map_err(|e| CliError::Usage(format!("{flag}: {e}")))?;
    if text.len() as u64 > DATA_BYTES_MAX {
        return Err(CliError::Usage(format!(
            "{flag}: more than {DATA_BYTES_MAX} bytes"
        )));
    }
    Ok(text)
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

/// The request id of this invocation's write: the given one, or a fresh one, so that
/// when a node fails mid-call and the next one gets the same body, the write applies
/// once.
pub fn request_id(given: Option<&str>) -> String {
    given.map_or_else(
        || {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            format!("rota-cli-{}-{nanos}", std::process::id())
        },
        str::to_string,
    )
}

/// Tasks as a table for people; jobs' tasks (added with a key) add their key, priority
/// and attempt.
pub fn render_tasks(tasks: &[Option<TaskJson>]) -> String {
    let jobs = tasks.iter().flatten().any(|t| t.key.is_some());
    let job_columns = |key: &str, priority: &str, attempt: &str| {
        if jobs {
            format!("{key:<24} {priority:>4} {attempt:>7} ")
        } else {
            String::new()
        }
    };
    let mut out = format!(
        "{:<12} {:<16} {}{:<15} {:<13} {}\n",
        "ID",
        "GROUP",
        job_columns("KEY", "PRI", "ATTEMPT"),
        "AVAILABLE",
        "OWNER",
        "DATA"
    );
    for task in tasks {
        match task {
            None => out.push_str("(missing)\n"),
            Some(t) => out.push_str(&format!(
                "{:<12} {:<16} {}{:<15} {:<13} {}\n",
                t.id,
                t.group,
                job_columns(
                    t.key.as_deref().unwrap_or("-"),
                    &t.priority.to_string(),
                    &t.attempt.to_string()
                ),
                t.timespec,
                t.ownerid,
                t.data.escape_debug()
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: u64, key: Option<&str>) -> TaskJson {
        TaskJson {
            id,
            group: "g".into(),
            data: "d".into(),
            timespec: 5,
            ownerid: 7,
            key: key.map(str::to_string),
            priority: 0,
            attempt: 0,
        }
    }

    #[test]
    fn job_columns_appear_only_for_jobs() {
        let seed = render_tasks(&[Some(task(1, None))]);
        assert!(!seed.contains("KEY"), "{seed}");
        let jobs = render_tasks(&[Some(task(1, None)), Some(task(2, Some("k")))]);
        let rows: Vec<&str> = jobs.lines().collect();
        assert!(
            rows[0].contains("KEY") && rows[0].contains("ATTEMPT"),
            "{jobs}"
        );
        assert!(
            rows[1].contains(" - "),
            "a seed task's key is a dash: {jobs}"
        );
        assert!(rows[2].contains(" k "), "{jobs}");
    }

    #[test]
    fn request_ids_are_given_or_fresh() {
        assert_eq!(request_id(Some("r1")), "r1");
        let fresh = request_id(None);
        assert!(fresh.starts_with("rota-cli-"), "{fresh}");
        assert_eq!(rpc::worker::check_request_id(&fresh), Ok(()), "{fresh}");
    }
}
