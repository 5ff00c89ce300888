//! A request's fingerprint: a 64-bit FNV-1a hash of what the request asks, kept with
//! its dedup entry so that a request id reused for a different request is refused
//! instead of answered with the first request's outcome.
//!
//! The hash walks the request's serde form (fields in declaration order, variants by
//! index), not `#[derive(Hash)]`, whose byte stream the language does not promise to keep:
//! a fingerprint stored in a snapshot must mean the same to the next build.

use serde::Serialize;
use serde::ser;

use super::types::Request;

/// The fingerprint of `request`. A claim that waits and one that does not, and the
/// seed's update and the job layer's, fingerprint alike: they are one request sent
/// through a different door. So do a finish or fail and its legacy form: a retry sent
/// across an upgrade is the same request.
pub fn fingerprint(request: &Request) -> u64 {
    let mut hasher = Fnv(FNV_OFFSET);
    let walked = match request {
        Request::LegacyUpdate(update) | Request::Update(update) => hasher.tagged(1, update),
        Request::Claim(claim) | Request::WaitingClaim(claim) => hasher.tagged(2, claim),
        Request::Finish(finish) | Request::LegacyFinish(finish) => hasher.tagged(3, finish),
        Request::Fail(fail) | Request::LegacyFail(fail) => hasher.tagged(4, fail),
        Request::Cancel(cancel) => hasher.tagged(5, cancel),
        Request::Retry(retry) => hasher.tagged(6, retry),
        Request::Settings(settings) => hasher.tagged(7, settings),
        Request::ClaimMany(many) | Request::WaitingClaimMany(many) => hasher.tagged(8, many),
        Request::TokenAdd(add) => hasher.tagged(9, add),
        Request::TokenRevoke(revoke) => hasher.tagged(10, revoke),
        Request::AuthBootstrap(add) => hasher.tagged(11, add),
        Request::FinishMany(many) | Request::LegacyFinishMany(many) => hasher.tagged(12, many),
        Request::PassTime => hasher.tagged(13, &()),
        Request::FinishAndClaim(both) => hasher.tagged(14, both),
        Request::RaiseLogForm(form) => hasher.tagged(15, form),
        Request::RaiseRulesForm(form) => hasher.tagged(16, form),
        Request::Batch(commands) => hasher.tagged(17, commands),
        // The scope is who asked, not what: a retry through the same door matches.
        Request::Scoped(scoped) => return fingerprint(&scoped.request),
    };
    // The walk cannot fail (every method below succeeds); were it to, a fingerprint
    // that matches nothing refuses the retry rather than answering it wrongly.
    match walked {
        Ok(()) => hasher.0,
        Err(Never) => 0,
    }
}

/// FNV-1a of `chunks` in turn: a cheap hash that is the same on every build.
pub(crate) fn fnv1a<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut hasher = Fnv(FNV_OFFSET);
    for chunk in chunks {
        hasher.bytes(chunk);
    }
    hasher.0
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a over the bytes of a serde walk, each value preceded by a kind byte so that
/// adjacent values cannot run into each other.
struct Fnv(u64);

impl Fnv {
    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
    }

    fn kind(&mut self, kind: u8, payload: &[u8]) {
        self.bytes(&[kind]);
        self.bytes(payload);
    }

    fn len(&mut self, kind: u8, len: usize) {
        self.kind(kind, &(len as u64).to_le_bytes());
    }

    fn tagged(&mut self, tag: u8, value: &impl Serialize) -> Result<(), Never> {
        self.kind(0xF0, &[tag]);
        value.serialize(&mut *self)
    }
}

/// The walk's error type; no method produces one.
#[derive(Debug)]
pub struct Never;

impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fingerprinting failed")
    }
}

impl std::error::Error for Never {}

impl ser::Error for Never {
    fn custom<T: std::fmt::Display>(_msg: T) -> Self {
        Never
    }
}

/// The end of a sequence, map or struct of unknown length.
const END: u8 = 0xEE;

