//! The snapshot format: a versioned, compact, checksummed encoding of a [`TaskMachine`].
//!
//! ```text
//! "ROTASNAP" | format version (u32 LE) | body (bincode, varint) | SHA-256 of body (32 bytes)
//! body = head, then per group (name, count, tasks in claim order), then dedup entries
//!        oldest first, then the ids of every node that was ever a member, ascending,
//!        then per group with job records (name, count, records in key order, each
//!        followed by its id), then the groups whose settings differ from the
//!        defaults (name, settings), then whether the first admin token was made and the access tokens in id order,
//!        then (version 7) the log entry form every member reads
//! ```
//!
//! Version 8 is version 7 for a machine whose recorded form is `RULES_FORM` or newer:
//! it applies rules that builds of older forms do not, so they must not take it.
//! Version 7 added the recorded log entry form (`TaskMachine::log_form`). It is written
//! only for a machine that recorded one, which every member of its cluster has said it
//! reads; a machine without one is written as version 6, so that builds reading at most
//! version 6 still take the snapshots of a cluster in the middle of an upgrade.
//! Version 6 added each job record's id after the record (older formats decode with
//! none, so their jobs are read by key only until their next run).
//! Version 5 added access tokens (older formats decode with none, never bootstrapped).
//! Version 4 added each dedup entry's request fingerprint (entries of older formats
//! decode without one, and answer any request under their id as before).
//! Version 3 added the job layer: job fields on every task, job records and settings.
//! Version 2 (no job layer) and version 1 (no member ids either) still decode: their
//! tasks are seed tasks, with an empty member history for version 1.
//!
//! The body is canonical (every collection is walked in key order), so its SHA-256 is
//! also the machine's state hash: two replicas with equal hashes hold equal state.
//! Encoding reads from a clone of the machine, which is O(1) to take, so apply goes on
//! while a snapshot is written.

use std::fmt;
use std::io;
use std::io::Write;
use std::sync::Arc;

use serde::Deserialize;
use serde::Serialize;
use sha2::Digest;
use sha2::Sha256;

use crate::machine::AuthParts;
use crate::machine::ClientId;
use crate::machine::GroupName;
use crate::machine::GroupSettings;
use crate::machine::JobParts;
use crate::machine::JobRecord;
use crate::machine::LogTime;
use crate::machine::MemberId;
use crate::machine::Outcome;
use crate::machine::Refusal;
use crate::machine::Task;
use crate::machine::TaskId;
use crate::machine::TaskJob;
use crate::machine::TaskMachine;
use crate::machine::TokenRecord;
use crate::machine::constants::RULES_FORM;
use crate::planted;

/// First bytes of every snapshot.
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"ROTASNAP";

/// The newest format this build writes and reads. Older formats get upgrade code
/// beside the decoder.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 8;

/// The format of a machine that recorded a log entry form older than [`RULES_FORM`].
const FORMAT_WITH_LOG_FORM: u32 = 7;

/// The format of a machine that recorded no log entry form, which builds before
/// [`FORMAT_WITH_LOG_FORM`] read.
const FORMAT_WITHOUT_LOG_FORM: u32 = 6;

/// The format `machine` is written in: the oldest that says what it needs, so that
/// every member reads it. Format 8 is format 7 for a machine that applies the rules of
/// [`RULES_FORM`] on: builds of older forms, which would apply it with their own rules,
/// refuse it.
fn format_of(machine: &TaskMachine) -> u32 {
    format_for_form(machine.log_form())
}

/// The format of a machine that recorded log entry form `form` (see [`format_of`]).
fn format_for_form(form: u32) -> u32 {
    match form {
        0 => FORMAT_WITHOUT_LOG_FORM,
        form if form < RULES_FORM => FORMAT_WITH_LOG_FORM,
        _ => SNAPSHOT_FORMAT_VERSION,
    }
}

/// The oldest format this build still reads.
pub const SNAPSHOT_FORMAT_OLDEST: u32 = 1;

/// Longest group name or task data a snapshot may hold, so a corrupt length cannot make
/// the decoder allocate without bound.
const STRING_BYTES_MAX: usize = 256 * 1024 * 1024;

const HEADER_BYTES: usize = SNAPSHOT_MAGIC.len() + 4;
const DIGEST_BYTES: usize = 32;

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The bytes do not start with the snapshot magic.
    #[error("not a Rota snapshot (bad magic); check that the file is a snapshot or backup")]
    BadMagic,
    /// The snapshot was written by a newer or unknown format.
    #[error(
        "snapshot format {found} is not supported (this build reads {SNAPSHOT_FORMAT_OLDEST} to {SNAPSHOT_FORMAT_VERSION}); use a Rota release that reads it"
    )]
    UnsupportedVersion {
        /// The version found in the header.
        found: u32,
    },
    /// The bytes end before the snapshot does.
    #[error("snapshot is truncated ({bytes} bytes); the file was cut short")]
    Truncated {
        /// How many bytes there were.
        bytes: usize,
    },
    /// The body does not match its checksum.
    #[error("snapshot checksum mismatch: the data is corrupt")]
    ChecksumMismatch,
    /// The body does not decode or describes an impossible state.
    #[error("snapshot body is invalid: {0}")]
    Invalid(String),
    /// Writing the snapshot failed.
    #[error("writing snapshot: {0}")]
    Io(#[from] io::Error),
}

/// SHA-256 of a machine's canonical encoding.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StateHash(pub [u8; DIGEST_BYTES]);

impl fmt::Display for StateHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl fmt::Debug for StateHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StateHash({self})")
    }
}

