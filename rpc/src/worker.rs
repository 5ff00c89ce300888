//! The worker API's JSON shapes, exactly as the seed (entrogo TaskStore) and SPEC
//! section 2 fix them.
//!
//! Requests reject unknown fields (an `id` inside an add is the seed's one exception:
//! accepted and ignored). `null` stands for a missing value, as in the seed's Go
//! service: a `null` list is empty, a `null` `data` is empty, a `null` `timespec` is now.

use serde::Deserialize;
use serde::Deserializer;
use serde::Serialize;
use serde::de::IgnoredAny;
use task_machine::constants::REQUEST_ID_BYTES_MAX;

/// A task as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskJson {
    /// Identity and fencing token of this version.
    pub id: u64,
    /// The task's group.
    pub group: String,
    /// Opaque payload.
    pub data: String,
    /// Available time, milliseconds since the Unix epoch.
    pub timespec: i64,
    /// The client that wrote this version.
    pub ownerid: i64,
}

fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// One entry of an update's `adds`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AddJson {
    /// Group of the new task; required (an add without one is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Payload; empty by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Missing: now; negative: now + |t|; otherwise absolute milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timespec: Option<i64>,
    /// The seed lets clients send an id here and ignores it.
    #[serde(default, rename = "id", skip_serializing)]
    pub ignored_id: Option<IgnoredAny>,
}

/// One entry of an update's `updates`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeJson {
    /// The task version being replaced.
    pub id: u64,
    /// New payload; a missing `data` sets it empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Missing: now; negative: now + |t|; otherwise absolute milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timespec: Option<i64>,
}

/// The body of `POST /update`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateRequestJson {
    /// The writing client; owner of every task written.
    pub clientid: i64,
    /// Tasks to create.
    #[serde(default, deserialize_with = "null_as_default")]
    pub adds: Vec<AddJson>,
    /// Tasks to replace.
    #[serde(default, deserialize_with = "null_as_default")]
    pub updates: Vec<ChangeJson>,
    /// Tasks to remove.
    #[serde(default, deserialize_with = "null_as_default")]
    pub deletes: Vec<u64>,
    /// Tasks that must exist, left untouched.
    #[serde(default, deserialize_with = "null_as_default")]
    pub depends: Vec<u64>,
    /// Makes a retry apply once (also accepted as the `Idempotency-Key` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requestid: Option<String>,
}

/// The body of `POST /claim`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequestJson {
    /// The claiming client.
    pub clientid: i64,
    /// Group to claim from.
    #[serde(default, deserialize_with = "null_as_default")]
    pub group: String,
    /// Milliseconds of ownership; positive and at most the node's configured maximum.
    pub duration: i64,
    /// Tasks that must exist, left untouched.
    #[serde(default, deserialize_with = "null_as_default")]
    pub depends: Vec<u64>,
    /// Makes a retry apply once (also accepted as the `Idempotency-Key` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requestid: Option<String>,
}

/// The answer to a processed `/update` or `/claim`: exactly one of the two keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum WriteResultJson {
    /// Success: adds first, then updates, in request order; a claim's task or none.
    Tasks {
        /// The written tasks.
        tasks: Vec<TaskJson>,
    },
    /// Refusal: every reason, nothing changed.
    Errors {
        /// Human-readable reasons naming the list and the id.
        errors: Vec<String>,
    },
}

/// The body of every non-200 answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorJson {
    /// What happened and what to do.
    pub error: String,
}

/// Checks a request id: at most [`REQUEST_ID_BYTES_MAX`] bytes.
pub fn check_request_id(request_id: &str) -> Result<(), String> {
    if request_id.len() > REQUEST_ID_BYTES_MAX {
        return Err(format!(
            "requestid is {} bytes long; use at most {REQUEST_ID_BYTES_MAX}",
            request_id.len()
        ));
    }
    Ok(())
}

/// Parses the seed's boolean spellings for `owned`: 0, 1, yes, no, true, false.
pub fn parse_owned(value: &str) -> Result<bool, String> {
    match value {
        "1" | "yes" | "true" => Ok(true),
        "0" | "no" | "false" => Ok(false),
        _ => Err(format!(
            "owned={value:?} is not one of 0, 1, yes, no, true, false"
        )),
    }
}

/// Whether `text` is a plain decimal number: digits only, no sign.
fn all_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Parses `limit`: a non-negative integer.
pub fn parse_limit(value: &str) -> Result<usize, String> {
    all_digits(value)
        .then(|| value.parse::<usize>().ok())
        .flatten()
        .ok_or_else(|| format!("limit={value:?} is not a non-negative integer"))
}