impl ser::Serializer for &mut Fnv {
    type Ok = ();
    type Error = Never;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    fn serialize_bool(self, v: bool) -> Result<(), Never> {
        self.kind(1, &[u8::from(v)]);
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), Never> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i16(self, v: i16) -> Result<(), Never> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i32(self, v: i32) -> Result<(), Never> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i64(self, v: i64) -> Result<(), Never> {
        self.kind(2, &v.to_le_bytes());
        Ok(())
    }
    fn serialize_i128(self, v: i128) -> Result<(), Never> {
        self.kind(3, &v.to_le_bytes());
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), Never> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u16(self, v: u16) -> Result<(), Never> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u32(self, v: u32) -> Result<(), Never> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u64(self, v: u64) -> Result<(), Never> {
        self.kind(4, &v.to_le_bytes());
        Ok(())
    }
    fn serialize_u128(self, v: u128) -> Result<(), Never> {
        self.kind(5, &v.to_le_bytes());
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Result<(), Never> {
        self.serialize_f64(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), Never> {
        self.kind(6, &v.to_bits().to_le_bytes());
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), Never> {
        self.kind(7, &u32::from(v).to_le_bytes());
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), Never> {
        self.len(8, v.len());
        self.bytes(v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Never> {
        self.len(9, v.len());
        self.bytes(v);
        Ok(())
    }
    fn serialize_none(self) -> Result<(), Never> {
        self.kind(10, &[]);
        Ok(())
    }
    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<(), Never> {
        self.kind(11, &[]);
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Never> {
        self.kind(12, &[]);
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Never> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
    ) -> Result<(), Never> {
        self.kind(13, &index.to_le_bytes());
        Ok(())
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Never> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        value: &T,
    ) -> Result<(), Never> {
        self.kind(14, &index.to_le_bytes());
        value.serialize(self)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self, Never> {
        self.kind(15, &[]);
        Ok(self)
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self, Never> {
        self.kind(16, &[]);
        Ok(self)
    }
    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Self, Never> {
        self.kind(17, &[]);
        Ok(self)
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self, Never> {
        self.kind(18, &index.to_le_bytes());
        Ok(self)
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self, Never> {
        self.kind(19, &[]);
        Ok(self)
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Self, Never> {
        self.kind(20, &[]);
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self, Never> {
        self.kind(21, &index.to_le_bytes());
        Ok(self)
    }
}

/// Every compound value: its elements in order, then [`END`].
macro_rules! compound {
    ($trait:ident, $method:ident $(, $key:ident)?) => {
        impl ser::$trait for &mut Fnv {
            type Ok = ();
            type Error = Never;
            fn $method<T: ?Sized + Serialize>(
                &mut self,
                $($key: &'static str,)?
                value: &T,
            ) -> Result<(), Never> {
                value.serialize(&mut **self)
            }
            fn end(self) -> Result<(), Never> {
                self.kind(END, &[]);
                Ok(())
            }
        }
    };
}

compound!(SerializeSeq, serialize_element);
compound!(SerializeTuple, serialize_element);
compound!(SerializeTupleStruct, serialize_field);
compound!(SerializeTupleVariant, serialize_field);
compound!(SerializeStruct, serialize_field, _key);
compound!(SerializeStructVariant, serialize_field, _key);

impl ser::SerializeMap for &mut Fnv {
    type Ok = ();
    type Error = Never;
    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result<(), Never> {
        key.serialize(&mut **self)
    }
    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Never> {
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), Never> {
        self.kind(END, &[]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AddTask;
    use crate::ClaimRequest;
    use crate::UpdateRequest;

    fn add(data: &str) -> Request {
        Request::Update(UpdateRequest {
            client: 1,
            adds: vec![AddTask::seed("g", data, None)],
            ..UpdateRequest::default()
        })
    }

    #[test]
    fn equal_requests_match_and_different_ones_do_not() {
        assert_eq!(fingerprint(&add("a")), fingerprint(&add("a")));
        assert_ne!(fingerprint(&add("a")), fingerprint(&add("b")));
        assert_ne!(fingerprint(&add("ab")), fingerprint(&add("a")));
        let claim = ClaimRequest {
            client: 1,
            group: "g".into(),
            duration_ms: 1_000,
            depends: Vec::new(),
        };
        let longer = ClaimRequest {
            duration_ms: 2_000,
            ..claim.clone()
        };
        assert_eq!(
            fingerprint(&Request::Claim(claim.clone())),
            fingerprint(&Request::WaitingClaim(claim.clone())),
            "waiting or not, one claim"
        );
        assert_ne!(
            fingerprint(&Request::Claim(claim)),
            fingerprint(&Request::Claim(longer))
        );
        if let Request::Update(update) = add("a") {
            assert_eq!(
                fingerprint(&Request::LegacyUpdate(update.clone())),
                fingerprint(&Request::Update(update))
            );
        }
    }

    #[test]
    fn the_fingerprint_is_pinned() {
        // Stored in snapshots: a change here must come with a snapshot format change.
        assert_eq!(fingerprint(&add("a")), 0xd9a4_9b02_e709_78f7);
    }
}
