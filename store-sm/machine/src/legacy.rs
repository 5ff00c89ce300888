//! The update command as builds before the job layer encoded it in the Raft log, so that
//! a node upgraded in place still applies the entries its log holds, and a cluster in
//! the middle of a rolling upgrade keeps applying seed traffic.
//!
//! `Request::LegacyUpdate` holds a plain [`UpdateRequest`] and is encoded through
//! [`seed_encoding`]: the adds without job fields. Decoding fills the job fields with
//! their defaults, with no copy at apply time; encoding refuses an update whose adds
//! carry job fields, which would otherwise be lost on the way through the log.
//!
//! Likewise `Request::LegacyFinish`, `LegacyFail` and `LegacyFinishMany` keep the variants
//! under which builds before the claimed-version rule logged a finish, a fail and a
//! finish of many, and apply with their rule (the owner may end any version it holds);
//! new builds log `Finish`, `Fail` and `FinishMany`, appended, which refuse a job's
//! version that is not claimed. The rule thus comes with the entry, never the build.

use serde::Deserialize;
use serde::Serialize;

use crate::jobs::AddJob;
use crate::types::ClientId;
use crate::types::Millis;
use crate::types::TaskId;
use crate::types::UpdateRequest;
use crate::types::UpdateTask;

/// An add as the seed encoding writes it.
#[derive(Serialize)]
struct SeedAddRef<'a> {
    group: &'a str,
    data: &'a str,
    timespec: Option<Millis>,
}

/// The seed encoding of an update, borrowed for writing.
#[derive(Serialize)]
struct SeedUpdateRef<'a> {
    client: ClientId,
    adds: Vec<SeedAddRef<'a>>,
    updates: &'a [UpdateTask],
    deletes: &'a [TaskId],
    depends: &'a [TaskId],
}

/// An add as the seed encoding reads it.
#[derive(Deserialize)]
struct SeedAdd {
    group: String,
    data: String,
    timespec: Option<Millis>,
}

/// The seed encoding of an update, owned for reading.
#[derive(Deserialize)]
struct SeedUpdate {
    client: ClientId,
    adds: Vec<SeedAdd>,
    updates: Vec<UpdateTask>,
    deletes: Vec<TaskId>,
    depends: Vec<TaskId>,
}

/// Whether `update` fits the seed encoding: none of its adds carries a job field.
pub fn fits_seed_encoding(update: &UpdateRequest) -> bool {
    update.adds.iter().all(|add| add.job == AddJob::default())
}

/// Serde adapter for `Request::LegacyUpdate` (see the module documentation).
pub mod seed_encoding {
    use serde::Deserialize;
    use serde::Deserializer;
    use serde::Serialize;
    use serde::Serializer;
    use serde::ser::Error as _;

    use super::SeedAddRef;
    use super::SeedUpdate;
    use super::SeedUpdateRef;
    use super::fits_seed_encoding;
    use crate::jobs::AddJob;
    use crate::types::AddTask;
    use crate::types::UpdateRequest;

    /// Writes `update` in the seed encoding; an add with job fields is an error.
    pub fn serialize<S: Serializer>(
        update: &UpdateRequest,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        if !fits_seed_encoding(update) {
            return Err(S::Error::custom(
                "an update whose adds carry job fields cannot be logged in the seed encoding",
            ));
        }
        SeedUpdateRef {
            client: update.client,
            adds: update
                .adds
                .iter()
                .map(|add| SeedAddRef {
                    group: &add.group,
                    data: &add.data,
                    timespec: add.timespec,
                })
                .collect(),
            updates: &update.updates,
            deletes: &update.deletes,
            depends: &update.depends,
        }
        .serialize(serializer)
    }