/// Parses a task id from a path: digits only.
pub fn parse_id(text: &str) -> Result<u64, String> {
    all_digits(text)
        .then(|| text.parse::<u64>().ok())
        .flatten()
        .ok_or_else(|| format!("{text:?} is not a numeric task id"))
}

/// Parses a comma-separated id list from a `/tasks/<id>,<id>` path.
pub fn parse_id_list(list: &str) -> Result<Vec<u64>, String> {
    list.split(',')
        .map(|part| parse_id(part).map_err(|e| format!("{e} (in /tasks/{list})")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_update_example_parses() {
        let body = r#"{"clientid": 1643,
           "adds": [{"group": "map", "data": "/path/to/file:1024:2048"},
                    {"group": "map", "data": "/path/to/file:2048:3096", "id": 77}],
           "updates": [{"id": 14, "data": "some data for this task", "timespec": -60000}],
           "deletes": [16, 18, 20],
           "depends": [12, 13]}"#;
        let update: UpdateRequestJson = serde_json::from_str(body).expect("parses");
        assert_eq!(update.clientid, 1643);
        assert_eq!(update.adds.len(), 2);
        assert_eq!(update.adds[1].group.as_deref(), Some("map"));
        assert_eq!(update.updates[0].timespec, Some(-60000));
        assert_eq!(update.deletes, [16, 18, 20]);
        assert_eq!(update.depends, [12, 13]);
    }

    #[test]
    fn nulls_are_missing_values() {
        let body = r#"{"clientid": 1, "adds": [{"group": "g", "data": null, "timespec": null}],
                       "updates": null, "deletes": null, "depends": null}"#;
        let update: UpdateRequestJson = serde_json::from_str(body).expect("parses");
        assert_eq!(update.adds[0].data, None);
        assert!(update.updates.is_empty());
    }

    #[test]
    fn malformed_requests_are_rejected() {
        for body in [
            r#"{"adds": []}"#,
            r#"{"clientid": "7"}"#,
            r#"{"clientid": 1.5}"#,
            r#"{"clientid": 1, "bogus": 1}"#,
            r#"{"clientid": 1, "updates": [{"id": 1, "group": "g"}]}"#,
            r#"{"clientid": 1, "deletes": ["x"]}"#,
            r#"{"clientid": 1, "deletes": [-1]}"#,
            "not json",
        ] {
            assert!(
                serde_json::from_str::<UpdateRequestJson>(body).is_err(),
                "{body}"
            );
        }
        for body in [
            r#"{"clientid": 1, "group": "g"}"#,
            r#"{"clientid": 1, "group": "g", "duration": "5"}"#,
            r#"{"clientid": 1, "group": "g", "duration": 5, "extra": true}"#,
        ] {
            assert!(
                serde_json::from_str::<ClaimRequestJson>(body).is_err(),
                "{body}"
            );
        }
    }

    #[test]
    fn results_have_exactly_one_key() {
        let tasks = WriteResultJson::Tasks { tasks: vec![] };
        assert_eq!(
            serde_json::to_string(&tasks).expect("json"),
            r#"{"tasks":[]}"#
        );
        let errors = WriteResultJson::Errors {
            errors: vec!["deletes: task 987 does not exist".into()],
        };
        assert_eq!(
            serde_json::to_string(&errors).expect("json"),
            r#"{"errors":["deletes: task 987 does not exist"]}"#
        );
        let back: WriteResultJson = serde_json::from_str(r#"{"errors":["x"]}"#).expect("parses");
        assert_eq!(
            back,
            WriteResultJson::Errors {
                errors: vec!["x".into()]
            }
        );
    }

    #[test]
    fn query_values() {
        for (value, owned) in [
            ("1", true),
            ("yes", true),
            ("true", true),
            ("0", false),
            ("no", false),
            ("false", false),
        ] {
            assert_eq!(parse_owned(value), Ok(owned));
        }
        assert!(parse_owned("maybe").is_err());
        assert!(parse_owned("TRUE").is_err(), "exactly the seed's spellings");
        assert!(parse_limit("+5").is_err());
        assert!(parse_id("+7").is_err());
        assert_eq!(parse_id("523623"), Ok(523623));
        assert_eq!(parse_limit("10"), Ok(10));
        assert!(parse_limit("-1").is_err());
        assert_eq!(parse_id_list("1,2,3"), Ok(vec![1, 2, 3]));
        assert!(parse_id_list("1,x").is_err());
        assert!(parse_id_list("").is_err());
    }
}