// The body's structs are encoded by position (bincode): a field's name is free to change,
// its type and place are the format (`LogTime` encodes as the bare i64 it replaced).
// `the_body_encoding_is_pinned` guards this.

#[derive(Serialize, Deserialize)]
struct Head {
    next_id: TaskId,
    log_time: LogTime,
    group_count: u64,
    dedup_count: u64,
    member_count: u64,
    job_group_count: u64,
    settings_count: u64,
}

/// The head of format 2, before the job layer.
#[derive(Serialize, Deserialize)]
struct HeadV2 {
    next_id: TaskId,
    log_time: LogTime,
    group_count: u64,
    dedup_count: u64,
    member_count: u64,
}

/// The head of format 1, which recorded no member history.
#[derive(Serialize, Deserialize)]
struct HeadV1 {
    next_id: TaskId,
    log_time: LogTime,
    group_count: u64,
    dedup_count: u64,
}

#[derive(Serialize, Deserialize)]
struct GroupHead<S> {
    name: S,
    task_count: u64,
}

#[derive(Serialize, Deserialize)]
struct TaskBody<S, J> {
    id: TaskId,
    available_at: LogTime,
    owner: ClientId,
    data: S,
    job: J,
}

/// A task as formats 1 and 2 stored it in a group.
#[derive(Serialize, Deserialize)]
struct TaskBodyV2<S> {
    id: TaskId,
    available_at: LogTime,
    owner: ClientId,
    data: S,
}

/// A task as formats 1 and 2 stored it in a remembered outcome.
#[derive(Serialize, Deserialize)]
struct LegacyTask {
    id: TaskId,
    group: GroupName,
    data: String,
    available_at: LogTime,
    owner: ClientId,
}

/// An outcome as formats 1 and 2 stored it (tasks without job fields).
#[derive(Serialize, Deserialize)]
enum LegacyOutcome {
    Tasks(Vec<LegacyTask>),
    Refused(Vec<Refusal>),
}

impl From<LegacyOutcome> for Outcome {
    fn from(legacy: LegacyOutcome) -> Self {
        match legacy {
            LegacyOutcome::Refused(refusals) => Outcome::Refused(refusals),
            LegacyOutcome::Tasks(tasks) => Outcome::Tasks(
                tasks
                    .into_iter()
                    .map(|task| Task {
                        id: task.id,
                        group: task.group,
                        data: task.data,
                        available_at: task.available_at,
                        owner: task.owner,
                        job: TaskJob::default(),
                    })
                    .collect(),
            ),
        }
    }
}

/// The access control section (format 5 on).
#[derive(Serialize, Deserialize)]
struct AuthHead {
    bootstrapped: bool,
    token_count: u64,
}

#[derive(Serialize, Deserialize)]
struct JobGroupHead<S> {
    name: S,
    record_count: u64,
}

#[derive(Serialize, Deserialize)]
struct DedupBody<S, O> {
    client: ClientId,
    request_id: S,
    applied_at: LogTime,
    outcome: O,
    fingerprint: Option<u64>,
}

/// A dedup entry of formats 1 to 3, before fingerprints.
#[derive(Serialize, Deserialize)]
struct DedupBodyV3<S, O> {
    client: ClientId,
    request_id: S,
    applied_at: LogTime,
    outcome: O,
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<STRING_BYTES_MAX>()
}

/// A writer that hashes what passes through it.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.hasher.update(&buf[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn put<T: Serialize, W: Write>(value: &T, out: &mut W) -> io::Result<()> {
    bincode::serde::encode_into_std_write(value, out, config())
        .map(|_| ())
        .map_err(io::Error::other)
}

/// Writes the canonical body and returns its SHA-256.
fn write_body<W: Write>(machine: &TaskMachine, out: W) -> io::Result<(W, StateHash)> {
    write_body_as(machine, out, format_of(machine))
}

/// Writes the body in `format` (this one, or an older one: tests of the upgrade write
/// them).
fn write_body_as<W: Write>(
    machine: &TaskMachine,
    out: W,
    format: u32,
) -> io::Result<(W, StateHash)> {
    let mut out = io::BufWriter::with_capacity(
        64 * 1024,
        HashingWriter {
            inner: out,
            hasher: Sha256::new(),
        },
    );
    let groups = machine.groups();
    let members: Vec<MemberId> = machine.members_ever().collect();
    let job_groups = machine.job_groups();
    let settings: Vec<(&GroupName, &GroupSettings)> = machine.configured_groups().collect();
    put(
        &Head {
            next_id: machine.next_id(),
            log_time: machine.log_time(),
            group_count: groups.len() as u64,
            dedup_count: machine.dedup().len() as u64,
            member_count: members.len() as u64,
            job_group_count: job_groups.len() as u64,
            settings_count: settings.len() as u64,
        },
        &mut out,
    )?;
    for group in &groups {
        put(
            &GroupHead {
                name: &**group,
                task_count: machine.group_len(group) as u64,
            },
            &mut out,
        )?;
        for task in machine.iter_group(group, true, LogTime::MAX) {
            put(
                &TaskBody {
                    id: task.id,
                    available_at: task.available_at,
                    owner: task.owner,
                    data: task.data.as_str(),
                    job: &task.job,
                },
                &mut out,
            )?;
        }
    }
    for ((client, request_id), entry) in machine.dedup().iter_oldest_first() {
        let (client, request_id, applied_at) = (*client, &**request_id, entry.applied_at);
        let outcome = &*entry.outcome;
        if format == 3 {
            let body = DedupBodyV3 {
                client,
                request_id,
                applied_at,
                outcome,
            };
            put(&body, &mut out)?;
        } else {
            let fingerprint = entry.fingerprint;
            let body = DedupBody {
                client,
                request_id,
                applied_at,
                outcome,
                fingerprint,
            };
            put(&body, &mut out)?;
        }
    }
    for member in &members {
        put(member, &mut out)?;
    }
    for group in &job_groups {
        let records: Vec<&JobRecord> = machine.jobs(group, None, None).collect();
        put(
            &JobGroupHead {
                name: &**group,
                record_count: records.len() as u64,
            },
            &mut out,
        )?;
        for record in records {
            put(record, &mut out)?;
            if format >= 6 {
                put(&record.id, &mut out)?;
            }
        }
    }
    for (group, settings) in settings {
        put(&(&**group, settings), &mut out)?;
    }
    if format >= 5 {
        let tokens: Vec<&TokenRecord> = machine.tokens().collect();
        put(
            &AuthHead {
                bootstrapped: machine.auth_bootstrapped(),
                token_count: tokens.len() as u64,
            },
            &mut out,
        )?;
        for token in tokens {
            put(token, &mut out)?;
        }
    }
    if format >= 7 {
        put(&machine.log_form(), &mut out)?;
    }
    let writer = out.into_inner().map_err(|e| e.into_error())?;
    let digest = StateHash(writer.hasher.finalize().into());
    Ok((writer.inner, digest))
}

