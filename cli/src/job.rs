//! `rota job ...` and `rota group ...`: the job API (finish, fail, cancel, retry, job
//! records, dead letters, group settings) from the command line, with tables for people
//! and the node's JSON for scripts. Also the duration and time forms the commands accept
//! (`90s`, `5m`, `1h30m`; `+10m`, `2030-01-02T03:04:05Z`) and show.

use rpc::job::JOBS_PAGE_MAX;
use rpc::job::JobJson;
use rpc::job::JobPageJson;
use rpc::job::SettingsJson;

use crate::CliError;
use crate::nodes::Nodes;
use crate::nodes::encode;

/// Milliseconds per unit of a duration, largest first (the order `format_duration`
/// tries them in).
const UNITS: [(&str, i64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// Parses a duration into milliseconds: one or more `NUMBER UNIT` parts with units
/// `ms`, `s`, `m`, `h`, `d` (`500ms`, `90s`, `5m`, `1h30m`, `7d`). A bare number is
/// refused, since it is unclear whether it means seconds or milliseconds.
pub fn parse_duration(text: &str) -> Result<i64, String> {
    let explain = |why: &str| {
        format!("{text:?} is not a duration: {why}; write e.g. 500ms, 90s, 5m, 1h30m or 7d")
    };
    if text.is_empty() {
        return Err(explain("it is empty"));
    }
    let mut rest = text;
    let mut total: i64 = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(explain("expected a number"));
        }
        let (number, after) = rest.split_at(digits);
        let letters = after.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, after) = after.split_at(letters);
        let Some(&(_, scale)) = UNITS.iter().find(|(name, _)| *name == unit) else {
            return Err(explain(if unit.is_empty() {
                "a number needs a unit"
            } else {
                "the units are ms, s, m, h and d"
            }));
        };
        let part = number
            .parse::<i64>()
            .ok()
            .and_then(|n| n.checked_mul(scale))
            .and_then(|ms| total.checked_add(ms));
        total = part.ok_or_else(|| explain("it is too long"))?;
        rest = after;
    }
    Ok(total)
}

/// `ms` in the largest units that show it exactly (`1h30m`, `90s`, `1500ms`, `0s`).
pub fn format_duration(ms: i64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    if ms < 0 {
        return format!("-{}", format_duration(ms.saturating_neg()));
    }
    // Below a second, or not a whole number of seconds: milliseconds alone read best.
    if ms % 1_000 != 0 {
        return format!("{ms}ms");
    }
    let mut rest = ms;
    let mut out = String::new();
    for (name, scale) in &UNITS[..4] {
        if rest >= *scale {
            out.push_str(&format!("{}{name}", rest / scale));
            rest %= scale;
        }
    }
    out
}

/// Days since 1970-01-01 of a civil date (proleptic Gregorian; H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The civil date `(year, month, day)` of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A time in milliseconds since the epoch as RFC 3339 in UTC, to the millisecond.
pub fn format_time(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1_000 % 60,
        in_day % 1_000
    )
}

/// Parses RFC 3339 (`2030-01-02T03:04:05Z`, `2030-01-02 03:04:05.250+02:00`) into
/// milliseconds since the epoch.
fn parse_rfc3339(text: &str) -> Option<i64> {
    let number = |s: &str| -> Option<i64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let (date, time) = text.split_once(['T', 't', ' '])?;
    let mut date_parts = date.split('-');
    let (year, month, day) = (
        number(date_parts.next()?)?,
        number(date_parts.next()?)?,
        number(date_parts.next()?)?,
    );
    if date_parts.next().is_some() || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let (clock, offset_ms) = if let Some(clock) = time.strip_suffix(['Z', 'z']) {
        (clock, 0)
    } else {
        let at = time.rfind(['+', '-'])?;
        let (clock, offset) = time.split_at(at);
        let sign = if offset.starts_with('-') { -1 } else { 1 };
        let (hours, minutes) = offset[1..].split_once(':')?;
        let (hours, minutes) = (number(hours)?, number(minutes)?);
        if hours > 23 || minutes > 59 {
            return None;
        }
        (clock, sign * (hours * 3_600_000 + minutes * 60_000))
    };
    let (whole, fraction) = clock.split_once('.').unwrap_or((clock, ""));
    let mut clock_parts = whole.split(':');
    let (hour, minute, second) = (
        number(clock_parts.next()?)?,
        number(clock_parts.next()?)?,
        number(clock_parts.next()?)?,
    );
    if clock_parts.next().is_some() || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let millis = if fraction.is_empty() {
        0
    } else {
        number(fraction)?;
        let digits: String = fraction.chars().chain("00".chars()).take(3).collect();
        number(&digits)?
    };
    let days = days_from_civil(year, month, day);
    Some(
        days * 86_400_000 + hour * 3_600_000 + minute * 60_000 + second * 1_000 + millis
            - offset_ms,
    )
}