    /// Reads an update written in the seed encoding, with default job fields.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<UpdateRequest, D::Error> {
        let seed = SeedUpdate::deserialize(deserializer)?;
        Ok(UpdateRequest {
            client: seed.client,
            adds: seed
                .adds
                .into_iter()
                .map(|add| AddTask {
                    group: add.group,
                    data: add.data,
                    timespec: add.timespec,
                    job: AddJob::default(),
                })
                .collect(),
            updates: seed.updates,
            deletes: seed.deletes,
            depends: seed.depends,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::AddTask;
    use crate::types::Request;

    /// The encoding of a seed update as builds before the job layer wrote it.
    #[derive(Serialize)]
    enum OldRequest {
        Update(OldUpdate),
    }

    #[derive(Serialize)]
    struct OldUpdate {
        client: ClientId,
        adds: Vec<OldAdd>,
        updates: Vec<UpdateTask>,
        deletes: Vec<TaskId>,
        depends: Vec<TaskId>,
    }

    #[derive(Serialize)]
    struct OldAdd {
        group: String,
        data: String,
        timespec: Option<Millis>,
    }

    #[test]
    fn a_seed_update_keeps_the_encoding_of_builds_before_the_job_layer() {
        let old = OldRequest::Update(OldUpdate {
            client: 7,
            adds: vec![OldAdd {
                group: "g".into(),
                data: "d".into(),
                timespec: Some(-5),
            }],
            updates: vec![UpdateTask {
                id: 3,
                data: "u".into(),
                timespec: None,
            }],
            deletes: vec![4],
            depends: vec![5],
        });
        let new = Request::LegacyUpdate(UpdateRequest {
            client: 7,
            adds: vec![AddTask::seed("g", "d", Some(-5))],
            updates: vec![UpdateTask {
                id: 3,
                data: "u".into(),
                timespec: None,
            }],
            deletes: vec![4],
            depends: vec![5],
        });
        // serde's own data model, as any format sees it: equal for both.
        let old_json = format!("{:?}", serde_value(&old));
        let new_json = format!("{:?}", serde_value(&new));
        assert_eq!(old_json, new_json);
    }

    #[test]
    fn job_fields_cannot_hide_in_the_seed_encoding() {
        let mut add = AddTask::seed("g", "d", None);
        add.job.key = Some("k".into());
        let request = Request::LegacyUpdate(UpdateRequest {
            client: 1,
            adds: vec![add],
            ..UpdateRequest::default()
        });
        assert!(serde_value(&request).is_err());
    }

    /// Entries of builds before the claimed-version rule decode as the legacy forms, which
    /// apply with their rule; new builds log the forms appended after `PassTime`.
    #[test]
    fn finish_and_fail_of_builds_before_the_claimed_version_rule_keep_their_variants() {
        use crate::jobs::FailRequest;
        use crate::jobs::FinishItem;
        use crate::jobs::FinishManyRequest;
        use crate::jobs::FinishRequest;

        let finish = FinishRequest {
            client: 3,
            id: 9,
            result: Some("r".into()),
        };
        let fail = FailRequest {
            client: 3,
            id: 9,
            error: "e".into(),
            retry_in_ms: None,
        };
        let many = FinishManyRequest {
            client: 3,
            finishes: vec![FinishItem {
                id: 9,
                result: None,
            }],
        };
        let variant = |request: Request| {
            let text = serde_value(&request).expect("serializes");
            text.split('(').next().unwrap_or_default().to_string()
        };
        assert_eq!(variant(Request::LegacyFinish(finish.clone())), "variant3");
        assert_eq!(variant(Request::LegacyFail(fail.clone())), "variant4");
        assert_eq!(
            variant(Request::LegacyFinishMany(many.clone())),
            "variant15"
        );
        assert_eq!(variant(Request::PassTime), "variant16");
        assert_eq!(variant(Request::Finish(finish)), "variant17");
        assert_eq!(variant(Request::FinishMany(many)), "variant18");
        assert_eq!(variant(Request::Fail(fail)), "variant19");
        let both = crate::jobs::FinishAndClaimRequest {
            finish: FinishRequest {
                client: 3,
                id: 9,
                result: None,
            },
            next: crate::types::ClaimManyRequest {
                claim: crate::types::ClaimRequest {
                    client: 3,
                    group: "g".into(),
                    duration_ms: 1,
                    depends: vec![],
                },
                count: 1,
            },
        };
        assert_eq!(variant(Request::FinishAndClaim(both)), "variant20");
        assert_eq!(variant(Request::RaiseLogForm(3)), "variant21");
        assert_eq!(variant(Request::RaiseRulesForm(4)), "variant22");
        assert_eq!(variant(Request::Batch(Vec::new())), "variant23");
    }

    /// A tiny serializer that records serde's data model as text, so the test needs no
    /// format crate (the machine depends on serde alone).
    fn serde_value<T: Serialize>(value: &T) -> Result<String, String> {
        value.serialize(Recorder).map_err(|e| e.0)
    }

    #[derive(Debug)]
    struct RecordError(String);

    impl std::fmt::Display for RecordError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl std::error::Error for RecordError {}

    impl serde::ser::Error for RecordError {
        fn custom<M: std::fmt::Display>(message: M) -> Self {
            RecordError(message.to_string())
        }
    }

    struct Recorder;

    macro_rules! leaf {
        ($name:ident, $t:ty) => {
            fn $name(self, v: $t) -> Result<String, RecordError> {
                Ok(format!("{}({v:?})", stringify!($name)))
            }
        };
    }

    struct Seq(Vec<String>, &'static str);

    impl Seq {
        fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), RecordError> {
            self.0.push(value.serialize(Recorder)?);
            Ok(())
        }
        fn done(self) -> Result<String, RecordError> {
            Ok(format!("{}[{}]", self.1, self.0.join(",")))
        }
    }

    impl serde::ser::SerializeSeq for Seq {
        type Ok = String;
        type Error = RecordError;
        fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), RecordError> {
            self.push(v)
        }
        fn end(self) -> Result<String, RecordError> {
            self.done()
        }
    }

    impl serde::ser::SerializeStruct for Seq {
        type Ok = String;
        type Error = RecordError;
        fn serialize_field<T: Serialize + ?Sized>(
            &mut self,
            _key: &'static str,
            v: &T,
        ) -> Result<(), RecordError> {
            self.push(v)
        }
        fn end(self) -> Result<String, RecordError> {
            self.done()
        }
    }

    impl serde::Serializer for Recorder {
        type Ok = String;
        type Error = RecordError;
        type SerializeSeq = Seq;
        type SerializeTuple = serde::ser::Impossible<String, RecordError>;
        type SerializeTupleStruct = serde::ser::Impossible<String, RecordError>;
        type SerializeTupleVariant = serde::ser::Impossible<String, RecordError>;
        type SerializeMap = serde::ser::Impossible<String, RecordError>;
        type SerializeStruct = Seq;
        type SerializeStructVariant = serde::ser::Impossible<String, RecordError>;

        leaf!(serialize_bool, bool);
        leaf!(serialize_i8, i8);
        leaf!(serialize_i16, i16);
        leaf!(serialize_i32, i32);
        leaf!(serialize_i64, i64);
        leaf!(serialize_u8, u8);
        leaf!(serialize_u16, u16);
        leaf!(serialize_u32, u32);
        leaf!(serialize_u64, u64);
        leaf!(serialize_f32, f32);
        leaf!(serialize_f64, f64);
        leaf!(serialize_char, char);
        leaf!(serialize_str, &str);
        leaf!(serialize_bytes, &[u8]);

        fn serialize_none(self) -> Result<String, RecordError> {
            Ok("none".into())
        }
        fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<String, RecordError> {
            Ok(format!("some({})", v.serialize(Recorder)?))
        }
        fn serialize_unit(self) -> Result<String, RecordError> {
            Ok("unit".into())
        }
        fn serialize_unit_struct(self, name: &'static str) -> Result<String, RecordError> {
            Ok(name.into())
        }
        fn serialize_unit_variant(
            self,
            _: &'static str,
            index: u32,
            _: &'static str,
        ) -> Result<String, RecordError> {
            Ok(format!("variant{index}"))
        }
        fn serialize_newtype_struct<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            v: &T,
        ) -> Result<String, RecordError> {
            v.serialize(Recorder)
        }
        fn serialize_newtype_variant<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            index: u32,
            _: &'static str,
            v: &T,
        ) -> Result<String, RecordError> {
            Ok(format!("variant{index}({})", v.serialize(Recorder)?))
        }
        fn serialize_seq(self, _: Option<usize>) -> Result<Seq, RecordError> {
            Ok(Seq(Vec::new(), "seq"))
        }
        fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, RecordError> {
            Err(RecordError("tuple".into()))
        }
        fn serialize_tuple_struct(
            self,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeTupleStruct, RecordError> {
            Err(RecordError("tuple struct".into()))
        }
        fn serialize_tuple_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeTupleVariant, RecordError> {
            Err(RecordError("tuple variant".into()))
        }
        fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, RecordError> {
            Err(RecordError("map".into()))
        }
        fn serialize_struct(self, _: &'static str, _: usize) -> Result<Seq, RecordError> {
            Ok(Seq(Vec::new(), "struct"))
        }
        fn serialize_struct_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeStructVariant, RecordError> {
            Err(RecordError("struct variant".into()))
        }
    }
}