/// Encodes `machine` as a snapshot into `out` and returns its state hash.
pub fn write_snapshot<W: Write>(machine: &TaskMachine, mut out: W) -> io::Result<StateHash> {
    out.write_all(SNAPSHOT_MAGIC)?;
    out.write_all(&format_of(machine).to_le_bytes())?;
    let (mut out, hash) = write_body(machine, out)?;
    out.write_all(&hash.0)?;
    out.flush()?;
    Ok(hash)
}

/// Encodes `machine` as a snapshot in memory.
pub fn encode_snapshot(machine: &TaskMachine) -> Vec<u8> {
    encode_snapshot_with_hash(machine).0
}

/// Encodes `machine` as a snapshot in memory and returns its state hash too.
pub fn encode_snapshot_with_hash(machine: &TaskMachine) -> (Vec<u8>, StateHash) {
    // Reserved at about its size (from what 10 million small tasks and 100 000
    // remembered outcomes encode to), so that a snapshot of megabytes is not copied and
    // faulted in again at each doubling. A larger one grows as before.
    const BYTES_PER_TASK: usize = 40;
    const RESERVE_MAX: usize = 1 << 30;
    let estimate = machine.dedup().approximate_bytes() / 2
        + machine.task_count().saturating_mul(BYTES_PER_TASK);
    let mut bytes = Vec::with_capacity(estimate.min(RESERVE_MAX));
    // Writing to a Vec cannot fail.
    write_snapshot(machine, &mut bytes).map_or_else(|e| unreachable!("{e}"), |hash| (bytes, hash))
}

/// The machine's state hash, computed without keeping the encoding.
pub fn state_hash(machine: &TaskMachine) -> StateHash {
    write_body(machine, io::sink()).map_or_else(|e| unreachable!("{e}"), |(_, hash)| hash)
}

/// The state hash recorded in a snapshot's trailer, without decoding it.
pub fn snapshot_hash(bytes: &[u8]) -> Result<StateHash, SnapshotError> {
    let body = checked_body(bytes)?;
    let trailer = &bytes[HEADER_BYTES + body.len()..];
    let mut digest = [0; DIGEST_BYTES];
    digest.copy_from_slice(trailer);
    Ok(StateHash(digest))
}

/// Checks magic, version and checksum and returns the body.
fn checked_body(bytes: &[u8]) -> Result<&[u8], SnapshotError> {
    checked_versioned_body(bytes).map(|(_, body)| body)
}

/// Checks magic, version and checksum and returns the format version and the body.
fn checked_versioned_body(bytes: &[u8]) -> Result<(u32, &[u8]), SnapshotError> {
    if bytes.len() < SNAPSHOT_MAGIC.len() || &bytes[..SNAPSHOT_MAGIC.len()] != SNAPSHOT_MAGIC {
        return Err(SnapshotError::BadMagic);
    }
    if bytes.len() < HEADER_BYTES + DIGEST_BYTES {
        return Err(SnapshotError::Truncated { bytes: bytes.len() });
    }
    let mut version = [0; 4];
    version.copy_from_slice(&bytes[SNAPSHOT_MAGIC.len()..HEADER_BYTES]);
    let version = u32::from_le_bytes(version);
    if !(SNAPSHOT_FORMAT_OLDEST..=SNAPSHOT_FORMAT_VERSION).contains(&version) {
        return Err(SnapshotError::UnsupportedVersion { found: version });
    }
    let (body, trailer) = bytes[HEADER_BYTES..].split_at(bytes.len() - HEADER_BYTES - DIGEST_BYTES);
    let digest: [u8; DIGEST_BYTES] = Sha256::digest(body).into();
    if digest != trailer {
        return Err(SnapshotError::ChecksumMismatch);
    }
    Ok((version, body))
}

fn take<T: serde::de::DeserializeOwned>(input: &mut &[u8]) -> Result<T, SnapshotError> {
    bincode::serde::decode_from_std_read(input, config())
        .map_err(|e| SnapshotError::Invalid(e.to_string()))
}

/// Decodes a snapshot into a machine equal to the one encoded (equal state hash).
pub fn decode_snapshot(bytes: &[u8]) -> Result<TaskMachine, SnapshotError> {
    decode_snapshot_with_hash(bytes).map(|(machine, _)| machine)
}