/// Parses `--at` into the seed's `timespec`: `now` (none), `+DURATION` from now (the
/// seed's negative timespec), RFC 3339, or milliseconds since the epoch as
/// `rota task --timespec` takes them (negative: from now).
pub fn parse_at(text: &str) -> Result<Option<i64>, String> {
    if text == "now" {
        return Ok(None);
    }
    if let Some(delay) = text.strip_prefix('+') {
        let ms = parse_duration(delay).map_err(|e| format!("--at {text}: {e}"))?;
        return Ok((ms > 0).then(|| ms.saturating_neg()));
    }
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(Some(ms));
    }
    parse_rfc3339(text).map(Some).ok_or_else(|| {
        format!(
            "--at {text:?}: give now, +DURATION (+90s, +1h), a time such as 2030-01-02T03:04:05Z, or milliseconds since the epoch"
        )
    })
}

/// `value` or `-` for a missing one.
fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// The time a job's table row shows: when its task is available while it is live, when
/// it finished otherwise.
fn job_when(job: &JobJson) -> String {
    or_dash(job.available_at.or(job.finished_at).map(format_time))
}

/// Job records as a table for people.
pub fn render_jobs(jobs: &[JobJson]) -> String {
    let mut out = format!(
        "{:<24} {:<10} {:>4} {:>8} {:<12} {:<24} {}\n",
        "KEY", "STATE", "RUN", "ATTEMPTS", "TASK", "AVAILABLE/FINISHED", "REASON"
    );
    for job in jobs {
        out.push_str(&format!(
            "{:<24} {:<10} {:>4} {:>8} {:<12} {:<24} {}\n",
            job.key,
            job.state,
            job.run,
            job.attempts,
            or_dash(job.task),
            job_when(job),
            job.reason.as_deref().unwrap_or("").escape_debug()
        ));
    }
    out
}

/// One job's record for people: its fields, then its attempts as a table.
pub fn render_job(job: &JobJson) -> String {
    let list = |keys: &[String]| {
        if keys.is_empty() {
            "-".to_string()
        } else {
            keys.join(", ")
        }
    };
    let rows = [
        ("group", job.group.clone()),
        ("key", job.key.clone()),
        ("id", or_dash(job.id)),
        ("state", job.state.clone()),
        ("task", or_dash(job.task)),
        ("available at", or_dash(job.available_at.map(format_time))),
        ("priority", job.priority.to_string()),
        (
            "max attempts",
            job.max_attempts
                .map_or_else(|| "the group's".to_string(), |n| n.to_string()),
        ),
        ("every", or_dash(job.every_ms.map(format_duration))),
        ("run", job.run.to_string()),
        ("attempts", job.attempts.to_string()),
        ("created at", format_time(job.created_at)),
        ("finished at", or_dash(job.finished_at.map(format_time))),
        ("expires at", or_dash(job.expires_at.map(format_time))),
        ("waits for", list(&job.after)),
        ("dependants", list(&job.dependants)),
        (
            "resubmitted",
            if job.resubmitted { "yes" } else { "no" }.into(),
        ),
        ("reason", or_dash(job.reason.clone())),
        ("result", or_dash(job.result.as_ref())),
        (
            "data",
            or_dash(job.data.as_deref().map(|d| d.escape_debug().to_string())),
        ),
    ];
    let mut out = String::new();
    for (name, value) in rows {
        out.push_str(&format!("{:<13} {value}\n", format!("{name}:")));
    }
    if !job.history.is_empty() {
        out.push_str(&format!(
            "\n{:>4} {:>7} {:<13} {:<24} {:<24} {:<9} {}\n",
            "RUN", "ATTEMPT", "OWNER", "STARTED", "ENDED", "OUTCOME", "ERROR"
        ));
        for attempt in &job.history {
            out.push_str(&format!(
                "{:>4} {:>7} {:<13} {:<24} {:<24} {:<9} {}\n",
                attempt.run,
                attempt.attempt,
                attempt.owner,
                format_time(attempt.started_at),
                or_dash(attempt.ended_at.map(format_time)),
                attempt.outcome,
                attempt.error.as_deref().unwrap_or("").escape_debug()
            ));
        }
    }
    out
}

/// A group's settings for people; `running` only where it was read (a change answers
/// 0 for it).
pub fn render_settings(settings: &SettingsJson, running: bool) -> String {
    let limit = |n: u32, none: &str| {
        if n == 0 {
            none.to_string()
        } else {
            n.to_string()
        }
    };
    let backoff = &settings.backoff;
    let mut rows = vec![
        ("group", settings.group.clone()),
        (
            "state",
            if settings.paused { "paused" } else { "active" }.into(),
        ),
        ("max running", limit(settings.max_running, "no limit")),
        ("max attempts", limit(settings.max_attempts, "unlimited")),
        (
            "backoff",
            format!(
                "base {}, factor {}, max {}",
                format_duration(backoff.base_ms),
                backoff.factor,
                format_duration(backoff.max_ms)
            ),
        ),
        ("retention", format_duration(settings.retention_ms)),
    ];
    if running {
        rows.push(("running", settings.running.to_string()));
    }
    rows.iter()
        .map(|(name, value)| format!("{:<13} {value}\n", format!("{name}:")))
        .collect()
}