/// Like [`decode_snapshot`], also returning the state hash, which the checksum check
/// has already computed.
pub fn decode_snapshot_with_hash(bytes: &[u8]) -> Result<(TaskMachine, StateHash), SnapshotError> {
    let (version, mut input) = checked_versioned_body(bytes)?;
    let mut hash = [0; DIGEST_BYTES];
    hash.copy_from_slice(&bytes[HEADER_BYTES + input.len()..]);
    let head: Head = match version {
        1 => {
            let v1: HeadV1 = take(&mut input)?;
            Head {
                next_id: v1.next_id,
                log_time: v1.log_time,
                group_count: v1.group_count,
                dedup_count: v1.dedup_count,
                member_count: 0,
                job_group_count: 0,
                settings_count: 0,
            }
        }
        2 => {
            let v2: HeadV2 = take(&mut input)?;
            Head {
                next_id: v2.next_id,
                log_time: v2.log_time,
                group_count: v2.group_count,
                dedup_count: v2.dedup_count,
                member_count: v2.member_count,
                job_group_count: 0,
                settings_count: 0,
            }
        }
        _ => take(&mut input)?,
    };
    let mut tasks = Vec::new();
    for _ in 0..head.group_count {
        let group: GroupHead<String> = take(&mut input)?;
        let name: Arc<str> = Arc::from(group.name);
        for _ in 0..group.task_count {
            let body: TaskBody<String, TaskJob> = if version < 3 {
                let v2: TaskBodyV2<String> = take(&mut input)?;
                TaskBody {
                    id: v2.id,
                    available_at: v2.available_at,
                    owner: v2.owner,
                    data: v2.data,
                    job: TaskJob::default(),
                }
            } else {
                take(&mut input)?
            };
            tasks.push(Task {
                id: body.id,
                group: Arc::clone(&name),
                data: body.data,
                available_at: body.available_at,
                owner: body.owner,
                job: body.job,
            });
        }
    }
    let mut dedup = Vec::new();
    for _ in 0..head.dedup_count {
        let (client, request_id, applied_at, outcome, fingerprint) = if version < 3 {
            let body: DedupBodyV3<String, LegacyOutcome> = take(&mut input)?;
            (
                body.client,
                body.request_id,
                body.applied_at,
                body.outcome.into(),
                None,
            )
        } else if version == 3 {
            let body: DedupBodyV3<String, Outcome> = take(&mut input)?;
            let (client, id, at) = (body.client, body.request_id, body.applied_at);
            (client, id, at, body.outcome, None)
        } else {
            let body: DedupBody<String, Outcome> = take(&mut input)?;
            let (client, id, at) = (body.client, body.request_id, body.applied_at);
            (client, id, at, body.outcome, body.fingerprint)
        };
        dedup.push((
            (client, Arc::from(request_id)),
            applied_at,
            Arc::new(outcome),
            fingerprint,
        ));
    }
    let mut members = Vec::new();
    for _ in 0..head.member_count {
        let member: MemberId = take(&mut input)?;
        if members.last().is_some_and(|&last| last >= member) {
            return Err(SnapshotError::Invalid(format!(
                "member ids are not ascending at {member}"
            )));
        }
        members.push(member);
    }
    let mut jobs = JobParts::default();
    for _ in 0..head.job_group_count {
        let group: JobGroupHead<String> = take(&mut input)?;
        for _ in 0..group.record_count {
            let mut record: JobRecord = take(&mut input)?;
            if version >= 6 {
                record.id = take(&mut input)?;
            }
            if *record.group != *group.name {
                return Err(SnapshotError::Invalid(format!(
                    "job {:?} of group {:?} is filed under group {:?}",
                    record.key, record.group, group.name
                )));
            }
            jobs.records.push(record);
        }
    }
    for _ in 0..head.settings_count {
        let (name, settings): (String, GroupSettings) = take(&mut input)?;
        jobs.settings.push((Arc::from(name), settings));
    }
    let mut auth = AuthParts::default();
    if version >= 5 {
        let auth_head: AuthHead = take(&mut input)?;
        auth.bootstrapped = auth_head.bootstrapped;
        for _ in 0..auth_head.token_count {
            auth.tokens.push(take(&mut input)?);
        }
    }
    let log_form: u32 = if version >= 7 { take(&mut input)? } else { 0 };
    let written_as = format_for_form(log_form);
    if version >= FORMAT_WITH_LOG_FORM && written_as != version {
        let recorded = match log_form {
            0 => "no log entry form".to_string(),
            form => format!("log entry form {form}"),
        };
        return Err(SnapshotError::Invalid(format!(
            "format {version} with {recorded} recorded (it is written as format {written_as})"
        )));
    }
    if !input.is_empty() {
        return Err(SnapshotError::Invalid(format!(
            "{} bytes left over after the last entry",
            input.len()
        )));
    }
    let next_id = if planted::is_planted(planted::Bug::IdReuse) {
        planted::next_id_after_live(&tasks)
    } else {
        head.next_id
    };
    let mut machine =
        TaskMachine::from_parts(next_id, head.log_time, tasks, dedup, members, jobs, auth)
            .map_err(|invalid| SnapshotError::Invalid(invalid.to_string()))?;
    machine.raise_log_form(log_form);
    Ok((machine, StateHash(hash)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::AddTask;
    use crate::machine::ClaimRequest;
    use crate::machine::Command;
    use crate::machine::Request;
    use crate::machine::Role;
    use crate::machine::TokenAddRequest;
    use crate::machine::UpdateRequest;

    /// Twenty seed tasks in three groups, added with request id r1.
    fn added() -> TaskMachine {
        let mut machine = TaskMachine::new();
        let adds = (0..20)
            .map(|i| {
                AddTask::seed(
                    format!("g{}", i % 3),
                    format!("payload {i}"),
                    Some(if i % 2 == 0 { 0 } else { -5000 }),
                )
            })
            .collect();
        machine.apply(&Command {
            stamp: LogTime::from_millis(1000),
            request_id: Some("r1".into()),
            request: Request::Update(UpdateRequest {
                client: 3,
                adds,
                ..Default::default()
            }),
        });
        machine
    }

    fn sample() -> TaskMachine {
        let mut machine = added();
        machine.apply(&Command {
            stamp: LogTime::from_millis(2000),
            request_id: Some("r2".into()),
            request: Request::Claim(ClaimRequest {
                client: 4,
                group: "g1".into(),
                duration_ms: 10_000,
                depends: vec![],
            }),
        });
        machine
    }

    #[test]
    fn round_trip_gives_an_identical_machine() {
        let machine = sample();
        let bytes = encode_snapshot(&machine);
        let restored = decode_snapshot(&bytes).expect("decodes");
        assert_eq!(state_hash(&restored), state_hash(&machine));
        assert_eq!(snapshot_hash(&bytes).expect("hash"), state_hash(&machine));
        let (decoded, hash) = decode_snapshot_with_hash(&bytes).expect("decodes");
        assert_eq!(
            (state_hash(&decoded), hash),
            (state_hash(&machine), state_hash(&machine))
        );
        assert_eq!(encode_snapshot_with_hash(&machine), (bytes.clone(), hash));
        assert_eq!(restored.next_id(), machine.next_id());
        assert_eq!(restored.groups(), machine.groups());
        assert_eq!(restored.dedup().len(), 2);
        assert_eq!(encode_snapshot(&restored), bytes, "canonical encoding");
    }

    /// The sample with a remembered refusal (which names a task's available time) and a
    /// member history, so that every part of the body is present.
    fn full_sample() -> TaskMachine {
        let mut machine = sample();
        machine.apply(&Command {
            stamp: LogTime::from_millis(2500),
            request_id: Some("r3".into()),
            request: Request::Update(UpdateRequest {
                client: 5,
                deletes: vec![machine.next_id() - 1, 999],
                ..Default::default()
            }),
        });
        machine.note_members([1, 2, 3]);
        machine
    }

    /// The job sample with two access tokens, one limited to groups.
    fn auth_sample() -> TaskMachine {
        let mut machine = job_sample();
        let token = |id: &str, role, groups: &[&str]| TokenAddRequest {
            client: 1,
            id: id.into(),
            name: format!("{id} token"),
            role,
            groups: groups.iter().map(|g| g.to_string()).collect(),
            secret_hash: "3c".repeat(32),
        };
        for request in [
            Request::AuthBootstrap(token("00000000000000a1", Role::Admin, &[])),
            Request::TokenAdd(token("00000000000000b2", Role::Worker, &["jobs-", "map"])),
        ] {
            let outcome = machine.apply(&Command {
                stamp: machine.log_time(),
                request_id: None,
                request,
            });
            assert!(matches!(&*outcome, Outcome::Token(_)), "{outcome:?}");
        }
        machine
    }

    /// The body in format `format` and its hash, as a whole snapshot.
    fn snapshot_as(machine: &TaskMachine, format: u32) -> Vec<u8> {
        let (body, hash) = write_body_as(machine, Vec::new(), format).expect("vec");
        [&SNAPSHOT_MAGIC[..], &format.to_le_bytes(), &body, &hash.0].concat()
    }

    /// Format 4's, 5's, 6's and 7's bodies, pinned: a change of any encoded type shows here
    /// before it reaches a disk or a replica with another build.
    #[test]
    fn the_body_encoding_is_pinned() {
        let machine = job_sample();
        assert!(
            matches!(&*machine.dedup().iter_oldest_first().nth(2).expect("r3").1.outcome,
                crate::machine::Outcome::Refused(refusals) if refusals.len() == 2),
            "the sample remembers a refusal naming an owned and a missing task"
        );
        let (_, format_4) = write_body_as(&machine, Vec::new(), 4).expect("vec");
        assert_eq!(
            format_4.to_string(),
            "a910240b0b2b2f9adb345c89e6efd87106a88977a014eba47015bcd0857de3d0"
        );
        let (_, format_5) = write_body_as(&auth_sample(), Vec::new(), 5).expect("vec");
        assert_eq!(
            format_5.to_string(),
            "6136dda3164181392bb3a33102c2e1234f71b68629a04d1e9cd9fd549d190991"
        );
        assert_eq!(
            state_hash(&auth_sample()).to_string(),
            "460e75edcb8c4dfa9d8b9b06927b73433ae0e9b79bc5570f543bc8609d2ca2d0"
        );
        let mut recorded = auth_sample();
        recorded.raise_log_form(3);
        assert_eq!(format_of(&recorded), 7);
        assert_eq!(
            state_hash(&recorded).to_string(),
            "f84fc398ac134eff4fd20ef63e9884e6c9cdb0289def8e6fa0e386f5e5da33d5"
        );
    }

    #[test]
    fn tokens_survive_a_round_trip_and_format_four_decodes_without_any() {
        let machine = auth_sample();
        let restored = decode_snapshot(&encode_snapshot(&machine)).expect("round trip");
        assert_eq!(state_hash(&restored), state_hash(&machine));
        assert_eq!(
            restored.tokens().collect::<Vec<_>>(),
            machine.tokens().collect::<Vec<_>>()
        );
        assert!(restored.auth_bootstrapped());
        assert_ne!(state_hash(&machine), state_hash(&job_sample()));

        let old = decode_snapshot(&snapshot_as(&machine, 4)).expect("format 4 decodes");
        assert_eq!(old.tokens().count(), 0);
        assert!(!old.auth_bootstrapped());
        // Format 4 has no job ids either: compare with the job sample read from it.
        let jobs_in_4 = decode_snapshot(&snapshot_as(&job_sample(), 4)).expect("decodes");
        assert_eq!(state_hash(&old), state_hash(&jobs_in_4));
    }

    #[test]
    fn job_ids_survive_a_round_trip_and_format_five_decodes_without_them() {
        let machine = job_sample();
        let ids: Vec<_> = machine.iter_jobs().map(|record| record.id).collect();
        assert!(
            ids.iter().all(Option::is_some),
            "every job has an id: {ids:?}"
        );
        let restored = decode_snapshot(&encode_snapshot(&machine)).expect("round trip");
        assert_eq!(state_hash(&restored), state_hash(&machine));
        for record in machine.iter_jobs() {
            let id = record.id.expect("an id");
            assert_eq!(restored.job_by_id(id), Some(record));
        }

        let old = decode_snapshot(&snapshot_as(&machine, 5)).expect("format 5 decodes");
        assert!(old.iter_jobs().all(|record| record.id.is_none()));
        assert_ne!(state_hash(&old), state_hash(&machine));
        let running = old
            .iter_jobs()
            .find(|record| record.key.as_ref() == "c")
            .expect("job c");
        let first = machine.job("jobs", "c").and_then(|r| r.id).expect("an id");
        assert_ne!(running.task, Some(first), "c was claimed since its add");
        assert_eq!(old.job_by_id(first), None, "format 5 knows no job ids");
        let live = running.task.expect("c runs");
        assert_eq!(old.job_by_id(live).map(|r| &*r.key), Some("c"));
    }

    #[test]
    fn a_recorded_log_form_takes_format_seven_and_none_keeps_format_six() {
        let version = |bytes: &[u8]| checked_versioned_body(bytes).expect("valid").0;
        let without = auth_sample();
        let six = encode_snapshot(&without);
        assert_eq!(version(&six), 6, "what builds before format 7 read");
        assert_eq!(six, snapshot_as(&without, 6), "the very bytes of format 6");
        assert_eq!(decode_snapshot(&six).expect("decodes").log_form(), 0);

        let mut with = auth_sample();
        with.apply(&Command {
            stamp: LogTime::from_millis(9000),
            request_id: None,
            request: Request::RaiseLogForm(3),
        });
        let seven = encode_snapshot(&with);
        assert_eq!(version(&seven), 7);
        let restored = decode_snapshot(&seven).expect("round trip");
        assert_eq!(restored.log_form(), 3);
        assert_eq!(state_hash(&restored), state_hash(&with));
        assert_ne!(
            state_hash(&with),
            state_hash(&without),
            "the hash covers it"
        );

        // Format 7 saying no form was recorded is not what any build writes.
        let (mut body, _) = write_body_as(&without, Vec::new(), 6).expect("vec");
        body.push(0); // the form, 0, as a varint
        let digest: [u8; DIGEST_BYTES] = Sha256::digest(&body).into();
        let zero = [&SNAPSHOT_MAGIC[..], &7u32.to_le_bytes(), &body, &digest].concat();
        assert!(matches!(
            decode_snapshot(&zero),
            Err(SnapshotError::Invalid(reason)) if reason.contains("no log entry form")
        ));
    }

    /// A machine on the rules of form 4 or newer is written as format 8, which builds of
    /// older forms refuse; its body is format 7's.
    #[test]
    fn a_rules_form_takes_format_eight() {
        let version = |bytes: &[u8]| checked_versioned_body(bytes).expect("valid").0;
        let mut with = auth_sample();
        with.apply(&Command {
            stamp: LogTime::from_millis(9000),
            request_id: None,
            request: Request::RaiseRulesForm(RULES_FORM),
        });
        let eight = encode_snapshot(&with);
        assert_eq!(version(&eight), 8);
        let restored = decode_snapshot(&eight).expect("round trip");
        assert_eq!(restored.log_form(), RULES_FORM);
        assert_eq!(state_hash(&restored), state_hash(&with));
        assert_eq!(
            &eight[12..eight.len() - DIGEST_BYTES],
            &snapshot_as(&with, 7)[12..eight.len() - DIGEST_BYTES],
            "format 7's body"
        );

        // Format 8 of a machine on an older form is not what any build writes.
        let mut older = auth_sample();
        older.raise_log_form(RULES_FORM - 1);
        assert!(matches!(
            decode_snapshot(&snapshot_as(&older, 8)),
            Err(SnapshotError::Invalid(reason)) if reason.contains("written as format 7")
        ));
    }

    #[test]
    fn member_history_survives_a_round_trip_and_changes_the_hash() {
        let plain = sample();
        let mut with_members = plain.clone();
        with_members.note_members([3, 1, 2]);
        with_members.note_members([2, 4]);
        let restored = decode_snapshot(&encode_snapshot(&with_members)).expect("decodes");
        assert_eq!(
            restored.members_ever().collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );
        assert_ne!(state_hash(&plain), state_hash(&with_members));
    }

    /// An outcome of a seed-only machine as formats 1 and 2 stored it.
    fn legacy_outcome(outcome: &Outcome) -> LegacyOutcome {
        match outcome {
            Outcome::Refused(refusals) => LegacyOutcome::Refused(refusals.clone()),
            Outcome::Tasks(tasks) => LegacyOutcome::Tasks(
                tasks
                    .iter()
                    .map(|task| {
                        assert!(task.job == TaskJob::default(), "a seed task: {task:?}");
                        LegacyTask {
                            id: task.id,
                            group: Arc::clone(&task.group),
                            data: task.data.clone(),
                            available_at: task.available_at,
                            owner: task.owner,
                        }
                    })
                    .collect(),
            ),
            Outcome::Settings(_) | Outcome::Token(_) | Outcome::Batch(_) => {
                panic!("formats 1 and 2 had no settings, tokens or batches")
            }
        }
    }

    /// Format 1 (before member history) or 2 (before the job layer) of a machine that
    /// uses neither jobs nor leases, as those builds wrote it.
    fn encode_legacy(machine: &TaskMachine, version: u32) -> Vec<u8> {
        let mut body = Vec::new();
        let groups = machine.groups();
        let members: Vec<MemberId> = machine.members_ever().collect();
        if version == 1 {
            let head = HeadV1 {
                next_id: machine.next_id(),
                log_time: machine.log_time(),
                group_count: groups.len() as u64,
                dedup_count: machine.dedup().len() as u64,
            };
            put(&head, &mut body).expect("vec");
        } else {
            let head = HeadV2 {
                next_id: machine.next_id(),
                log_time: machine.log_time(),
                group_count: groups.len() as u64,
                dedup_count: machine.dedup().len() as u64,
                member_count: members.len() as u64,
            };
            put(&head, &mut body).expect("vec");
        }
        for group in &groups {
            let task_count = machine.group_len(group) as u64;
            put(
                &GroupHead {
                    name: &**group,
                    task_count,
                },
                &mut body,
            )
            .expect("vec");
            for task in machine.iter_group(group, true, LogTime::MAX) {
                let (id, available_at, owner, data) =
                    (task.id, task.available_at, task.owner, task.data.as_str());
                put(
                    &TaskBodyV2 {
                        id,
                        available_at,
                        owner,
                        data,
                    },
                    &mut body,
                )
                .expect("vec");
            }
        }
        for ((client, request_id), entry) in machine.dedup().iter_oldest_first() {
            let dedup = DedupBodyV3 {
                client: *client,
                request_id: &**request_id,
                applied_at: entry.applied_at,
                outcome: legacy_outcome(&entry.outcome),
            };
            put(&dedup, &mut body).expect("vec");
        }
        if version == 2 {
            for member in &members {
                put(member, &mut body).expect("vec");
            }
        }
        let digest: [u8; DIGEST_BYTES] = Sha256::digest(&body).into();
        [&SNAPSHOT_MAGIC[..], &version.to_le_bytes(), &body, &digest].concat()
    }

    /// Like `sample`, but its claim remembers no outcome and its lease is gone, so that
    /// nothing in it needs the job layer (formats 1 and 2 had no leases).
    fn seed_sample() -> TaskMachine {
        let mut machine = added();
        let claim = Request::Claim(ClaimRequest {
            client: 4,
            group: "g2".into(),
            duration_ms: 10_000,
            depends: vec![],
        });
        machine.apply(&Command {
            stamp: LogTime::from_millis(3000),
            request_id: None,
            request: claim,
        });
        let leased: Vec<u64> = machine
            .iter_tasks()
            .filter(|task| task.job.leased)
            .map(|task| task.id)
            .collect();
        machine.apply(&Command {
            stamp: LogTime::from_millis(20_000),
            request_id: Some("r4".into()),
            request: Request::Update(UpdateRequest {
                client: 4,
                deletes: leased,
                ..Default::default()
            }),
        });
        machine
    }

    /// `restored` remembers what `original` does, without the requests' fingerprints
    /// (formats before 4 kept none).
    fn assert_without_fingerprints(restored: &TaskMachine, original: &TaskMachine) {
        let entries = |m: &TaskMachine| -> Vec<_> {
            m.dedup()
                .iter_oldest_first()
                .map(|(key, e)| (key.clone(), e.applied_at, Arc::clone(&e.outcome)))
                .collect()
        };
        assert_eq!(entries(restored), entries(original));
        assert!(
            original
                .dedup()
                .iter_oldest_first()
                .all(|(_, e)| e.fingerprint.is_some())
        );
        assert!(
            restored
                .dedup()
                .iter_oldest_first()
                .all(|(_, e)| e.fingerprint.is_none())
        );
    }

    #[test]
    fn format_three_still_decodes_and_answers_any_retry_under_an_old_id() {
        let machine = job_sample();
        let mut bytes = SNAPSHOT_MAGIC.to_vec();
        bytes.extend_from_slice(&3u32.to_le_bytes());
        let (body, hash) = write_body_as(&machine, Vec::new(), 3).expect("vec");
        bytes.extend_from_slice(&body);
        bytes.extend_from_slice(&hash.0);
        let mut restored = decode_snapshot(&bytes).expect("format 3 decodes");
        assert_without_fingerprints(&restored, &machine);
        let (key, entry) = restored
            .dedup()
            .iter_oldest_first()
            .next()
            .expect("an entry");
        let (client, request_id) = (key.0, key.1.to_string());
        let first = Arc::clone(&entry.outcome);
        // Another request under a remembered id gets the first outcome, as before.
        let other = restored.apply(&Command {
            stamp: restored.log_time(),
            request_id: Some(request_id),
            request: Request::Claim(ClaimRequest {
                client,
                group: "elsewhere".into(),
                duration_ms: 1,
                depends: vec![],
            }),
        });
        assert_eq!(other, first);
    }

    #[test]
    fn format_one_still_decodes_with_an_empty_member_history() {
        let machine = seed_sample();
        let restored = decode_snapshot(&encode_legacy(&machine, 1)).expect("format 1 decodes");
        assert_eq!(encode_legacy(&restored, 1), encode_legacy(&machine, 1));
        assert_without_fingerprints(&restored, &machine);
        assert_eq!(restored.members_ever().count(), 0);
    }

    #[test]
    fn format_two_still_decodes_as_seed_tasks() {
        let mut machine = seed_sample();
        machine.note_members([1, 2, 3]);
        let restored = decode_snapshot(&encode_legacy(&machine, 2)).expect("format 2 decodes");
        assert_eq!(encode_legacy(&restored, 2), encode_legacy(&machine, 2));
        assert_without_fingerprints(&restored, &machine);
        assert_eq!(restored.members_ever().collect::<Vec<_>>(), vec![1, 2, 3]);
        assert!(
            restored
                .iter_tasks()
                .all(|task| task.job == TaskJob::default())
        );
    }

    /// A machine that uses every part of the job layer: keys, a dependency, a lease,
    /// a failure, a dead letter, a cancel and group settings.
    fn job_sample() -> TaskMachine {
        use crate::machine::AddJob;
        use crate::machine::CancelRequest;
        use crate::machine::FailRequest;
        use crate::machine::SettingsChange;
        use crate::machine::SettingsRequest;
        let mut machine = full_sample();
        let keyed = |key: &str, after: &[&str]| AddTask {
            job: AddJob {
                key: Some(key.into()),
                after: after.iter().map(|k| k.to_string()).collect(),
                priority: 2,
                max_attempts: Some(1),
                ..AddJob::default()
            },
            ..AddTask::seed("jobs", format!("data {key}"), Some(0))
        };
        let mut step = 3000;
        let mut run = |machine: &mut TaskMachine, request: Request| {
            step += 100;
            machine.apply(&Command {
                stamp: LogTime::from_millis(step),
                request_id: None,
                request,
            })
        };
        run(
            &mut machine,
            Request::Settings(SettingsRequest {
                client: 1,
                group: "jobs".into(),
                change: SettingsChange {
                    max_running: Some(4),
                    retention_ms: Some(60_000),
                    ..SettingsChange::default()
                },
            }),
        );
        run(
            &mut machine,
            Request::Update(UpdateRequest {
                client: 1,
                adds: vec![
                    keyed("a", &[]),
                    keyed("b", &["a"]),
                    keyed("c", &[]),
                    keyed("d", &[]),
                ],
                ..Default::default()
            }),
        );
        let claim = |client| {
            Request::Claim(ClaimRequest {
                client,
                group: "jobs".into(),
                duration_ms: 60_000,
                depends: vec![],
            })
        };
        let failing = run(&mut machine, claim(7));
        let Outcome::Tasks(claimed) = &*failing else {
            panic!("claim")
        };
        run(
            &mut machine,
            Request::Fail(FailRequest {
                client: 7,
                id: claimed[0].id,
                error: "boom".into(),
                retry_in_ms: None,
            }),
        );
        run(&mut machine, claim(8));
        run(
            &mut machine,
            Request::Cancel(CancelRequest {
                client: 1,
                group: "jobs".into(),
                keys: vec!["d".into()],
            }),
        );
        machine
    }

    #[test]
    fn job_state_survives_a_round_trip() {
        let machine = job_sample();
        let states: Vec<_> = machine
            .jobs("jobs", None, None)
            .map(|record| (record.key.to_string(), record.state))
            .collect();
        assert_eq!(
            states,
            vec![
                ("a".to_string(), crate::machine::JobState::Dead),
                ("b".to_string(), crate::machine::JobState::Cancelled),
                ("c".to_string(), crate::machine::JobState::Running),
                ("d".to_string(), crate::machine::JobState::Cancelled),
            ]
        );
        let bytes = encode_snapshot(&machine);
        let restored = decode_snapshot(&bytes).expect("decodes");
        assert_eq!(state_hash(&restored), state_hash(&machine));
        assert_eq!(encode_snapshot(&restored), bytes, "canonical encoding");
        assert_eq!(restored.running_in_group("jobs"), 1);
        assert_eq!(restored.group_settings("jobs").max_running, 4);
    }

    #[test]
    fn the_hash_tells_states_apart() {
        let a = sample();
        let mut b = a.clone();
        b.apply(&Command {
            stamp: LogTime::from_millis(3000),
            request_id: None,
            request: Request::Claim(ClaimRequest {
                client: 4,
                group: "g2".into(),
                duration_ms: 1,
                depends: vec![],
            }),
        });
        assert_ne!(state_hash(&a), state_hash(&b));
    }

    #[test]
    fn damaged_snapshots_are_refused_with_a_reason() {
        let bytes = encode_snapshot(&sample());
        assert!(matches!(
            decode_snapshot(b"nonsense"),
            Err(SnapshotError::BadMagic)
        ));
        assert!(matches!(
            decode_snapshot(&bytes[..20]),
            Err(SnapshotError::ChecksumMismatch | SnapshotError::Truncated { .. })
        ));
        let mut flipped = bytes.clone();
        let middle = flipped.len() / 2;
        flipped[middle] ^= 1;
        assert!(matches!(
            decode_snapshot(&flipped),
            Err(SnapshotError::ChecksumMismatch)
        ));
        let mut future = bytes;
        future[8] = 99;
        assert!(matches!(
            decode_snapshot(&future),
            Err(SnapshotError::UnsupportedVersion { found: 99 })
        ));
    }
}