/// Which records `/jobs` or `/dead` lists.
pub struct JobQuery<'a> {
    /// `/jobs` or `/dead`.
    pub path: &'a str,
    /// The group.
    pub group: &'a str,
    /// `/jobs` only: one state.
    pub state: Option<&'a str>,
    /// Start after this key.
    pub after: Option<&'a str>,
    /// Page size (the node's default when none).
    pub limit: Option<usize>,
    /// Follow `next` until the last page.
    pub all: bool,
}

impl JobQuery<'_> {
    /// The path of the page after `after`.
    fn page_path(&self, after: Option<&str>) -> String {
        let mut path = format!("{}?group={}", self.path, encode(self.group));
        if let Some(state) = self.state {
            path.push_str(&format!("&state={}", encode(state)));
        }
        if let Some(after) = after {
            path.push_str(&format!("&after={}", encode(after)));
        }
        if let Some(limit) = self.limit {
            path.push_str(&format!("&limit={limit}"));
        }
        path
    }

    /// Reads one page, or with `all` every page from `after` on, joined into one whose
    /// `next` is null.
    pub async fn read(&self, nodes: &Nodes) -> Result<JobPageJson, CliError> {
        if let Some(limit) = self.limit
            && !(1..=JOBS_PAGE_MAX).contains(&limit)
        {
            return Err(CliError::Usage(format!(
                "--limit {limit}: a page holds 1 to {JOBS_PAGE_MAX} jobs; use --all for more"
            )));
        }
        let mut page: JobPageJson = nodes.get_json(&self.page_path(self.after)).await?;
        if !self.all {
            return Ok(page);
        }
        while let Some(after) = page.next.take() {
            let more: JobPageJson = nodes.get_json(&self.page_path(Some(&after))).await?;
            if more.next.as_deref() == Some(after.as_str()) {
                return Err(CliError::Failed(format!(
                    "the node answered the page after {after:?} with the same cursor; report this"
                )));
            }
            page.jobs.extend(more.jobs);
            page.next = more.next;
        }
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpc::job::AttemptJson;
    use rpc::job::BackoffJson;

    #[test]
    fn durations_parse_in_every_unit() {
        for (text, ms) in [
            ("0s", 0),
            ("250ms", 250),
            ("5s", 5_000),
            ("90s", 90_000),
            ("5m", 300_000),
            ("2h", 7_200_000),
            ("7d", 604_800_000),
            ("1h30m", 5_400_000),
            ("1m500ms", 60_500),
        ] {
            assert_eq!(parse_duration(text), Ok(ms), "{text}");
        }
        for text in [
            "",
            "5",
            "s",
            "5x",
            "-5s",
            "1.5s",
            "5 s",
            "99999999999999999999d",
        ] {
            let error = parse_duration(text).expect_err(text);
            assert!(error.contains("not a duration"), "{text}: {error}");
        }
        assert!(
            parse_duration("60")
                .expect_err("bare")
                .contains("needs a unit")
        );
    }

    #[test]
    fn durations_show_in_the_largest_exact_units() {
        for (ms, text) in [
            (0, "0s"),
            (250, "250ms"),
            (1_500, "1500ms"),
            (90_000, "1m30s"),
            (300_000, "5m"),
            (604_800_000, "7d"),
            (-5_000, "-5s"),
        ] {
            assert_eq!(format_duration(ms), text, "{ms}");
            if ms >= 0 {
                assert_eq!(parse_duration(text), Ok(ms), "round trip of {text}");
            }
        }
    }

    #[test]
    fn times_parse_and_show_in_utc() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_time(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(format_time(-1), "1969-12-31T23:59:59.999Z");
        let ms = 1_893_553_445_250; // 2030-01-02T03:04:05.250Z
        assert_eq!(format_time(ms), "2030-01-02T03:04:05.250Z");
        assert_eq!(parse_at("2030-01-02T03:04:05.250Z"), Ok(Some(ms)));
        assert_eq!(parse_at("2030-01-02T03:04:05.25Z"), Ok(Some(ms)));
        assert_eq!(parse_at("2030-01-02 05:04:05.250+02:00"), Ok(Some(ms)));
        assert_eq!(parse_at("2030-01-01T22:04:05.250-05:00"), Ok(Some(ms)));
        for day in [0, 1, 59, 365, 10_957, 20_000, 2_932_896] {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y, m, d), day);
        }
    }

    #[test]
    fn at_takes_now_a_delay_a_time_or_a_timespec() {
        assert_eq!(parse_at("now"), Ok(None));
        assert_eq!(parse_at("+90s"), Ok(Some(-90_000)));
        assert_eq!(parse_at("+0s"), Ok(None));
        assert_eq!(parse_at("1700000000000"), Ok(Some(1_700_000_000_000)));
        assert_eq!(parse_at("-60000"), Ok(Some(-60_000)));
        for bad in [
            "tomorrow",
            "+5",
            "2030-13-01T00:00:00Z",
            "2030-01-01T25:00:00Z",
        ] {
            assert!(parse_at(bad).is_err(), "{bad}");
        }
    }

    fn job() -> JobJson {
        JobJson {
            group: "mail".into(),
            key: "welcome-42".into(),
            id: Some(7),
            state: "dead".into(),
            task: None,
            available_at: None,
            data: Some("to=42".into()),
            priority: 0,
            max_attempts: Some(1),
            every_ms: None,
            run: 1,
            attempts: 1,
            history: vec![AttemptJson {
                run: 1,
                attempt: 1,
                owner: 7,
                started_at: 1_893_553_445_000,
                ended_at: Some(1_893_553_446_000),
                outcome: "failed".into(),
                error: Some("smtp down".into()),
            }],
            result: None,
            reason: Some("attempt 1 failed: smtp down".into()),
            created_at: 1_893_553_440_000,
            finished_at: Some(1_893_553_446_000),
            expires_at: None,
            after: vec![],
            dependants: vec!["report".into()],
            resubmitted: false,
        }
    }

    #[test]
    fn a_job_shows_its_fields_and_history() {
        let text = render_job(&job());
        assert!(text.contains("state:        dead\n"), "{text}");
        assert!(text.contains("id:           7\n"), "{text}");
        assert!(text.contains("max attempts: 1\n"), "{text}");
        assert!(text.contains("dependants:   report\n"), "{text}");
        assert!(
            text.contains("2030-01-02T03:04:06.000Z failed    smtp down"),
            "{text}"
        );
        let table = render_jobs(&[job()]);
        assert_eq!(table.lines().count(), 2, "{table}");
        assert!(
            table
                .lines()
                .nth(1)
                .is_some_and(|row| row.starts_with("welcome-42")
                    && row.ends_with("attempt 1 failed: smtp down")),
            "{table}"
        );
    }

    #[test]
    fn json_output_is_the_nodes_json() {
        // A record and a page as a node writes them: --json prints them unchanged, every
        // field kept (nulls included) and the result's JSON as it was recorded.
        let node = serde_json::json!({"jobs": [{
            "group": "etl", "key": "extract", "id": 2, "state": "succeeded", "task": null,
            "available_at": null, "data": null, "priority": 5, "max_attempts": 1,
            "every_ms": null, "run": 1, "attempts": 1,
            "history": [{"run": 1, "attempt": 1, "owner": 7, "started_at": 10,
                         "ended_at": 20, "outcome": "succeeded"}],
            "result": {"rows": 3, "files": ["a", "b"]}, "reason": null, "created_at": 5,
            "finished_at": 20, "expires_at": 604_800_020_i64, "after": [],
            "dependants": ["load"], "resubmitted": false}],
            "next": "extract"});
        let page: JobPageJson = serde_json::from_value(node.clone()).expect("a page");
        let printed = crate::json_text(&page).expect("json");
        let back: serde_json::Value = serde_json::from_str(&printed).expect("parses");
        assert_eq!(back, node);
        let settings = serde_json::json!({"group": "etl", "max_running": 2, "paused": true,
            "max_attempts": 0, "backoff": {"base_ms": 1000, "factor": 2.5, "max_ms": 60000},
            "retention_ms": 86_400_000, "running": 1});
        let parsed: SettingsJson = serde_json::from_value(settings.clone()).expect("settings");
        let printed = crate::json_text(&parsed).expect("json");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&printed).expect("parses"),
            settings
        );
    }

    #[test]
    fn settings_show_limits_and_backoff_in_words() {
        let settings = SettingsJson {
            group: "mail".into(),
            max_running: 0,
            paused: true,
            max_attempts: 5,
            backoff: BackoffJson {
                base_ms: 1_000,
                factor: 2.0,
                max_ms: 300_000,
            },
            retention_ms: 604_800_000,
            running: 3,
        };
        let text = render_settings(&settings, true);
        assert_eq!(
            text,
            "group:        mail\nstate:        paused\nmax running:  no limit\nmax attempts: 5\nbackoff:      base 1s, factor 2, max 5m\nretention:    7d\nrunning:      3\n"
        );
        assert!(!render_settings(&settings, false).contains("running:      3"));
    }
}
